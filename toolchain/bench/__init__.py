"""Latency and size reporting: single model vs deep ensemble vs Hydra, per engine.

* :func:`run_bench` (:mod:`toolchain.bench.suite`): everything from an export folder's
  ``graphs.json``: runners per engine kind, generated feeds, interleaved timing, ratios,
  sizes, memory, analytic costs and roofline ratios, and the report files.
* :mod:`toolchain.bench.measure`: :class:`Variant`, :class:`Case`, :func:`measure`
  (warm-up + interleaved rounds, every sample kept), :func:`summarize`, :func:`paired_ratios`,
  :func:`process_memory`, :func:`file_footprint`.
* :mod:`toolchain.bench.roofline`: :func:`calibrate` / :func:`resolve_peaks` (peak FLOP/s and
  bandwidth), :func:`roofline_bound`, :func:`roofline_ratio`, :class:`CostModel`.
* :mod:`toolchain.bench.report`: :func:`write_report` (JSON, Markdown, PNG), :func:`machine_info`.
* :mod:`toolchain.bench.profile`: :func:`profile_onnx` (ONNX Runtime profiler, per-op-type totals)
  and :func:`breakdown_table`.
"""

from toolchain.bench.measure import (
    Case,
    CaseResult,
    Variant,
    file_footprint,
    measure,
    paired_ratios,
    process_memory,
    summarize,
)
from toolchain.bench.profile import breakdown_table, profile_onnx
from toolchain.bench.report import machine_info, markdown_report, plot_report, write_report
from toolchain.bench.roofline import (
    CostModel,
    Peaks,
    calibrate,
    cost_model_from_hydra,
    resolve_peaks,
    roofline_bound,
    roofline_ratio,
)
from toolchain.bench.suite import make_feed, plan_variants, ratio_pairs, read_graphs, run_bench

__all__ = [
    "Case",
    "CaseResult",
    "CostModel",
    "Peaks",
    "Variant",
    "breakdown_table",
    "calibrate",
    "cost_model_from_hydra",
    "file_footprint",
    "machine_info",
    "make_feed",
    "markdown_report",
    "measure",
    "paired_ratios",
    "plan_variants",
    "plot_report",
    "process_memory",
    "profile_onnx",
    "ratio_pairs",
    "read_graphs",
    "resolve_peaks",
    "roofline_bound",
    "roofline_ratio",
    "run_bench",
    "summarize",
    "write_report",
]
