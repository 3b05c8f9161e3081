"""Normalised errors of correct and wrong FP16/BF16 graphs at a recipe's evaluation size.

``calibrate.py`` measured the default tolerances on 256 rows. The parity stage checks every row
of a recipe's test and OOD splits (3,000 rows plus 11 generated ones, 24,088 logits for the ViT recipe), and the max of
a rounding error over more elements is larger. This script takes a recipe's exported graphs and
parity inputs (``hydra-toolchain run RECIPE`` first), runs them exactly as the parity stage does
(PyTorch reference; FP16 on ONNX Runtime CPU, BF16 on ``onnxrt-cpu-bf16emu``) and reports, per
graph and output, the distribution of the normalised error ``e = |c - r| / (atol + rtol * |r|)``
under the precision's current default tolerance: max over every element, max over the first 128
ID and 128 OOD rows (the trained ViT's calibration size in calibrate.py), the 0.999 and 0.9999
quantiles, the largest per-feed 0.99 quantile, how many elements exceed 1, and the default rule's
verdict (every clause, feeds as the parity stage has them).

Then the wrong graphs: every MatMul/Gemm weight of the single model's FP32 graph in turn scaled
by 1.05, or given 5% relative noise, converted to the precision and run on the same feeds; the
same statistics tell which of them each candidate rule catches. Scaling atol and rtol by ``k``
divides every ``e`` by ``k``, so "max e <= k" is the max rule with both tolerances ``k`` times
the defaults.

Real arithmetic (``--engines ...,openvino-cpu``): every FP32 graph is also compiled by OpenVINO
at FP16/BF16 where this CPU runs it (real BF16 kernels on AVX512-BF16/AMX), correct and wrong
graphs alike, beside the emulation. For each such engine the differential rule is evaluated too:
the engine's error against the PyTorch reference may be at most ``k`` times the error of the
emulation of the same (correct) graph on the same rows, on the max and on the 0.999 quantile of
``e`` (k = 2 and 3; the pattern of PyTorch's ``torch._dynamo.utils.same`` and FlashAttention's
tests), so a false-alarm and a catch rate are reported for it next to the default rule's.

    hydra-toolchain run recipes/vit-fashion-mnist.yaml
    python benchmarks/parity_tolerances/eval_size.py --recipe recipes/vit-fashion-mnist.yaml --out F.json
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
ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

CALIBRATION_ROWS = 256


def _stats(e: np.ndarray, e_first: np.ndarray) -> dict[str, Any]:
    finite = bool(np.isfinite(e).all())
    return {"elements": int(e.size), "max": float(e.max()), "max_first_256_rows": float(e_first.max()),
            "q0.999": float(np.quantile(e, 0.999, method="inverted_cdf")),
            "q0.9999": float(np.quantile(e, 0.9999, method="inverted_cdf")),
            "over_1": int((e > 1).sum()), "over_0.5": int((e > 0.5).sum()), "finite": finite}


def _first_rows(data: list[np.ndarray], n_id_feeds: int) -> np.ndarray:
    half = CALIBRATION_ROWS // 2
    parts = []
    for group in (data[:n_id_feeds], data[n_id_feeds:]):
        rows = np.concatenate([x.reshape(len(x), -1) for x in group]) if group else np.zeros((0, 1))
        parts.append(rows[:half].reshape(-1))
    return np.concatenate(parts)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--recipe", default=str(ROOT / "recipes" / "vit-fashion-mnist.yaml"))
    p.add_argument("--profile", default=None)
    p.add_argument("--out", type=Path, help="also write the JSON here")
    p.add_argument("--no-wrong", action="store_true", help="skip the perturbed graphs")
    p.add_argument("--weights", type=int, default=0, help="perturb only N weights, evenly spaced in graph order "
                   "(0: every MatMul/Gemm weight)")
    p.add_argument("--engines", default="emulated,openvino-cpu",
                   help="emulated (ONNX Runtime FP16 / the exact BF16 emulation on the converted graph) and/or "
                        "openvino-cpu (the FP32 graph compiled at the precision, where this CPU runs it)")
    args = p.parse_args(argv)
    engines = [e.strip() for e in args.engines.split(",") if e.strip()]

    import onnx
    import torch
    from calibrate import matmul_weights, perturb_initializer, scale_initializer

    from toolchain.artifacts import read_json
    from toolchain.engines import make_runner, reference_kind
    from toolchain.export import convert_precision
    from toolchain.hydra.fuse import load_hydra
    from toolchain.models.wrappers import SingleModel
    from toolchain.pipeline import Context
    from toolchain.recipe import load_recipe
    from toolchain.stages.common import load_stage_model, runner_input_specs
    from toolchain.stages.parity import parity_inputs

    torch.set_num_threads(2)
    t0 = time.time()
    ctx = Context(load_recipe(args.recipe, profile=args.profile))
    export = ctx.stage_dir("export")
    graphs = read_json(export / "graphs.json")
    _m, base, tok = load_stage_model(ctx, ctx.stage_dir("finetune") / "model")
    names = list(graphs["single"]["inputs"])
    generated, ident, ood = parity_inputs(ctx, names, tok)
    feeds = [*generated, *[f for f, _ in ident], *ood]
    n_ident = len(ident)
    specs = runner_input_specs(ctx, names)

    def infer(runner: Any) -> list[dict[str, np.ndarray]]:
        with runner:
            return [{k: np.asarray(v, np.float64) for k, v in runner.infer(f).items()} for f in feeds]

    def graph_run(path: Path, precision: str, outputs: list[str]) -> list[dict[str, np.ndarray]]:
        kind = "onnxrt-cpu-bf16emu" if precision == "bf16" else "onnxrt-cpu"
        outs = infer(make_runner(kind, path=path, intra_op_threads=2))
        return [{k: o[k] for k in outputs} for o in outs]

    from toolchain.engines import engine_kind

    ov = engine_kind("openvino-cpu")
    real = [p for p in ("fp16", "bf16") if "openvino-cpu" in engines and ov.unavailable(p) is None]
    result_unavailable = {p: ov.unavailable(p) for p in ("fp16", "bf16") if ov.unavailable(p) is not None}

    def ov_run(path: Path, precision: str, outputs: list[str]) -> tuple[list[dict[str, np.ndarray]], str]:
        runner = make_runner("openvino-cpu", onnx_path=path, precision=precision, threads=2)
        with runner:
            outs = [{k: np.asarray(v, np.float64) for k, v in runner.infer(f).items() if k in outputs}
                    for f in feeds]
            return outs, runner.engine_info()["ran_precision"]

    result: dict[str, Any] = {"recipe": ctx.recipe.name, "rows": {"id": int(sum(len(y) for _, y in ident)),
                                                                  "ood": int(sum(len(next(iter(f.values())))
                                                                                 for f in ood))},
                              "generated_feeds": len(generated), "correct": {}, "wrong": {},
                              "openvino_unavailable": result_unavailable}
    modules = {"hydra": (load_hydra(ctx.stage_dir("fuse") / "hydra"), ["probs", "member_logits"]),
               "single": (SingleModel(base), ["logits", "probs"])}
    refs = {}
    emulated: dict[str, Any] = {}  # graph -> the emulation's statistics (the differential rule's yardstick)
    for group, (module, outputs) in modules.items():
        refs[group] = infer(make_runner(reference_kind(), module=module, input_specs=specs, output_names=outputs,
                                        name=f"torch-{group}"))
        for gname, g in graphs.items():
            is_group = (g.get("kind") == "hydra") == (group == "hydra") and g.get("kind") != "member"
            if not is_group or g["precision"] == "fp32":
                continue
            outs = graph_run(export / g["path"], g["precision"], outputs)
            res = {name: _per_output(refs[group], outs, name, g["precision"], len(generated), n_ident)
                   for name in outputs}
            if g["precision"] in real:  # the FP32 graph on OpenVINO's real kernels at this precision
                fp32_path = export / graphs[gname.rsplit(".", 1)[0]]["path"]
                ov_outs, ran = ov_run(fp32_path, g["precision"], outputs)
                ov_res = {name: _per_output(refs[group], ov_outs, name, g["precision"], len(generated), n_ident)
                          for name in outputs}
                for name in outputs:
                    ov_res[name]["differential"] = _differential(ov_res[name], res[name])
                result["correct"][f"{gname}@openvino-cpu"] = {**ov_res, "ran_precision": ran}
                emulated[gname] = res
                print(f"{gname}@openvino-cpu (ran {ran})", json.dumps(
                    {k: {s: round(v[s], 4) if isinstance(v[s], float) else v[s]
                         for s in ("max", "q0.999", "worst_feed_q0.99", "over_1", "passes_default_rule")}
                     | {"differential": v["differential"]} for k, v in ov_res.items()}), flush=True)
            if g["precision"] == "bf16":  # a BF16-quality engine must fail the FP16 rule (a silent precision loss)
                res["under_fp16_rule"] = {name: _per_output(refs[group], outs, name, "fp16", len(generated), n_ident)
                                          for name in outputs}
            result["correct"][gname] = res
            print(gname, json.dumps({k: {s: round(v[s], 4) if isinstance(v[s], float) else v[s]
                                         for s in ("elements", "max", "max_first_256_rows", "q0.999", "q0.9999",
                                                   "worst_feed_q0.99", "over_1", "passes_default_rule")}
                                     for k, v in res.items() if k != "under_fp16_rule"}), flush=True)
            if "under_fp16_rule" in res:
                print(f"  {gname} under the FP16 rule: passes "
                      f"{[v['passes_default_rule'] for v in res['under_fp16_rule'].values()]}", flush=True)
    if not args.no_wrong:
        fp32 = onnx.load(str(export / graphs["single"]["path"]))
        weights = matmul_weights(fp32)
        if 0 < args.weights < len(weights):
            weights = [weights[i] for i in np.linspace(0, len(weights) - 1, args.weights).round().astype(int)]
        with tempfile.TemporaryDirectory() as tmp:
            for precision in ("fp16", "bf16"):
                for kind, make in (("scale1.05", lambda n: scale_initializer(fp32, n, 1.05)),
                                   ("noise5%", lambda n: perturb_initializer(fp32, n, 0.05))):
                    rows = []
                    for w in weights:
                        path = Path(tmp) / "wrong.onnx"
                        onnx.save(convert_precision(make(w), precision).model, str(path))
                        outs = graph_run(path, precision, ["logits", "probs"])
                        rows.append({"weight": w, **{n: _per_output(refs["single"], outs, n, precision,
                                                                    len(generated), n_ident)
                                                     for n in ("logits", "probs")}})
                    caught = sum(not (r["logits"]["passes_default_rule"] and r["probs"]["passes_default_rule"])
                                 for r in rows)
                    result["wrong"][f"{kind}_{precision}"] = {"caught_by_default_rule": f"{caught}/{len(rows)}",
                                                             "weights": rows}
                    print(kind, precision, "logits max e (min/median/max):",
                          np.quantile([r["logits"]["max"] for r in rows], [0, 0.5, 1]).round(3).tolist(),
                          f"caught by the default rule {caught}/{len(rows)}", flush=True)
                    if precision not in real:
                        continue
                    rows = []  # the wrong FP32 graph on OpenVINO's real kernels at this precision
                    yardstick = emulated.get(f"single.{precision}")
                    for w in weights:
                        path = Path(tmp) / "wrong.onnx"
                        onnx.save(make(w), str(path))
                        outs, _ran = ov_run(path, precision, ["logits", "probs"])
                        row = {"weight": w}
                        for n in ("logits", "probs"):
                            row[n] = _per_output(refs["single"], outs, n, precision, len(generated), n_ident)
                            if yardstick is not None:
                                row[n]["differential"] = _differential(row[n], yardstick[n])
                        rows.append(row)
                    summary = {"caught_by_default_rule": f"{_caught(rows, None)}/{len(rows)}", "weights": rows}
                    if yardstick is not None:
                        summary |= {f"caught_by_differential_k{k}": f"{_caught(rows, k)}/{len(rows)}" for k in (2, 3)}
                    result["wrong"][f"{kind}_{precision}@openvino-cpu"] = summary
                    print(kind, precision, "openvino-cpu:", {k: v for k, v in summary.items() if k != "weights"},
                          flush=True)
    result["seconds"] = time.time() - t0
    text = json.dumps(result, indent=1)
    if args.out:
        args.out.write_text(text)
    print(f"done in {result['seconds']:.0f} s")
    return 0


def _per_output(ref: list[dict[str, np.ndarray]], cand: list[dict[str, np.ndarray]], name: str, precision: str,
                n_generated: int, n_ident: int) -> dict[str, Any]:
    """Statistics of ``e`` under ``precision``'s default atol/rtol, and the default rule's verdict."""
    from toolchain.parity.tolerances import default_tolerances, evaluate_rule, normalised_error, resolve_tolerance

    tol = resolve_tolerance(default_tolerances(precision), name)
    per_feed = [normalised_error(c[name], r[name], tol.atol, tol.rtol) for r, c in zip(ref, cand, strict=True)]
    e = np.concatenate([x.reshape(-1) for x in per_feed])
    data = per_feed[n_generated:]
    rule = evaluate_rule(np.concatenate([c[name].reshape(-1) for c in cand]),
                         np.concatenate([r[name].reshape(-1) for r in ref]), tol,
                         feed_sizes=[r[name].size for r in ref])
    return {**_stats(e, _first_rows(data, n_ident)), "worst_feed_q0.99": rule.feed_value,
            "passes_default_rule": rule.passed, "failed_clause": rule.failed, "default_rule": tol.describe()}


def _differential(candidate: dict[str, Any], emulation: dict[str, Any]) -> dict[str, Any]:
    """The candidate's error relative to the emulation's (same rows): ratios of max and q0.999 of ``e``.

    ``passes_k2`` / ``passes_k3``: both ratios <= k (an emulation error of 0 counts as 1e-3 of the rule, so a
    bit-exact emulation does not make every real engine fail).
    """
    floor = 1e-3
    ratio_max = candidate["max"] / max(emulation["max"], floor)
    ratio_q = candidate["q0.999"] / max(emulation["q0.999"], floor)
    return {"ratio_max": ratio_max, "ratio_q0.999": ratio_q,
            **{f"passes_k{k}": bool(ratio_max <= k and ratio_q <= k) for k in (2, 3)}}


def _caught(rows: list[dict[str, Any]], k: int | None) -> int:
    """Wrong graphs the default rule (k None) or the differential rule with ``k`` fails on logits or probs."""
    def passes(r: dict[str, Any]) -> bool:
        return r["passes_default_rule"] if k is None else r["differential"][f"passes_k{k}"]

    return sum(not (passes(r["logits"]) and passes(r["probs"])) for r in rows)


if __name__ == "__main__":
    raise SystemExit(main())
