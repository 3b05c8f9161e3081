"""Interleaved latency measurement of named variants, with every sample kept.

A *variant* is a list of runners run one after another on the same feed: the single model is
one runner, a deep ensemble of M models is M runners, a fused Hydra graph is one runner. Its
latency is the time of the whole list. :func:`measure` warms every variant up, then runs
*interleaved rounds* ``A B C A B C ...``: machine drift (other jobs, turbo, thermal) hits all
variants alike, and the ratio of two variants is taken *per round* (the two samples of one
round were measured seconds apart), which is far steadier on a shared machine than the ratio
of two medians taken minutes apart.

Clocks: ``time.perf_counter_ns`` for CPU runners. A variant with a CUDA runner (``onnxrt-cuda``,
``tensorrt``, a ``torch`` runner on a CUDA device) is timed with CUDA events
(``torch.cuda.Event``); ``torch.cuda`` is imported only then, so CPU machines never touch it.
Every runner of this package returns host arrays, so the event interval also covers the copies.

Statistics (:func:`summarize`): median, p10, p25, p75, p90, p99, min, max, mean, IQR, the
relative spread ``(p90 - p10) / median`` and the throughput ``batch / median`` (samples/s).
Paired ratios (:func:`paired_ratios`): the same statistics of ``num[r] / den[r]`` over rounds.

Memory and size: :func:`process_memory` reads the resident set and its high-water mark
(``VmRSS`` / ``VmHWM`` from ``/proc/self/status``, else ``resource.getrusage``);
:func:`file_footprint` the bytes of an engine or ONNX file plus its external weights files.
"""

from __future__ import annotations

import gc
import logging
import resource
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from toolchain import interrupts
from toolchain.engines.base import Runner
from toolchain.engines.registry import clock_of

log = logging.getLogger(__name__)

Feed = dict[str, np.ndarray]
#: ``(variant name, round index or -1 for warm-up)`` handed to the optional ``on_call`` hook
CallHook = Callable[[str, int], None]


# --------------------------------------------------------------------------- variants and cases
@dataclass
class Variant:
    """A named deployment: ``runners`` run one after another on the same feed.

    Attributes:
        name: e.g. ``"single"``, ``"deep-ensemble"``, ``"hydra-conv"``.
        runners: active runners (their ``infer`` is called in order).
        engine: the runner kind, for the report (``"onnxrt-cpu"``).
        meta: free JSON-able facts (graph files, lowering, precision).
    """

    name: str
    runners: Sequence[Runner]
    engine: str = ""
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("Variant.name must be a non-empty string")
        if not self.runners:
            raise ValueError(f"variant '{self.name}' has no runners; give at least one")

    @property
    def uses_cuda(self) -> bool:
        """True when one of the runners runs on a CUDA device (timed with CUDA events)."""
        return any(is_cuda_runner(r) for r in self.runners)

    def run(self, feed: Feed) -> None:
        """Run every runner on ``feed``, in order; outputs are discarded."""
        for runner in self.runners:
            runner.infer(feed)


@dataclass(frozen=True)
class Case:
    """One input shape: its key (``{"batch": 8, "sequence": 128}``) and its feed.

    ``feeds`` optionally gives a variant its own copy of the feed (same values, another dtype,
    e.g. an FP16 graph without FP32 I/O); the conversion happens once, outside the timing.
    ``rounds`` overrides :func:`measure`'s rounds for this case (short cases afford more).
    """

    key: Mapping[str, int]
    feed: Feed
    feeds: Mapping[str, Feed] = field(default_factory=dict)
    rounds: int | None = None

    @property
    def batch(self) -> int:
        """The batch size (``key["batch"]``)."""
        return int(self.key["batch"])

    def feed_for(self, variant: str) -> Feed:
        """The feed of ``variant`` (its own when given, else the shared one)."""
        return self.feeds.get(variant, self.feed)

    def label(self) -> str:
        """``"batch=8 sequence=128"``."""
        return " ".join(f"{k}={v}" for k, v in self.key.items())


def is_cuda_runner(runner: Runner) -> bool:
    """Whether ``runner`` runs on a CUDA device (its kind's registered clock, or its device; no CUDA import)."""
    if clock_of(getattr(runner, "kind", "")) == "cuda-event":
        return True
    device = getattr(runner, "device", None)
    return getattr(device, "type", None) == "cuda"


# --------------------------------------------------------------------------------------- clocks
def time_cpu(variant: Variant, feed: Feed) -> float:
    """Seconds of one ``variant.run(feed)`` by ``perf_counter_ns``."""
    start = time.perf_counter_ns()
    variant.run(feed)
    return (time.perf_counter_ns() - start) * 1e-9


def time_cuda(variant: Variant, feed: Feed) -> float:
    """Seconds of one ``variant.run(feed)`` between two CUDA events on the current stream."""
    import torch  # imported here only: CPU machines never reach this function

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    variant.run(feed)
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e-3


def clock_for(variant: Variant) -> tuple[str, Callable[[Variant, Feed], float]]:
    """``("cuda-event", time_cuda)`` for a CUDA variant, else ``("perf_counter", time_cpu)``."""
    return ("cuda-event", time_cuda) if variant.uses_cuda else ("perf_counter", time_cpu)


# ----------------------------------------------------------------------------------- statistics
_QUANTILES = {"p10": 10, "p25": 25, "p75": 75, "p90": 90, "p99": 99}


def summarize(samples: Sequence[float], batch: int | None = None) -> dict[str, float]:
    """Statistics of latency samples (seconds).

    Returns:
        ``n, median, mean, std, min, max, p10, p25, p75, p90, p99, iqr, spread`` where
        ``spread = (p90 - p10) / median`` and ``rel_iqr = iqr / median``; with ``batch`` also
        ``throughput = batch / median`` (samples per second). Quantiles interpolate linearly.
    """
    values = np.asarray(list(samples), dtype=np.float64)
    if values.size == 0:
        raise ValueError("summarize needs at least one sample; got none")
    if not np.isfinite(values).all():
        raise ValueError(f"summarize got non-finite samples: {values[~np.isfinite(values)][:3].tolist()}")
    median = float(np.median(values))
    out: dict[str, float] = {
        "n": int(values.size),
        "median": median,
        "mean": float(values.mean()),
        "std": float(values.std(ddof=1)) if values.size > 1 else 0.0,
        "min": float(values.min()),
        "max": float(values.max()),
    }
    for name, q in _QUANTILES.items():
        out[name] = float(np.percentile(values, q))
    out["iqr"] = out["p75"] - out["p25"]
    out["spread"] = (out["p90"] - out["p10"]) / median if median > 0 else float("nan")
    out["rel_iqr"] = out["iqr"] / median if median > 0 else float("nan")
    if batch is not None:
        out["throughput"] = batch / median if median > 0 else float("nan")
    return out


def paired_ratios(numerator: Sequence[float], denominator: Sequence[float]) -> dict[str, Any]:
    """Per-round ratios ``numerator[r] / denominator[r]`` and their statistics.

    Both lists hold one sample per round of the same run (see :func:`measure`).

    Returns:
        ``{"per_round": [...], "median": .., "p10": .., "p90": .., "spread": .., ...,
        "ratio_of_medians": median(num) / median(den)}``.
    """
    num = np.asarray(list(numerator), dtype=np.float64)
    den = np.asarray(list(denominator), dtype=np.float64)
    if num.shape != den.shape or num.size == 0:
        raise ValueError(f"paired_ratios needs two equally long, non-empty sample lists; got {num.size} and "
                         f"{den.size}")
    if (den <= 0).any():
        raise ValueError("paired_ratios: a denominator sample is <= 0")
    per_round = num / den
    stats = summarize(per_round)
    return {"per_round": per_round.tolist(), **stats,
            "ratio_of_medians": float(np.median(num) / np.median(den))}


# ------------------------------------------------------------------------------------- measuring
@dataclass
class CaseResult:
    """Samples of one case: ``samples[variant]`` (seconds, one per round) and the clocks used."""

    case: Case
    samples: dict[str, list[float]]
    clocks: dict[str, str]
    order: list[str]

    def stats(self) -> dict[str, dict[str, float]]:
        """:func:`summarize` of every variant."""
        return {name: summarize(s, self.case.batch) for name, s in self.samples.items()}

    def ratio(self, numerator: str, denominator: str) -> dict[str, Any]:
        """:func:`paired_ratios` of two variants of this case."""
        return paired_ratios(self.samples[numerator], self.samples[denominator])


def measure(
    variants: Sequence[Variant],
    cases: Sequence[Case],
    *,
    warmup: int = 3,
    rounds: int = 15,
    progress: bool = True,
    on_call: CallHook | None = None,
    description: str = "bench",
) -> list[CaseResult]:
    """Time every variant on every case: warm-up, then interleaved rounds.

    For each case: ``warmup`` untimed passes over the variants, then ``rounds`` rounds; a round
    runs each variant once, in the order given (``A B C A B C ...``). The garbage collector is
    off while timing.

    Args:
        variants: active variants (unique names).
        cases: the input shapes with their feeds.
        warmup: untimed passes per case (>= 0).
        rounds: timed rounds per case (>= 1); a case's own ``rounds`` takes precedence.
        progress: show a tqdm bar over rounds.
        on_call: called as ``on_call(variant name, round)`` before each call (round -1 = warm-up).
        description: the bar's label.

    Returns:
        One :class:`CaseResult` per case, samples in seconds, one per round.
    """
    names = [v.name for v in variants]
    if len(set(names)) != len(names):
        raise ValueError(f"variant names must be unique; got {names}")
    if not variants or not cases:
        raise ValueError(f"measure needs variants and cases; got {len(variants)} variants and {len(cases)} cases")
    per_case = [case.rounds if case.rounds is not None else rounds for case in cases]
    if warmup < 0 or min(per_case) < 1:
        raise ValueError(f"warmup must be >= 0 and rounds >= 1; got warmup={warmup}, rounds={per_case}")
    clocks = {v.name: clock_for(v) for v in variants}
    bar = _progress(total=sum(per_case), enabled=progress, description=description)
    results = []
    try:
        for case, case_rounds in zip(cases, per_case):
            bar.set_postfix_str(case.label())
            for _ in range(warmup):
                for v in variants:
                    if on_call is not None:
                        on_call(v.name, -1)
                    v.run(case.feed_for(v.name))
            samples: dict[str, list[float]] = {v.name: [] for v in variants}
            gc_was_enabled = gc.isenabled()
            gc.collect()
            gc.disable()
            try:
                for r in range(case_rounds):
                    interrupts.check()  # a graceful SIGTERM stops between rounds
                    for v in variants:
                        if on_call is not None:
                            on_call(v.name, r)
                        samples[v.name].append(clocks[v.name][1](v, case.feed_for(v.name)))
                    bar.update(1)
            finally:
                if gc_was_enabled:
                    gc.enable()
            results.append(CaseResult(case, samples, {k: c[0] for k, c in clocks.items()}, names))
            med = {k: 1e3 * float(np.median(s)) for k, s in samples.items()}
            log.info("%s: %s", case.label(), ", ".join(f"{k} {v:.2f} ms" for k, v in med.items()))
    finally:
        bar.close()
    return results


def measure_passes(
    variants: Sequence[Variant],
    feeds: Sequence[Feed],
    *,
    rounds: int = 3,
    warmup: int = 1,
    progress: bool = True,
) -> dict[str, list[float]]:
    """Seconds of one whole pass over ``feeds`` per variant and round (interleaved rounds, as :func:`measure`).

    For throughput on real rows: ``feeds`` are the batches of a data split (token-length order, so
    shapes vary); every round runs each variant over every batch once. A variant's inputs are cast
    to its first runner's dtypes once, outside the timing.

    Returns:
        variant name -> one sample (seconds) per round.
    """
    names = [v.name for v in variants]
    if len(set(names)) != len(names) or not variants or not feeds:
        raise ValueError(f"measure_passes needs unique variants and feeds; got {names} and {len(feeds)} feeds")
    if rounds < 1 or warmup < 0:
        raise ValueError(f"rounds must be >= 1 and warmup >= 0; got rounds={rounds}, warmup={warmup}")
    own = {v.name: [_as_inputs_of(v.runners[0], f) for f in feeds] for v in variants}
    clocks = {v.name: clock_for(v) for v in variants}

    def one_pass(v: Variant) -> float:
        return sum(clocks[v.name][1](v, f) for f in own[v.name])

    for _ in range(warmup):
        for v in variants:
            one_pass(v)
    samples: dict[str, list[float]] = {n: [] for n in names}
    bar = _progress(total=rounds, enabled=progress, description="rows/s")
    try:
        for _ in range(rounds):
            interrupts.check()
            gc.collect()
            for v in variants:
                samples[v.name].append(one_pass(v))
            bar.update(1)
    finally:
        bar.close()
    return samples


def _as_inputs_of(runner: Runner, feed: Feed) -> Feed:
    """``feed`` in the runner's input dtypes (a copy only where one differs)."""
    specs = runner.input_specs()
    return {k: v.astype(specs[k].dtype) if k in specs and specs[k].dtype is not None and v.dtype != specs[k].dtype
            else v for k, v in feed.items()}


def _progress(total: int, enabled: bool, description: str) -> Any:
    from toolchain.progress import progress

    return progress(total, description, unit="round", enabled=enabled)


# ------------------------------------------------------------------------------ memory and size
def process_memory() -> dict[str, int]:
    """Resident set of this process now and its high-water mark, in bytes.

    ``/proc/self/status`` (``VmRSS``, ``VmHWM``) on Linux; elsewhere ``resource.getrusage``'s
    ``ru_maxrss`` (kilobytes on Linux, bytes on macOS) for both.
    """
    out: dict[str, int] = {}
    status = Path("/proc/self/status")
    if status.is_file():
        for line in status.read_text().splitlines():
            key, _, rest = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                out["rss_bytes" if key == "VmRSS" else "peak_rss_bytes"] = int(rest.split()[0]) * 1024
    if "peak_rss_bytes" not in out:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        peak = peak if sys.platform == "darwin" else peak * 1024
        out["peak_rss_bytes"] = int(peak)
        out.setdefault("rss_bytes", int(peak))
    return out


def file_footprint(path: Path) -> dict[str, Any]:
    """Bytes on disk of an engine or ONNX file and of its external weights files.

    Returns:
        ``{"file", "file_bytes", "external_data_bytes", "total_bytes"}``; for ONNX files also
        ``initializer_bytes`` (the weights the graph stores, wherever they are) and
        ``external_data_files``.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"file_footprint: {path} does not exist")
    out: dict[str, Any] = {"file": path.name, "file_bytes": path.stat().st_size, "external_data_bytes": 0}
    if path.suffix == ".onnx":
        from toolchain.export.graph import graph_summary

        summary = graph_summary(path)
        out["external_data_bytes"] = int(summary["external_data_bytes"])
        out["external_data_files"] = list(summary["external_data_files"])
        out["initializer_bytes"] = int(summary["initializer_bytes"])
    out["total_bytes"] = out["file_bytes"] + out["external_data_bytes"]
    return out
