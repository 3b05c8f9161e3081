"""Per-sample uncertainty / OOD scores (higher = more uncertain = more likely OOD or wrong).

Single-prediction scores take ``probs [N, C]``; ensemble scores take the members' raw logits
``member_logits [N, M, C]`` (M members) and apply a softmax per member. All return float64
arrays of shape ``[N]``. Entropies use the natural log, with ``0 log 0 = 0``.

Names (REFERENCE.md section 4 asks to say which "entropy" is meant):

* :func:`msp_score` = ``-max_c p_c`` (negated maximum softmax probability).
* :func:`entropy_score` = ``H(p)`` of the prediction it is given; for an ensemble pass the mean
  prediction (:func:`ensemble_probs`), giving the *entropy of the mean* (total uncertainty).
* :func:`expected_entropy` = ``mean_m H(p_m)``, the *mean of the members' entropies* (aleatoric).
* :func:`mutual_information` = ``H(mean_m p_m) - mean_m H(p_m)`` (epistemic), clamped below at 0
  because rounding can make it about -1e-16 for identical members. Values of that size are
  rounding noise: rankings among such near-ties are arbitrary.
* :func:`disagreement` = **argmax disagreement rate**: the fraction of members whose argmax class
  differs from the ensemble's argmax class (argmax of the mean probabilities); both argmaxes are
  taken on softmax probabilities, ties go to the lowest class index. Values are multiples of
  ``1/M`` in ``[0, 1]``. It can reach 1: the mean prediction's argmax may be a class that no
  member ranks first (e.g. members 0, 1, 0 whose second choices all favour class 2).
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike

from toolchain.metrics._validation import as_member_logits, as_probs


def _entropy(p: np.ndarray) -> np.ndarray:
    """Entropy along the last axis with ``0 log 0 = 0`` (natural log)."""
    positive = p > 0.0
    plogp = np.where(positive, p * np.log(np.where(positive, p, 1.0)), 0.0)
    return -np.sum(plogp, axis=-1)


def _softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits - logits.max(axis=-1, keepdims=True)
    e = np.exp(shifted)
    return e / e.sum(axis=-1, keepdims=True)


def msp_score(probs: ArrayLike) -> np.ndarray:
    """Negated maximum softmax probability.

    Args:
        probs: ``[N, C]`` class probabilities.

    Returns:
        ``[N]`` scores ``-max_c probs[n, c]`` in ``[-1, -1/C]``.
    """
    p = as_probs("probs", probs)
    return -p.max(axis=1)


def entropy_score(probs: ArrayLike) -> np.ndarray:
    """Predictive entropy ``-sum_c p_c log p_c`` of each row (entropy of the mean for ensembles).

    Args:
        probs: ``[N, C]`` class probabilities (the ensemble's mean prediction for an ensemble).

    Returns:
        ``[N]`` entropies in ``[0, log C]`` nats.
    """
    p = as_probs("probs", probs)
    return np.maximum(_entropy(p), 0.0)


def member_probs(member_logits: ArrayLike) -> np.ndarray:
    """Numerically stable softmax of each member's logits.

    Args:
        member_logits: ``[N, M, C]`` raw logits of M ensemble members.

    Returns:
        ``[N, M, C]`` float64 probabilities (each ``[n, m, :]`` sums to 1).
    """
    return _softmax(as_member_logits("member_logits", member_logits))


def ensemble_probs(member_logits: ArrayLike) -> np.ndarray:
    """Ensemble prediction: mean over members of the members' softmax probabilities.

    Args:
        member_logits: ``[N, M, C]`` raw logits of M ensemble members.

    Returns:
        ``[N, C]`` float64 mean probabilities.
    """
    return member_probs(member_logits).mean(axis=1)


def expected_entropy(member_logits: ArrayLike) -> np.ndarray:
    """Mean of the members' predictive entropies, ``mean_m H(p_m)``.

    Args:
        member_logits: ``[N, M, C]`` raw logits of M ensemble members.

    Returns:
        ``[N]`` values in ``[0, log C]`` nats.
    """
    return np.maximum(_entropy(member_probs(member_logits)), 0.0).mean(axis=1)


def mutual_information(member_logits: ArrayLike) -> np.ndarray:
    """Mutual information ``H(mean_m p_m) - mean_m H(p_m)``, clamped below at 0.

    Args:
        member_logits: ``[N, M, C]`` raw logits of M ensemble members.

    Returns:
        ``[N]`` values in ``[0, min(log M, log C)]`` nats; 0 (up to ~1e-16) for identical members.
    """
    pm = member_probs(member_logits)
    total = _entropy(pm.mean(axis=1))
    aleatoric = _entropy(pm).mean(axis=1)
    return np.maximum(total - aleatoric, 0.0)


def disagreement(member_logits: ArrayLike) -> np.ndarray:
    """Argmax disagreement rate: fraction of members whose argmax differs from the ensemble's.

    The ensemble argmax is the argmax of the mean of the members' softmax probabilities; a
    member's argmax is the argmax of its own softmax probabilities (not of its logits, so that
    logits differing below float64 resolution after the softmax count as a tie, consistently
    with the ensemble argmax; a single member never disagrees with itself). Ties go to the
    lowest class index.

    Args:
        member_logits: ``[N, M, C]`` raw logits of M ensemble members.

    Returns:
        ``[N]`` values in ``{0, 1/M, ..., 1}`` (0 for a single member).
    """
    pm = member_probs(member_logits)  # [N, M, C]
    ens_pred = np.argmax(pm.mean(axis=1), axis=1)  # [N]
    member_pred = np.argmax(pm, axis=2)  # [N, M]
    return np.mean(member_pred != ens_pred[:, None], axis=1)
