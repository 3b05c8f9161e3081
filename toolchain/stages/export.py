"""Stage ``export``: ONNX graphs (Hydra in both lowerings, the single model, the members; FP16/BF16)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from toolchain import interrupts
from toolchain.artifacts import atomic_write_json
from toolchain.pipeline import Context, stage
from toolchain.stages.common import build_hydra, dynamic_axes, example_feed, load_stage_model, trt_profile


def export_one(ctx: Context, module: torch.nn.Module, outputs: list[str], path: Path) -> dict[str, Any]:
    """Export, check at shapes other than the export shape, lint for TensorRT; return facts."""
    from toolchain.engines.onnxrt.dynamic import check_dynamic
    from toolchain.export.lint import lint_tensorrt
    from toolchain.export.onnx_export import export_onnx
    from toolchain.export.stats import graph_stats

    interrupts.check()  # a graceful SIGTERM stops between graphs, not inside the ONNX exporter
    e = ctx.recipe.export
    feed = example_feed(ctx, 2, min(e.sequence.opt, 32))
    names = [n for n in getattr(module, "input_names", feed) if n in feed]
    feed = {n: feed[n] for n in names}
    module.eval()
    axes = dynamic_axes(ctx, names) | {o: {0: "batch"} for o in outputs}
    res = export_onnx(module, feed, outputs, path, dynamic_axes=axes, opset=e.opset)
    shapes = [(3, min(e.sequence.max, 21)), (1, min(e.sequence.max, 40))]
    report = check_dynamic(path, module, lambda s: {n: v for n, v in example_feed(ctx, s[0], s[1], seed=5).items()
                                                    if n in names}, shapes, atol=1e-4)
    lint = lint_tensorrt(path, trt_version="10", profile=trt_profile(ctx, names))
    return {"path": path.name, "outputs": outputs, "inputs": names, "summary": res.summary,
            "dynamic_check": {"ok": report.ok, "shapes": [list(s) for s in shapes]},
            "lint_ok": lint.ok, "lint": [str(f) for f in lint.findings], "stats": graph_stats(path)}


@stage("export", sections=("model", "data", "finetune", "scoring", "pruning", "fusion", "export"),
       upstream=("fuse", "ensemble"), summary="export ONNX graphs: Hydra (both lowerings), single model, members",
       version=3)  # 2: BF16 constants clamped to the BF16 range; 3: lean Hydra graphs, node counts in graphs.json
def export_stage(ctx: Context, work: Path) -> dict[str, Any]:
    """Export every graph the later stages run.

    FP32 graphs of Hydra (each lowering), the single model and each deep-ensemble member, and
    their FP16/BF16 variants (the recipe's ``export.precisions``).
    """
    from toolchain.export.precision import write_precision_variant
    from toolchain.export.stats import graph_stats
    from toolchain.models.wrappers import SingleModel

    e = ctx.recipe.export
    graphs: dict[str, dict[str, Any]] = {}
    for low in e.lowerings:
        hydra = build_hydra(ctx, lowering=low)
        graphs[f"hydra-{low}"] = {"kind": "hydra", "lowering": low, "precision": "fp32",
                                  **export_one(ctx, hydra, ["probs", "member_logits"], work / f"hydra-{low}.onnx")}
    _m, adapter, _t = load_stage_model(ctx, ctx.stage_dir("finetune") / "model")
    graphs["single"] = {"kind": "single", "precision": "fp32",
                        **export_one(ctx, SingleModel(adapter), ["logits", "probs"], work / "single.onnx")}
    for i in range(1, ctx.recipe.pruning.members):
        _m, member, _t = load_stage_model(ctx, ctx.stage_dir("ensemble") / f"member{i}")
        graphs[f"member{i}"] = {"kind": "member", "precision": "fp32",
                                **export_one(ctx, SingleModel(member), ["logits", "probs"], work / f"member{i}.onnx")}
    members = [f"member{i}" for i in range(1, ctx.recipe.pruning.members)]
    for base in [f"hydra-{low}" for low in e.lowerings] + ["single", *members]:
        for prec in [p for p in e.precisions if p != "fp32"]:
            name = f"{base}.{prec}"
            interrupts.check()
            res = write_precision_variant(work / f"{base}.onnx", work / f"{name}.onnx", prec)
            keep = {k: v for k, v in graphs[base].items() if k in ("kind", "lowering", "outputs", "inputs")}
            graphs[name] = {**keep, "precision": prec, "path": f"{name}.onnx", "precision_report": res.report(),
                            "stats": graph_stats(work / f"{name}.onnx")}
    atomic_write_json(work / "graphs.json", graphs)
    for name, g in graphs.items():
        extra = ""
        if g["precision"] == "fp32":
            dyn = "ok" if g["dynamic_check"]["ok"] else "FAILED"
            extra = f", dynamic check {dyn}, lint {'ok' if g['lint_ok'] else 'FAILED'}"
        extra += f", {g['stats']['nodes_excluding_constant']} nodes"
        ctx.console.print(f"  {name}.onnx ({g['precision']}){extra}")
    return {"graphs": sorted(graphs)}
