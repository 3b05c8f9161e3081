"""Rank-metric gate: false alarms on correct engines and catches of broken ones, calibrated vs worst-case rule.

The parity gate judges a rank UQ metric (``failure_auroc``, ``auroc_*``, ``aupr_*``, ``fpr95_*``)
against how far rounding at the candidate's precision moves it (:mod:`toolchain.parity.resolution`).
This script counts, for the calibrated rule (``|delta| <= max(limit, bound)`` passes; not resolvable
only on flat scores) and the former worst-case rule (not resolvable whenever the worst case exceeds
the tolerance), how many rank checks pass, fail and are not resolvable:

(a) synthetic Hydra outputs (``synthetic.py``): sample sizes x score spreads x FP16/BF16, correct
    candidates (the precision's rounding after 0-2 unit roundoffs of upstream error) and broken
    ones (a class-logit bias, swapped rows, noise of 3-10x the resolution);
(b) real graphs of a recipe (default: the packaged all-MiniLM-L6-v2 recipe, its 1,000 ID test rows
    and 500 OOD rows), run as the parity stage runs them: the PyTorch reference (fused Hydra, the
    single model) against the recipe's FP16/BF16 graphs on the engine kinds of ``--engines`` (a
    BF16 graph on ``onnxrt-cpu`` runs as ``onnxrt-cpu-bf16emu``, the registry's substitute), on
    all rows and on seeded 80% subsets of them; and wrong graphs: the FP32 graph's MatMul weights
    (evenly spaced over the graph) scaled by 1.05 or given 5% noise (the helpers of
    benchmarks/parity_tolerances), converted to the precision and run the same way. For each real
    candidate it also reports how often a sample's score moved beyond its resolution ``d_i``.

    hydra-toolchain export recipes/minilm-tweets.yaml        # or let this script run the stages
    python benchmarks/rank_gate/run.py                         # writes results.json and results.md here
    python benchmarks/rank_gate/run.py --engines onnxrt-cpu,openvino-cpu
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")
HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT / "benchmarks" / "parity_tolerances"))

import synthetic  # noqa: E402

from toolchain.parity import DEFAULT_UQ_TOLERANCES, uq_parity  # noqa: E402
from toolchain.parity.flips import FLIP_METRICS  # noqa: E402
from toolchain.parity.resolution import is_rank_metric, rank_resolutions, score_resolution  # noqa: E402
from toolchain.parity.tolerances import within_limit  # noqa: E402

STATUSES = ("pass", "fail", "unresolved")
SIZES = ((200, 200), (1000, 500), (3000, 1000))
SPREADS = (1.0, 2.5, 5.0)
CORRECT = (("rounding only", 0.0), ("1 u upstream", 1.0), ("2 u upstream", 2.0))
BROKEN = (("bias", 0.05), ("bias", 0.2), ("swap", 0.01), ("swap", 0.05), ("noise", 3.0), ("noise", 10.0))


# ------------------------------------------------------------------------------------------ rules


_FORMER: dict[tuple[int, str], tuple[Any, dict[str, float]]] = {}


def former_bounds(ref_id: list, labels: np.ndarray, ref_ood: list, precision: str) -> dict[str, float]:
    """The former worst-case bound of every rank metric (toolchain/parity/resolution.py before the
    calibrated rule): each reference score pushed by its resolution ``d_i`` against and for the
    detector, the larger distance from the reference's value (scikit-learn metrics, as it was)."""
    from toolchain.metrics import disagreement, entropy_score, failure_auroc, msp_score, mutual_information
    from toolchain.metrics.ood import ood_metrics
    from toolchain.parity.uq import UQOutputs, gather_uq_inputs

    key = (id(ref_id[0]["probs"]), precision)
    if key in _FORMER:
        return _FORMER[key][1]
    probs, members = gather_uq_inputs(ref_id, UQOutputs(), "reference")
    probs_ood, members_ood = gather_uq_inputs(ref_ood, UQOutputs(), "reference") if ref_ood else (None, None)
    out: dict[str, float] = {}
    wrong = probs.argmax(axis=1) != labels
    if wrong.any() and not wrong.all():
        s, d = msp_score(probs), score_resolution(msp_score, probs, precision)
        ref = failure_auroc(probs, labels, score=s)
        out["failure_auroc"] = max(abs(failure_auroc(probs, labels, score=s + k * d * np.where(wrong, 1.0, -1.0))
                                       - ref) for k in (1.0, -1.0))
    sources = ([("msp", msp_score, "probs", probs, probs_ood), ("entropy", entropy_score, "probs", probs, probs_ood)]
               if probs_ood is not None else [])  # a recipe without OOD rows has failure AUROC only
    if members is not None and members_ood is not None:
        sources += [("mi", mutual_information, "logits", members, members_ood),
                    ("disagreement", disagreement, "logits", members, members_ood)]
    for name, score, inputs, x_id, x_ood in sources:
        s_id, s_ood = score(x_id), score(x_ood)
        d_id = score_resolution(score, x_id, precision, inputs)
        d_ood = score_resolution(score, x_ood, precision, inputs)
        ref = ood_metrics(s_id, s_ood)
        worse, better = ood_metrics(s_id + d_id, s_ood - d_ood), ood_metrics(s_id - d_id, s_ood + d_ood)
        out.update({f"{m}_{name}": max(abs(worse[m] - ref[m]), abs(better[m] - ref[m])) for m in ref})
    _FORMER[key] = (ref_id[0]["probs"], out)  # the array is kept so that its id is not reused
    return out


def former_status(check: Any, worst_case: float) -> str:
    """The former rule on the same check: a worst case within the tolerance lets the tolerance
    decide; otherwise a change beyond the worst case fails, and one within it is not resolvable."""
    if math.isnan(check.delta):
        return check.status
    if worst_case <= check.limit:
        return "pass" if within_limit(check.delta, check.limit, check.reference, check.candidate) else "fail"
    return "unresolved" if within_limit(check.delta, worst_case, check.reference, check.candidate) else "fail"


def judge(ref_id: list, cand_id: list, labels: np.ndarray, ref_ood: list, cand_ood: list,
          precision: str) -> dict[str, Any]:
    """The rank checks of one candidate under both rules: per metric status, delta, limit, bounds."""
    _, checks = uq_parity(ref_id, cand_id, labels, ref_ood, cand_ood, DEFAULT_UQ_TOLERANCES, precision=precision)
    former = former_bounds(ref_id, labels, ref_ood, precision)
    out = {}
    for c in checks:
        if c.metric in FLIP_METRICS:  # judged by flips (toolchain/parity/flips.py); old: the plain tolerance
            old = "pass" if within_limit(c.delta, c.limit, c.reference, c.candidate) else "fail"
            out[c.metric] = {"new": c.status, "old": old, "delta": c.delta, "limit": c.limit, "bound": None,
                             "worst_case": None, "former_worst_case": None, "flat": None,
                             "flippable": None if c.flips is None else c.flips.flippable,
                             "clear_flips": None if c.flips is None else c.flips.clear_flips}
            continue
        if not is_rank_metric(c.metric):
            continue
        res = c.resolution
        out[c.metric] = {"new": c.status, "old": former_status(c, former[c.metric]), "delta": c.delta,
                         "limit": c.limit, "bound": None if res is None else res.bound,
                         "worst_case": None if res is None else res.worst_case, "former_worst_case": former[c.metric],
                         "flat": None if res is None else res.flat}
    return out


def tally(candidates: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """Check counts per status and the candidates with at least one failing rank check, both rules."""
    checks = {rule: Counter() for rule in ("new", "old")}
    flagged = Counter()
    n = 0
    for cand in candidates:
        n += 1
        for rule in ("new", "old"):
            statuses = [m[rule] for m in cand.values()]
            checks[rule].update(statuses)
            flagged[rule] += "fail" in statuses
    return {"candidates": n, **{f"{rule}_checks": {s: checks[rule][s] for s in STATUSES} for rule in checks},
            **{f"{rule}_flagged": flagged[rule] for rule in ("new", "old")}}


# -------------------------------------------------------------------------------- (a) synthetic


def synthetic_part(seeds: int, sizes: Sequence[tuple[int, int]], members: int = 3,
                   classes: int = 3) -> dict[str, Any]:
    """Every (size, spread, precision): ``seeds`` candidates per correct and broken variant."""
    rows = []
    for n_id, n_ood in sizes:
        for spread in SPREADS:
            ref, labels = synthetic.reference(n_id, n_ood, spread, members=members, classes=classes, seed=0)
            r_id, r_ood = ref.feeds()
            for precision in ("fp16", "bf16"):
                t0 = time.process_time()
                rank_resolutions(ref.probs_id, labels, ref.probs_ood, ref.logits_id, ref.logits_ood,
                                 precision)  # no limits: every score drawn (the cost of the bounds)
                seconds = time.process_time() - t0
                variants = [("correct", name, "upstream", e) for name, e in CORRECT]
                variants += [("broken", f"{fault} {size:g}", fault, size) for fault, size in BROKEN]
                for group, name, fault, size in variants:
                    results = []
                    for seed in range(seeds):
                        cand = (synthetic.correct(ref, precision, size, 1000 + seed) if group == "correct"
                                else synthetic.broken(ref, precision, fault, size, 1000 + seed))
                        c_id, c_ood = cand.feeds()
                        results.append(judge(r_id, c_id, labels, r_ood, c_ood, precision))
                    rows.append({"n_id": n_id, "n_ood": n_ood, "spread": spread, "precision": precision,
                                 "group": group, "variant": name, **tally(results),
                                 "bound_cpu_seconds": seconds, "candidates_detail": results})
                flagged = ", ".join(f"{r['variant']} {r['new_flagged']}/{r['candidates']}"
                                    for r in rows[-len(variants):])
                print(f"synthetic {n_id}+{n_ood} spread {spread} {precision}: bounds in {seconds:.2f} s cpu, "
                      f"flagged {flagged}", flush=True)
    return {"rows": rows, "bounds": _bound_summary(rows), "members": members, "classes": classes}


def _bound_summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per precision: calibrated bound / worst case / limit, median over the synthetic references."""
    out: dict[str, Any] = {}
    for precision in ("fp16", "bf16"):
        ratios = [(m["bound"] / m["limit"], m["former_worst_case"] / m["limit"]) for r in rows
                  if r["precision"] == precision and r["variant"] == CORRECT[0][0]
                  for m in r["candidates_detail"][0].values() if m["bound"] is not None]
        if ratios:
            a = np.asarray(ratios)
            out[precision] = {"bound_over_limit_median": float(np.median(a[:, 0])),
                              "bound_over_limit_max": float(a[:, 0].max()),
                              "worst_over_limit_median": float(np.median(a[:, 1])),
                              "worst_over_limit_max": float(a[:, 1].max())}
    return out


# ---------------------------------------------------------------------------------- (b) real graphs


def _concat(outputs: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    outputs = [o for o in outputs if o]  # a recipe without OOD rows has no OOD outputs
    return {k: np.concatenate([o[k] for o in outputs]) for k in outputs[0]} if outputs else {}


def _subset(outs: dict[str, np.ndarray], rows: np.ndarray) -> list[dict[str, np.ndarray]]:
    return [{k: v[rows] for k, v in outs.items()}] if outs else []


def _moved_beyond(ref: dict[str, np.ndarray], cand: dict[str, np.ndarray], precision: str) -> dict[str, Any]:
    """Per score, how far a real engine moved each sample's score, against the model behind the bound:
    the share of samples that moved beyond their d_i and beyond their reach_i (the larger of d_i and
    64 moves of the inputs within their resolution, as resolution.py draws them), and |move| / reach_i."""
    from toolchain.metrics import disagreement, entropy_score, msp_score, mutual_information
    from toolchain.parity.resolution import _moves, reach_eps

    scores = [("msp", msp_score, "probs", "probs"), ("entropy", entropy_score, "probs", "probs")]
    if "member_logits" in ref:
        scores += [("mi", mutual_information, "member_logits", "logits"),
                   ("disagreement", disagreement, "member_logits", "logits")]
    out = {}
    for name, score, key, inputs in scores:
        s = score(ref[key])
        d = score_resolution(score, ref[key], precision, inputs)
        eps = reach_eps(precision, inputs)
        reach = np.maximum(d, np.abs(_moves(score, ref[key], inputs, eps, np.random.default_rng(0))[0] - s).max(0))
        moved = np.abs(score(cand[key]) - s)
        ratio = np.where(reach > 0, moved / np.where(reach > 0, reach, 1.0), np.where(moved > 0, np.inf, 0.0))
        out[name] = {"beyond_d": float((moved > d).mean()), "beyond_reach": float((ratio > 1).mean()),
                     "max_ratio": float(ratio.max()), "q0.99_ratio": float(np.quantile(ratio, 0.99)),
                     "median_ratio": float(np.median(ratio))}
    return out


class RealCase:
    """A recipe's exported graphs, parity rows and PyTorch references (what the parity stage runs)."""

    def __init__(self, recipe: str, profile: str | None, threads: int, needs_build: bool,
                 deep_ensemble: bool = True, artifacts: Path | None = None) -> None:
        import torch

        from toolchain.artifacts import read_json
        from toolchain.pipeline import Context, run_pipeline
        from toolchain.recipe import load_recipe
        from toolchain.stages.common import load_stage_model
        from toolchain.stages.parity import parity_inputs

        torch.set_num_threads(threads)
        self.threads = threads
        loaded = load_recipe(recipe, profile=profile)
        if not deep_ensemble:  # the Hydra and single graphs do not depend on it (export's other inputs)
            loaded = loaded.model_copy(update={"baselines": loaded.baselines.model_copy(
                update={"deep_ensemble": False})})
        if artifacts is not None:  # another artifacts folder (e.g. a finished run's)
            loaded = loaded.model_copy(update={"artifacts_dir": str(Path(artifacts).resolve())})
        self.ctx = Context(loaded)
        run_pipeline(self.ctx, until="build" if needs_build else "export")  # cached stages are skipped
        self.export = self.ctx.stage_dir("export")
        self.graphs = read_json(self.export / "graphs.json")
        _m, self.base, tok = load_stage_model(self.ctx, self.ctx.stage_dir("finetune") / "model")
        self.names = list(self.graphs["single"]["inputs"])
        _generated, ident, ood = parity_inputs(self.ctx, self.names, tok)  # the UQ checks use ID and OOD rows
        self.id_feeds = [f for f, _ in ident]
        self.ood_feeds = ood
        self.labels = np.concatenate([y for _, y in ident])

    def run(self, runner: Any) -> tuple[list[dict[str, np.ndarray]], list[dict[str, np.ndarray]]]:
        """``(ID outputs, OOD outputs)``, batch by batch as the parity stage feeds them, float64."""
        with runner:
            outs = [{k: np.asarray(v, np.float64) for k, v in runner.infer(f).items()}
                    for f in [*self.id_feeds, *self.ood_feeds]]
        n = len(self.id_feeds)
        return outs[:n], outs[n:]

    def reference(self, group: str) -> tuple[list[dict[str, np.ndarray]], list[dict[str, np.ndarray]], list[str]]:
        from toolchain.engines import make_runner, reference_kind
        from toolchain.hydra.fuse import load_hydra
        from toolchain.models.wrappers import SingleModel
        from toolchain.stages.common import runner_input_specs

        module, outputs = ((load_hydra(self.ctx.stage_dir("fuse") / "hydra"), ["probs", "member_logits"])
                           if group == "hydra" else (SingleModel(self.base), ["logits", "probs"]))
        runner = make_runner(reference_kind(), module=module, input_specs=runner_input_specs(self.ctx, self.names),
                             output_names=outputs, name=f"torch-{group}")
        return (*self.run(runner), outputs)

    def candidates(self, group: str, kinds: Sequence[str], precisions: Sequence[str]) -> list[tuple[str, str, Any]]:
        """``(label, precision, runner)`` of the group's graphs on every kind, as the parity stage makes them."""
        from toolchain.engines import candidate_label, entries_for, resolve_kind, runner_for

        out = []
        for kind in kinds:
            for gname, entry in entries_for(kind, self.graphs, build_dir=self.ctx.stage_dir("build")).items():
                g = self.graphs.get(gname, {})
                in_group = (g.get("kind") == "hydra") == (group == "hydra") and g.get("kind") != "member"
                actual = resolve_kind(kind, entry["precision"])
                if not in_group or entry["precision"] not in precisions or actual is None:
                    continue
                label = candidate_label(actual, gname)
                out.append((label, entry["precision"], runner_for(
                    actual, entry, export_dir=self.export, build_dir=self.ctx.stage_dir("build"),
                    threads=self.threads, name=label)))
        return list({label: (label, p, r) for label, p, r in out}.values())

    def wrong_runner(self, kind: str, model: Any, precision: str, work: Path, outputs: list[str]) -> Any:
        """A runner of ``kind`` (or its substitute) for a wrong FP32 graph converted to ``precision``."""
        import onnx

        from toolchain.engines import engine_kind, resolve_kind, runner_for
        from toolchain.export import convert_precision

        actual = resolve_kind(kind, precision)
        if actual is None:
            raise RuntimeError(f"{kind} does not run {precision} graphs")
        spec = engine_kind(actual)
        path = work / f"wrong.{precision}.onnx"
        converted = precision != "fp32" and not spec.compiles  # a compiling kind takes the FP32 graph at a precision
        onnx.save(convert_precision(model, precision).model if converted else model, str(path))
        entry = {"path": path.name, "precision": precision, "kind": "single", "inputs": self.names,
                 "outputs": outputs}
        if spec.needs_build:  # a kind that compiles the graph first (its builder's documented signature)
            built = spec.builder(path, work / f"wrong.{precision}{spec.suffix}", precision=precision, profile=None,
                                 timing_cache=None)
            entry = {**entry, "engine": Path(built).name, "onnx": path.name}
        return runner_for(actual, entry, export_dir=work, build_dir=work, threads=self.threads,
                          name=f"{actual}:wrong")


def real_part(args: argparse.Namespace) -> dict[str, Any]:
    import onnx
    from calibrate import matmul_weights, perturb_initializer, scale_initializer
    from eval_size import _per_output

    from toolchain.engines import engine_kind
    from toolchain.models.wrappers import SingleModel
    from toolchain.parity.weights import weight_parity

    kinds = [k.strip() for k in args.engines.split(",") if k.strip()]
    precisions = [p.strip() for p in args.precisions.split(",") if p.strip()]
    t0 = time.time()
    case = RealCase(args.recipe, args.profile, args.threads, any(engine_kind(k).needs_build for k in kinds),
                    deep_ensemble=not args.no_deep_ensemble, artifacts=args.artifacts)
    out: dict[str, Any] = {"recipe": case.ctx.recipe.name, "profile": args.profile, "engines": kinds,
                           "deep_ensemble": not args.no_deep_ensemble,
                           "rows": {"id": len(case.labels), "ood": int(sum(len(next(iter(f.values())))
                                                                                 for f in case.ood_feeds))},
                           "correct": {}, "subsets": {}, "wrong": {}, "seconds": {}}
    refs = {}
    rng = np.random.default_rng(0)
    n_id, n_ood = out["rows"]["id"], out["rows"]["ood"]
    subsets = [(np.sort(rng.choice(n_id, int(0.8 * n_id), replace=False)),
                np.sort(rng.choice(n_ood, int(0.8 * n_ood), replace=False))) for _ in range(args.subsets)]
    for group in ("hydra", "single"):
        t = time.time()
        ref_id, ref_ood, outputs = case.reference(group)
        refs[group] = (ref_id, ref_ood, outputs)
        out["seconds"][f"reference {group}"] = time.time() - t
        for label, precision, runner in case.candidates(group, kinds, precisions):
            t = time.time()
            c_id, c_ood = case.run(runner)
            out["seconds"][label] = time.time() - t
            t = time.process_time()
            verdict = judge(ref_id, c_id, case.labels, ref_ood, c_ood, precision)
            judged = time.process_time() - t
            r_all, c_all = _concat(ref_id), _concat(c_id)
            r_ood_all, c_ood_all = _concat(ref_ood), _concat(c_ood)
            out["correct"][label] = {"group": group, "precision": precision, "checks": verdict,
                                     "judge_cpu_seconds": judged, "moved_beyond_resolution": _moved_beyond(
                                         _concat([r_all, r_ood_all]), _concat([c_all, c_ood_all]), precision)}
            out["subsets"][label] = [judge(_subset(r_all, i), _subset(c_all, i), case.labels[i],
                                           _subset(r_ood_all, o), _subset(c_ood_all, o), precision)
                                     for i, o in subsets]
            print(f"real {label}: {Counter(v['new'] for v in verdict.values())} (former rule "
                  f"{Counter(v['old'] for v in verdict.values())}), subsets "
                  f"{tally(out['subsets'][label])['new_flagged']}/{len(subsets)} flagged", flush=True)
    fp32 = onnx.load(str(case.export / case.graphs["single"]["path"]))
    weights = matmul_weights(fp32)
    picked = [weights[i] for i in np.linspace(0, len(weights) - 1, min(args.wrong_weights, len(weights))).round()
              .astype(int)] if args.wrong_weights else []
    ref_id, ref_ood, outputs = refs["single"]
    n_id_feeds = len(case.id_feeds)
    with tempfile.TemporaryDirectory() as tmp:
        for kind in kinds:
            for precision in precisions:
                for fault, make in (("scale1.05", lambda w: scale_initializer(fp32, w, 1.05)),
                                    ("noise5%", lambda w: perturb_initializer(fp32, w, 0.05))):
                    rows = []
                    for w in picked:
                        t = time.time()
                        try:
                            runner = case.wrong_runner(kind, make(w), precision, Path(tmp), outputs)
                        except Exception as exc:  # a kind that cannot build or run it: recorded, not counted
                            rows.append({"weight": w, "skipped": f"{type(exc).__name__}: {exc}"})
                            continue
                        c_id, c_ood = case.run(runner)
                        verdict = judge(ref_id, c_id, case.labels, ref_ood, c_ood, precision)
                        graph = Path(tmp) / f"wrong.{precision}.onnx"  # what wrong_runner wrote and ran
                        weights = weight_parity(graph, SingleModel(case.base), precision)
                        # the numeric rule on the same outputs and batches (eval_size's bookkeeping)
                        numeric = {name: _per_output([*ref_id, *ref_ood], [*c_id, *c_ood], name, precision, 0,
                                                     n_id_feeds)["passes_default_rule"] for name in outputs}
                        rows.append({"weight": w, "checks": verdict, "numeric_passes": numeric,
                                     "weights_caught": not weights.passed,
                                     "weights_failing": [m.initializer for m in weights.failures],
                                     "seconds": time.time() - t})
                    key = f"{kind} {precision} {fault}"
                    out["wrong"][key] = rows
                    done = [r for r in rows if "checks" in r]
                    print(f"wrong {key}: rank gate flags {tally(r['checks'] for r in done)['new_flagged']}/"
                          f"{len(done)} (former rule {tally(r['checks'] for r in done)['old_flagged']}), numeric "
                          f"rule {sum(not all(r['numeric_passes'].values()) for r in done)}/{len(done)}, weights "
                          f"{sum(r['weights_caught'] for r in done)}/{len(done)}", flush=True)
    out["seconds"]["total"] = time.time() - t0
    return out


# -------------------------------------------------------------------------------------- reporting


def _row(cells: Iterable[Any]) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


def _counts(t: dict[str, Any], rule: str) -> str:
    c = t[f"{rule}_checks"]
    return f"{c['pass']} / {c['fail']} / {c['unresolved']}"


def _rate(k: int, n: int) -> str:
    return f"{k}/{n} ({100.0 * k / n:.1f}%)" if n else "-"


def markdown(result: dict[str, Any], command: str) -> str:
    lines = ["# Rank-metric gate: calibrated bound vs worst case", "",
             f"Written by `{command}` ({result['seconds']:.0f} s). Rules (toolchain/parity/resolution.py): **new** "
             "= `|delta| <= max(limit, bound)` passes, `bound` the largest change of the metric over 1,000 "
             "seeded draws of every reference score within its reach (draws where it is undefined left out); "
             "not resolvable only on flat scores or when too few draws are defined. **old** = the former "
             "worst-case rule: when the worst case exceeds the tolerance, the check is not resolvable unless "
             "the change exceeds the worst case. Counts are pass / fail / not "
             "resolvable over rank checks and the flip-judged accuracy and ECE checks (toolchain/parity/flips.py; "
             "**old** for them: the plain tolerance); a candidate is *flagged* when at least one of them fails.",
             ""]
    syn = result.get("synthetic")
    if syn:
        sizes = sorted({(r["n_id"], r["n_ood"]) for r in syn["rows"]})
        lines += [f"## (a) Synthetic Hydra outputs ({syn.get('members', 3)} members, {syn.get('classes', 3)} "
                  "classes)", "",
                  f"Sizes {', '.join(f'{a}+{b}' for a, b in sizes)}"
                  f" ID+OOD rows x logit spreads {', '.join(f'{s:g}' for s in SPREADS)} x FP16/BF16, "
                  f"{syn['rows'][0]['candidates']} seeded candidates per variant and setting (benchmarks/rank_gate/"
                  "synthetic.py).", ""]
        for precision in ("fp16", "bf16"):
            lines += [f"### {precision.upper()}", "",
                      _row(["variant", "flagged, new rule", "flagged, old rule", "checks new (pass/fail/n.r.)",
                            "checks old (pass/fail/n.r.)"]), _row(["---"] * 5)]
            for group, name in [("correct", n) for n, _ in CORRECT] + [("broken", f"{f} {s:g}") for f, s in BROKEN]:
                sel = [r for r in syn["rows"] if r["precision"] == precision and r["variant"] == name]
                t = tally(c for r in sel for c in r["candidates_detail"])
                label = f"{group}: {name}"
                lines.append(_row([label, _rate(t["new_flagged"], t["candidates"]),
                                   _rate(t["old_flagged"], t["candidates"]), _counts(t, "new"), _counts(t, "old")]))
            lines.append("")
        for precision in ("fp16", "bf16"):
            sel = [r for r in syn["rows"] if r["precision"] == precision]
            correct = tally(c for r in sel if r["group"] == "correct" for c in r["candidates_detail"])
            broken = tally(c for r in sel if r["group"] == "broken" for c in r["candidates_detail"])
            n_checks = sum(correct["new_checks"].values())
            lines.append(f"- {precision.upper()}: false alarms (correct candidates flagged) "
                         f"{_rate(correct['new_flagged'], correct['candidates'])} new vs "
                         f"{_rate(correct['old_flagged'], correct['candidates'])} old; per check "
                         f"{_rate(correct['new_checks']['fail'], n_checks)} new; catches (broken flagged) "
                         f"{_rate(broken['new_flagged'], broken['candidates'])} new vs "
                         f"{_rate(broken['old_flagged'], broken['candidates'])} old; not resolvable "
                         f"{correct['new_checks']['unresolved'] + broken['new_checks']['unresolved']} new vs "
                         f"{correct['old_checks']['unresolved'] + broken['old_checks']['unresolved']} old checks.")
        for precision, b in syn["bounds"].items():
            secs = [r["bound_cpu_seconds"] for r in syn["rows"] if r["precision"] == precision
                    and r["variant"] == CORRECT[0][0]]
            lines.append(f"- {precision.upper()} bounds: calibrated / tolerance median "
                         f"{b['bound_over_limit_median']:.2f} (max {b['bound_over_limit_max']:.2f}); "
                         "worst case / tolerance median "
                         f"{b['worst_over_limit_median']:.2f} (max {b['worst_over_limit_max']:.2f}); all 13 bounds "
                         f"of a reference in {min(secs):.2f}-{max(secs):.2f} s CPU (draws made for every score).")
        lines.append("")
    real = result.get("real")
    if real:
        lines += [f"## (b) Real graphs: recipe `{real['recipe']}`" + (f" (profile {real['profile']})"
                                                                     if real["profile"] else ""), "",
                  f"{real['rows']['id']} ID + {real['rows']['ood']} OOD rows, engines `{', '.join(real['engines'])}`; "
                  "PyTorch reference vs each graph, as the parity stage runs them.", "",
                  _row(["candidate", "checks new (pass/fail/n.r.)", "checks old (pass/fail/n.r.)", "checks with "
                        "bound > limit", "largest \\|delta\\| / limit", "largest \\|delta\\| / bound",
                        f"{len(next(iter(real['subsets'].values()), []))} 80% subsets: flagged new / old, n.r. "
                        "checks new / old", "judge s (CPU)"]), _row(["---"] * 8)]
        for label, c in real["correct"].items():
            t = tally([c["checks"]])
            s = tally(real["subsets"][label])
            ok = [m for m in c["checks"].values() if not math.isnan(m["delta"]) and m["bound"] is not None]
            over = sum(m["bound"] > m["limit"] for m in ok)
            by_limit = max(abs(m["delta"]) / m["limit"] for m in ok)
            by_bound = max((abs(m["delta"]) / m["bound"] for m in ok if m["bound"] > 0), default=0.0)
            lines.append(_row([f"`{label}`", _counts(t, "new"), _counts(t, "old"), over, f"{by_limit:.2f}",
                               f"{by_bound:.2f}", f"{s['new_flagged']} / {s['old_flagged']}, "
                               f"{s['new_checks']['unresolved']} / {s['old_checks']['unresolved']}",
                               f"{c['judge_cpu_seconds']:.2f}"]))
        lines += ["", "Per sample, real correct engines against the model behind the bound: share of samples "
                  "whose score moved beyond d_i (K ulps of the inputs, alternating signs) / beyond reach_i (the "
                  "larger of d_i and the 64 rounded moves the draws pick from); |move| / reach_i, q0.99 and max. "
                  "The draws are independent per sample, so the bound can hold with some samples beyond their "
                  "reach; the column `largest |delta| / bound` above is the test at the metric level.", ""]
        for label, c in real["correct"].items():
            lines.append(f"- `{label}`: " + "; ".join(
                f"{k} {100 * v['beyond_d']:.1f}% / {100 * v['beyond_reach']:.1f}% (q0.99 {v['q0.99_ratio']:.2f}, "
                f"max {v['max_ratio']:.3g})" for k, v in c["moved_beyond_resolution"].items()))
        if real["wrong"]:
            lines += ["", "Wrong graphs (the single model's FP32 graph, one MatMul weight perturbed, converted):", "",
                      _row(["engine, precision, fault", "flagged by the rank gate, new", "old",
                            "failed by the numeric rule", "either gate, new", "failed by weight parity",
                            "largest \\|delta\\| / max(limit, bound), median (max)"]), _row(["---"] * 7)]
            for key, rows in real["wrong"].items():
                done = [r for r in rows if "checks" in r]
                t = tally(r["checks"] for r in done)
                numeric = sum(not all(r["numeric_passes"].values()) for r in done)
                either = sum(("fail" in [m["new"] for m in r["checks"].values()])
                             or not all(r["numeric_passes"].values()) for r in done)
                skipped = len(rows) - len(done)
                ratios = [max(abs(m["delta"]) / max(m["limit"], m["bound"]) for m in r["checks"].values()
                              if not math.isnan(m["delta"]) and m["bound"] is not None) for r in done]
                caught = sum(r.get("weights_caught", False) for r in done)
                lines.append(_row([key + (f" ({skipped} skipped)" if skipped else ""),
                                   _rate(t["new_flagged"], len(done)), _rate(t["old_flagged"], len(done)),
                                   _rate(numeric, len(done)), _rate(either, len(done)), _rate(caught, len(done)),
                                   f"{np.median(ratios):.2f} ({max(ratios):.2f})" if ratios else "-"]))
        lines += ["", "Seconds: " + ", ".join(f"{k} {v:.0f}" for k, v in real["seconds"].items())]
    return "\n".join(lines) + "\n"


def _per_metric(candidates: list[dict[str, Any]]) -> dict[str, Any]:
    """Per rank metric over candidates: its bounds (one reference), the largest |delta| and status counts."""
    out = {}
    for metric in candidates[0]:
        rows = [c[metric] for c in candidates]
        first = rows[0]
        out[metric] = {"limit": first["limit"], "bound": first["bound"], "worst_case": first["worst_case"],
                       "former_worst_case": first["former_worst_case"],
                       "max_abs_delta": max((abs(r["delta"]) for r in rows if not math.isnan(r["delta"])),
                                            default=math.nan),
                       **{rule: dict(Counter(r[rule] for r in rows)) for rule in ("new", "old")}}
    return out


def compact(result: dict[str, Any]) -> dict[str, Any]:
    """results.json: every count and bound; synthetic candidates as counts (per metric for one variant per
    reference, with its bounds), real subsets as counts and per metric."""
    out = json.loads(json.dumps(result, default=float))
    for row in out.get("synthetic", {}).get("rows", []):  # per metric: the bounds, once per reference
        detail = row.pop("candidates_detail")
        if row["variant"] == CORRECT[0][0]:
            row["per_metric"] = _per_metric(detail)
    real = out.get("real")
    if real:
        real["subsets"] = {label: {**tally(runs), "per_metric": _per_metric(runs)}
                           for label, runs in real["subsets"].items()}
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--recipe", default=str(ROOT / "recipes" / "minilm-tweets.yaml"))
    p.add_argument("--profile", default=None)
    p.add_argument("--artifacts", type=Path, default=None, help="artifacts folder instead of the recipe's "
                   "artifacts_dir (its stages are run when missing or stale, cached ones are reused)")
    p.add_argument("--engines", default="onnxrt-cpu", help="registered kinds, comma-separated (BF16 graphs on "
                   "onnxrt-cpu run as onnxrt-cpu-bf16emu)")
    p.add_argument("--precisions", default="fp16,bf16")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seeds", type=int, default=10, help="synthetic candidates per variant and setting")
    p.add_argument("--sizes", type=int, default=len(SIZES), help=f"how many of the synthetic sizes {SIZES}")
    p.add_argument("--rows", default=None, help="synthetic sizes instead, e.g. 200+200,1000+500 (ID+OOD rows)")
    p.add_argument("--members", type=int, default=3, help="synthetic Hydra members M")
    p.add_argument("--classes", type=int, default=3, help="synthetic classes C")
    p.add_argument("--subsets", type=int, default=20, help="seeded 80%% row subsets per real candidate")
    p.add_argument("--wrong-weights", type=int, default=8, help="wrong graphs per fault, precision and engine")
    p.add_argument("--no-deep-ensemble", action="store_true", help="skip the recipe's deep-ensemble baseline "
                   "(M - 1 more fine-tunes; neither the Hydra nor the single graphs depend on it)")
    p.add_argument("--no-synthetic", action="store_true")
    p.add_argument("--no-real", action="store_true")
    p.add_argument("--out", type=Path, default=HERE, help="folder of results.json and results.md")
    args = p.parse_args(argv)
    t0 = time.time()
    result: dict[str, Any] = {}
    if not args.no_synthetic:
        sizes = (SIZES[:args.sizes] if args.rows is None else
                 [tuple(int(x) for x in r.split("+")) for r in args.rows.split(",") if r.strip()])
        result["synthetic"] = synthetic_part(args.seeds, sizes, args.members, args.classes)
    if not args.no_real:
        result["real"] = real_part(args)
    result["seconds"] = time.time() - t0
    command = "python benchmarks/rank_gate/run.py" + "".join(f" {a}" for a in (argv if argv is not None
                                                                               else sys.argv[1:]))
    result["command"] = command
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(compact(result), indent=1, default=float) + "\n")
    (args.out / "results.md").write_text(markdown(result, command))
    print(f"wrote {args.out / 'results.md'} in {result['seconds']:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
