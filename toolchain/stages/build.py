"""Stage ``build``: engines the registry says must be built first (TensorRT, OpenVINO), where they can be."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from toolchain.artifacts import atomic_write_json, read_json
from toolchain.pipeline import Context, stage
from toolchain.stages.common import trt_profile


@stage("build", sections=("model", "data", "finetune", "scoring", "pruning", "fusion", "export", "engines"),
       upstream=("export",), summary="build engines: OpenVINO (CPU), TensorRT (where tensorrt and a CUDA GPU are)",
       version=2)  # 2: engines.json per kind; OpenVINO
def build_stage(ctx: Context, work: Path) -> dict[str, Any]:
    """:func:`toolchain.verbs.build.build_engines` on the export folder; what cannot be built here is recorded.

    A kind that cannot build at all (no TensorRT or GPU) and a precision this machine lacks (a CPU
    without BF16) are written to ``engines.json`` with the reason, not raised: ``run`` goes on.
    """
    from toolchain.engines import engine_kind, engine_kinds
    from toolchain.verbs.build import build_engines

    kinds = [k for k in ctx.recipe.engines if engine_kind(k).needs_build]
    if not kinds:
        wanted = " or ".join(f"'{s.name}'" for s in engine_kinds() if s.needs_build)
        atomic_write_json(work / "engines.json", {})
        ctx.console.print(f"  no engines to build (the recipe's engines name no {wanted})")
        return {"engines": []}
    graphs = read_json(ctx.stage_dir("export") / "graphs.json")
    records = build_engines(kinds, graphs, ctx.stage_dir("export"), work, precisions=ctx.recipe.export.precisions,
                            profile=lambda names: trt_profile(ctx, list(names)), timing_cache=ctx.root / "timing.cache",
                            say=lambda line: ctx.console.print(f"  {line}"))
    atomic_write_json(work / "engines.json", records)
    return {"engines": sorted(f"{k}:{n}" for k, r in records.items() for n in r.get("engines", {})),
            "unavailable": sorted(f"{k}:{n}" for k, r in records.items() for n in r.get("unavailable", {})),
            "skipped": {k: r["skipped"] for k, r in records.items() if "skipped" in r}}
