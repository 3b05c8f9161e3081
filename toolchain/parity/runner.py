"""``run_parity``: every candidate engine against the reference, numerically and on UQ metrics.

Flow (the comparator knows only the :class:`~toolchain.engines.base.Runner` interface):

1. validate the inputs where they enter (feeds are dicts of numpy arrays, labels match the ID
   batches, tolerances are well formed): a problem raises :class:`~toolchain.errors.ToolchainError`
   (exit 2) naming the argument;
2. run the reference once on every feed (generated feeds at several shapes, the ID test
   batches, the OOD test batches); activated for that and deactivated after;
3. for each candidate in turn: activate, run the same feeds, deactivate (one engine in memory
   at a time); then the numeric checks (one per output, pooled over every feed) and the UQ
   checks (one per metric of :func:`toolchain.metrics.uq_report`);
   with ``graphs``, a ``weights`` check per engine whose ONNX graph is known
   (:mod:`toolchain.parity.weights`: every graph weight against the reference's parameter);
4. a :class:`~toolchain.parity.verdict.Verdict` with every check; written to ``out_dir`` as
   ``report.json``, ``junit.xml`` and ``summary.md`` (each atomically).

A candidate that cannot be loaded or run (missing engine file, a shape its profile rejects)
becomes one ``run`` check with status ``error`` (exit 2; 3 when an optional component such as
TensorRT is missing); the other candidates still run, so every problem is reported together.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from toolchain.engines.base import Runner
from toolchain.engines.registry import ran_lower
from toolchain.errors import ToolchainError
from toolchain.parity.numeric import compare_outputs, polygraphy_cross_check
from toolchain.parity.tolerances import (
    DEFAULT_UQ_TOLERANCES,
    PRECISIONS,
    MetricTolerance,
    Tolerance,
    ToleranceError,
    default_tolerances,
    first_nonfinite,
    parse_tolerances,
    parse_uq_tolerances,
)
from toolchain.parity.uq import UQOutputs, uq_parity
from toolchain.parity.verdict import Check, Verdict

__all__ = ["ParityData", "ReferenceOutputs", "check_candidate", "engine_tolerances", "run_parity", "run_reference",
           "weights_check"]

log = logging.getLogger(__name__)

Feed = Mapping[str, np.ndarray]
Outputs = dict[str, np.ndarray]
ToleranceArg = Mapping[str, Any] | None


def _feed_label(kind: str, index: int, feed: Feed) -> str:
    shapes = ", ".join(f"{k}={'x'.join(str(d) for d in np.shape(v))}" for k, v in feed.items())
    return f"{kind}[{index}] ({shapes})"


def _check_feed(what: str, feed: object) -> dict[str, np.ndarray]:
    if not isinstance(feed, Mapping) or not feed:
        raise ToolchainError(f"run_parity: {what} must be a non-empty dict of numpy arrays, got {type(feed).__name__}.")
    bad = [k for k, v in feed.items() if not isinstance(v, np.ndarray)]
    if bad:
        raise ToolchainError(f"run_parity: {what} inputs {bad} are not numpy arrays.")
    return dict(feed)


@dataclass(frozen=True)
class ParityData:
    """Validated inputs: feeds with labels for messages, ID labels concatenated."""

    generated: list[dict[str, np.ndarray]]
    id_feeds: list[dict[str, np.ndarray]]
    id_labels: np.ndarray
    ood_feeds: list[dict[str, np.ndarray]]

    @classmethod
    def build(
        cls,
        generated_feeds: Sequence[Feed],
        id_feeds: Sequence[tuple[Feed, np.ndarray]],
        ood_feeds: Sequence[Feed],
    ) -> ParityData:
        """Check the arguments of :func:`run_parity`; raise ToolchainError naming the bad one."""
        generated = [_check_feed(f"generated_feeds[{i}]", f) for i, f in enumerate(generated_feeds)]
        if not generated and not id_feeds:
            raise ToolchainError("run_parity: no feeds: pass generated_feeds and/or id_feeds.")
        shapes = {tuple(sorted((k, np.shape(v)) for k, v in f.items())) for f in generated}
        if len(generated) and len(shapes) < 2:
            log.warning("run_parity: every generated feed has the same shapes; pass several shapes (batch, "
                        "sequence) to catch engines specialised to one shape")
        ids, labels = [], []
        for i, item in enumerate(id_feeds):
            if not isinstance(item, tuple | list) or len(item) != 2:
                raise ToolchainError(f"run_parity: id_feeds[{i}] must be a (feed, labels) pair.")
            feed = _check_feed(f"id_feeds[{i}]", item[0])
            lab = np.asarray(item[1])
            if lab.ndim != 1 or not np.issubdtype(lab.dtype, np.integer):
                raise ToolchainError(f"run_parity: id_feeds[{i}] labels must be a 1-D integer array, "
                                     f"got {lab.dtype} {lab.shape}.")
            batch = {np.shape(v)[0] for v in feed.values() if np.ndim(v)}
            if batch != {len(lab)}:
                raise ToolchainError(f"run_parity: id_feeds[{i}] has {len(lab)} labels but its inputs have batch "
                                     f"size(s) {sorted(batch)}.")
            ids.append(feed)
            labels.append(lab.astype(np.int64))
        oods = [_check_feed(f"ood_feeds[{i}]", f) for i, f in enumerate(ood_feeds)]
        if oods and not ids:
            raise ToolchainError("run_parity: ood_feeds without id_feeds: OOD metrics need the ID test set.")
        return cls(generated, ids, np.concatenate(labels) if labels else np.zeros(0, np.int64), oods)

    def feeds(self) -> list[tuple[str, str, dict[str, np.ndarray]]]:
        """Every feed as ``(group, label, feed)`` in run order: generated, id, ood."""
        out = []
        for group, feeds in (("generated", self.generated), ("id", self.id_feeds), ("ood", self.ood_feeds)):
            out += [(group, _feed_label(group, i, f), f) for i, f in enumerate(feeds)]
        return out

    def summary(self) -> dict[str, Any]:
        """Counts and shapes for the report."""
        return {
            "generated": [{k: list(np.shape(v)) for k, v in f.items()} for f in self.generated],
            "id_samples": len(self.id_labels), "id_batches": len(self.id_feeds),
            "ood_samples": int(sum(next(iter(f.values())).shape[0] for f in self.ood_feeds)),
            "ood_batches": len(self.ood_feeds),
        }


@dataclass
class ReferenceOutputs:
    """The reference's outputs per feed group (computed once, reused for every candidate)."""

    generated: list[Outputs] = field(default_factory=list)
    id: list[Outputs] = field(default_factory=list)
    ood: list[Outputs] = field(default_factory=list)
    seconds: float = 0.0

    def all(self) -> list[Outputs]:
        """Every feed's outputs in :meth:`ParityData.feeds` order."""
        return self.generated + self.id + self.ood


def _infer_all(runner: Runner, data: ParityData) -> tuple[dict[str, list[Outputs]], float]:
    """Run ``runner`` on every feed; activate it only if the caller did not."""
    owned = not runner.is_active
    start = time.perf_counter()
    results: dict[str, list[Outputs]] = {"generated": [], "id": [], "ood": []}
    if owned:
        runner.activate()
    try:
        for group, _label, feed in data.feeds():
            results[group].append({k: np.asarray(v) for k, v in runner.infer(feed).items()})
    finally:
        if owned:
            runner.deactivate()
    return results, time.perf_counter() - start


def _error_check(engine: str, exc: ToolchainError, seconds: float = 0.0) -> Check:
    code = exc.exit_code if exc.exit_code in (2, 3) else 2
    return Check(engine, "run", "error", f"{type(exc).__name__}: {exc}", {"exception": type(exc).__name__},
                 seconds, code)


def weights_check(engine: str, graph: str | Path, module: Any, precision: str | None = None) -> Check:
    """The ``weights`` check of one engine: every weight of its ONNX graph against the reference module.

    ``fail`` names each differing initializer and the parameter it should hold; a graph that cannot
    be read or a missing module is an ``error`` (exit 2).
    """
    from toolchain.parity.weights import weight_parity

    start = time.perf_counter()
    if module is None:
        return Check(engine, "weights", "error", "weights not checked: no reference module (pass reference_module)",
                     {"graph": str(graph)}, 0.0, 2)
    try:
        report = weight_parity(graph, module, precision)
    except ToolchainError as exc:
        code = exc.exit_code if exc.exit_code in (2, 3) else 2
        return Check(engine, "weights", "error", f"{type(exc).__name__}: {exc}", {"graph": str(graph)}, 0.0, code)
    return Check(engine, "weights", "pass" if report.passed else "fail", report.message(), report.to_dict(),
                 time.perf_counter() - start)


def run_reference(reference: Runner, data: ParityData) -> tuple[ReferenceOutputs | None, list[Check]]:
    """The reference's outputs on every feed, or None and an ``error`` check saying why not."""
    try:
        results, seconds = _infer_all(reference, data)
    except ToolchainError as exc:
        return None, [_error_check("reference", exc)]
    ref = ReferenceOutputs(results["generated"], results["id"], results["ood"], seconds)
    labels = [label for _, label, _ in data.feeds()]
    for label, outputs in zip(labels, ref.all()):
        for name, value in outputs.items():
            bad = first_nonfinite(value)
            if bad is not None:
                msg = (f"the reference output '{name}' has {bad[1]!r} at feed {label} index {tuple(bad[0])}: "
                       "no candidate can be judged against it; fix the reference model or the inputs")
                return None, [Check("reference", "run", "error", msg, {"output": name, "feed": label,
                                                                      "index": list(bad[0])}, seconds, 2)]
    return ref, []


def check_candidate(
    engine: str,
    runner: Runner,
    data: ParityData,
    reference: ReferenceOutputs,
    tolerances: Mapping[str, Tolerance],
    uq_tolerances: Mapping[str, MetricTolerance],
    *,
    uq_outputs: UQOutputs | None = None,
    n_bins: int = 15,
    cross_check: bool = True,
    precision: str = "fp32",
) -> list[Check]:
    """Every check of one candidate: ``run``, ``numeric/<output>`` and ``uq/<metric>``.

    Args:
        engine: the candidate's name in reports.
        runner: the candidate (activated here unless already active; deactivated after).
        data: validated feeds.
        reference: the reference's outputs on ``data``.
        tolerances: per-output :class:`Tolerance` with a ``""`` default.
        uq_tolerances: per-metric :class:`MetricTolerance` with a ``""`` default.
        uq_outputs: output names for the UQ report.
        n_bins: ECE bins.
        cross_check: also run Polygraphy's comparator and record its verdict.
        precision: the candidate's precision: how far rounding can move each rank metric
            (:mod:`toolchain.parity.resolution`; a rank metric it cannot resolve is ``unresolved``).
    """
    try:
        results, seconds = _infer_all(runner, data)
    except ToolchainError as exc:
        return [_error_check(engine, exc)]
    labels = [label for _, label, _ in data.feeds()]
    cand_all = results["generated"] + results["id"] + results["ood"]
    log.info("parity: %s ran %d feeds in %.2f s", engine, len(labels), seconds)
    checks = [Check(engine, "run", "pass", f"ran {len(labels)} feeds",
                    {"feeds": len(labels), "outputs": sorted(cand_all[0]) if cand_all else []}, seconds)]

    start = time.perf_counter()
    comparisons = compare_outputs(reference.all(), cand_all, labels, tolerances)
    poly = polygraphy_cross_check(reference.all(), cand_all, tolerances, list(comparisons)) if cross_check else {}
    per_output = (time.perf_counter() - start) / max(1, len(comparisons))
    for name, comp in comparisons.items():
        if name in poly:
            comp.polygraphy = poly[name]
            if poly[name]["passed"] != comp.passed:
                comp.polygraphy["note"] = ("Polygraphy's verdict differs: its rule passes an element if either "
                                           "|c-r| <= atol or |c-r|/|r| <= rtol, takes each statistic per feed "
                                           "and has no max_limit or per-feed quantile")
        checks.append(Check(engine, f"numeric/{name}", "pass" if comp.passed else "fail", comp.message(),
                            comp.to_dict(), per_output))

    if data.id_feeds:
        start = time.perf_counter()
        try:
            _, metrics = uq_parity(reference.id, results["id"], data.id_labels, reference.ood, results["ood"],
                                   uq_tolerances, names=uq_outputs, n_bins=n_bins, precision=precision)
        except ToolchainError as exc:
            return [*checks, _error_check(engine, exc)]
        elapsed = (time.perf_counter() - start) / max(1, len(metrics))
        checks += [Check(engine, f"uq/{m.metric}", m.status, m.message(), m.to_dict(), elapsed)  # type: ignore[arg-type]
                   for m in metrics]
    return checks


def engine_tolerances(
    engines: Sequence[str], tolerances: ToleranceArg, precisions: Mapping[str, str] | None
) -> dict[str, dict[str, Tolerance]]:
    """Per engine, per-output tolerances: the precision's defaults, overridden by ``tolerances``.

    ``tolerances`` is either per output (``{"": Tolerance, "probs": ...}``, every value a
    Tolerance or a dict with atol/rtol): applied to every engine; or per engine
    (``{"trt-fp16": {"probs": ...}}``).
    """
    precisions = dict(precisions or {})
    unknown = set(precisions) - set(engines)
    if unknown:
        raise ToleranceError(f"precisions names unknown engine(s) {sorted(unknown)}; engines: {list(engines)}.")
    for engine, prec in precisions.items():
        if prec not in PRECISIONS:
            raise ToleranceError(f"precisions['{engine}'] must be one of {list(PRECISIONS)}, got {prec!r}.")
    raw = dict(tolerances or {})
    per_output = all(isinstance(v, Tolerance) or (isinstance(v, Mapping) and "atol" in v) for v in raw.values())
    out = {}
    for engine in engines:
        prec = precisions.get(engine, "fp32")
        if not raw:
            out[engine] = default_tolerances(prec)
        elif per_output:
            out[engine] = parse_tolerances(raw, prec)
        else:
            out[engine] = parse_tolerances(raw.get(engine, {}), prec)
    if raw and not per_output:
        extra = set(raw) - set(engines)
        if extra:
            raise ToleranceError(f"tolerances names unknown engine(s) {sorted(extra)}; engines: {list(engines)}.")
    return out


def _judged_precision(engine: str, runner: Runner, meta: dict[str, Any], tols: dict[str, dict[str, Tolerance]],
                      tolerances: ToleranceArg, precisions: Mapping[str, str] | None) -> str:
    """The precision ``engine`` is judged at: what the active engine says it really ran in, else the one asked for.

    A kind that reads its layers' precision back (OpenVINO) may report another precision than asked
    (a hint the CPU ignored or replaced): the engine is then judged, and labelled, at the precision
    it ran, with the tolerances of that precision, and ``meta["engines"]`` says what was asked. A
    lower precision than asked also fails (:func:`_lower_precision_check`).
    """
    info = runner.engine_info()
    asked = meta["precisions"][engine]
    ran = info.get("ran_precision") or asked
    if info:
        meta.setdefault("engines", {})[engine] = {**info, "precision_asked": asked}
    if ran != asked:
        log.warning("parity: %s was asked for %s and ran %s; judged at %s", engine, asked, ran, ran)
        meta["precisions"][engine] = ran
        tols[engine] = engine_tolerances(list(tols), tolerances, {**dict(precisions or {}), engine: ran})[engine]
        meta["tolerances"][engine] = {k: t.to_dict() for k, t in sorted(tols[engine].items())}
    return ran


def _lower_precision_check(engine: str, asked: str, ran: str) -> Check:
    """A failed ``run/precision`` check: the engine ran a lower precision than asked (fewer mantissa bits).

    Its numbers are still judged at the precision it ran; the gate fails because the engine is not
    what was asked for (an FP32 engine that ran BF16 would pass BF16's wider tolerances).
    """
    return Check(engine, "run/precision", "fail",
                 f"asked for {asked}, the engine ran {ran} (read back from it): a lower precision than asked fails; "
                 f"rebuild it where {asked} is honoured, or ask for {ran}",
                 {"precision_asked": asked, "ran_precision": ran})


def run_parity(
    reference: Runner,
    candidates: Mapping[str, Runner],
    generated_feeds: Sequence[Feed],
    id_feeds: Sequence[tuple[Feed, np.ndarray]],
    ood_feeds: Sequence[Feed],
    tolerances: ToleranceArg = None,
    uq_tolerances: Mapping[str, MetricTolerance | Mapping[str, float] | float] | None = None,
    out_dir: Path | None = None,
    *,
    precisions: Mapping[str, str] | None = None,
    uq_outputs: UQOutputs | None = None,
    n_bins: int = 15,
    cross_check: bool = True,
    reference_name: str | None = None,
    graphs: Mapping[str, str | Path | None] | None = None,
    reference_module: Any = None,
) -> Verdict:
    """Run every candidate against the reference; return (and write) the verdict.

    Args:
        reference: the FP32 truth (e.g. ``make_runner("torch", module=...)``).
        candidates: engine name -> runner (ONNX Runtime, TensorRT, ...), checked in order.
        generated_feeds: feeds at several shapes (e.g. batch 1 and 3, two sequence lengths).
        id_feeds: ``(feed, labels [B])`` batches of the ID test set.
        ood_feeds: feeds of the OOD test set (may be empty: no OOD metrics).
        tolerances: per-output (``{"": Tolerance(...), "probs": ...}``) or per-engine
            (``{"trt-fp16": {...}}``) overrides of the precision defaults; None = defaults.
        uq_tolerances: per-metric overrides of :data:`~toolchain.parity.tolerances.DEFAULT_UQ_TOLERANCES`.
        out_dir: where ``report.json``, ``junit.xml`` and ``summary.md`` go (None: not written).
        precisions: engine -> ``fp32`` | ``fp16`` | ``bf16`` (selects default tolerances; default fp32).
        uq_outputs: which outputs hold probs / logits / member logits.
        n_bins: ECE bins.
        cross_check: record Polygraphy's comparator verdict next to ours.
        reference_name: the reference's name in reports (default: the runner's name).
        graphs: engine -> the ONNX graph it runs (an engine file: the graph it was built from), or
            None when unknown; with it every engine also gets a ``weights`` check
            (:func:`~toolchain.parity.weights.weight_parity`: each graph weight against the reference
            parameter it came from) and ``meta["weights"]`` says which engines had no graph. None:
            no weight checks.
        reference_module: the torch module the weights are compared with (default: the reference
            runner's ``module``).

    Returns:
        The :class:`Verdict`; ``verdict.exit_code`` is 0/1/2/3 and ``verdict.raise_for_status()``
        raises the matching error.

    Raises:
        ToolchainError: bad arguments (no feeds, labels that do not match, bad tolerances).
    """
    if not candidates:
        raise ToolchainError("run_parity: no candidate engines to check.")
    engines = list(candidates)
    tols = engine_tolerances(engines, tolerances, precisions)
    uq_tols = parse_uq_tolerances(uq_tolerances)
    data = ParityData.build(generated_feeds, id_feeds, ood_feeds)
    ref_name = reference_name or reference.name
    meta: dict[str, Any] = {
        "precisions": {e: (precisions or {}).get(e, "fp32") for e in engines},
        "tolerances": {e: {k: t.to_dict() for k, t in sorted(v.items())} for e, v in tols.items()},
        "uq_tolerances": {k: t.to_dict() for k, t in sorted(uq_tols.items())},
        "data": data.summary(), "n_bins": n_bins,
        "rule": ("|c - r| <= atol + rtol*|r| on the named statistic of every element, "
                 "[max of every element <= max_limit], [feed_quantile of every feed <= 1]"),
    }
    log.info("parity: reference '%s' on %d feeds", ref_name, len(data.feeds()))
    ref, problems = run_reference(reference, data)
    checks: list[Check] = list(problems)
    if ref is not None:
        log.info("parity: reference '%s' ran in %.2f s", ref_name, ref.seconds)  # timings: log only
        for engine, runner in candidates.items():
            owned = not runner.is_active
            try:
                if owned:
                    runner.activate()
            except ToolchainError as exc:
                checks.append(_error_check(engine, exc))
                continue
            try:
                asked = meta["precisions"][engine]
                precision = _judged_precision(engine, runner, meta, tols, tolerances, precisions)
                log.info("parity: checking '%s' (%s)", engine, precision)
                engine_uq = uq_tols
                if precision == "int8":  # INT8's own UQ defaults, the caller's real overrides over them
                    engine_uq = parse_uq_tolerances({k: v for k, v in uq_tols.items()
                                                     if DEFAULT_UQ_TOLERANCES.get(k) != v}, "int8")
                    meta.setdefault("uq_tolerances_by_engine", {})[engine] = {
                        k: t.to_dict() for k, t in sorted(engine_uq.items())}
                found = check_candidate(engine, runner, data, ref, tols[engine], engine_uq, uq_outputs=uq_outputs,
                                        n_bins=n_bins, cross_check=cross_check, precision=precision)
            finally:
                if owned:
                    runner.deactivate()
            if ran_lower(asked, precision):
                found.append(_lower_precision_check(engine, asked, precision))
            for check in found:
                if check.status != "pass":
                    log.warning("parity %s %s: %s", check.engine, check.name, check.message)
            checks += found
    if graphs is not None:
        module = reference_module if reference_module is not None else getattr(reference, "module", None)
        meta["weights"] = {}
        by_graph: dict[Path, Check] = {}  # engines built from one graph (ORT, OpenVINO FP32/BF16): checked once
        for engine in engines:
            graph = graphs.get(engine)
            if graph is None:
                meta["weights"][engine] = "not checked: no graph"
                continue
            meta["weights"][engine] = str(graph)
            key = Path(graph).resolve()
            if key not in by_graph:
                by_graph[key] = weights_check(engine, graph, module)  # judged at the graph's own precision
            checks.append(dataclasses.replace(by_graph[key], engine=engine))
            if checks[-1].status != "pass":
                log.warning("parity %s weights: %s", engine, checks[-1].message)
    verdict = Verdict(reference=ref_name, engines=engines, checks=checks, meta=meta)
    if out_dir is not None:
        written = verdict.write(Path(out_dir))
        log.info("parity: %s; reports in %s", verdict.headline(), ", ".join(str(p) for p in written.values()))
    return verdict
