"""One-call uncertainty report: classification, calibration, failure and OOD detection metrics."""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike

from toolchain.metrics._validation import MetricInputError, as_labels, as_member_logits, as_probs
from toolchain.metrics.classification import DEFAULT_N_BINS
from toolchain.metrics.ood import ood_metrics
from toolchain.metrics.registry import OOD_METRIC_INFO, OOD_SCORE_NEEDS, UQ_METRICS
from toolchain.metrics.scores import disagreement, entropy_score, msp_score, mutual_information

#: Keys always present in :func:`uq_report`, in order.
BASE_KEYS: tuple[str, ...] = tuple(k for k, m in UQ_METRICS.items() if m.needs == "id")
#: OOD score names, in report order: the first two need ``probs_ood``, the last two need both
#: ``member_logits_id`` and ``member_logits_ood``.
OOD_SCORES: tuple[str, ...] = tuple(OOD_SCORE_NEEDS)
#: Per-score OOD metric prefixes, in report order.
OOD_METRICS: tuple[str, ...] = tuple(OOD_METRIC_INFO)


def report_keys(with_probs_ood: bool, with_members: bool) -> tuple[str, ...]:
    """Return the keys :func:`uq_report` gives, in order, for the given inputs (the metric registry's order)."""
    given = {"id"} | ({"probs_ood"} if with_probs_ood else set()) | ({"members"} if with_members else set())
    return tuple(k for k, m in UQ_METRICS.items() if m.needs in given)


def _check_members(name: str, value: ArrayLike, n: int | None, n_classes: int) -> np.ndarray:
    logits = as_member_logits(name, value)
    if n is not None and logits.shape[0] != n:
        raise MetricInputError(f"{name}: has {logits.shape[0]} samples, expected {n} (shape {logits.shape}).")
    if logits.shape[2] != n_classes:
        raise MetricInputError(f"{name}: has {logits.shape[2]} classes, expected {n_classes} (shape {logits.shape}).")
    return logits


def uq_report(
    probs_id: ArrayLike,
    labels_id: ArrayLike,
    probs_ood: ArrayLike | None = None,
    member_logits_id: ArrayLike | None = None,
    member_logits_ood: ArrayLike | None = None,
    n_bins: int = DEFAULT_N_BINS,
) -> dict[str, float]:
    """All applicable uncertainty metrics as a flat ``{key: float}`` dict with stable keys.

    Args:
        probs_id: ``[N, C]`` in-distribution probabilities (for an ensemble: the mean of the
            members' softmax probabilities).
        labels_id: ``[N]`` integer labels in ``[0, C)``.
        probs_ood: optional ``[N_ood, C]`` probabilities on OOD data.
        member_logits_id: optional ``[N, M, C]`` per-member logits on the ID data.
        member_logits_ood: optional ``[N_ood', M, C]`` per-member logits on the OOD data, same
            ensemble (same M). Give both member arrays or neither.
        n_bins: number of ECE bins (default 15).

    Returns:
        Keys, in this order (see :func:`report_keys`):

        * always: ``accuracy``, ``nll``, ``brier``, ``ece``, ``failure_auroc``
          (errors positive, score -MSP; NaN when all ID predictions are right or all wrong);
        * with ``probs_ood``: ``auroc_msp``, ``aupr_msp``, ``fpr95_msp``, ``auroc_entropy``,
          ``aupr_entropy``, ``fpr95_entropy`` (entropy of the given, i.e. mean, prediction);
        * with both member arrays: ``auroc_mi``, ``aupr_mi``, ``fpr95_mi``,
          ``auroc_disagreement``, ``aupr_disagreement``, ``fpr95_disagreement``.

        OOD metrics treat OOD as positive. Values are Python floats in [0, 1] except ``nll``
        (in ``[0, 27.63]``, nats) and ``brier`` (in [0, 2]).

    Raises:
        MetricInputError: (a ``ValueError``) on invalid shapes, NaN/Inf, labels out of range,
            empty arrays, mismatched class / member counts, or only one member-logit array.
    """
    p_id = as_probs("probs_id", probs_id)
    n, n_classes = p_id.shape
    y_id = as_labels("labels_id", labels_id, n, n_classes)
    if (member_logits_id is None) != (member_logits_ood is None):
        raise MetricInputError(
            "member_logits_id / member_logits_ood: give both (for the mi and disagreement OOD scores) or neither."
        )

    out: dict[str, float] = {k: UQ_METRICS[k].fn(p_id, y_id, n_bins) for k in BASE_KEYS}  # type: ignore[misc]

    scores: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    if probs_ood is not None:
        p_ood = as_probs("probs_ood", probs_ood)
        if p_ood.shape[1] != n_classes:
            raise MetricInputError(f"probs_ood: has {p_ood.shape[1]} classes, probs_id has {n_classes}.")
        scores["msp"] = (msp_score(p_id), msp_score(p_ood))
        scores["entropy"] = (entropy_score(p_id), entropy_score(p_ood))
    if member_logits_id is not None and member_logits_ood is not None:
        m_id = _check_members("member_logits_id", member_logits_id, n, n_classes)
        m_ood = _check_members("member_logits_ood", member_logits_ood, None, n_classes)
        if m_ood.shape[1] != m_id.shape[1]:
            raise MetricInputError(
                f"member_logits_ood: has {m_ood.shape[1]} members, member_logits_id has {m_id.shape[1]}."
            )
        scores["mi"] = (mutual_information(m_id), mutual_information(m_ood))
        scores["disagreement"] = (disagreement(m_id), disagreement(m_ood))

    for name in OOD_SCORES:
        if name in scores:
            s_id, s_ood = scores[name]
            for metric, value in ood_metrics(s_id, s_ood).items():
                out[f"{metric}_{name}"] = value
    return out
