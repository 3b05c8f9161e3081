"""Stage ``export``: ONNX graphs (Hydra in the recipe's lowerings, the single model, the members; FP16/BF16)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from toolchain import interrupts
from toolchain.artifacts import atomic_write_json, read_json
from toolchain.hydra.io import load_hydra
from toolchain.pipeline import Context, stage
from toolchain.stages.common import baseline_models, build_hydra, dynamic_axes, example_feed, trt_profile


def export_one(ctx: Context, module: torch.nn.Module, outputs: list[str], path: Path) -> dict[str, Any]:
    """Export, check at shapes other than the export shape, lint for TensorRT; return facts.

    The recipe's shapes through :func:`toolchain.verbs.export_module`, the function
    ``hydra-toolchain export SRC`` uses too.
    """
    from toolchain.verbs import export_module

    e = ctx.recipe.export
    feed = example_feed(ctx, 1)
    names = [n for n in getattr(module, "input_names", feed) if n in feed]
    return export_module(module, outputs, path, make_feed=lambda b, s, seed: example_feed(ctx, b, s, seed=seed),
                         names=names, axes=dynamic_axes(ctx, names), profile=trt_profile(ctx, names), opset=e.opset,
                         sequence=e.sequence)


def export_summary(ctx: Context) -> str:
    """The stage's line: the graphs the recipe really exports (its ``export.lowerings`` and ``export.precisions``)."""
    e = ctx.recipe.export
    hydra = f"Hydra ({' and '.join(e.lowerings)} lowering{'s' if len(e.lowerings) > 1 else ''}), " \
        if e.lowerings else "no Hydra graph (export.lowerings is empty), "
    extra = [p.upper() for p in e.precisions if p != "fp32"]
    return (f"export ONNX graphs: {hydra}single model, deep-ensemble members"
            + (f"; FP32 and {'/'.join(extra)} variants" if extra else "; FP32 only"))


# version 2: BF16 constants clamped to the BF16 range; 3: lean Hydra graphs, node counts in graphs.json;
# 4: FP32 islands for a decomposed RMSNorm and the rotary angles (LLaMA FP16/BF16 graphs)
@stage("export", sections=("model", "data", "finetune", "scoring", "pruning", "fusion", "export",
                           "baselines.temperature"),
       upstream=("fuse", "ensemble"), summary=export_summary, version=4)
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
    fused = read_json(ctx.stage_dir("fuse") / "summary.json")
    scaled = fused.get("temperature") or {}
    trained_fused = bool(scaled or fused.get("recovery"))  # weights only the fuse stage's folder holds
    for low in e.lowerings:
        # the fuse stage's folder in this lowering where it trained or calibrated the fused model; else rebuilt
        # from the members as before (the same weights: graphs and cache keys from before these options stay)
        hydra = load_hydra(ctx.stage_dir("fuse") / "hydra").set_lowering(low) if trained_fused else \
            build_hydra(ctx, lowering=low)
        graphs[f"hydra-{low}"] = {"kind": "hydra", "lowering": low, "precision": "fp32",
                                  **export_one(ctx, hydra, ["probs", "member_logits"], work / f"hydra-{low}.onnx")}
    adapter, de_members, _t, temperatures = baseline_models(ctx)  # baselines.temperature: T folded in
    graphs["single"] = {"kind": "single", "precision": "fp32",
                        **export_one(ctx, SingleModel(adapter), ["logits", "probs"], work / "single.onnx")}
    members = [f"member{i}" for i in range(1, len(de_members))]
    for i in range(1, len(members) + 1):
        graphs[f"member{i}"] = {"kind": "member", "precision": "fp32",
                                **export_one(ctx, SingleModel(de_members[i]), ["logits", "probs"],
                                             work / f"member{i}.onnx")}
    if scaled:
        temperatures["hydra"] = scaled
    for base in [f"hydra-{low}" for low in e.lowerings] + ["single", *members]:
        for prec in [p for p in e.precisions if p != "fp32"]:
            name = f"{base}.{prec}"
            interrupts.check()
            res = write_precision_variant(work / f"{base}.onnx", work / f"{name}.onnx", prec)
            keep = {k: v for k, v in graphs[base].items() if k in ("kind", "lowering", "outputs", "inputs")}
            graphs[name] = {**keep, "precision": prec, "path": f"{name}.onnx", "precision_report": res.report(),
                            "stats": graph_stats(work / f"{name}.onnx")}
    atomic_write_json(work / "graphs.json", graphs)
    atomic_write_json(work / "temperatures.json", temperatures)  # {} when nothing is temperature-scaled
    for name, g in graphs.items():
        extra = ""
        if g["precision"] == "fp32":
            dyn = "ok" if g["dynamic_check"]["ok"] else "FAILED"
            extra = f", dynamic check {dyn}, lint {'ok' if g['lint_ok'] else 'FAILED'}"
        extra += f", {g['stats']['nodes_excluding_constant']} nodes"
        ctx.console.print(f"  {name}.onnx ({g['precision']}){extra}")
    return {"graphs": sorted(graphs)}
