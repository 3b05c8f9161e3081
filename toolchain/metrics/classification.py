"""Classification and calibration metrics from predicted probabilities.

All functions take ``probs`` of shape ``[N, C]`` (float, rows sum to 1; for an ensemble pass the
mean of the members' softmax probabilities) and integer ``labels`` of shape ``[N]`` in
``[0, C)``, validate them at entry (:class:`~toolchain.metrics.MetricInputError`, a
``ValueError``) and compute in float64. Conventions (REFERENCE.md section 4):

* **Prediction** = ``argmax_c probs[n, c]``; ties go to the lowest class index (``np.argmax``).
* **NLL** = ``-mean_n log(max(p_{n, y_n}, eps))`` with ``eps = 1e-12`` (natural log). The true-class
  probability is clipped from below only; a zero probability contributes
  ``-log(1e-12) = 27.631021115928547``. (scikit-learn's ``log_loss`` clips at 2.2e-16 instead.)
* **Brier** = ``mean_n sum_c (p_{n,c} - onehot(y_n)_c)^2``, in ``[0, 2]``. Not halved for two
  classes (scikit-learn's binary ``brier_score_loss`` is half of this).
* **ECE** = top-label, L1: ``sum_b (|B_b| / N) * |acc(B_b) - conf(B_b)|`` over ``n_bins``
  equal-width bins (15 by default). Bin rule: **[lo, hi)**, except that the last bin is closed,
  ``[lo, 1]``. Bin edges are ``i / n_bins`` computed in float64 (correctly rounded), and the
  confidences are compared in float64, so a confidence of exactly ``0.2``, ``0.4`` or ``7/15``
  (the float64 nearest those values) falls in the bin that *starts* at that edge.
  A confidence of exactly ``1.0`` is in the last bin, with the rest of ``[lo, 1]``: the usual
  convention (Guo et al. 2017's reference code, whose bins are (lo, hi], does the same).
  Where this differs from other libraries: torchmetrics (``_binning_bucketize``:
  ``torch.bucketize(conf, linspace(0, 1, n_bins + 1), right=True) - 1`` into ``n_bins + 1``
  slots) uses the same [lo, hi) rule for the inner edges (computed in float32), but it puts a
  confidence of exactly 1.0 in an extra bin of its own (``{1.0}``), so its ECE differs from
  this one whenever some confidences are exactly 1.0 and others share the last bin (e.g. one
  wrong prediction at confidence 1.0 and one right one at 0.95: 0.525 there, 0.475 here). Guo
  et al.'s (lo, hi] differs from this rule only for confidences lying exactly on an inner edge.
  ``tests/metrics/test_metrics_classification.py`` pins both differences.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike

from toolchain.metrics._validation import MetricInputError, as_labels, as_n_bins, as_probs

#: Lower clip on the true-class probability in :func:`nll`.
NLL_EPS = 1e-12
#: Default number of equal-width confidence bins for ECE and reliability diagrams.
DEFAULT_N_BINS = 15


@dataclass(frozen=True)
class ReliabilityBins:
    """Per-bin statistics of a top-label reliability diagram.

    Attributes:
        edges: ``[n_bins + 1]`` float64 bin edges ``i / n_bins``; bin ``b`` is
            ``[edges[b], edges[b+1])``, the last bin is ``[edges[-2], 1]``.
        confidence: ``[n_bins]`` mean top-label confidence of the samples in each bin (NaN if empty).
        accuracy: ``[n_bins]`` fraction of correct predictions in each bin (NaN if empty).
        count: ``[n_bins]`` int64 number of samples in each bin (sums to N).
    """

    edges: np.ndarray
    confidence: np.ndarray
    accuracy: np.ndarray
    count: np.ndarray

    @property
    def n_bins(self) -> int:
        """Number of bins."""
        return int(self.count.shape[0])

    @property
    def ece(self) -> float:
        """Expected calibration error of these bins (empty bins contribute 0)."""
        total = int(self.count.sum())
        nonempty = self.count > 0
        gaps = np.abs(self.accuracy[nonempty] - self.confidence[nonempty])
        return float(np.sum(self.count[nonempty] / total * gaps))


def _probs_labels(probs: ArrayLike, labels: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    p = as_probs("probs", probs)
    y = as_labels("labels", labels, p.shape[0], p.shape[1])
    return p, y


def accuracy(probs: ArrayLike, labels: ArrayLike) -> float:
    """Top-1 accuracy.

    Args:
        probs: ``[N, C]`` class probabilities.
        labels: ``[N]`` integer labels in ``[0, C)``.

    Returns:
        Fraction of samples whose argmax class (lowest index on ties) equals the label, in [0, 1].
    """
    p, y = _probs_labels(probs, labels)
    return float(np.mean(np.argmax(p, axis=1) == y))


def nll(probs: ArrayLike, labels: ArrayLike, eps: float = NLL_EPS) -> float:
    """Negative log-likelihood ``-mean_n log(max(p_{n, y_n}, eps))`` (natural log).

    Args:
        probs: ``[N, C]`` class probabilities.
        labels: ``[N]`` integer labels in ``[0, C)``.
        eps: lower clip on the true-class probability (default 1e-12), so a zero probability
            gives the finite value ``-log(eps)`` (27.631021115928547 for the default).

    Returns:
        The mean NLL, in ``[0, -log(eps)]``.
    """
    if not (isinstance(eps, float | int) and 0.0 < eps < 1.0):
        raise MetricInputError(f"eps: expected a float in (0, 1), got {eps!r}.")
    p, y = _probs_labels(probs, labels)
    p_true = p[np.arange(p.shape[0]), y]
    return float(-np.mean(np.log(np.clip(p_true, eps, 1.0))))


def brier(probs: ArrayLike, labels: ArrayLike) -> float:
    """Multi-class Brier score ``mean_n sum_c (p_{n,c} - onehot(y_n)_c)^2`` (not halved).

    Args:
        probs: ``[N, C]`` class probabilities.
        labels: ``[N]`` integer labels in ``[0, C)``.

    Returns:
        The Brier score, in [0, 2]. For two classes this is twice scikit-learn's binary
        ``brier_score_loss`` (equal to ``brier_score_loss(..., scale_by_half=False)``).
    """
    p, y = _probs_labels(probs, labels)
    diff = p.copy()
    diff[np.arange(p.shape[0]), y] -= 1.0
    return float(np.mean(np.sum(diff * diff, axis=1)))


def bin_edges(n_bins: int = DEFAULT_N_BINS) -> np.ndarray:
    """Equal-width confidence bin edges ``[i / n_bins for i in 0..n_bins]`` in float64.

    Each edge is the correctly rounded float64 of the rational ``i / n_bins``, so it compares
    equal to a literal such as ``0.2`` or ``7 / 15``.
    """
    n_bins = as_n_bins(n_bins)
    return np.arange(n_bins + 1, dtype=np.float64) / n_bins


def bin_index(confidences: np.ndarray, n_bins: int) -> np.ndarray:
    """Bin of each confidence in ``[0, 1]`` under the [lo, hi) rule (last bin closed at 1).

    Args:
        confidences: ``[N]`` values in [0, 1] (compared in float64).
        n_bins: number of equal-width bins.

    Returns:
        ``[N]`` int64 bin indices in ``[0, n_bins)``.
    """
    edges = bin_edges(n_bins)
    conf = np.asarray(confidences, dtype=np.float64)
    # side="right": an exact edge value e_b goes to the bin [e_b, e_{b+1}).
    idx = np.searchsorted(edges, conf, side="right") - 1
    return np.clip(idx, 0, n_bins - 1).astype(np.int64)


def reliability_bins(probs: ArrayLike, labels: ArrayLike, n_bins: int = DEFAULT_N_BINS) -> ReliabilityBins:
    """Top-label reliability statistics over ``n_bins`` equal-width confidence bins.

    Args:
        probs: ``[N, C]`` class probabilities.
        labels: ``[N]`` integer labels in ``[0, C)``.
        n_bins: number of bins (default 15); bin rule [lo, hi), last bin [lo, 1].

    Returns:
        A :class:`ReliabilityBins` with per-bin mean confidence, accuracy (NaN for empty bins)
        and sample count; ``.ece`` gives the ECE.
    """
    n_bins = as_n_bins(n_bins)
    p, y = _probs_labels(probs, labels)
    conf = p.max(axis=1)
    correct = (np.argmax(p, axis=1) == y).astype(np.float64)
    idx = bin_index(conf, n_bins)
    count = np.bincount(idx, minlength=n_bins).astype(np.int64)
    conf_sum = np.bincount(idx, weights=conf, minlength=n_bins)
    acc_sum = np.bincount(idx, weights=correct, minlength=n_bins)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean_conf = np.where(count > 0, conf_sum / count, np.nan)
        mean_acc = np.where(count > 0, acc_sum / count, np.nan)
    return ReliabilityBins(edges=bin_edges(n_bins), confidence=mean_conf, accuracy=mean_acc, count=count)


def ece(probs: ArrayLike, labels: ArrayLike, n_bins: int = DEFAULT_N_BINS) -> float:
    """Top-label expected calibration error (L1), equal-width bins.

    ``ECE = sum_b (|B_b| / N) * |acc(B_b) - conf(B_b)|``; see the module docstring for the bin rule.

    Args:
        probs: ``[N, C]`` class probabilities.
        labels: ``[N]`` integer labels in ``[0, C)``.
        n_bins: number of equal-width bins (default 15).

    Returns:
        The ECE, in [0, 1].
    """
    return reliability_bins(probs, labels, n_bins).ece


def paired_ece(probs: ArrayLike, labels: ArrayLike, reference_probs: ArrayLike, n_bins: int = DEFAULT_N_BINS) -> float:
    """ECE of ``probs`` with every sample in the bin of its ``reference_probs`` confidence.

    For comparing an engine's calibration with its reference's (parity): plain ECE jumps when a
    sample whose confidence sits near a bin edge crosses it, so two engines a rounding apart (BF16:
    mean |p - p_ref| 6.5e-4) can differ by 0.005 in ECE. With the reference's bins the difference is
    continuous: at most the mean absolute confidence change plus 1/N per flipped prediction. For
    ``probs == reference_probs`` it equals :func:`ece`.
    """
    n_bins = as_n_bins(n_bins)
    p, y = _probs_labels(probs, labels)
    ref, _ = _probs_labels(reference_probs, labels)
    if ref.shape != p.shape:
        raise MetricInputError(f"paired_ece: reference_probs has shape {ref.shape}, probs {p.shape}")
    idx = bin_index(ref.max(axis=1), n_bins)
    conf = p.max(axis=1)
    correct = (np.argmax(p, axis=1) == y).astype(np.float64)
    count = np.bincount(idx, minlength=n_bins).astype(np.int64)
    conf_sum = np.bincount(idx, weights=conf, minlength=n_bins)
    acc_sum = np.bincount(idx, weights=correct, minlength=n_bins)
    with np.errstate(invalid="ignore", divide="ignore"):  # the same arithmetic as ReliabilityBins.ece
        mean_conf = np.where(count > 0, conf_sum / count, np.nan)
        mean_acc = np.where(count > 0, acc_sum / count, np.nan)
    return ReliabilityBins(edges=bin_edges(n_bins), confidence=mean_conf, accuracy=mean_acc, count=count).ece
