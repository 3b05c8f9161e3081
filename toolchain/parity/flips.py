"""Prediction flips: which of the reference's predictions rounding at a precision can change.

Accuracy, ECE and failure AUROC jump when a prediction changes class: one flip moves accuracy by
exactly ``1/N`` and a paired ECE (:func:`toolchain.metrics.classification.paired_ece`) by at most
``1/N``. A correct FP16/BF16 engine flips the predictions whose top two probabilities lie within
rounding of each other (near-ties), so a fixed tolerance smaller than one sample (accuracy's 0.003
on 300 rows) cries wolf on a correct engine, and one larger than the near-ties lets a broken engine
flip clear predictions. This module decides, from the REFERENCE's probabilities and the candidate's
precision only, which predictions rounding can flip; the candidate's outputs are used only to count
which predictions it did change.

The rule
--------
1. Reach: every probability moves by a relative ``eps = ULPS[p]["probs"] * u`` (the rank metrics' reach,
   :func:`toolchain.parity.resolution.reach_eps`, measured per precision). Sample ``i`` with top two
   reference probabilities ``p1 >= p2`` is **flippable** when ``p1 (1 - eps) <= p2 (1 + eps)``: the
   two can swap when they move apart by their reach in opposite directions.
2. Within reach: a flippable correct prediction can become wrong (``can_lose``); a flippable wrong
   one whose runner-up is the label can become right (``can_gain``).
3. Verdict, with ``limit`` the metric's tolerance (:class:`~toolchain.parity.tolerances.MetricTolerance`):

   * **accuracy**: the change passes within ``[-max(limit, can_lose/N), +max(limit, can_gain/N)]``,
     AND the candidate changed at most ``floor(limit * N)`` predictions that are NOT flippable
     (clear-margin flips: the tolerance read as a number of samples, so at 300 rows and 0.003 none);
   * **ECE** (paired, in the reference's bins): ``|delta| <= limit + k/N`` with ``k`` the flippable
     predictions the candidate did change (the tolerance covers the confidences' rounding, each such
     flip adds at most ``1/N``; near-ties it left alone explain nothing);
   * **failure AUROC** defined on one side only (the reference has no error and the candidate one,
     or the other way round): not resolvable (too few failures to rank) when every changed
     prediction is flippable; a clear-margin flip fails it.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from toolchain.parity.resolution import reach_eps

__all__ = ["FLIP_METRICS", "FlipResolution", "flip_resolution"]

#: metrics that a changed prediction moves by a jump of 1/N (besides failure AUROC, a rank metric)
FLIP_METRICS: tuple[str, ...] = ("accuracy", "ece")


@dataclass(frozen=True)
class FlipResolution:
    """Which of the reference's ``n`` predictions rounding at ``precision`` can flip, and what the candidate flipped."""

    precision: str
    eps: float  # relative reach of every probability
    n: int
    flippable: int  # top-two margin within reach
    can_lose: int  # flippable and correct
    can_gain: int  # flippable, wrong, runner-up is the label
    changed: int  # predictions the candidate changed
    clear_flips: int  # of those, not flippable: beyond what rounding can do
    clear_rows: tuple[int, ...] = ()  # the first few such rows (positions in the ID rows)

    def clear_allowed(self, limit: float) -> int:
        """Clear-margin flips a tolerance ``limit`` admits: ``floor(limit * n)`` (0 when below one sample)."""
        return math.floor(limit * self.n + 1e-9)

    def accuracy_window(self, limit: float) -> tuple[float, float]:
        """``(lowest, highest)`` accuracy change that rounding (or the tolerance) explains."""
        return -max(limit, self.can_lose / self.n), max(limit, self.can_gain / self.n)

    @property
    def near_tie_flips(self) -> int:
        """Changed predictions that rounding can flip."""
        return self.changed - self.clear_flips

    def ece_allowed(self, limit: float) -> float:
        """``limit + near_tie_flips / n``: each flip within rounding moves a paired ECE by at most 1/n."""
        return limit + self.near_tie_flips / self.n

    def describe(self) -> str:
        """One clause for the verdict line."""
        return (f"{self.flippable} of {self.n} predictions within {self.precision} rounding of a tie "
                f"({self.can_lose} can turn wrong, {self.can_gain} right); the candidate changed {self.changed}, "
                f"{self.clear_flips} of them clear of a tie")

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields."""
        out = asdict(self)
        out["clear_rows"] = list(self.clear_rows)
        return out


def _flippable(probs: np.ndarray, eps: float) -> tuple[np.ndarray, np.ndarray]:
    """``(flippable [N], runner-up class [N])`` of reference probabilities ``[N, C]``."""
    if probs.shape[-1] < 2:
        return np.zeros(len(probs), bool), np.zeros(len(probs), int)
    top2 = np.argsort(probs, axis=1, kind="stable")[:, ::-1][:, :2]
    p1 = np.take_along_axis(probs, top2[:, :1], axis=1)[:, 0]
    p2 = np.take_along_axis(probs, top2[:, 1:2], axis=1)[:, 0]
    return p1 * (1.0 - eps) <= p2 * (1.0 + eps), top2[:, 1]


def flip_resolution(reference: np.ndarray, labels: np.ndarray, candidate: np.ndarray | None,
                    precision: str) -> FlipResolution:
    """The flip analysis of the module docstring.

    Args:
        reference: ``[N, C]`` the reference's probabilities.
        labels: ``[N]`` integer labels.
        candidate: ``[N, C]`` the candidate's probabilities (or logits: only the argmax is read), or
            None (nothing changed: the counts of what rounding can do only).
        precision: the candidate's precision.
    """
    ref = np.asarray(reference, dtype=np.float64)
    y = np.asarray(labels)
    eps = reach_eps(precision)
    flip, runner_up = _flippable(ref, eps)
    pred = ref.argmax(axis=1)
    correct = pred == y
    changed = np.zeros(len(ref), bool)
    if candidate is not None:
        cand = np.asarray(candidate)
        if cand.shape == ref.shape:
            with np.errstate(invalid="ignore"):
                changed = cand.argmax(axis=1) != pred
    clear = np.flatnonzero(changed & ~flip)
    return FlipResolution(precision, eps, len(ref), int(flip.sum()), int((flip & correct).sum()),
                          int((flip & ~correct & (runner_up == y)).sum()), int(changed.sum()), int(clear.size),
                          tuple(int(i) for i in clear[:10]))
