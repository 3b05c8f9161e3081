"""Stage ``fuse``: the fused Hydra model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from toolchain.artifacts import atomic_write_json
from toolchain.pipeline import Context, stage
from toolchain.stages.common import build_hydra


@stage("fuse", sections=("model", "data", "finetune", "scoring", "pruning", "fusion"), upstream=("prune",),
       summary="fuse the M members into one Hydra model",
       version=2)  # 2: lean Hydra module (same files; its outputs differ by float rounding: downstream reruns)
def fuse_stage(ctx: Context, work: Path) -> dict[str, Any]:
    """Fused model saved as safetensors + JSON config (reloads without the checkpoint)."""
    from toolchain.hydra.fuse import format_summary, save_hydra, summary

    model = build_hydra(ctx)
    save_hydra(model, work / "hydra")
    info = summary(model)
    atomic_write_json(work / "summary.json", info)
    ctx.console.print(format_summary(info))
    return {"members": ctx.recipe.pruning.members}
