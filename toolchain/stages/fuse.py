"""Stage ``fuse``: the fused Hydra model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from toolchain.artifacts import atomic_write_json
from toolchain.pipeline import Context, stage
from toolchain.stages.common import build_hydra, calibrate_hydra, recover_fused


@stage("fuse", sections=("model", "data", "finetune", "scoring", "pruning", "fusion"), upstream=("prune",),
       summary="fuse the M members into one Hydra model",
       version=3)  # 2: lean Hydra module (outputs differ by float rounding); 3: the tokenizer in the Hydra folder
def fuse_stage(ctx: Context, work: Path) -> dict[str, Any]:
    """Fused model saved as safetensors + JSON config (reloads without the checkpoint), with the tokenizer.

    With ``fusion.recovery_steps`` the fused model is first fine-tuned end to end; with
    ``fusion.temperature`` one temperature, fitted on the validation split, is then folded into the
    heads (``summary.json`` records both), so every graph exported from this folder has them.
    """
    from toolchain.errors import ModelError
    from toolchain.hydra.fuse import format_summary, save_hydra, summary
    from toolchain.models.loading import load_tokenizer

    model = build_hydra(ctx)
    try:
        tokenizer = load_tokenizer(ctx.stage_dir("finetune") / "model")
    except ModelError:  # image models: no tokenizer
        tokenizer = None
    recovered = recover_fused(ctx, model, tokenizer)  # fusion.recovery_steps: the fused model trained end to end
    scaled = calibrate_hydra(ctx, model, tokenizer)  # fusion.temperature: T folded into the heads
    save_hydra(model, work / "hydra", tokenizer=tokenizer)
    info = summary(model)
    if recovered:
        info["recovery"] = recovered
    if scaled:
        info["temperature"] = scaled
    atomic_write_json(work / "summary.json", info)
    ctx.console.print(format_summary(info))
    return {"members": ctx.recipe.pruning.members}
