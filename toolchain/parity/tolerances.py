"""Parity tolerances: per precision, per output, atol AND rtol, a named error statistic; UQ deltas.

The rule
--------
For one output, with reference ``r`` and candidate ``c`` (every element, every feed, flattened)::

    e_i = |c_i - r_i| / (atol + rtol * |r_i|)          (normalised error; 0/0 = 0, x/0 = inf)
    pass  <=>  every c_i is finite  and  stat(e) <= 1
               [and  max(e) <= max_limit]  [and  q_feed(e of each feed) <= 1]

``stat`` is one of ``max | mean | median | quantile`` (``quantile`` uses :attr:`Tolerance.quantile`);
the optional ``max_limit`` bounds every element however the statistic summarises them, and the
optional ``feed_quantile`` asks that fraction of the elements of EVERY feed (one input shape, one
batch of rows) to meet the elementwise rule, so a fault confined to one shape is not pooled away.
A feed of fewer than ``1 / (1 - feed_quantile)`` elements must meet it everywhere.
With ``max`` this is exactly the elementwise ``|c - r| <= atol + rtol * |r|`` of ``numpy.allclose``
for every element; ``quantile`` (the ``inverted_cdf`` quantile: the smallest value with at least
a fraction q of the errors at or below it) with q = 0.99 reads exactly "at least 99% of the
elements satisfy the elementwise rule"; ``median`` "about half of them"; ``mean`` bounds the
average normalised error.

NaN or Inf anywhere in a candidate output fails the output whatever the statistic, and the
report names the output, the feed and the FIRST offending index (row-major order): a NaN is
never averaged away by ``mean`` or hidden above a quantile.

Relation to Polygraphy (``SimpleCompareFunc``): Polygraphy's elementwise rule fails an element
only if BOTH ``|c - r| > atol`` AND ``|c - r| / |r| > rtol``, i.e. it passes
``|c - r| <= max(atol, rtol * |r|)``. Ours passes ``|c - r| <= atol + rtol * |r|``. Since
``max(a, b) <= a + b <= 2 * max(a, b)``, everything Polygraphy passes we pass, and everything we
pass Polygraphy passes with both tolerances doubled. For ``max/mean/median/quantile`` Polygraphy
takes the statistic of the absolute and of the relative errors separately (possibly from two
different elements) and fails only if both exceed; we take the statistic of the per-element
normalised error, so one element cannot pass on its absolute error and another on its relative
error. :mod:`toolchain.parity.numeric` runs Polygraphy's comparator with the same numbers as a
recorded cross-check. With the default ``max`` statistic (FP32) the relation above is exact; the
FP16/BF16 rule pools its quantile over every feed and adds ``max_limit`` and ``feed_quantile``,
which Polygraphy (a statistic per feed, no bound) does not have, so the two verdicts can differ
either way there; the report notes where they do.

Default tolerances and the measurements behind them
---------------------------------------------------
Reproduce with ``python benchmarks/parity_tolerances/calibrate.py`` (about 20 min on 2 CPU threads). Reference:
the FP32 graph on ONNX Runtime CPU. Models: the tiny BERT and tiny ViT of ``toolchain.models.tiny``
(SingleModel, 64 samples at 2 shapes); a ViT (4 layers x 4 heads, hidden 64) trained on
Fashion-MNIST for up to one epoch / 240 s (76.7% test accuracy in the run quoted), on 128
Fashion-MNIST + 128 digits images; all-MiniLM-L6-v2 (the packaged real encoder, random 3-class
head, 32 sentences x 48 tokens). "true" = ``onnx.reference`` (numpy float16/bfloat16 arithmetic,
what a strongly typed GPU engine computes); ONNX Runtime CPU computes FP16 chains in FP32 (it
inserts Casts), so its FP16 errors are a lower bound. Max absolute errors, worst over the models
(|logits| <= 7.5), and the rule value under the defaults (FP32: max normalised error; FP16/BF16:
its 0.999 quantile; > 1 fails). The FP16/BF16 rule values and every "caught" count below are from
the rerun under the current rule (commit c20eb94; its ViT reached 68.8% in the 240 s budget on a
shared machine); the other columns are from the run quoted:

=============================================  ===========  ==========  ======================  =========
graph                                          logits max   probs max   rule value under the    argmax
                                               abs error    abs error   fp32 / fp16 / bf16      agreement
                                                                        defaults
=============================================  ===========  ==========  ======================  =========
FP32 ORT vs torch                              2.2e-6       4.8e-7      <= 0.05 / - / -         1.000
correct FP16, ORT CPU                          2.8e-3       7.6e-4      - / <= 0.28 / -         1.000
correct FP16, true FP16 arithmetic             9.3e-3       1.9e-3      - / 0.24-0.46 / <= 0.07 1.000
correct BF16, true BF16 arithmetic             5.9e-2       1.9e-2      - / 1.1-2.9 / 0.14-0.54 0.996
LayerNormalization forced FP16, input x300     8.5e-3       1.8e-3      - / < 1 / -             1.000
rsqrt-form LayerNorm in FP16, input x300       4.8          0.75        - / > 80 / -            0.34
=============================================  ===========  ==========  ======================  =========

The ONNX ``LayerNormalization`` node computes in FP32 (``stash_type=1``) on ORT and onnx.reference
alike, so forcing it to FP16 does not overflow there; the LayerNorm written with ``rsqrt``
(exporters below opset 17, hand-written models) is decomposed into ``Mul -> ReduceMean -> Add ->
Sqrt``, which the precision pass does not recognise as a LayerNorm, and its squared deviations pass
65504 in FP16 (even with the pass's default ``keep_fp32_ops``).

Wrong engines: each MatMul/Gemm weight of a model in turn scaled by 1.05 (systematic) or given
5% relative noise, then converted; "caught" = fails the defaults of that precision:

======================================  =========================  ==============  ==============  ==============
perturbation                            logits max abs error       caught FP32     caught FP16     caught BF16
                                        min / median / max         defaults        defaults        defaults
======================================  =========================  ==============  ==============  ==============
x1.05, trained ViT (25 weights)         0.024 / 0.12 / 0.40        25/25           25/25           13/25
5% noise, trained ViT                   0.008 / 0.022 / 0.19       25/25           12/25           1/25
x1.05, tiny ViT (13 weights)            0.004 / 0.035 / 0.24       13/13           9/13            1/13
x1.05, tiny BERT (14 weights)           0.0055 / 0.009 / 0.19      10/14           2/14            2/14
======================================  =========================  ==============  ==============  ==============

At evaluation size
------------------
The tables above use 256 rows; the parity stage checks every row of a recipe's test and OOD splits
(ViT recipe: 3,000 test and OOD rows plus 11 generated ones, 24,088 logits, 72,264 member
logits). A correct engine's largest
normalised error grows with the number of elements (its tail is heavier than Gaussian), so a
``max`` rule calibrated on 256 rows cries wolf at evaluation size: the ViT recipe's correct BF16
graphs failed it by 3% in two runs (1 of 24,088 single-model logits in one, 1 of 72,264 Hydra
member logits in the other). ``python benchmarks/parity_tolerances/eval_size.py`` runs a recipe's
own graphs as the parity stage does (PyTorch reference; BF16 on ``onnxrt-cpu-bf16emu``) and reports
the normalised error under the defaults' atol/rtol. ViT recipe (3,011 rows; MiniLM recipe, 1,511
rows, in brackets):

========================  ===================  ===================  ===================  ===================
correct graph, output     max, first 256 rows  max, every row       q0.999               q0.9999
========================  ===================  ===================  ===================  ===================
FP16 single logits        0.19 (0.08)          0.35 (0.17)          0.15 (0.09)          0.27 (0.17)
FP16 Hydra member logits  0.33-0.36 (0.17-0.37) 0.64-0.76 (0.19-0.37) 0.24 (0.13-0.18)  0.49-0.52 (0.19-0.30)
BF16 single logits        0.44 (0.29)          0.73 (0.30)          0.31 (0.26)          0.51 (0.30)
BF16 Hydra member logits  0.45-0.56 (0.34-0.37) 0.91-1.03 (0.34-0.37) 0.36-0.41 (0.24-0.28) 0.69 (0.34-0.36)
========================  ===================  ===================  ===================  ===================

The 0.999 quantile barely moves with the number of rows (it is a property of the engine, not of
the sample size) while the max keeps growing. Wrong graphs at evaluation size (each of the ViT
single model's 25 MatMul/Gemm weights in turn; caught by the max rule -> by the chosen rule):
FP16 x1.05 25/25 -> 25/25, 5% noise 25/25 -> 21/25; BF16 x1.05 23/25 -> 13/25, 5% noise 7/25 ->
2/25 (the max rule's extra catches at BF16 come with its false alarms: the correct engines' max
reaches 1.03, the wrong ones' median 1.5). A correct BF16 graph fails the FP16 rule (every output of
the ViT graphs; the logits of every MiniLM graph): an FP16 build that silently lost precision is
still caught.

Chosen defaults (FP32: ``stat = "max"``, a fault confined to a few samples or one shape must not be
diluted; FP16/BF16: ``stat = "quantile"``, ``quantile = 0.999``, ``max_limit = 4``,
``feed_quantile = 0.99`` - at least 99.9% of all the elements within the rule, at least 99% of
every feed's (a feed of under 100 elements, e.g. a generated batch-1 shape, entirely) and none
beyond 4x it: a fault confined to one shape or one batch still fails; what passes is a fault on
fewer than 0.1% of the elements and 1% of each feed, within 4x the rule. Correct engines' worst
per-feed 0.99 quantile at evaluation size: 0.25 (FP16), 0.35 (BF16). NaN/Inf fail regardless):

* ``fp32``: logits ``atol 1e-4, rtol 1e-4``; probs ``atol 1e-5, rtol 1e-4``. Correct FP32 uses at most 5%
  of it (TensorRT FP32 must be built without TF32 to stay inside); catches every perturbation
  of the trained and tiny ViT; the tiny BERT's misses (Q/K weights of a random model) move the
  logits by < 2e-5.
* ``fp16``: logits ``atol 1e-2, rtol 1e-2``; probs ``atol 3e-3, rtol 1e-2``. At evaluation size correct
  FP16 engines on ONNX Runtime CPU have a 0.999 quantile of at most 0.24 (4x margin) and a max of
  0.76 (5x under ``max_limit``); true FP16 arithmetic, measured on 256 rows, reaches 0.46 (2.2x);
  a BF16-quality engine (an FP16 build that silently lost precision) fails it, and it
  catches every x1.05 weight of the trained ViT. What it misses moves the logits by less than ~2x
  the FP16 rounding itself: no tolerance can separate that from a correct FP16 engine (UQ parity
  and FP32 parity of the same export are the backstop).
* ``bf16``: logits ``atol 1e-1, rtol 2e-2``; probs ``atol 3e-2, rtol 2e-2``. At evaluation size correct
  BF16 (``onnxrt-cpu-bf16emu``) has a 0.999 quantile of at most 0.41 (2.4x margin) and a max of 1.03
  (3.9x under ``max_limit``); true BF16 arithmetic, measured on 256 rows, reaches 0.54 (1.85x).
  BF16 keeps 8 mantissa bits: its rounding (0.06) is as large as most single weight perturbations,
  so it catches overflow/NaN, wrong ops or layouts and weight errors that move the logits by more
  than ~0.1 on more than 0.1% of the elements (13/25 of the x1.05 weights).
* Argmax agreement and cosine are reported, not gated (``min_argmax_agreement=None``): a correct
  BF16 engine flipped 1 of 256 near-tie predictions; the accuracy UQ check bounds flips in aggregate.

UQ-metric tolerances
--------------------
Reference and candidate are evaluated on the SAME samples, so the paired delta, not sampling
noise, is what a correct engine must keep small. Trained ViT, 1000 Fashion-MNIST test (ID) /
500 digits (OOD), the eval sizes we use; reference accuracy 0.767, NLL 0.593, Brier 0.307,
ECE 0.052, AUROC(MSP) 0.683 (deltas over two training runs, largest shown):

=================  =========  =========  ==========  =========  ============  ==================
metric             bootstrap  FP16 ORT   FP16 true   BF16 true  wrong: head   default tolerance
                   std                                          weight x1.05
=================  =========  =========  ==========  =========  ============  ==================
accuracy           0.014      0          0           0.0010     0             0.003 (0.3 points)
NLL                0.028      0          0           0.0001     0.0030        rtol 0.01 + atol 1e-3
Brier              0.014      0          0           0.0003     0.0021        rtol 0.01 + atol 1e-3
ECE                0.010      0.0004     0.0028      0.0008     **0.0130**    0.005
failure AUROC      0.013      0          0.0001      0.0018     0.0004        0.005
AUROC (MSP/ent.)   0.013      0.0001     0.0001      0.0011     0.0048        0.005
AUPR               0.018      0.0001     0.0002      0.0008     0.0038        0.005
FPR95              0.018-22   0.0020     0.0020      0.0030     0.0040        0.01
=================  =========  =========  ==========  =========  ============  ==================

Every default is at least 1.8x the largest delta of a correct engine and about half or less of the
metric's own bootstrap std: a delta the gate lets through is invisible next to the evaluation's
own uncertainty, and a head-weight error that moves calibration (ECE 0.013) fails. FPR95 gets
0.01: it is the least stable metric (a few ID samples crossing the 95%-TPR threshold; correct BF16
moved it 0.003). Accuracy and FPR95 move in steps of 1/N_ID (0.001 at 1000 ID samples); with
much smaller eval sets, raise them to a few steps. Rank metrics on near-tied scores (a random
tiny model's MSP, identical members' MI) are fragile too: a correct BF16 tiny ViT moved failure
AUROC by 0.006 on 200 samples.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from types import MappingProxyType
from typing import Any, Literal

import numpy as np

from toolchain.errors import ToolchainError

__all__ = [
    "DEFAULT_UQ_TOLERANCES",
    "INT8_UQ_TOLERANCES",
    "PRECISIONS",
    "STATS",
    "MetricTolerance",
    "RuleResult",
    "Tolerance",
    "ToleranceError",
    "default_tolerances",
    "evaluate_metric",
    "evaluate_rule",
    "first_nonfinite",
    "normalised_error",
    "parse_tolerances",
    "parse_uq_tolerances",
    "resolve_metric_tolerance",
    "resolve_tolerance",
    "within_limit",
]

Stat = Literal["max", "mean", "median", "quantile"]
Precision = Literal["fp32", "fp16", "bf16", "int8"]
STATS: tuple[str, ...] = ("max", "mean", "median", "quantile")
PRECISIONS: tuple[str, ...] = ("fp32", "fp16", "bf16", "int8")


class ToleranceError(ToolchainError):
    """A tolerance is malformed (negative, NaN, unknown statistic, no default key): exit code 2."""


def _non_negative(what: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float | np.floating | np.integer):
        raise ToleranceError(f"{what} must be a number >= 0, got {value!r}.")
    value = float(value)
    if not math.isfinite(value) or value < 0:
        raise ToleranceError(f"{what} must be a finite number >= 0, got {value!r}.")
    return value


def _fraction(what: str, value: object | None) -> float | None:
    if value is None:
        return None
    value = _non_negative(what, value)
    if value > 1:
        raise ToleranceError(f"{what} must lie in [0, 1], got {value!r}.")
    return value


def _quantile(what: str, value: object) -> float:
    q = _non_negative(what, value)
    if not 0 < q <= 1:
        raise ToleranceError(f"{what} must lie in (0, 1], got {q!r}.")
    return q


@dataclass(frozen=True)
class Tolerance:
    """The pass rule for one output (see the module docstring for the exact rule).

    Args:
        atol: absolute tolerance (>= 0).
        rtol: relative tolerance, a fraction of ``|reference|`` (>= 0).
        stat: ``max`` | ``mean`` | ``median`` | ``quantile`` of the normalised error.
        quantile: the quantile used when ``stat == "quantile"`` (0 < q <= 1).
        min_argmax_agreement: also require this fraction of rows with the same argmax over the last
            axis (``[B, C]`` and ``[B, M, C]`` outputs); None reports it only.
        min_cosine: also require this cosine similarity of the flattened outputs; None reports only.
        max_limit: also require the largest normalised error to be at most this (> 0): with a
            ``quantile`` statistic, the bound that no single element escapes (a fault confined
            to a few elements); None: no bound beyond ``stat``.
        feed_quantile: also require this quantile of every feed's normalised error to be <= 1
            (0 < q <= 1; feeds as :func:`evaluate_rule` is given them): a fault confined to one
            input shape or one batch fails even when it is a small part of all the elements.
            None: no per-feed clause.
    """

    atol: float
    rtol: float
    stat: Stat = "max"
    quantile: float = 0.99
    min_argmax_agreement: float | None = None
    min_cosine: float | None = None
    max_limit: float | None = None
    feed_quantile: float | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "atol", _non_negative("tolerance atol", self.atol))
        object.__setattr__(self, "rtol", _non_negative("tolerance rtol", self.rtol))
        if self.stat not in STATS:
            raise ToleranceError(f"tolerance stat must be one of {list(STATS)}, got {self.stat!r}.")
        object.__setattr__(self, "quantile", _quantile("tolerance quantile", self.quantile))
        object.__setattr__(self, "min_argmax_agreement",
                           _fraction("tolerance min_argmax_agreement", self.min_argmax_agreement))
        if self.min_cosine is not None:
            cos = _non_negative("tolerance min_cosine", self.min_cosine)
            if cos > 1:
                raise ToleranceError(f"tolerance min_cosine must lie in [0, 1], got {cos!r}.")
            object.__setattr__(self, "min_cosine", cos)
        if self.max_limit is not None:
            cap = _non_negative("tolerance max_limit", self.max_limit)
            if cap == 0:
                raise ToleranceError("tolerance max_limit must be > 0 (or null for no bound), got 0.")
            object.__setattr__(self, "max_limit", cap)
        if self.feed_quantile is not None:
            object.__setattr__(self, "feed_quantile", _quantile("tolerance feed_quantile", self.feed_quantile))

    @property
    def stat_name(self) -> str:
        """``max``, ``mean``, ``median`` or ``q0.99`` (for messages)."""
        return f"q{self.quantile:g}" if self.stat == "quantile" else self.stat

    def describe(self) -> str:
        """One-line rule, e.g. ``q0.999 of |c-r|/(0.1 + 0.02*|r|) <= 1, max <= 4, q0.99 per feed <= 1``."""
        rule = f"{self.stat_name} of |c-r|/({self.atol:g} + {self.rtol:g}*|r|) <= 1"
        if self.max_limit is not None and self.stat != "max":
            rule += f", max <= {self.max_limit:g}"
        if self.feed_quantile is not None:
            rule += f", q{self.feed_quantile:g} per feed <= 1"
        return rule

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields."""
        return asdict(self)


@dataclass(frozen=True)
class MetricTolerance:
    """Allowed change of one UQ metric: ``|cand - ref| <= atol + rtol * |ref|``."""

    atol: float
    rtol: float = 0.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "atol", _non_negative("UQ tolerance atol", self.atol))
        object.__setattr__(self, "rtol", _non_negative("UQ tolerance rtol", self.rtol))

    def limit(self, reference: float) -> float:
        """The largest allowed ``|delta|`` for this reference value."""
        return self.atol + self.rtol * abs(reference)

    def to_dict(self) -> dict[str, float]:
        """JSON-ready fields."""
        return asdict(self)


# ------------------------------------------------------------------------------------ defaults

# Chosen from the measurements in the module docstring (python benchmarks/parity_tolerances/calibrate.py).
# The "" default of each precision is the logits rule: unknown outputs are treated like logits.
#: FP16/BF16: 99.9% of the elements and 99% of every feed's within the rule, none beyond 4x it
#: ("At evaluation size" and "Chosen defaults" above).
_REDUCED: dict[str, Any] = {"stat": "quantile", "quantile": 0.999, "max_limit": 4.0, "feed_quantile": 0.99}
_DEFAULTS: dict[str, dict[str, Tolerance]] = {
    "fp32": {
        "": Tolerance(atol=1e-4, rtol=1e-4),
        "logits": Tolerance(atol=1e-4, rtol=1e-4),
        "member_logits": Tolerance(atol=1e-4, rtol=1e-4),
        "probs": Tolerance(atol=1e-5, rtol=1e-4),
    },
    "fp16": {
        "": Tolerance(atol=1e-2, rtol=1e-2, **_REDUCED),
        "logits": Tolerance(atol=1e-2, rtol=1e-2, **_REDUCED),
        "member_logits": Tolerance(atol=1e-2, rtol=1e-2, **_REDUCED),
        "probs": Tolerance(atol=3e-3, rtol=1e-2, **_REDUCED),
    },
    "bf16": {
        "": Tolerance(atol=1e-1, rtol=2e-2, **_REDUCED),
        "logits": Tolerance(atol=1e-1, rtol=2e-2, **_REDUCED),
        "member_logits": Tolerance(atol=1e-1, rtol=2e-2, **_REDUCED),
        "probs": Tolerance(atol=3e-2, rtol=2e-2, **_REDUCED),
    },
    # INT8 (Q/DQ): correct MiniLM engines reach 0.72 of it at most (worst feed's q0.99; docs/quantization.md)
    "int8": {
        "": Tolerance(atol=1.25, rtol=2e-1, **_REDUCED),
        "logits": Tolerance(atol=1.25, rtol=2e-1, **_REDUCED),
        "member_logits": Tolerance(atol=1.25, rtol=2e-1, **_REDUCED),
        "probs": Tolerance(atol=3.5e-1, rtol=2e-1, **_REDUCED),
    },
}

#: UQ-metric tolerances by metric family (``auroc`` covers ``auroc_msp``, ``auroc_mi`` ...).
DEFAULT_UQ_TOLERANCES: Mapping[str, MetricTolerance] = MappingProxyType({
    "": MetricTolerance(atol=0.005),
    "accuracy": MetricTolerance(atol=0.003),
    "auroc": MetricTolerance(atol=0.005),
    "aupr": MetricTolerance(atol=0.005),
    "fpr95": MetricTolerance(atol=0.01),
    "ece": MetricTolerance(atol=0.005),
    "failure_auroc": MetricTolerance(atol=0.005),
    "nll": MetricTolerance(atol=1e-3, rtol=0.01),
    "brier": MetricTolerance(atol=1e-3, rtol=0.01),
})

#: UQ-metric tolerances of INT8 engines (docs/quantization.md, benchmarks/parity_tolerances/int8.py): what INT8 may
#: cost the uncertainty metrics before the float fallback keeps layers float; rank metrics on INT8's resolution too.
INT8_UQ_TOLERANCES: Mapping[str, MetricTolerance] = MappingProxyType({
    "": MetricTolerance(atol=0.01), "accuracy": MetricTolerance(atol=0.01), "auroc": MetricTolerance(atol=0.01),
    "aupr": MetricTolerance(atol=0.015), "fpr95": MetricTolerance(atol=0.03), "ece": MetricTolerance(atol=0.03),
    "failure_auroc": MetricTolerance(atol=0.015), "nll": MetricTolerance(atol=5e-3, rtol=0.03),
    "brier": MetricTolerance(atol=3e-3, rtol=0.03),
})


def default_tolerances(precision: str) -> dict[str, Tolerance]:
    """Per-output default tolerances for ``fp32`` | ``fp16`` | ``bf16`` (a fresh dict, ``""`` = default)."""
    if precision not in _DEFAULTS:
        raise ToleranceError(f"precision must be one of {list(PRECISIONS)}, got {precision!r}.")
    return dict(_DEFAULTS[precision])


def resolve_tolerance(tolerances: Mapping[str, Tolerance], output: str) -> Tolerance:
    """The tolerance of ``output``: its own key, else the ``""`` default (Polygraphy style)."""
    if output in tolerances:
        return tolerances[output]
    if "" in tolerances:
        return tolerances[""]
    raise ToleranceError(f"no tolerance for output '{output}' and no default ('' key) in {sorted(tolerances)}.")


def resolve_metric_tolerance(tolerances: Mapping[str, MetricTolerance], metric: str) -> MetricTolerance:
    """The tolerance of a UQ metric: exact key, else its family (``auroc_msp`` -> ``auroc``), else ``""``."""
    from toolchain.metrics.registry import uq_metric

    known = uq_metric(metric)
    for key in (metric, known.family if known is not None else metric.split("_", 1)[0], ""):
        if key in tolerances:
            return tolerances[key]
    raise ToleranceError(f"no UQ tolerance for metric '{metric}' and no default ('' key) in {sorted(tolerances)}.")


def _tolerance_from(name: str, value: object, base: Tolerance) -> Tolerance:
    if isinstance(value, Tolerance):
        return value
    if not isinstance(value, Mapping):
        raise ToleranceError(f"tolerances['{name}'] must be a mapping with atol/rtol/stat, got {value!r}.")
    unknown = set(value) - set(Tolerance.__dataclass_fields__)
    if unknown or not {"atol", "rtol"} <= set(value):
        raise ToleranceError(f"tolerances['{name}'] needs atol and rtol (and optionally stat, quantile, "
                             f"max_limit, feed_quantile, min_argmax_agreement, min_cosine); got keys {sorted(value)}.")
    return replace(base, **value)  # what the mapping leaves out (stat, quantile, max_limit ...) is the default's


def parse_tolerances(raw: Mapping[str, object], precision: str = "fp32") -> dict[str, Tolerance]:
    """Per-output tolerances from plain data (a recipe), merged over :func:`default_tolerances`.

    Example: ``{"probs": {"atol": 1e-3, "rtol": 1e-2, "stat": "max"}}``. A mapping that leaves a
    field out keeps the precision's default for it (``{"atol": 0.2, "rtol": 0.05}`` on a BF16 graph
    keeps the BF16 statistic, ``max_limit`` and ``feed_quantile``); a :class:`Tolerance` replaces
    the default whole. The ``""`` key (the CLI's ``*``) applies to every output: those the defaults
    name and any other; an output's own key wins over it.
    """
    defaults = default_tolerances(precision)
    merged = dict(defaults)
    if "" in raw:
        merged.update({name: _tolerance_from(name, raw[""], tol) for name, tol in defaults.items()})
    merged.update({name: _tolerance_from(name, value, resolve_tolerance(defaults, name))
                   for name, value in raw.items() if name != ""})
    return merged


def parse_uq_tolerances(raw: Mapping[str, object] | None = None,
                        precision: str = "fp32") -> dict[str, MetricTolerance]:
    """UQ tolerances from plain data (``{"auroc": {"atol": 0.01}}`` or ``{"auroc": 0.01}``) over the defaults.

    The defaults of ``precision``: :data:`INT8_UQ_TOLERANCES` for ``int8``, else :data:`DEFAULT_UQ_TOLERANCES`.
    """
    merged = dict(INT8_UQ_TOLERANCES if precision == "int8" else DEFAULT_UQ_TOLERANCES)
    for name, value in (raw or {}).items():
        if isinstance(value, MetricTolerance):
            merged[name] = value
        elif isinstance(value, Mapping):
            unknown = set(value) - {"atol", "rtol"}
            if unknown:
                raise ToleranceError(f"uq_tolerances['{name}']: unknown keys {sorted(unknown)} (use atol, rtol).")
            merged[name] = MetricTolerance(**value)  # type: ignore[arg-type]
        else:
            merged[name] = MetricTolerance(atol=value)  # type: ignore[arg-type]
    return merged


# -------------------------------------------------------------------------------- the rule


def first_nonfinite(array: np.ndarray) -> tuple[tuple[int, ...], float] | None:
    """Index (row-major) and value of the first NaN/Inf in ``array``, or None."""
    array = np.asarray(array)
    if array.dtype.kind not in "fc":
        return None
    bad = ~np.isfinite(array)
    if not bad.any():
        return None
    flat = int(np.argmax(bad.reshape(-1)))
    index = tuple(int(i) for i in np.unravel_index(flat, array.shape))
    return index, float(array.reshape(-1)[flat])


def normalised_error(candidate: np.ndarray, reference: np.ndarray, atol: float, rtol: float) -> np.ndarray:
    """``|c - r| / (atol + rtol * |r|)`` in float64; ``0/0 = 0`` and ``x/0 = inf`` (x > 0)."""
    c = np.asarray(candidate, dtype=np.float64)
    r = np.asarray(reference, dtype=np.float64)
    diff = np.abs(c - r)
    limit = atol + rtol * np.abs(r)
    with np.errstate(divide="ignore", invalid="ignore"):
        out = diff / limit
    out[(limit == 0) & (diff == 0)] = 0.0
    return out


@dataclass(frozen=True)
class RuleResult:
    """Outcome of :func:`evaluate_rule` for one output over every element."""

    passed: bool
    value: float  # stat(normalised error); <= 1 passes; inf when a candidate value is not finite
    worst_flat_index: int  # flat index of the largest normalised error (-1 when empty)
    nonfinite: tuple[tuple[int, ...], float] | None  # first NaN/Inf in the candidate
    max_value: float = 0.0  # the largest normalised error (inf when a candidate value is not finite)
    feed_value: float = 0.0  # the largest per-feed ``feed_quantile`` of the normalised error (0: no clause)
    worst_feed: int = -1  # the feed with that value (-1: no per-feed clause)
    failed: str | None = None  # the first clause that failed: nonfinite | stat | max_limit | feed; None: passed


def _stat(values: np.ndarray, stat: str, quantile: float) -> float:
    if values.size == 0:
        return 0.0
    if stat == "max":
        return float(values.max())
    if stat == "mean":
        return float(values.mean())
    if stat == "median":
        return float(np.median(values))
    return float(np.quantile(values, quantile, method="inverted_cdf"))  # smallest v with P(e <= v) >= q


def evaluate_rule(candidate: np.ndarray, reference: np.ndarray, tol: Tolerance,
                  feed_sizes: Sequence[int] | None = None) -> RuleResult:
    """Apply ``tol`` to one output (arrays of the same shape).

    Args:
        candidate: the candidate's output, every feed flattened and concatenated in feed order.
        reference: the reference's output, the same way.
        tol: the rule.
        feed_sizes: element counts of the feeds in that order (summing to the size); None: one feed.

    Returns:
        :class:`RuleResult`; a NaN/Inf in ``candidate`` always fails, with its first index.
    """
    c = np.asarray(candidate)
    r = np.asarray(reference)
    if c.shape != r.shape:
        raise ToleranceError(f"evaluate_rule: shapes differ: candidate {c.shape} vs reference {r.shape}.")
    sizes = [int(c.size)] if feed_sizes is None else [int(n) for n in feed_sizes]
    if sum(sizes) != c.size or any(n < 0 for n in sizes):
        raise ToleranceError(f"evaluate_rule: feed sizes {sizes} do not add up to the {c.size} elements.")
    bad = first_nonfinite(c)
    err = normalised_error(c, r, tol.atol, tol.rtol).reshape(-1)
    if bad is not None:
        return RuleResult(False, math.inf, int(np.ravel_multi_index(bad[0], c.shape)) if c.ndim else 0, bad,
                          math.inf, failed="nonfinite")
    worst = int(np.argmax(err)) if err.size else -1
    value = _stat(err, tol.stat, tol.quantile)
    largest = float(err[worst]) if err.size else 0.0
    feed_value, worst_feed = 0.0, -1
    if tol.feed_quantile is not None:
        start = 0
        for i, n in enumerate(sizes):
            v = _stat(err[start:start + n], "quantile", tol.feed_quantile)
            start += n
            if worst_feed < 0 or v > feed_value:
                feed_value, worst_feed = v, i
    failed = None
    if not value <= 1.0:  # NaN (a NaN reference) fails too
        failed = "stat"
    elif tol.max_limit is not None and not largest <= tol.max_limit:
        failed = "max_limit"
    elif not feed_value <= 1.0:
        failed = "feed"
    return RuleResult(failed is None, value, worst, None, largest, feed_value, worst_feed, failed)


#: float64 rounding allowance of :func:`within_limit`, in units of the operands' magnitude.
ROUNDING_ULPS = 64


def within_limit(delta: float, limit: float, *magnitudes: float) -> bool:
    """``|delta| <= limit`` up to float64 rounding: a delta AT its limit passes.

    Metrics are float64 values computed from counts and sums (FPR95 = k/n, accuracy = k/n,
    AUROC = pairs/(n_pos*n_neg)), and ``delta = candidate - reference`` and ``limit = atol +
    rtol*|ref|`` are rounded once more: ``0.05 - 0.1`` is ``-0.05000000000000000444``, so an
    exact delta of 1/20 against a limit of 0.05 would fail on the last bit. The comparison
    allows ``ROUNDING_ULPS`` (64) float64 ulps of the largest operand (~1.4e-14 for metrics in
    [0, 1]): far below any metric's resolution (1/n, n < 1e12), so no real change is let through.
    """
    scale = max(1.0, abs(limit), *(abs(m) for m in magnitudes))
    return abs(delta) <= limit + ROUNDING_ULPS * sys.float_info.epsilon * scale


def evaluate_metric(reference: float, candidate: float, tol: MetricTolerance) -> tuple[bool, float, float]:
    """``(passed, delta, limit)`` for one UQ metric; both NaN passes (e.g. failure AUROC undefined), one NaN fails.

    ``passed`` is :func:`within_limit` (a delta exactly at the limit passes despite float rounding).
    """
    ref_nan, cand_nan = math.isnan(reference), math.isnan(candidate)
    if ref_nan or cand_nan:
        return ref_nan and cand_nan, math.nan, tol.limit(0.0 if ref_nan else reference)
    delta = candidate - reference
    limit = tol.limit(reference)
    return within_limit(delta, limit, reference, candidate), delta, limit
