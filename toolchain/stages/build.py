"""Stage ``build``: TensorRT engines where TensorRT and a CUDA GPU exist."""

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
    from toolchain.engines.tensorrt.builder import build_engine
    from toolchain.errors import MissingDependencyError

    if "tensorrt" not in ctx.recipe.engines:
        atomic_write_json(work / "engines.json", {"skipped": "the recipe's engines list has no 'tensorrt'"})
        ctx.console.print("  no TensorRT engines requested (engines: " + ", ".join(ctx.recipe.engines) + ")")
        return {"engines": []}
    graphs = read_json(ctx.stage_dir("export") / "graphs.json")
    built: dict[str, Any] = {}
    for name, g in graphs.items():
        if g["kind"] != "hydra" or g.get("lowering") != "conv":
            continue
        try:
            path = build_engine(ctx.stage_dir("export") / g["path"], work / f"{name}.engine",
                                precision=g["precision"], profile=trt_profile(ctx, g["inputs"]),
                                timing_cache=ctx.root / "timing.cache")
            built[name] = {"engine": path.name, "precision": g["precision"], "onnx": g["path"]}
        except MissingDependencyError as exc:
            atomic_write_json(work / "engines.json", {"skipped": str(exc)})
            ctx.console.print(f"  [yellow]TensorRT engines skipped[/yellow]: {exc}")
            return {"engines": [], "skipped": str(exc)}
    atomic_write_json(work / "engines.json", built)
    return {"engines": sorted(built)}
