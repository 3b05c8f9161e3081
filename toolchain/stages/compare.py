"""Stage ``compare``: more Hydra variants from the same fine-tuned model, side by side."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from toolchain.artifacts import atomic_write_json, read_json
from toolchain.pipeline import Context, stage
from toolchain.stages.common import VARIANT_STAGES, VariantContext


@stage("compare", sections=("model", "data", "finetune", "scoring", "pruning", "fusion", "compare"),
       upstream=("finetune", "ensemble"), summary="more Hydra variants side by side (recipe 'compare')")
def compare_stage(ctx: Context, work: Path) -> dict[str, Any]:
    """Prune, fuse and evaluate every ``compare`` variant (each cached under ``variants/<name>/``)."""
    from toolchain.pipeline import run_pipeline

    results: dict[str, Any] = {}
    for entry in ctx.recipe.compare:
        sub = VariantContext(ctx, ctx.recipe.variant(entry))
        ctx.console.print(f"  variant [bold]{entry.name}[/bold]: criterion {sub.recipe.scoring.criterion}, "
                          f"strategy {sub.recipe.pruning.strategy}")
        run_pipeline(sub, only=VARIANT_STAGES)
        ev = sub.stage_dir("evaluate")
        results[entry.name] = {
            "criterion": sub.recipe.scoring.criterion,
            "strategy": sub.recipe.pruning.strategy,
            "overrides": entry.model_dump(exclude={"name"}),
            "metrics": read_json(ev / "metrics.json"),
            "diversity": read_json(ev / "diversity.json"),
            "selection": read_json(ev / "selection.json"),
            "members": read_json(sub.stage_dir("prune") / "diversity.json"),
            "size": read_json(sub.stage_dir("fuse") / "summary.json"),
        }
    atomic_write_json(work / "compare.json", results)
    return {"variants": list(results)}
