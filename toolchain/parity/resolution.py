"""Rank-metric resolution: how far rounding at a precision moves a rank metric on given samples.

Rank metrics (``failure_auroc``, ``auroc_*``, ``aupr_*``, ``fpr95_*``) depend only on the ORDER of
per-sample scores. A correct FP16/BF16 engine moves every score a little; where reference scores
lie closer together than that, their order in the candidate is rounding noise and so is part of
the metric's delta. This module decides, from the REFERENCE's outputs and the candidate's
precision only (never from the candidate's outputs, so a broken engine cannot make itself
unjudgeable), how far rounding moves each rank metric.

The rule
--------
1. Resolution of the inputs at precision ``p`` (unit roundoff ``u``: fp32 2^-24, fp16 2^-11,
   bf16 2^-8): ``K = ULPS[p][inputs]`` unit roundoffs, relative for probabilities (the MSP, entropy
   and failure scores), ``K*u*max(|z|, 1)`` for member logits (mutual information, disagreement).
   ``K`` is the largest move measured on correct engines, rounded up: 10 engines of the
   own-checkpoint recipe (MiniLM single model and Hydra; ONNX Runtime FP32, FP16 and emulated BF16,
   OpenVINO FP32 and real BF16 on AVX512-BF16; 600 ID + 300 OOD rows and the generated feeds;
   ``python benchmarks/rank_gate/reach.py``, benchmarks/rank_gate/reach-own-checkpoint.json):
   probabilities of the top two classes moved by at most 68.4 u (FP32: kernels sum in another order),
   4.2 u (FP16), 7.9 u (BF16, OpenVINO); member logits by 63.5 u, 9.4 u, 10.1 u. INT8 (``u`` =
   2^-8, half a step of a symmetric 8-bit grid) is not rounding-like: its moves have heavy tails (the
   largest, 362 u, is a second-class probability of 0.01 moving to 0.024), and a reach at the max
   would make every MSP score interval overlap (no rank check resolvable); ``K`` is the 0.99 quantile
   of the moves of correct INT8 engines (MiniLM single model and Hydra, ONNX Runtime and OpenVINO,
   every Q/DQ variant of ``benchmarks/parity_tolerances/int8.py``): 121 u for probabilities, 90 u for
   member logits, so the member disagreement quantization alone creates stays within the bound. The former single
   ``K = 4`` came from true FP16/BF16 arithmetic on one graph; real BF16 engines moved up to twice
   that. ``d_i``: the change of sample ``i``'s score when its inputs move by that much with
   alternating signs along the class (and member) axes.
2. Rounded scores: ``MOVES = 64`` times, every input of every sample moves by an independent
   amount uniform within its resolution and the score is recomputed (a discrete score such as
   disagreement stays on its grid; for ``failure_auroc`` the predicted class is recomputed too,
   so rounding can change WHICH predictions are wrong, its positives, where the top two
   probabilities lie within rounding of each other: one such flip moves it by about
   ``(1 - AUROC) / n_errors``). ``reach_i``: the larger of ``d_i`` and the largest of these moves.
3. Worst case ``worst_case``: the metric recomputed with each reference score pushed by its
   ``reach_i`` against the detector (positives down, negatives up) and for it, the larger
   distance from the reference's value. Every rank metric is monotone in such shifts, so no
   engine whose scores stay within ``reach_i`` of the reference's and keep their labels can move
   the metric further (with label flips: at least as far as the largest drawn change, below).
4. Calibrated bound ``bound``: a correct engine's rounding errors are not all against the
   detector at once. ``DRAWS = 1000`` times, every sample takes one of its rounded scores (and
   labels) at random, independently of the others, and the metric is recomputed
   (:func:`rank_metrics`, vectorised over the draws); ``bound`` is the LARGEST
   ``|metric(draw) - metric(reference)|`` over the draws (a stated maximum: with 1,000 draws a 0.999
   quantile, the former estimator, is the largest draw or two, not a statistic). A draw in which
   rounding leaves one class empty (failure AUROC when every error flipped to right) has no metric:
   it is counted (``undefined``) and left out, never taken as a change of 1.0 (two such draws used
   to make the bound 1.0, so that the check could never fail). With fewer than ``MIN_DEFINED = 100``
   defined draws no bound can be stated and the check is **not resolvable** (too few failures, or
   OOD rows, to rank). Every random number is seeded (``SEED``, one stream per score): the same
   reference and precision always give the same bound. Uniform within ``K`` unit roundoffs is wider
   than real rounding (most errors of a correct engine are a fraction of its largest), so the bound
   errs towards passing correct engines; benchmarks/rank_gate measures its false-alarm rate on
   correct engines and its catch rate on broken ones. When ``worst_case <= limit`` and no prediction
   can flip, the draws are skipped (no bound can then change the verdict) and ``bound =
   worst_case``, ``draws = 0``.
5. Flat scores: when the intervals ``[s_i - reach_i, s_i + reach_i]`` of ALL the reference's
   scores (both groups) share a point, i.e. ``max(s_i - reach_i) < min(s_i + reach_i)``, rounding
   alone can put the samples in any order and the metric carries no information at this
   precision (the near-untrained case). Only then, and with too few defined draws (step 4), can a
   check be **not resolvable**.
6. Verdict of the rank check, with ``limit`` its tolerance and ``delta`` the candidate's change:

   * flat scores and ``worst_case > limit``: ``|delta| > worst_case`` fails (more than any
     rounding can do: a broken engine, however flat the scores), otherwise **not resolvable**
     (neither pass nor fail; the numeric checks still gate);
   * too few defined draws: not resolvable (a candidate whose metric is undefined too is judged by
     :mod:`toolchain.parity.flips`: undefined after flips within rounding only is not resolvable);
   * otherwise: ``|delta| <= max(limit, bound)`` passes, a larger change fails.

Example: a near-untrained model whose mean confidences span 0.33648-0.33657 (9e-5, below FP16's
spacing of 2.4e-4 at 0.34): every score's interval covers the whole spread, so its rank checks
are not resolvable (tests/parity/test_parity_resolution.py). The default recipe's Hydra at BF16
(``onnxrt-cpu-bf16emu``, 1,000 ID + 500 OOD rows): the former worst-case rule left 12 of its 13
rank checks not resolvable per engine; with the calibrated bound (then ``K = 4``, the 0.999 quantile)
all 13 passed, 4 of them on a bound above the tolerance (``fpr95_mi``: bound 0.024, the matmul
graph's change -0.012 exceeds the tolerance 0.01). benchmarks/rank_gate/results.md has the rates
under the current rule.
"""

from __future__ import annotations

import hashlib
import math
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from toolchain.metrics import disagreement, entropy_score, msp_score, mutual_information
from toolchain.metrics.ood import TPR_TARGET

__all__ = ["DRAWS", "MIN_DEFINED", "RANK_PREFIXES", "SEED", "ULPS", "UNIT_ROUNDOFF", "RankResolution",
           "is_rank_metric", "rank_metrics", "rank_resolutions", "reach_eps", "score_resolution"]

#: metric name prefixes of the rank (order-only) metrics of :func:`toolchain.metrics.uq_report`.
RANK_PREFIXES: tuple[str, ...] = ("failure_auroc", "auroc_", "aupr_", "fpr95_")
#: unit roundoff (half the spacing at 1) of each precision.
UNIT_ROUNDOFF: dict[str, float] = {"fp32": 2.0**-24, "fp16": 2.0**-11, "bf16": 2.0**-8,
                                   # INT8: half a step of a symmetric 8-bit grid over a tensor's range (1/254)
                                   "int8": 2.0**-8}
#: how many unit roundoffs a correct engine moves a score's inputs, per precision and input kind: the
#: largest move measured on 10 correct engines, rounded up (module docstring, step 1;
#: benchmarks/rank_gate/reach-own-checkpoint.json)
ULPS: dict[str, dict[str, float]] = {"fp32": {"probs": 69.0, "logits": 64.0},
                                     "fp16": {"probs": 5.0, "logits": 10.0},
                                     "bf16": {"probs": 8.0, "logits": 11.0},
                                     # INT8: the 0.99 quantile of the moves of correct INT8 engines, not their max
                                     # (docs/quantization.md; benchmarks/parity_tolerances/int8.py)
                                     "int8": {"probs": 121.0, "logits": 90.0}}
#: Monte Carlo draws of the calibrated bound (the bound is the LARGEST change over them), and the seed.
DRAWS = 1000
#: fewer draws than this with the metric defined (rounding alone leaves one class empty in the rest):
#: no bound can be stated and the check is not resolvable (too few failures, or OOD rows, to rank).
MIN_DEFINED = 100
SEED = 0
MOVES = 64  # rounded values of each sample's score that the draws pick from
_PER_PASS = 16  # moves computed at once (memory: [16, N, M, C] float64 member logits)
_CHUNK = 250  # draws per vectorised batch (memory: a few [250, n] float64 arrays)
_METRICS = ("auroc", "aupr", "fpr95")
_STREAMS = ("failure", "msp", "entropy", "mi", "disagreement")  # one random stream per score, by name
_CACHE: OrderedDict[str, dict[str, RankResolution]] = OrderedDict()  # a verdict judges many candidates
_CACHE_SIZE = 8  # against one reference: the draws are made once per (reference, precision, limits)


def reach_eps(precision: str, inputs: str = "probs") -> float:
    """How far a correct engine at ``precision`` moves a score's ``inputs`` (``probs`` | ``logits``), relative.

    ``ULPS[precision][inputs]`` unit roundoffs of the precision.
    """
    p = precision if precision in UNIT_ROUNDOFF else "fp32"
    return ULPS[p][inputs] * UNIT_ROUNDOFF[p]


def _rng(name: str, part: int = 0) -> np.random.Generator:
    """The seeded random stream of one score (and part): the same inputs always give the same bounds."""
    return np.random.default_rng([SEED, _STREAMS.index(name), part])


def is_rank_metric(metric: str) -> bool:
    """True for ``failure_auroc``, ``auroc_*``, ``aupr_*``, ``fpr95_*``."""
    from toolchain.metrics.registry import uq_metric

    known = uq_metric(metric)  # the registry's rank flag; a key it does not know: by its prefix
    return known.rank if known is not None else metric.startswith(RANK_PREFIXES[1:])


@dataclass(frozen=True)
class RankResolution:
    """How far rounding at the candidate's precision moves one rank metric on these samples."""

    metric: str
    precision: str
    score_delta: float  # the largest per-sample reach_i: how far rounding of the inputs moves a score
    score_spread: float  # max - min of the reference's scores (both groups)
    bound: float  # calibrated: the largest |metric change| over the draws of rounded scores where it is defined
    worst_case: float  # every score pushed by reach_i against (or for) the detector
    flat: bool  # every interval [s_i - reach_i, s_i + reach_i] shares one point: any order is rounding
    n_positive: int
    n_negative: int
    step: float  # the metric's resolution: 1/n_negative (fpr95), 1/(n_pos*n_neg) (auroc, aupr)
    draws: int  # Monte Carlo draws behind ``bound`` (0: skipped, the worst case is within the limit)
    undefined: int = 0  # draws in which rounding alone left no positive (or no negative): metric undefined

    @property
    def too_few(self) -> bool:
        """Rounding alone leaves the metric undefined in all but fewer than MIN_DEFINED draws: no bound."""
        return self.draws > 0 and self.draws - self.undefined < MIN_DEFINED

    def resolvable(self, limit: float) -> bool:
        """False for flat scores whose worst case exceeds ``limit``, and where too few draws are defined."""
        return not self.too_few and (not self.flat or self.worst_case <= limit)

    def allowed(self, limit: float) -> float:
        """The largest ``|delta|`` that passes on resolvable scores: ``max(limit, bound)``."""
        return max(limit, self.bound)

    def reason(self, limit: float) -> str:
        """One sentence for the verdict."""
        # one console line (the numbers behind it are in to_dict(): report.json)
        where = (f"(resolution {self.score_delta:.3g}, spread {self.score_spread:.3g}; "
                 f"{self.n_positive} pos/{self.n_negative} neg, step {self.step:.3g})")
        if self.too_few:
            return (f"too few {'failures' if self.metric == 'failure_auroc' else 'positives or negatives'} to "
                    f"rank {where}: {self.precision} rounding alone leaves one class empty in {self.undefined} "
                    f"of {self.draws} draws")
        if not self.resolvable(limit):
            return (f"flat reference scores {where}: {self.precision} rounding alone can move it by "
                    f"{self.worst_case:.4g} > {limit:.4g}")
        undefined = f", {self.undefined} undefined left out" if self.undefined else ""
        return (f"{self.precision} rounding {where} moves it by up to {self.bound:.4g} (the largest of "
                f"{self.draws} draws{undefined}; worst case {self.worst_case:.4g})")

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields."""
        return asdict(self)


# ------------------------------------------------------------------------------------ rank metrics


def rank_metrics(scores: np.ndarray, positive: np.ndarray) -> dict[str, np.ndarray]:
    """AUROC, AUPR and FPR95 of every row of ``scores`` at once (positives: higher score).

    Hand-written rather than scikit-learn's because the gate evaluates them on ``DRAWS`` rows of
    scores per metric: one ``argsort`` over ``[D, n]`` and a few cumulative sums replace ``D``
    calls of ``roc_auc_score`` / ``average_precision_score`` / ``roc_curve`` (about 50x faster).
    They follow :mod:`toolchain.metrics.ood` exactly, ties included (tests/parity/test_rank_gate.py
    checks equality to 1e-12): tied scores form one threshold; AUROC counts a tied positive/negative
    pair 1/2; AUPR is the step-wise ``sum_k (R_k - R_{k-1}) P_k`` over distinct thresholds; FPR95 is
    the FPR of the first threshold, in decreasing order, whose TPR ``tp / n_pos >= 0.95``.

    Args:
        scores: ``[n]`` or ``[D, n]`` scores (higher = more likely positive).
        positive: ``[n]`` booleans, the same labels for every row, or ``[D, n]``, one set per row.

    Returns:
        ``{"auroc": [D], "aupr": [D], "fpr95": [D]}`` float64; NaN in a row without both classes.
    """
    s = np.atleast_2d(np.asarray(scores, dtype=np.float64))
    pos = np.asarray(positive, dtype=bool)
    rows, n = s.shape
    if pos.shape not in ((n,), (rows, n)):
        raise ValueError(f"rank_metrics: labels of shape {pos.shape} for scores of shape {s.shape}")
    order = np.argsort(s, axis=1, kind="stable")[:, ::-1]  # decreasing; timsort: fast on nearly sorted draws
    ss = np.take_along_axis(s, order, axis=1)
    y = pos[order] if pos.ndim == 1 else np.take_along_axis(pos, order, axis=1)
    tied = ss[:, 1:] == ss[:, :-1]
    n_pos = pos.sum(axis=-1)
    if pos.ndim == 1 and 0 < n_pos < n and not tied.any():  # the usual case for draws: no ties, one label set
        # the positives' positions, row by row in decreasing score: the r-th positive (0-based) at
        # position q has q - r negatives above it, and the metrics need nothing else
        n_pos = int(n_pos)
        n_neg = n - n_pos
        q = np.nonzero(y)[1].reshape(rows, n_pos)
        r = np.arange(n_pos)
        pairs = n_pos * n_neg - (q.sum(axis=1) - n_pos * (n_pos - 1) // 2)  # (positive, negative) pairs in order
        k = int(np.argmax((r + 1) / n_pos >= TPR_TARGET))  # the same float comparison as metrics.ood
        return {"auroc": pairs / (n_pos * n_neg), "aupr": ((r + 1) / (q + 1.0)).sum(axis=1) / n_pos,
                "fpr95": (q[:, k] - k) / n_neg}
    n_pos = np.broadcast_to(n_pos, (rows,)).astype(np.float64)
    n_neg = n - n_pos
    with np.errstate(invalid="ignore", divide="ignore"):
        undefined = np.where((n_pos == 0) | (n_neg == 0), np.nan, 0.0)
        idx = np.arange(n)
        last = np.ones((rows, n), dtype=bool)  # the last position of each run of tied scores (a threshold)
        last[:, :-1] = ~tied
        tp = np.cumsum(y, axis=1)  # positives at or above each position
        if tied.any():
            end = np.minimum.accumulate(np.where(last, idx, n)[:, ::-1], axis=1)[:, ::-1]  # its threshold's position
            first = np.ones((rows, n), dtype=bool)
            first[:, 1:] = ~tied
            start = np.maximum.accumulate(np.where(first, idx, 0), axis=1)
            tp_end = np.take_along_axis(tp, end, axis=1)
            tp_before = np.take_along_axis(tp - y, start, axis=1)  # positives strictly above the tie
        else:  # every position is its own threshold (labels that differ by row, e.g. failure AUROC's draws)
            end, tp_end, tp_before = np.broadcast_to(idx, (rows, n)), tp, tp - y
        # each negative: the positives above it, ties counted 1/2 (integers until the one division)
        auroc = np.where(y, 0, tp_before + tp_end).sum(axis=1) / (2.0 * n_pos * n_neg)
        # each positive adds recall 1/n_pos at its threshold's precision
        aupr = np.where(y, tp_end / (end + 1.0), 0.0).sum(axis=1) / n_pos
        reached = last & (tp / n_pos[:, None] >= TPR_TARGET)  # the same float comparison as metrics.ood
        k = reached.argmax(axis=1)
        fp = k + 1 - tp[np.arange(rows), k]
        return {"auroc": auroc + undefined, "aupr": aupr + undefined, "fpr95": fp / n_neg + undefined}


# --------------------------------------------------------------------------- score resolution d_i


def _alternating(shape: tuple[int, ...]) -> np.ndarray:
    """+-1 in a checkerboard over every axis but the first (members AND classes differ in sign)."""
    grids = np.indices(shape[1:]).sum(axis=0)
    return np.where(grids % 2 == 0, 1.0, -1.0)


def _perturbed_probs(probs: np.ndarray, eps: float) -> np.ndarray:
    out = probs * (1.0 + eps * _alternating(probs.shape))
    return np.clip(out, 0.0, None) / np.clip(out, 0.0, None).sum(axis=-1, keepdims=True)


def _perturbed_logits(logits: np.ndarray, eps: float) -> np.ndarray:
    return logits + eps * np.maximum(np.abs(logits), 1.0) * _alternating(logits.shape)


def score_resolution(score: Callable[[np.ndarray], np.ndarray], x: np.ndarray, precision: str,
                     inputs: str = "probs") -> np.ndarray:
    """Per sample ``d_i``: the largest change of ``score(x)`` under the +-K-ulp perturbation of its inputs.

    Args:
        score: maps ``x`` to ``[N]`` scores.
        x: ``[N, C]`` probabilities (``inputs="probs"``) or ``[N, M, C]`` member logits (``"logits"``).
        precision: ``fp32`` | ``fp16`` | ``bf16``.
        inputs: ``probs`` or ``logits``: how the inputs are perturbed (module docstring, step 1).
    """
    eps = reach_eps(precision, inputs)
    perturb = _perturbed_probs if inputs == "probs" else _perturbed_logits
    base = score(x)
    return np.maximum(np.abs(score(perturb(x, eps)) - base), np.abs(score(perturb(x, -eps)) - base))


# ------------------------------------------------------------------------------------------ bounds


def _moves(score: Callable[[np.ndarray], np.ndarray], x: np.ndarray, inputs: str, eps: float,
           rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """``MOVES`` rounded values of every sample's score, and of its predicted class: ``([R, N], [R, N])``.

    Each is ``score`` recomputed with every input moved by an independent amount uniform within its
    resolution: probabilities by a relative ``[-eps, eps]`` (renormalised), member logits by
    ``[-eps, eps] * max(|z|, 1)``.
    """
    scores, classes = [], []
    for _ in range(MOVES // _PER_PASS):
        noise = rng.uniform(-eps, eps, (_PER_PASS, *x.shape))
        if inputs == "probs":
            moved = x * (1.0 + noise)
            moved /= moved.sum(axis=-1, keepdims=True)
            classes.append(moved.argmax(axis=-1))
        else:
            moved = x + noise * np.maximum(np.abs(x), 1.0)
        scores.append(score(moved.reshape(-1, *x.shape[1:])).reshape(_PER_PASS, len(x)))
    return np.concatenate(scores), (np.concatenate(classes) if classes else np.zeros(0))


def _group(s: np.ndarray, pos: np.ndarray, moved: np.ndarray, moved_pos: np.ndarray | None, reach: np.ndarray,
           limits: Mapping[str, float] | None, keys: Mapping[str, str],
           rng: np.random.Generator) -> dict[str, tuple[float, float, int, int]]:
    """``{metric: (worst case, calibrated bound, draws, undefined draws)}`` of one score on one sample set.

    ``moved [R, n]``: each sample's rounded scores (:func:`_moves`); ``moved_pos [R, n]``: whether
    it is positive in each (failure AUROC: whether the prediction is wrong), None: never changes;
    ``reach [n]``: how far each score can move (no drawn score moves further).
    """
    ref = rank_metrics(s, pos)
    sign = np.where(pos, 1.0, -1.0)
    pushed = rank_metrics(np.stack([s - sign * reach, s + sign * reach]), pos)  # against, then for, the detector
    worst = {m: float(np.abs(pushed[m] - ref[m]).max()) for m in keys}
    flips = moved_pos is not None and bool((moved_pos != pos).any())
    if not flips and limits is not None and all(worst[m] <= limits.get(key, 0.0) for m, key in keys.items()):
        return {m: (worst[m], worst[m], 0, 0) for m in keys}
    by_score = np.argsort(s, kind="stable")  # then every draw is nearly sorted: a faster argsort
    moved = moved[:, by_score]
    moved_pos = moved_pos[:, by_score] if flips else pos[by_score]
    columns = np.arange(len(s))
    changes: dict[str, list[np.ndarray]] = {m: [] for m in keys}
    for done in range(0, DRAWS, _CHUNK):
        pick = rng.integers(0, MOVES, (min(_CHUNK, DRAWS - done), len(s)))  # each sample: one of its moves
        got = rank_metrics(moved[pick, columns], moved_pos[pick, columns] if flips else moved_pos)
        for m in keys:
            changes[m].append(np.abs(got[m] - ref[m]))
    out = {}
    for m in keys:
        every = np.concatenate(changes[m])
        defined = every[~np.isnan(every)]  # a draw where rounding left one class empty has no metric to
        undefined = int(every.size - defined.size)  # compare: counted, never taken as a change of 1.0
        bound = float(defined.max()) if defined.size else math.inf
        out[m] = (max(worst[m], bound) if defined.size else worst[m], bound, DRAWS, undefined)
    return out


def rank_resolutions(
    probs_id: np.ndarray,
    labels_id: np.ndarray,
    probs_ood: np.ndarray | None,
    members_id: np.ndarray | None,
    members_ood: np.ndarray | None,
    precision: str,
    limits: Mapping[str, float] | None = None,
) -> dict[str, RankResolution]:
    """One :class:`RankResolution` per rank metric of the reference's report (see the module docstring).

    The arguments are the REFERENCE's UQ inputs, as given to :func:`toolchain.metrics.uq_report`.

    Args:
        probs_id: ``[N, C]`` ID probabilities.
        labels_id: ``[N]`` ID labels.
        probs_ood: ``[N_ood, C]`` OOD probabilities, or None.
        members_id: ``[N, M, C]`` member logits on ID, or None.
        members_ood: ``[N_ood, M, C]`` member logits on OOD, or None.
        precision: the candidate's precision, ``fp32`` | ``fp16`` | ``bf16``.
        limits: metric -> its tolerance on this reference; a score whose metrics' worst cases are all
            within their limits skips the draws (``bound = worst_case``, ``draws = 0``). None: always draw.

    The result is remembered for the last few (inputs, precision, limits): a verdict judges many
    candidates against one reference, and the draws are the costly part (about 0.1 s per score).
    """
    labels = np.asarray(labels_id)
    digest = hashlib.sha256(repr((precision, sorted((limits or {}).items()), labels.dtype.str)).encode())
    for a in (probs_id, labels, probs_ood, members_id, members_ood):
        digest.update(b"-" if a is None else np.ascontiguousarray(a).tobytes() + repr(np.shape(a)).encode())
    key = digest.hexdigest()
    if key in _CACHE:
        _CACHE.move_to_end(key)
        return dict(_CACHE[key])
    out = _resolutions(probs_id, labels, probs_ood, members_id, members_ood, precision, limits)
    _CACHE[key] = out
    while len(_CACHE) > _CACHE_SIZE:
        _CACHE.popitem(last=False)
    return dict(out)


def _resolutions(probs_id: np.ndarray, labels: np.ndarray, probs_ood: np.ndarray | None,
                 members_id: np.ndarray | None, members_ood: np.ndarray | None, precision: str,
                 limits: Mapping[str, float] | None) -> dict[str, RankResolution]:
    out: dict[str, RankResolution] = {}
    eps = reach_eps(precision)  # of probabilities; member logits: reach_eps(precision, "logits")
    # (score name, {metric: report key}, scores s_i (higher: positive), positive mask, rounded scores [R, n],
    #  rounded positive masks [R, n] or None, d_i)
    groups: list[tuple[str, dict[str, str], np.ndarray, np.ndarray, np.ndarray, np.ndarray | None, np.ndarray]] = []
    wrong = probs_id.argmax(axis=1) != labels
    if wrong.any() and not wrong.all():  # misclassification detection: errors positive, score -MSP
        moved, classes = _moves(msp_score, probs_id, "probs", eps, _rng("failure"))
        groups.append(("failure", {"auroc": "failure_auroc"}, msp_score(probs_id), wrong, moved, classes != labels,
                       score_resolution(msp_score, probs_id, precision)))
    sources: list[tuple[str, Callable[[np.ndarray], np.ndarray], str, Any, Any]] = []
    if probs_ood is not None:
        sources += [("msp", msp_score, "probs", probs_id, probs_ood),
                    ("entropy", entropy_score, "probs", probs_id, probs_ood)]
    if members_id is not None and members_ood is not None:
        sources += [("mi", mutual_information, "logits", members_id, members_ood),
                    ("disagreement", disagreement, "logits", members_id, members_ood)]
    for name, score, inputs, x_id, x_ood in sources:  # OOD detection: OOD positive, higher = more OOD
        rng = _rng(name)
        s = np.concatenate([score(x_id), score(x_ood)])
        d = np.concatenate([score_resolution(score, x_id, precision, inputs),
                            score_resolution(score, x_ood, precision, inputs)])
        e = reach_eps(precision, inputs)
        moved = np.concatenate([_moves(score, x_id, inputs, e, rng)[0], _moves(score, x_ood, inputs, e, rng)[0]],
                               axis=1)
        pos = np.r_[np.zeros(len(x_id), bool), np.ones(len(x_ood), bool)]
        groups.append((name, {m: f"{m}_{name}" for m in _METRICS}, s, pos, moved, None, d))
    for name, keys, s, pos, moved, moved_pos, d in groups:
        reach = np.maximum(d, np.abs(moved - s).max(axis=0))
        values = _group(s, pos, moved, moved_pos, reach, limits, keys, _rng(name, 1))
        n_pos, n_neg = int(pos.sum()), int((~pos).sum())
        flat = bool(np.max(s - reach) < np.min(s + reach))  # every interval [s - reach, s + reach] overlaps
        for metric, key in keys.items():
            worst, bound, draws, undefined = values[metric]
            step = 1.0 / n_neg if metric == "fpr95" else 1.0 / (n_pos * n_neg)
            out[key] = RankResolution(key, precision, float(reach.max()), float(np.ptp(s)), bound, worst, flat,
                                      n_pos, n_neg, step, draws, undefined)
    return out
