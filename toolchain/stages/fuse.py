"""Stage ``fuse``: the fused Hydra model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from toolchain.artifacts import atomic_write_json
from toolchain.pipeline import Context, stage
from toolchain.stages.common import build_hydra


@stage("fuse", sections=("model", "data", "finetune", "scoring", "pruning", "fusion"), upstream=("prune",),
       summary="fuse the M members into one Hydra model",
       version=3)  # 2: lean Hydra module (outputs differ by float rounding); 3: the tokenizer in the Hydra folder
def fuse_stage(ctx: Context, work: Path) -> dict[str, Any]:
    """Fused model saved as safetensors + JSON config (reloads without the checkpoint), with the tokenizer."""
    from toolchain.errors import ModelError
    from toolchain.hydra.fuse import format_summary, save_hydra, summary
    from toolchain.models.loading import load_tokenizer

    model = build_hydra(ctx)
    try:
        tokenizer = load_tokenizer(ctx.stage_dir("finetune") / "model")
    except ModelError:  # image models: no tokenizer
        tokenizer = None
    save_hydra(model, work / "hydra", tokenizer=tokenizer)
    info = summary(model)
    atomic_write_json(work / "summary.json", info)
    ctx.console.print(format_summary(info))
    return {"members": ctx.recipe.pruning.members}
