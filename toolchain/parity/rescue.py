"""Precision rescue: the smallest set of nodes to keep in FP32 so an FP16/BF16 graph passes parity.

When a low-precision variant fails numeric or UQ parity, :func:`rescue_precision` searches over
the nodes that the precision pass put in low precision (``PrecisionResult.low_nodes``, in the
graph's topological order) for a small set ``S`` such that
``convert_precision(src, target, keep_fp32_nodes=S)`` passes every parity check. Each
evaluation re-creates the variant from the FP32 source, runs it on the same feeds and compares
it with the reference outputs (computed once).

Search (every decision is logged and returned in ``RescueResult.evaluations``):

1. the unrescued variant must fail (else nothing to do) and keeping every candidate node in FP32
   must pass (else the problem is not precision: :class:`~toolchain.errors.CheckFailed`);
2. prefix bisection: the shortest prefix ``nodes[:k]`` (topological order) that passes, in
   ``log2(n)`` evaluations. Errors start somewhere and propagate downstream, so a prefix that
   covers the culprits suffices;
3. shrink with delta debugging (ddmin) over node groups of that prefix: split it into ``g``
   groups; keep only one group if that passes, else drop one group if the rest passes, else
   double ``g``; stop when no single node can be dropped (a 1-minimal set: removing any one node
   fails parity).

The search assumes that keeping more nodes in FP32 never hurts (true in practice, not a
theorem); each step only accepts sets that were run and passed, so the result always passes.
The default evaluator is :class:`~toolchain.parity.reference_engine.ReferenceEvaluatorRunner`
(true FP16/BF16 arithmetic; ONNX Runtime's CPU provider computes FP16 chains in FP32 and would
hide overflows). Pass ``runner_factory`` to search with another engine (e.g. TensorRT on a GPU).
"""

from __future__ import annotations

import logging
import math
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import onnx

from toolchain.artifacts import atomic_write_json
from toolchain.engines.base import Runner
from toolchain.errors import CheckFailed, ToolchainError
from toolchain.export import convert_precision, load_checked, write_precision_variant
from toolchain.parity.reference_engine import ReferenceEvaluatorRunner
from toolchain.parity.runner import ParityData, check_candidate, engine_tolerances, run_reference
from toolchain.parity.tolerances import MetricTolerance, parse_uq_tolerances
from toolchain.parity.uq import UQOutputs
from toolchain.parity.verdict import Check

__all__ = ["RescueResult", "rescue_int8", "rescue_precision"]

log = logging.getLogger(__name__)

Feed = Mapping[str, np.ndarray]
RunnerFactory = Callable[[Path], Runner]


_OK = ("pass", "unresolved")  # an unresolvable rank metric is no failure to rescue


@dataclass
class RescueResult:
    """What the rescue found and wrote."""

    target: str
    kept_fp32_nodes: tuple[str, ...]
    path: Path | None
    candidates: int
    initial_failures: list[Check]
    final_checks: list[Check]
    evaluations: list[dict[str, Any]] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def passed(self) -> bool:
        """True when the written variant passed every check."""
        return bool(self.final_checks) and all(c.status in _OK for c in self.final_checks)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready summary (the search log included)."""
        return {
            "target": self.target, "kept_fp32_nodes": list(self.kept_fp32_nodes), "path": str(self.path),
            "candidates": self.candidates, "passed": self.passed, "seconds": self.seconds,
            "initial_failures": [f"{c.name}: {c.message}" for c in self.initial_failures],
            "evaluations": self.evaluations,
        }


class _Search:
    """Memoised evaluation of keep-sets, with a budget."""

    def __init__(self, evaluate: Callable[[tuple[str, ...]], list[Check]], order: Sequence[str], budget: int) -> None:
        self.evaluate = evaluate
        self.rank = {name: i for i, name in enumerate(order)}
        self.budget = budget
        self.cache: dict[frozenset[str], bool] = {}
        self.log: list[dict[str, Any]] = []
        self.last_checks: dict[frozenset[str], list[Check]] = {}

    def passes(self, nodes: Iterable[str], stage: str) -> bool:
        keep = frozenset(nodes)
        if keep in self.cache:
            return self.cache[keep]
        if len(self.cache) >= self.budget:
            raise _BudgetSpent
        ordered = tuple(sorted(keep, key=self.rank.__getitem__))
        checks = self.evaluate(ordered)
        ok = all(c.status in _OK for c in checks)
        failed = [c.name for c in checks if c.status not in _OK]
        self.cache[keep] = ok
        self.last_checks[keep] = checks
        self.log.append({"stage": stage, "kept": len(keep), "passed": ok, "failed_checks": failed[:10],
                         "nodes": list(ordered) if len(ordered) <= 16 else f"{len(ordered)} nodes"})
        log.info("rescue %s: %d nodes FP32 -> %s%s", stage, len(keep), "pass" if ok else "fail",
                 "" if ok else f" ({', '.join(failed[:4])})")
        return ok


class _BudgetSpent(Exception):
    """The evaluation budget is spent; keep the best passing set found so far."""


def _split(items: list[str], groups: int) -> list[list[str]]:
    size, extra = divmod(len(items), groups)
    out, start = [], 0
    for i in range(groups):
        stop = start + size + (1 if i < extra else 0)
        if stop > start:
            out.append(items[start:stop])
        start = stop
    return out


def _prefix(search: _Search, nodes: list[str]) -> list[str]:
    """Shortest passing prefix by bisection (``nodes`` itself passes, the empty set fails)."""
    lo, hi = 0, len(nodes)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if search.passes(nodes[:mid], "prefix"):
            hi = mid
        else:
            lo = mid
    return nodes[:hi]


def _ddmin(search: _Search, keep: list[str]) -> list[str]:
    """Delta debugging: shrink ``keep`` (which passes) to a 1-minimal passing set."""
    groups = 2
    while len(keep) >= 2:
        chunks = _split(keep, min(groups, len(keep)))
        reduced = False
        for chunk in chunks:
            if len(chunk) < len(keep) and search.passes(chunk, f"shrink g={len(chunks)} keep-group"):
                keep, groups, reduced = chunk, 2, True
                break
        if not reduced:
            for chunk in chunks:
                rest = [n for n in keep if n not in chunk]
                if rest and search.passes(rest, f"shrink g={len(chunks)} drop-group"):
                    keep, groups, reduced = rest, max(groups - 1, 2), True
                    break
        if not reduced:
            if groups >= len(keep):
                break
            groups = min(groups * 2, len(keep))
    return keep


def _search_keep(evaluate: Callable[[tuple[str, ...]], list[Check]], nodes: list[str], max_evaluations: int,
                 target: str, graph: str) -> tuple[list[str], list[Check], list[Check], _Search]:
    """The search of the module docstring over ``nodes``.

    Returns ``(kept nodes, the unrescued variant's failures, the kept set's checks, the search)``;
    CheckFailed when keeping every candidate does not pass either.
    """
    search = _Search(evaluate, nodes, max_evaluations)
    search.passes((), "initial")
    initial = [c for c in search.last_checks[frozenset()] if c.status not in _OK]
    if not initial:
        log.info("rescue: the %s variant already passes; nothing kept", target)
        return [], initial, search.last_checks[frozenset()], search
    if not search.passes(nodes, "all-float"):
        still = [f"{c.name}: {c.message}" for c in search.last_checks[frozenset(nodes)] if c.status not in _OK]
        raise CheckFailed(
            f"rescue: the {target} variant of {graph} fails parity even with all {len(nodes)} candidate nodes in "
            "float, so no float node set can fix it (a wrong weight or op?): " + "; ".join(still[:5]))
    keep = list(nodes)
    try:
        keep = _prefix(search, nodes)
        keep = _ddmin(search, keep)
    except _BudgetSpent:
        passing = [set(k) for k, ok in search.cache.items() if ok]
        keep = sorted(min(passing, key=len), key=search.rank.__getitem__)
        log.warning("rescue: evaluation budget (%d) spent; keeping the best passing set (%d nodes)",
                    max_evaluations, len(keep))
    return keep, initial, search.last_checks[frozenset(keep)], search


def rescue_int8(
    src: Path,
    dst: Path,
    qdq: Path | None,
    reference: Runner,
    generated_feeds: Sequence[Feed],
    id_feeds: Sequence[tuple[Feed, np.ndarray]] = (),
    ood_feeds: Sequence[Feed] = (),
    tolerances: Mapping[str, Any] | None = None,
    uq_tolerances: Mapping[str, MetricTolerance] | None = None,
    *,
    calibration: Sequence[Feed] = (),
    runner_factory: RunnerFactory | None = None,
    uq_outputs: UQOutputs | None = None,
    n_bins: int = 15,
    max_evaluations: int = 40,
    quantize: Mapping[str, Any] | None = None,
) -> RescueResult:
    """The UQ-aware float fallback of an INT8 graph.

    The smallest set of quantized matrix layers of the Q/DQ graph ``qdq`` to turn back to float so that
    it passes every parity check (numeric and UQ, at INT8's tolerances) against ``reference``, on the
    feeds given (the caller's validation rows: a recipe's fallback never sees its test split). ``src`` is
    its FP32 graph (the float weights); ``qdq`` None quantizes ``src`` first on ``calibration``
    (:func:`~toolchain.engines.onnxrt.quantize.quantize_int8`; ``quantize``: its keyword arguments).

    Each evaluated set is the failing graph itself with the set's layers reading float again
    (:func:`~toolchain.export.quantize.keep_float_layers`: no recalibration, every other scale as it is, so
    a broken scale stays broken until its layer is float, and the written graph is the evaluated one), run by
    ``runner_factory`` (default: the CPU kind every recipe has). The candidates are the layers that read an
    INT8 weight, searched in order of sensitivity (the numeric error left when each alone is float, on the
    first ID feeds) with the prefix bisection and delta debugging of :func:`rescue_precision`. The passing
    graph goes to ``dst`` with ``<stem>.precision.json`` and ``<stem>.rescue.json`` (the search).
    Raises CheckFailed when even every layer in float fails (not a quantization problem).
    """
    from toolchain.engines import default_engines, engine_kind, runner_for
    from toolchain.engines.onnxrt.quantize import quantize_int8
    from toolchain.export.graph import write_summary
    from toolchain.export.quantize import keep_float_layers, quantized_layers
    from toolchain.parity.numeric import compare_outputs

    started = time.perf_counter()
    src, dst = Path(src), Path(dst)
    cpu = next(k for k in default_engines() if engine_kind(k).runs_files)  # the CPU kind every recipe has
    factory = runner_factory or (lambda path: runner_for(cpu, {"path": str(path), "precision": "int8"},
                                                          name="rescue-int8"))
    tols = engine_tolerances(["candidate"], tolerances, {"candidate": "int8"})["candidate"]
    uq_tols = parse_uq_tolerances(uq_tolerances, "int8")
    data = ParityData.build(generated_feeds, id_feeds, ood_feeds)
    ref, problems = run_reference(reference, data)
    if ref is None:
        raise ToolchainError("rescue: the reference cannot run: " + "; ".join(c.message for c in problems))
    dst.parent.mkdir(parents=True, exist_ok=True)
    fp32 = load_checked(src)
    with tempfile.TemporaryDirectory(prefix="rescue-", dir=dst.parent) as tmp:
        if qdq is None:
            quantize_int8(src, Path(tmp) / "first.onnx", calibration, measure_members=False, **dict(quantize or {}))
            qdq = Path(tmp) / "first.onnx"
        failing = onnx.load_model(str(qdq))
        layers = quantized_layers(failing)
        label = Path(qdq).name

        def evaluate(kept: tuple[str, ...]) -> list[Check]:
            path = Path(tmp) / "variant.onnx"
            onnx.save_model(keep_float_layers(failing, fp32, kept), str(path))
            try:
                return check_candidate("candidate", factory(path), data, ref, tols, uq_tols,
                                       uq_outputs=uq_outputs, n_bins=n_bins, cross_check=False, precision="int8")
            finally:
                path.unlink(missing_ok=True)

        # sensitivity: the numeric error left with one layer float, on the first ID feeds (else generated)
        probe = ParityData.build(generated_feeds if not id_feeds else [], list(id_feeds)[:2], [])
        probe_ref = ref.id[:2] if id_feeds else ref.generated  # the reference's outputs on those feeds, run once
        left: dict[str, float] = {}
        for name in layers:
            path = Path(tmp) / "probe.onnx"
            onnx.save_model(keep_float_layers(failing, fp32, [name]), str(path))
            try:
                with factory(path) as runner:
                    got = [runner.infer(f) for _, _, f in probe.feeds()]
                comps = compare_outputs(probe_ref, got, [lab for _, lab, _ in probe.feeds()], tols)
                values = [float(c.rule_value) for c in comps.values()]
                left[name] = max(v if math.isfinite(v) else math.inf for v in values)
            except ToolchainError:
                left[name] = math.inf  # this variant cannot run: tried last
            finally:
                path.unlink(missing_ok=True)
        order = sorted(layers, key=lambda n: (left[n], layers.index(n)))
        log.info("rescue int8 of %s: %d quantized layers; most sensitive first: %s", label, len(layers),
                 ", ".join(order[:4]))
        keep, initial, final, search = _search_keep(evaluate, order, max_evaluations, "int8", label)
        tmp_dst = dst.with_name(f".{dst.name}.tmp")
        onnx.save_model(keep_float_layers(failing, fp32, keep), str(tmp_dst))
        tmp_dst.replace(dst)
    why = "; ".join(c.name for c in initial[:4])
    report = {"target": "int8", "source": label, "quantized": [n for n in layers if n not in keep],
              "quantized_count": len(layers) - len(keep),
              "kept_float": {n: f"float fallback: needed to pass {why}" for n in keep}}
    atomic_write_json(dst.with_name(f"{dst.stem}.precision.json"), report)
    write_summary(dst)
    for name in keep:
        log.info("rescue: keep %s in float (needed for parity)", name)
    out = RescueResult(target="int8", kept_fp32_nodes=tuple(keep), path=dst, candidates=len(layers),
                       initial_failures=initial, final_checks=final, evaluations=search.log,
                       seconds=time.perf_counter() - started)
    atomic_write_json(dst.with_name(f"{dst.stem}.rescue.json"),
                      {**out.to_dict(), "sensitivity": {n: (round(left[n], 4) if math.isfinite(left[n]) else None)
                                                        for n in order}})
    return out


def rescue_precision(
    src: Path,
    dst: Path,
    target: Literal["fp16", "bf16"],
    reference: Runner,
    generated_feeds: Sequence[Feed],
    id_feeds: Sequence[tuple[Feed, np.ndarray]] = (),
    ood_feeds: Sequence[Feed] = (),
    tolerances: Mapping[str, Any] | None = None,
    uq_tolerances: Mapping[str, MetricTolerance] | None = None,
    *,
    keep_fp32_ops: Iterable[str] | Mapping[str, str] | None = None,
    keep_fp32_nodes: Iterable[str] = (),
    runner_factory: RunnerFactory | None = None,
    uq_outputs: UQOutputs | None = None,
    n_bins: int = 15,
    max_evaluations: int = 200,
) -> RescueResult:
    """Find a small set of nodes to keep in FP32 so the ``target`` variant of ``src`` passes parity.

    Args:
        src: the FP32 ONNX file.
        dst: where the passing variant is written (with ``<stem>.precision.json`` and
            ``<stem>.rescue.json``, the search log).
        target: ``"fp16"`` or ``"bf16"``.
        reference: the FP32 reference runner (torch module or the FP32 graph).
        generated_feeds: feeds at several shapes, as in :func:`~toolchain.parity.runner.run_parity`.
        id_feeds: ``(feed, labels)`` ID batches (UQ checks); may be empty.
        ood_feeds: OOD batches; may be empty.
        tolerances: per-output overrides of the ``target`` defaults.
        uq_tolerances: per-metric overrides of the UQ defaults.
        keep_fp32_ops: the operator list of the failing conversion (None = the pass's defaults).
        keep_fp32_nodes: nodes the caller already keeps in FP32 (always kept).
        runner_factory: ``path -> Runner`` for each evaluated variant (default: onnx.reference).
        uq_outputs: output names for the UQ report.
        n_bins: ECE bins.
        max_evaluations: budget of variants to evaluate; when spent, the best passing set so far.

    Returns:
        :class:`RescueResult` with the kept node names (topological order) and the written path;
        ``kept_fp32_nodes`` is empty when the unrescued variant already passes.

    Raises:
        CheckFailed: even with every candidate node in FP32 the variant fails (not a precision
            problem: a wrong weight, a broken op...).
        ToolchainError: bad inputs, or the reference cannot run.
    """
    started = time.perf_counter()
    src, dst = Path(src), Path(dst)
    source = load_checked(src)
    base_keep = tuple(keep_fp32_nodes)
    conv_kw: dict[str, Any] = {"keep_fp32_ops": keep_fp32_ops}
    factory = runner_factory or (lambda path: ReferenceEvaluatorRunner(path, name=f"rescue-{target}"))
    tols = engine_tolerances(["candidate"], tolerances, {"candidate": target})["candidate"]
    uq_tols = parse_uq_tolerances(uq_tolerances)
    data = ParityData.build(generated_feeds, id_feeds, ood_feeds)
    ref, problems = run_reference(reference, data)
    if ref is None:
        raise ToolchainError("rescue: the reference cannot run: " + "; ".join(c.message for c in problems))
    first = convert_precision(source, target, keep_fp32_nodes=base_keep, **conv_kw)
    nodes = [n for n in first.low_nodes if n not in base_keep]
    log.info("rescue %s of %s: %d low-precision candidate nodes", target, src.name, len(nodes))

    with tempfile.TemporaryDirectory(prefix="rescue-", dir=dst.parent if dst.parent.exists() else None) as tmp:
        counter = iter(range(1_000_000))

        def evaluate(kept: tuple[str, ...]) -> list[Check]:
            model = convert_precision(source, target, keep_fp32_nodes=base_keep + kept, **conv_kw).model
            path = Path(tmp) / f"variant{next(counter)}.onnx"
            onnx.save_model(model, str(path))
            return check_candidate("candidate", factory(path), data, ref, tols, uq_tols,
                                   uq_outputs=uq_outputs, n_bins=n_bins, cross_check=False, precision=target)

        keep, initial, final, search = _search_keep(evaluate, nodes, max_evaluations, target, src.name)
    result = write_precision_variant(src, dst, target, keep_fp32_nodes=base_keep + tuple(keep), **conv_kw)
    for name in keep:
        log.info("rescue: keep %s in FP32 (needed for parity)", name)
    out = RescueResult(target=target, kept_fp32_nodes=tuple(keep), path=dst, candidates=len(nodes),
                       initial_failures=initial, final_checks=final, evaluations=search.log,
                       seconds=time.perf_counter() - started)
    atomic_write_json(dst.with_name(f"{dst.stem}.rescue.json"),
                      {**out.to_dict(), "kept_fp32_reasons": {k: result.kept_fp32[k] for k in keep}})
    return out
