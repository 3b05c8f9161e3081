"""OOD detection and misclassification (failure) detection metrics, over scikit-learn.

Conventions (REFERENCE.md section 4):

* **OOD is the positive class** (label 1), in-distribution is negative (label 0).
* Scores: **higher = more OOD** (e.g. :func:`~toolchain.metrics.msp_score`, entropy, MI).
* The ID and OOD scores are **concatenated once** and every metric is computed on that single
  array with scikit-learn (no per-batch state, no sigmoid, no rescaling of the scores).
* :func:`auroc` = ``sklearn.metrics.roc_auc_score``; tied scores count 1/2 (a constant score
  gives exactly 0.5).
* :func:`aupr` = ``sklearn.metrics.average_precision_score`` with OOD positive (step-wise sum
  ``sum_k (R_k - R_{k-1}) P_k``, no interpolation); a constant score gives the OOD prevalence
  ``n_ood / (n_id + n_ood)``.
* :func:`fpr_at_95_tpr`: the operating points of ``sklearn.metrics.roc_curve`` (with
  ``drop_intermediate=False``) are scanned in order of decreasing threshold and the FPR of the
  **first point with TPR >= 0.95** is returned. No interpolation between points. A constant
  score gives 1.0 (the only point with TPR >= 0.95 flags everything).
* :func:`failure_auroc`: misclassification detection AUROC, **errors positive**, score
  ``-MSP`` by default.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from numpy.typing import ArrayLike
from sklearn.metrics import average_precision_score, roc_auc_score, roc_curve

from toolchain.metrics._validation import MetricInputError, as_labels, as_probs, as_scores
from toolchain.metrics.scores import entropy_score, msp_score

#: Target true-positive rate of :func:`fpr_at_95_tpr`.
TPR_TARGET = 0.95

ScoreSpec = str | Callable[[np.ndarray], ArrayLike] | ArrayLike | None


def ood_labels_and_scores(id_scores: ArrayLike, ood_scores: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    """Validate and concatenate ID and OOD scores into one binary problem (OOD = 1).

    Args:
        id_scores: ``[N_id]`` scores of in-distribution samples (higher = more OOD).
        ood_scores: ``[N_ood]`` scores of OOD samples.

    Returns:
        ``(y_true, y_score)``, both ``[N_id + N_ood]``: int64 labels (0 = ID first, then 1 = OOD)
        and float64 scores.
    """
    s_id = as_scores("id_scores", id_scores)
    s_ood = as_scores("ood_scores", ood_scores)
    y = np.concatenate([np.zeros(s_id.shape[0], np.int64), np.ones(s_ood.shape[0], np.int64)])
    return y, np.concatenate([s_id, s_ood])


def _fpr_at_tpr(y: np.ndarray, s: np.ndarray, target: float = TPR_TARGET) -> float:
    fpr, tpr, _ = roc_curve(y, s, drop_intermediate=False)
    # The last point (threshold = min score) has TPR = 1, so a point always qualifies.
    first = int(np.flatnonzero(tpr >= target)[0])
    return float(fpr[first])


def auroc(id_scores: ArrayLike, ood_scores: ArrayLike) -> float:
    """Area under the ROC curve for detecting OOD samples (OOD positive, higher = more OOD).

    Args:
        id_scores: ``[N_id]`` scores of in-distribution samples.
        ood_scores: ``[N_ood]`` scores of OOD samples.

    Returns:
        AUROC in [0, 1]: ``P(s_ood > s_id) + 0.5 P(s_ood == s_id)``; 1 = perfect, 0.5 = chance.
    """
    y, s = ood_labels_and_scores(id_scores, ood_scores)
    return float(roc_auc_score(y, s))


def aupr(id_scores: ArrayLike, ood_scores: ArrayLike) -> float:
    """Average precision (area under the precision-recall curve) with OOD as the positive class.

    Args:
        id_scores: ``[N_id]`` scores of in-distribution samples.
        ood_scores: ``[N_ood]`` scores of OOD samples.

    Returns:
        Average precision in (0, 1]; 1 = perfect, a constant score gives ``N_ood / (N_id + N_ood)``.
    """
    y, s = ood_labels_and_scores(id_scores, ood_scores)
    return float(average_precision_score(y, s, pos_label=1))


def fpr_at_95_tpr(id_scores: ArrayLike, ood_scores: ArrayLike) -> float:
    """False-positive rate (ID flagged as OOD) at the first ROC point with TPR >= 0.95.

    Args:
        id_scores: ``[N_id]`` scores of in-distribution samples.
        ood_scores: ``[N_ood]`` scores of OOD samples.

    Returns:
        FPR in [0, 1] (lower is better): 0 = perfect, a constant score gives 1. No interpolation.
    """
    y, s = ood_labels_and_scores(id_scores, ood_scores)
    return _fpr_at_tpr(y, s)


def ood_metrics(id_scores: ArrayLike, ood_scores: ArrayLike) -> dict[str, float]:
    """AUROC, AUPR and FPR95 of one score, computed from a single concatenation.

    Returns:
        ``{"auroc": ..., "aupr": ..., "fpr95": ...}`` as Python floats.
    """
    y, s = ood_labels_and_scores(id_scores, ood_scores)
    return {
        "auroc": float(roc_auc_score(y, s)),
        "aupr": float(average_precision_score(y, s, pos_label=1)),
        "fpr95": _fpr_at_tpr(y, s),
    }


def _resolve_failure_score(score: ScoreSpec, probs: np.ndarray) -> np.ndarray:
    if score is None or (isinstance(score, str) and score == "msp"):
        return msp_score(probs)
    if isinstance(score, str):
        if score == "entropy":
            return entropy_score(probs)
        raise MetricInputError(f"score: unknown score name {score!r}; use 'msp', 'entropy', an array or a callable.")
    if callable(score):
        return as_scores("score", score(probs))
    return as_scores("score", score)


def failure_auroc(probs: ArrayLike, labels: ArrayLike, score: ScoreSpec = None) -> float:
    """Misclassification-detection AUROC: errors are positives, higher score = more likely wrong.

    Args:
        probs: ``[N, C]`` class probabilities; the prediction is the argmax (ties: lowest index).
        labels: ``[N]`` integer labels in ``[0, C)``.
        score: ``None`` or ``"msp"`` (default, ``-max prob``), ``"entropy"``, an ``[N]`` array of
            scores, or a callable mapping ``probs [N, C]`` (float64) to ``[N]`` scores.

    Returns:
        AUROC in [0, 1], or NaN when it is undefined: all predictions correct or all wrong.
    """
    p = as_probs("probs", probs)
    y = as_labels("labels", labels, p.shape[0], p.shape[1])
    s = _resolve_failure_score(score, p)
    if s.shape[0] != p.shape[0]:
        raise MetricInputError(f"score: has {s.shape[0]} values but the probabilities have {p.shape[0]} rows.")
    errors = (np.argmax(p, axis=1) != y).astype(np.int64)
    if errors.min() == errors.max():
        return float("nan")
    return float(roc_auc_score(errors, s))
