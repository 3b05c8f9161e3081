"""Stage ``build``: engines the registry says must be built first (TensorRT), where their toolkit and GPU exist."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from toolchain.artifacts import atomic_write_json, read_json
from toolchain.pipeline import Context, stage
from toolchain.stages.common import trt_profile


@stage("build", sections=("model", "data", "finetune", "scoring", "pruning", "fusion", "export", "engines"),
       upstream=("export",), summary="build TensorRT engines (where tensorrt and a CUDA GPU are available)")
def build_stage(ctx: Context, work: Path) -> dict[str, Any]:
    """One engine per Hydra graph and precision; absent TensorRT is recorded, not fatal, for ``run``."""
    from toolchain.engines import engine_kind, engine_kinds
    from toolchain.errors import MissingDependencyError

    kinds = [engine_kind(k) for k in ctx.recipe.engines if engine_kind(k).needs_build]
    if not kinds:
        wanted = " or ".join(f"'{s.name}'" for s in engine_kinds() if s.needs_build)
        atomic_write_json(work / "engines.json", {"skipped": f"the recipe's engines list has no {wanted}"})
        ctx.console.print("  no TensorRT engines requested (engines: " + ", ".join(ctx.recipe.engines) + ")")
        return {"engines": []}
    graphs = read_json(ctx.stage_dir("export") / "graphs.json")
    built: dict[str, Any] = {}
    for spec in kinds:  # engines.json is keyed by graph name: one kind that needs a build (tensorrt) today
        assert spec.builder is not None and spec.suffix is not None  # register_kind checks the builder
        for name, g in graphs.items():
            if not spec.build_filter(g):
                continue
            try:
                path = spec.builder(ctx.stage_dir("export") / g["path"], work / f"{name}{spec.suffix}",
                                    precision=g["precision"], profile=trt_profile(ctx, g["inputs"]),
                                    timing_cache=ctx.root / "timing.cache")
                built[name] = {"engine": path.name, "precision": g["precision"], "onnx": g["path"]}
            except MissingDependencyError as exc:
                atomic_write_json(work / "engines.json", {"skipped": str(exc)})
                ctx.console.print(f"  [yellow]TensorRT engines skipped[/yellow]: {exc}")
                return {"engines": [], "skipped": str(exc)}
    atomic_write_json(work / "engines.json", built)
    return {"engines": sorted(built)}
