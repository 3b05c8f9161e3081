"""Rank-metric resolution: how far rounding at a precision can move a rank metric on given samples.

Rank metrics (``failure_auroc``, ``auroc_*``, ``aupr_*``, ``fpr95_*``) depend only on the ORDER of
per-sample scores. A correct FP16/BF16 engine moves every score a little; where reference scores
lie closer together than that, their order in the candidate is rounding noise and so is the
metric's delta. This module decides, from the REFERENCE's outputs and the candidate's precision
only (never from the candidate's outputs, so a broken engine cannot make itself unjudgeable),
how far rounding alone can move each rank metric.

The rule
--------
1. Score resolution ``delta_i`` of sample ``i`` at precision ``p`` (unit roundoff ``u``: fp32
   2^-24, fp16 2^-11, bf16 2^-8): the largest change of its score when the score's inputs are
   perturbed by ``K = 4`` unit roundoffs (2 ulps) of ``p`` with alternating signs along
   the class axis: probabilities by ``K*u*p`` (the MSP, entropy and failure scores), member
   logits by ``K*u*max(|z|, 1)`` (mutual information, disagreement). ``K = 4`` is the measured
   largest error of correct engines: true FP16 arithmetic moved probabilities by <= 1.9e-3 at
   p ~ 0.9 (4.3 u), true BF16 by <= 1.9e-2 (5 u at p ~ 0.9, less at higher p) (see :mod:`.tolerances`).
   A discrete score (disagreement) gets ``delta_i`` > 0 only where a member's argmax can flip.
2. Rounding bound ``bound``: the metric recomputed with each reference score pushed by its
   ``delta_i`` against the detector (positives down, negatives up) and for it; ``bound`` is the
   larger of the two distances from the reference's value. Every rank metric is monotone in
   such shifts, so no engine whose scores stay within ``delta_i`` of the reference's can move the
   metric further. ``bound`` accounts for the number of samples too: one sample that can cross
   the threshold moves FPR95 by ``1/n_negatives`` (its resolution), a pair moves AUROC by
   ``1/(n_pos*n_neg)``.
3. Verdict of the rank check, with ``limit`` its tolerance: ``|delta_metric| > bound`` fails (more
   than rounding can do: a broken engine, however flat the scores); otherwise, when
   ``bound > limit`` the check is **not resolvable** (neither pass nor fail: the gate cannot
   separate rounding from breakage on these samples at this precision; the numeric checks still
   gate), else the ordinary ``|delta_metric| <= limit`` rule decides.

Example: a near-untrained model whose mean confidences span 0.33648-0.33657 (9e-5, below FP16's
spacing of 2.4e-4 at 0.34): every score's resolution covers the whole spread, so ``bound`` is of
the order of the metric's range and its rank checks are not resolvable (tests/parity/
test_parity_resolution.py). Scores spread over [0.4, 1] on 200 + 200 samples give bounds of
0.002-0.006 at FP16 (gated, tolerance 0.005-0.01) and 0.01-0.055 at BF16 (mostly not
resolvable at the default tolerances: BF16's 8 bits cannot resolve AUROC to 0.005 in the worst
case; a change beyond the bound still fails).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from toolchain.metrics import disagreement, entropy_score, msp_score, mutual_information
from toolchain.metrics.ood import failure_auroc, ood_metrics

__all__ = ["RANK_PREFIXES", "ULPS", "UNIT_ROUNDOFF", "RankResolution", "is_rank_metric", "rank_resolutions"]

#: metric name prefixes of the rank (order-only) metrics of :func:`toolchain.metrics.uq_report`.
RANK_PREFIXES: tuple[str, ...] = ("failure_auroc", "auroc_", "aupr_", "fpr95_")
#: unit roundoff (half the spacing at 1) of each precision.
UNIT_ROUNDOFF: dict[str, float] = {"fp32": 2.0**-24, "fp16": 2.0**-11, "bf16": 2.0**-8}
#: a correct engine's score inputs move by about this many unit roundoffs (measured, see the docstring).
ULPS = 4.0


def is_rank_metric(metric: str) -> bool:
    """True for ``failure_auroc``, ``auroc_*``, ``aupr_*``, ``fpr95_*``."""
    from toolchain.metrics.registry import uq_metric

    known = uq_metric(metric)  # the registry's rank flag; a key it does not know: by its prefix
    return known.rank if known is not None else metric.startswith(RANK_PREFIXES[1:])


@dataclass(frozen=True)
class RankResolution:
    """How far rounding at the candidate's precision can move one rank metric on these samples."""

    metric: str
    precision: str
    score_delta: float  # the largest per-sample score resolution: K ulps of the inputs, propagated
    score_spread: float  # max - min of the reference's scores (both groups)
    bound: float  # the largest metric change an engine within score_delta can cause
    n_positive: int
    n_negative: int
    step: float  # the metric's resolution: 1/n_negative (fpr95), 1/(n_pos*n_neg) (auroc, aupr)

    def resolvable(self, limit: float) -> bool:
        """True when rounding alone cannot move the metric past ``limit``."""
        return self.bound <= limit

    def reason(self, limit: float) -> str:
        """One sentence for the verdict."""
        return (f"rounding at {self.precision} (score resolution {self.score_delta:.3g}, reference scores spread "
                f"{self.score_spread:.3g}) can move it by up to {self.bound:.4g} > allowed {limit:.4g} on "
                f"{self.n_positive} positive / {self.n_negative} negative samples (metric step {self.step:.3g})")

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields."""
        return asdict(self)


def _alternating(shape: tuple[int, ...]) -> np.ndarray:
    """+-1 in a checkerboard over every axis but the first (members AND classes differ in sign)."""
    grids = np.indices(shape[1:]).sum(axis=0)
    return np.where(grids % 2 == 0, 1.0, -1.0)


def _perturbed_probs(probs: np.ndarray, eps: float) -> np.ndarray:
    out = probs * (1.0 + eps * _alternating(probs.shape))
    return np.clip(out, 0.0, None) / np.clip(out, 0.0, None).sum(axis=-1, keepdims=True)


def _perturbed_logits(logits: np.ndarray, eps: float) -> np.ndarray:
    return logits + eps * np.maximum(np.abs(logits), 1.0) * _alternating(logits.shape)


def _score_delta(score: Callable[[np.ndarray], np.ndarray], x: np.ndarray,
                 perturb: Callable[[np.ndarray, float], np.ndarray], eps: float) -> np.ndarray:
    """Per sample: the largest change of its score under the +-eps perturbation of its inputs."""
    base = score(x)
    return np.maximum(np.abs(score(perturb(x, eps)) - base), np.abs(score(perturb(x, -eps)) - base))


def _ood_bound(s_id: np.ndarray, s_ood: np.ndarray, d_id: np.ndarray, d_ood: np.ndarray,
               ref: dict[str, float]) -> dict[str, float]:
    worse = ood_metrics(s_id + d_id, s_ood - d_ood)  # OOD positive, higher = more OOD
    better = ood_metrics(s_id - d_id, s_ood + d_ood)
    return {k: max(abs(worse[k] - ref[k]), abs(better[k] - ref[k])) for k in ref}


def rank_resolutions(
    probs_id: np.ndarray,
    labels_id: np.ndarray,
    probs_ood: np.ndarray | None,
    members_id: np.ndarray | None,
    members_ood: np.ndarray | None,
    precision: str,
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
    """
    eps = ULPS * UNIT_ROUNDOFF.get(precision, UNIT_ROUNDOFF["fp32"])
    out: dict[str, RankResolution] = {}
    n_id = len(labels_id)

    def failure_score(p: np.ndarray) -> np.ndarray:
        return -msp_score(p)

    wrong = probs_id.argmax(axis=1) != labels_id
    if wrong.any() and not wrong.all():
        delta = _score_delta(failure_score, probs_id, _perturbed_probs, eps)
        s = failure_score(probs_id)
        ref = failure_auroc(probs_id, labels_id, score=s)
        shifted = [failure_auroc(probs_id, labels_id, score=s + sign * delta * np.where(wrong, -1.0, 1.0))
                   for sign in (1.0, -1.0)]
        n_pos = int(wrong.sum())
        out["failure_auroc"] = RankResolution("failure_auroc", precision, float(delta.max()), float(np.ptp(s)),
                                              max(abs(v - ref) for v in shifted), n_pos, n_id - n_pos,
                                              1.0 / (n_pos * (n_id - n_pos)))
    groups: list[tuple[str, Callable[[np.ndarray], np.ndarray], Callable[..., np.ndarray], Any, Any]] = []
    if probs_ood is not None:
        groups += [("msp", msp_score, _perturbed_probs, probs_id, probs_ood),
                   ("entropy", entropy_score, _perturbed_probs, probs_id, probs_ood)]
    if members_id is not None and members_ood is not None:
        groups += [("mi", mutual_information, _perturbed_logits, members_id, members_ood),
                   ("disagreement", disagreement, _perturbed_logits, members_id, members_ood)]
    for name, score, perturb, x_id, x_ood in groups:
        d_id, d_ood = _score_delta(score, x_id, perturb, eps), _score_delta(score, x_ood, perturb, eps)
        s_id, s_ood = score(x_id), score(x_ood)
        ref = ood_metrics(s_id, s_ood)
        bounds = _ood_bound(s_id, s_ood, d_id, d_ood, ref)
        delta = float(max(d_id.max(), d_ood.max()))
        spread = float(np.ptp(np.concatenate([s_id, s_ood])))
        n_pos, n_neg = len(s_ood), len(s_id)
        for metric in ("auroc", "aupr", "fpr95"):
            step = 1.0 / n_neg if metric == "fpr95" else 1.0 / (n_pos * n_neg)
            key = f"{metric}_{name}"
            out[key] = RankResolution(key, precision, delta, spread, bounds[metric], n_pos, n_neg, step)
    return out
