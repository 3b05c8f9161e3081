"""Stage ``load``: the model and the data sets, and the checks that need the model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.table import Table

from toolchain.artifacts import atomic_write_json
from toolchain.pipeline import Context, check_recipe_against_model, stage, stage_manifest
from toolchain.stages.common import build_base_model, count_parameters


def check_loaded_model(ctx: Context) -> None:
    """Checks that need the model (a head budget larger than the model...), also when ``load`` was cached."""
    summary = stage_manifest(ctx, "load").get("summary", {})
    check_recipe_against_model(ctx.recipe, summary["heads_per_layer"])


@stage("load", sections=("model", "data"), upstream=(), summary="load the model and the data sets",
       after=check_loaded_model)
def load_stage(ctx: Context, work: Path) -> dict[str, Any]:
    """Load model and data, check the recipe against them, write ``summary.json``."""
    model, adapter, _tok = build_base_model(ctx)
    splits = {
        name: {"size": len(part), "classes": part.class_counts(), "fingerprint": part.fingerprint()}
        for name, part in ctx.data.items()
    }
    summary = {
        "model": {
            "family": adapter.family,
            "class": type(model).__name__,
            "layers": adapter.num_layers,
            "heads_per_layer": adapter.heads_per_layer(),
            "head_dim": adapter.head_dims()[0],
            "parameters": count_parameters(model),
        },
        "classes": ctx.class_names,
        "splits": splits,
    }
    atomic_write_json(work / "summary.json", summary)
    table = Table(title=f"{ctx.recipe.name}: model and data")
    table.add_column("item")
    table.add_column("value")
    m = summary["model"]
    table.add_row("model", f"{m['class']} ({m['family']}), {m['layers']} layers x {max(m['heads_per_layer'])} heads, "
                           f"{m['parameters'] / 1e6:.1f}M parameters")
    for name, s in splits.items():
        counts = ", ".join(f"{k}: {v}" for k, v in s["classes"].items())
        table.add_row(f"split {name}", f"{s['size']} samples, {counts}")
    from toolchain.report import print_table  # lazy, as the report stage: full width when not a terminal

    print_table(ctx.console, table)
    return {"summary": summary["model"]}
