"""What INT8 (Q/DQ) graphs of a recipe do to the outputs and the uncertainty metrics: the INT8 tolerances.

Takes a recipe's exported FP32 graphs (``hydra-toolchain run RECIPE`` first: single model, Hydra
conv lowering) and reference modules, quantizes each with
:func:`toolchain.engines.onnxrt.quantize.quantize_int8` on the recipe's ``calib`` split, and runs them
on ONNX Runtime CPU and OpenVINO CPU on the parity stage's own feeds (generated shapes, the ID test
split, the OOD test split) against the PyTorch FP32 reference. Per graph and engine: the normalised
error ``e = |c - r| / (atol + rtol |r|)`` of every output under the INT8 defaults (max, the 0.999 and
0.99 quantiles, the worst per-feed 0.99 quantile), max absolute error, argmax agreement, the paired UQ
deltas (accuracy, NLL, ECE, AUROC with MSP and, for Hydra, MI; the mean ID MI), how far the rank gate's
inputs moved in INT8 unit roundoffs (``reach``: what ``ULPS["int8"]`` must cover), what OpenVINO read
back, and the gate's own verdict (``run_parity``: numeric, UQ with the rank bound, weights).

Variants per graph: ``default`` (every matrix layer but the classifier heads), ``keep-fc2`` (the MLP's
second matrix also float: the layer whose input, after GELU, has the outliers), ``percentile``
calibration. Wrong graphs (the single model's ``default`` graph): N evenly spaced quantized weights'
scales x1.25 (a scale taken from another layer), N activation scales x0.25 and x0.05 (a calibration
that saturates at a quarter / a twentieth of the range); caught = the gate fails it, per check kind.

    hydra-toolchain run recipes/minilm-tweets.yaml
    python benchmarks/parity_tolerances/int8.py --out benchmarks/parity_tolerances/int8-minilm.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")
HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(ROOT))


def _softmax(x: np.ndarray) -> np.ndarray:
    z = np.exp(x - x.max(-1, keepdims=True))
    return z / z.sum(-1, keepdims=True)


def _uq(ref: list[dict[str, np.ndarray]], cand: list[dict[str, np.ndarray]], n_gen: int, n_id: int,
        labels: np.ndarray, probs_key: str, member_key: str | None) -> dict[str, float]:
    """Paired deltas candidate - reference of the gate's metrics on the ID and OOD rows."""
    from sklearn.metrics import roc_auc_score

    from toolchain.metrics import ece as ece_of

    def collect(outs: list[dict[str, np.ndarray]], key: str) -> tuple[np.ndarray, np.ndarray]:
        ident = np.concatenate([o[key] for o in outs[n_gen:n_gen + n_id]])
        ood = np.concatenate([o[key] for o in outs[n_gen + n_id:]]) if len(outs) > n_gen + n_id else None
        return ident, ood

    out: dict[str, float] = {}
    vals = {}
    for tag, outs in (("ref", ref), ("cand", cand)):
        p_id, p_ood = collect(outs, probs_key)
        if probs_key == "logits":
            p_id, p_ood = _softmax(p_id), (_softmax(p_ood) if p_ood is not None else None)
        v = {"accuracy": float((p_id.argmax(1) == labels).mean()),
             "nll": float(-np.log(np.clip(p_id[np.arange(len(labels)), labels], 1e-12, None)).mean()),
             "ece": float(ece_of(p_id, labels))}
        if p_ood is not None:
            score = np.concatenate([p_id.max(1), p_ood.max(1)])
            y = np.r_[np.zeros(len(p_id)), np.ones(len(p_ood))]
            v["auroc_msp"] = float(roc_auc_score(y, -score))
            if member_key:
                m_id, m_ood = collect(outs, member_key)
                mi = []
                for m in (m_id, m_ood):
                    pm = _softmax(m)
                    mean = pm.mean(1)
                    h = -(mean * np.log(np.clip(mean, 1e-12, None))).sum(-1)
                    eh = -(pm * np.log(np.clip(pm, 1e-12, None))).sum(-1).mean(1)
                    mi.append(h - eh)
                v["auroc_mi"] = float(roc_auc_score(y, np.concatenate(mi)))
                v["mi_mean_id"] = float(mi[0].mean())
        vals[tag] = v
    for k in vals["ref"]:
        out[k] = round(vals["cand"][k] - vals["ref"][k], 5)
    out["argmax_agreement"] = round(float(np.mean(np.concatenate(
        [c[probs_key].argmax(-1) == r[probs_key].argmax(-1) for r, c in zip(ref[n_gen:], cand[n_gen:], strict=True)]))),
        5)
    out["reference"] = {k: round(v, 5) for k, v in vals["ref"].items()}
    return out


def _reach(ref: list[dict[str, np.ndarray]], cand: list[dict[str, np.ndarray]], probs_key: str,
           member_key: str | None) -> dict[str, float]:
    """How far the engine moved the rank gate's inputs, in INT8 unit roundoffs (2^-8), as
    ``benchmarks/rank_gate/reach.py`` measures ``ULPS``: the reference's top two probabilities of each row,
    ``|c / r - 1| / u``; member logits, ``|c - r| / max(|z|, 1) / u``. The max and the 0.999 and 0.99
    quantiles over every element."""
    from toolchain.parity.resolution import UNIT_ROUNDOFF

    u = UNIT_ROUNDOFF["int8"]
    probs, logits = [], []
    for r, c in zip(ref, cand, strict=True):
        pr, pc = r[probs_key], c[probs_key]
        if probs_key == "logits":
            pr, pc = _softmax(pr), _softmax(pc)
        top = np.argsort(pr, axis=-1)[..., -2:]
        a, b = np.take_along_axis(pr, top, -1), np.take_along_axis(pc, top, -1)
        probs.append((np.abs(b / np.maximum(a, 1e-30) - 1.0) / u).ravel())
        if member_key:
            zr, zc = r[member_key], c[member_key]
            logits.append((np.abs(zc - zr) / np.maximum(np.abs(zr), 1.0) / u).ravel())
    out = {}
    for name, parts in (("probs", probs), ("logits", logits)):
        if parts:
            v = np.concatenate(parts)
            out[name] = {"max": round(float(v.max()), 1), "q0.999": round(float(np.quantile(v, 0.999)), 1),
                         "q0.99": round(float(np.quantile(v, 0.99)), 1)}
    return out


def _numeric(ref: list[dict[str, np.ndarray]], cand: list[dict[str, np.ndarray]], name: str) -> dict[str, Any]:
    from toolchain.parity.tolerances import default_tolerances, evaluate_rule, normalised_error, resolve_tolerance

    tol = resolve_tolerance(default_tolerances("int8"), name)
    r = np.concatenate([o[name].reshape(-1) for o in ref])
    c = np.concatenate([o[name].reshape(-1) for o in cand])
    e = normalised_error(c, r, tol.atol, tol.rtol)
    per_feed = [float(np.quantile(normalised_error(b[name].reshape(-1), a[name].reshape(-1), tol.atol, tol.rtol),
                                  0.99, method="inverted_cdf")) for a, b in zip(ref, cand, strict=True)]
    passed = all(evaluate_rule(np.asarray(b[name], np.float32), np.asarray(a[name], np.float32), tol).passed
                 for a, b in zip(ref, cand, strict=True))
    return {"max_abs": float(np.abs(c - r).max()), "max": float(e.max()),
            "q0.999": float(np.quantile(e, 0.999, method="inverted_cdf")),
            "q0.99": float(np.quantile(e, 0.99, method="inverted_cdf")),
            "worst_feed_q0.99": max(per_feed), "passes_default_rule_every_feed": bool(passed)}


def _uq_fails(uq: dict[str, Any]) -> list[str]:
    """The metrics among ``_uq``'s deltas beyond the INT8 UQ defaults (rank metrics at their tolerance, no
    resolution bound: the bound only widens them)."""
    from toolchain.parity.tolerances import INT8_UQ_TOLERANCES, evaluate_metric, resolve_metric_tolerance

    ref = uq["reference"]
    return [m for m in ("accuracy", "nll", "ece", "auroc_msp", "auroc_mi") if m in ref and not evaluate_metric(
        ref[m], ref[m] + uq[m], resolve_metric_tolerance(INT8_UQ_TOLERANCES, m))[0]]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--recipe", default=str(ROOT / "recipes" / "minilm-tweets.yaml"))
    p.add_argument("--out", type=Path, help="also write the JSON here")
    p.add_argument("--wrong", type=int, default=6, help="wrong graphs per kind (evenly spaced layers; 0: none)")
    p.add_argument("--engines", default="onnxrt-cpu,openvino-cpu")
    args = p.parse_args(argv)
    engines = [e.strip() for e in args.engines.split(",") if e.strip()]

    import onnx
    import torch
    from onnx import numpy_helper

    from toolchain.artifacts import read_json
    from toolchain.bench.report import machine_info, machine_line
    from toolchain.engines import make_runner, reference_kind
    from toolchain.engines.onnxrt.quantize import quantize_int8
    from toolchain.hydra.io import load_hydra
    from toolchain.models.wrappers import SingleModel
    from toolchain.parity import run_parity
    from toolchain.pipeline import Context
    from toolchain.recipe import load_recipe
    from toolchain.stages.common import load_stage_model, runner_input_specs, split_feeds
    from toolchain.stages.parity import parity_inputs

    torch.set_num_threads(2)
    t0 = time.time()
    ctx = Context(load_recipe(args.recipe))
    export = ctx.stage_dir("export")
    graphs = read_json(export / "graphs.json")
    _m, base, tok = load_stage_model(ctx, ctx.stage_dir("finetune") / "model")
    names = list(graphs["single"]["inputs"])
    generated, ident, ood = parity_inputs(ctx, names, tok)
    feeds = [*generated, *[f for f, _ in ident], *ood]
    labels = np.concatenate([y for _, y in ident])
    n_gen, n_id = len(generated), len(ident)
    calib = [f for f, _ in split_feeds(ctx, "calib", names, tok, 16)]
    specs = runner_input_specs(ctx, names)

    def infer(runner: Any, outputs: list[str]) -> tuple[list[dict[str, np.ndarray]], dict[str, Any]]:
        with runner:
            outs = [{k: np.asarray(v, np.float64) for k, v in runner.infer(f).items() if k in outputs} for f in feeds]
            return outs, runner.engine_info()

    def run(kind: str, path: Path, outputs: list[str]) -> tuple[list[dict[str, np.ndarray]], dict[str, Any]]:
        if kind == "openvino-cpu":
            return infer(make_runner(kind, onnx_path=path, precision="int8", threads=2), outputs)
        return infer(make_runner(kind, path=path, intra_op_threads=2), outputs)

    result: dict[str, Any] = {"recipe": ctx.recipe.name, "machine": machine_line(machine_info(threads=2)),
                              "rows": {"id": len(labels), "ood": int(sum(len(next(iter(f.values()))) for f in ood)),
                                       "calibration": int(sum(len(next(iter(f.values()))) for f in calib))},
                              "correct": {}, "wrong": {}}
    cases = {"single": (SingleModel(base), "single", ["logits", "probs"], "logits", None),
             "hydra": (load_hydra(ctx.stage_dir("fuse") / "hydra").set_lowering("conv"), "hydra-conv",
                       ["probs", "member_logits"], "probs", "member_logits")}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for group, (module, graph, outputs, probs_key, member_key) in cases.items():
            ref, _ = infer(make_runner(reference_kind(), module=module, input_specs=specs, output_names=outputs,
                                       name=f"torch-{group}"), outputs)
            src = export / f"{graph}.onnx"
            layers = onnx.load(str(src), load_external_data=False)
            from toolchain.export.quantize import matrix_layers

            fc2 = [n for n in matrix_layers(layers) if ("output/dense" in n and "attention" not in n)
                   or "/mlp/fc2/" in n]
            variants = {"default": {}, "keep-fc2": {"keep_float_nodes": fc2}, "percentile": {"calibrate": "percentile"}}
            for vname, kw in variants.items():
                path = work / f"{graph}.{vname}.int8.onnx"
                q = quantize_int8(src, path, calib, **kw)
                for kind in engines:
                    outs, info = run(kind, path, outputs)
                    row = {name: _numeric(ref, outs, name) for name in outputs}
                    row["uq"] = _uq(ref, outs, n_gen, n_id, labels, probs_key, member_key)
                    row["reach"] = _reach(ref[n_gen:], outs[n_gen:], probs_key, member_key)
                    row["quantized_layers"] = len(q.quantized)
                    if info:
                        row["ran_precision"] = info.get("ran_precision")
                        row["float_matrix_layers"] = info.get("kept_fp32_matrix_layers")
                    if vname == "default":
                        row["member_ranges_min"] = min((min(v) for v in q.member_ranges.values()), default=None)
                    row["uq_fails"] = _uq_fails(row["uq"])
                    result["correct"][f"{graph}.{vname}@{kind}"] = row
                    print(f"{graph}.{vname}@{kind}", json.dumps(
                        {k: ({s: round(x, 4) for s, x in v.items() if isinstance(x, float)} if isinstance(v, dict)
                             and k != "uq" else v) for k, v in row.items() if k != "uq"}),
                          "uq", json.dumps({k: v for k, v in row["uq"].items() if k != "reference"}), flush=True)
            # the gate itself (run_parity, as the parity verb and stage run it: numeric, UQ with the rank bound
            # at INT8's resolution, weights) on every correct variant and engine
            cands, precs, srcs = {}, {}, {}
            for vname in variants:
                path = work / f"{graph}.{vname}.int8.onnx"
                for kind in engines:
                    label = f"{kind}:{graph}.{vname}"
                    cands[label] = (make_runner(kind, onnx_path=path, precision="int8", threads=2)
                                    if kind == "openvino-cpu" else make_runner(kind, path=path, intra_op_threads=2))
                    precs[label], srcs[label] = "int8", path
            verdict = run_parity(make_runner(reference_kind(), module=module, input_specs=specs, output_names=outputs,
                                             name=f"torch-{group}"), cands, generated, ident, ood,
                                 precisions=precs, graphs=srcs, reference_module=module, cross_check=False)
            for label in cands:
                mine = [c for c in verdict.checks if c.engine == label]
                row = {"pass": sum(c.status == "pass" for c in mine),
                       "fail": [c.name for c in mine if c.status == "fail"],
                       "unresolved": [c.name for c in mine if c.status == "unresolved"]}
                result.setdefault("gate", {})[label] = row
                print("gate", label, json.dumps(row), flush=True)
            if group != "single" or args.wrong <= 0:
                continue
            good = onnx.load(str(work / f"{graph}.default.int8.onnx"))
            inits = {i.name: i for i in good.graph.initializer}
            w_scales, a_scales = [], []
            for node in good.graph.node:
                if node.op_type != "DequantizeLinear" or node.input[1] not in inits:
                    continue
                (w_scales if node.input[0] in inits else a_scales).append(node.input[1])
            w_scales, a_scales = list(dict.fromkeys(w_scales)), list(dict.fromkeys(a_scales))
            kinds = (("weight-scale x1.25", w_scales, 1.25), ("activation-scale x0.25", a_scales, 0.25),
                     ("activation-scale x0.05", a_scales, 0.05))
            wrong, labels_of = {}, {}
            for kind_name, pool, factor in kinds:
                picks = [pool[i] for i in np.linspace(0, len(pool) - 1, min(args.wrong, len(pool))).round().astype(int)]
                for n, scale in enumerate(picks):
                    bad = onnx.ModelProto()
                    bad.CopyFrom(good)
                    init = next(i for i in bad.graph.initializer if i.name == scale)
                    init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init) * np.float32(factor), scale))
                    path = work / f"wrong-{kind_name.split()[0]}-{factor}-{n}.int8.onnx"
                    onnx.save(bad, str(path))
                    for kind in engines:
                        label = f"{kind}:{path.name}"
                        wrong[label] = (make_runner(kind, onnx_path=path, precision="int8", threads=2)
                                        if kind == "openvino-cpu" else make_runner(kind, path=path, intra_op_threads=2))
                        labels_of[label] = (kind_name, kind, scale, path)
            # one gate run over every wrong graph: the same checks a user's parity run makes
            verdict = run_parity(make_runner(reference_kind(), module=module, input_specs=specs, output_names=outputs,
                                             name=f"torch-{group}"), wrong, generated, ident, ood,
                                 precisions={k: "int8" for k in wrong}, graphs={k: v[3] for k, v in labels_of.items()},
                                 reference_module=module, cross_check=False)
            for kind_name, _pool, _factor in kinds:
                for kind in engines:
                    mine = [lab for lab, v in labels_of.items() if v[0] == kind_name and v[1] == kind]
                    fails = {lab: [c.name for c in verdict.checks if c.engine == lab and c.status == "fail"]
                             for lab in mine}
                    n = len(mine)
                    summary = {"numeric": sum(any(f.startswith("numeric/") for f in v) for v in fails.values()),
                               "uq": sum(any(f.startswith("uq/") for f in v) for v in fails.values()),
                               "weights": sum("weights" in v for v in fails.values()),
                               "gate": sum(bool(v) for v in fails.values())}
                    result["wrong"][f"{kind_name}@{kind}"] = {**{k: f"{v}/{n}" for k, v in summary.items()},
                                                              "failed_checks": {labels_of[lab][2]: v
                                                                                for lab, v in fails.items()}}
                    print(kind_name, kind, "caught by: " + ", ".join(f"{k} {v}/{n}" for k, v in summary.items()),
                          flush=True)
    result["seconds"] = round(time.time() - t0, 1)
    if args.out:
        args.out.write_text(json.dumps(result, indent=1))
    print(f"done in {result['seconds']:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
