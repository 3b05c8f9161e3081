"""Diversity of ensemble members: overlap of their kept heads and disagreement of their predictions.

* Jaccard of two kept-head sets ``A``, ``B``: ``|A & B| / |A | B|`` (1.0 when both are empty).
  Per layer it compares the layer's kept heads; "overall" compares the whole sets of
  ``(layer, head)`` pairs (not the mean of the per-layer values). Ensemble summaries are the mean
  over the ``M (M - 1) / 2`` unordered member pairs.
* Prediction disagreement, from member logits ``[M, N, C]``: the ensemble prediction is the
  argmax of the mean of the members' softmax probabilities (ties: lowest class index); a member's
  disagreement is the fraction of samples where its argmax differs from the ensemble's. Also
  reported: the mean over member pairs of the fraction of samples where the two argmaxes differ.
* Pairwise KL, from member logits ``[M, N, C]``: ``KL(p_i || p_j) = sum_c p_i,c (log p_i,c - log p_j,c)``
  (natural log) from float64 log-softmax, averaged over the ``N`` samples, for every ordered pair;
  the summary is the mean over the ``M (M - 1)`` ordered pairs ``i != j`` (KL is not symmetric).
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import combinations
from typing import Any

import numpy as np
import torch

__all__ = ["jaccard", "pairwise_jaccard", "pairwise_kl", "prediction_disagreement"]


def jaccard(a: torch.Tensor, b: torch.Tensor) -> float:
    """Jaccard index of two boolean masks of the same shape."""
    a, b = torch.as_tensor(a, dtype=torch.bool), torch.as_tensor(b, dtype=torch.bool)
    if a.shape != b.shape:
        raise ValueError(f"masks must have the same shape, got {tuple(a.shape)} and {tuple(b.shape)}")
    union = int((a | b).sum())
    return 1.0 if union == 0 else int((a & b).sum()) / union


def _stack(masks: Sequence[torch.Tensor] | torch.Tensor) -> torch.Tensor:
    stacked = masks if isinstance(masks, torch.Tensor) else torch.stack([torch.as_tensor(m) for m in masks])
    stacked = stacked.to(torch.bool)
    if stacked.dim() != 3 or stacked.shape[0] < 2:
        raise ValueError(
            f"masks must be >= 2 keep masks [M, layers, heads], got shape {tuple(stacked.shape)}"
        )
    return stacked


def pairwise_jaccard(masks: Sequence[torch.Tensor] | torch.Tensor) -> dict[str, Any]:
    """Overlap of the members' kept heads.

    Args:
        masks: ``M >= 2`` keep masks ``[layers, max_heads]`` (or one ``[M, layers, max_heads]`` tensor).

    Returns:
        ``{"overall": mean over pairs of the whole-set Jaccard, "per_layer": [layers] mean over
        pairs, "matrix": [M][M] whole-set Jaccard (1 on the diagonal)}``.
    """
    m = _stack(masks)
    n_members, n_layers = m.shape[0], m.shape[1]
    matrix = [[1.0] * n_members for _ in range(n_members)]
    per_layer = [0.0] * n_layers
    pairs = list(combinations(range(n_members), 2))
    overall = 0.0
    for i, j in pairs:
        v = jaccard(m[i], m[j])
        matrix[i][j] = matrix[j][i] = v
        overall += v
        for l in range(n_layers):
            per_layer[l] += jaccard(m[i, l], m[j, l])
    return {
        "overall": overall / len(pairs),
        "per_layer": [v / len(pairs) for v in per_layer],
        "matrix": matrix,
    }


def _member_logits(member_logits: torch.Tensor) -> torch.Tensor:
    x = torch.as_tensor(member_logits)
    if x.dim() != 3 or x.shape[0] < 2 or x.shape[1] < 1 or x.shape[2] < 1:
        raise ValueError(f"member_logits must be [M >= 2, N >= 1, C >= 1], got shape {tuple(x.shape)}")
    return x.double()


def prediction_disagreement(member_logits: torch.Tensor) -> dict[str, Any]:
    """How often members' predictions differ (see the module docstring).

    Args:
        member_logits: ``[M, N, C]`` logits (or log-probabilities) of ``M >= 2`` members.

    Returns:
        ``{"per_member": [M] fraction disagreeing with the ensemble, "mean": their mean,
        "pairwise_mean": mean over pairs of the fraction of differing argmaxes,
        "ensemble_pred": [N] ensemble argmax}``.
    """
    x = _member_logits(member_logits)
    preds = x.argmax(dim=-1)  # [M, N]
    ens = torch.softmax(x, dim=-1).mean(dim=0).argmax(dim=-1)  # [N]
    per_member = (preds != ens[None, :]).double().mean(dim=1)
    pairs = list(combinations(range(x.shape[0]), 2))
    pairwise = sum(float((preds[i] != preds[j]).double().mean()) for i, j in pairs) / len(pairs)
    return {
        "per_member": per_member.tolist(),
        "mean": float(per_member.mean()),
        "pairwise_mean": pairwise,
        "ensemble_pred": ens.tolist(),
    }


def pairwise_kl(member_logits: torch.Tensor) -> dict[str, Any]:
    """Mean KL divergence between the members' predictive distributions (see the module docstring).

    Args:
        member_logits: ``[M, N, C]`` finite logits (or log-probabilities) of ``M >= 2`` members.

    Returns:
        ``{"mean": mean over ordered pairs i != j of matrix[i][j], "matrix": [M][M] with
        matrix[i][j] = mean over samples of KL(p_i || p_j) in nats (0 on the diagonal)}``.

    Raises:
        ValueError: wrong shape or a non-finite logit.
    """
    x = _member_logits(member_logits)
    if not bool(torch.isfinite(x).all()):
        raise ValueError("member_logits must be finite (no NaN/Inf)")
    logp = torch.log_softmax(x, dim=-1)  # [M, N, C]
    p = logp.exp()
    n_members = x.shape[0]
    # row i: mean_n sum_c p_i (log p_i - log p_j) for every j, one [M, N, C] block at a time
    kl = torch.stack([(p[i] * (logp[i] - logp)).sum(dim=-1).mean(dim=1) for i in range(n_members)])
    kl = kl.clamp_min(0.0)  # KL >= 0; rounding can give about -1e-17 for equal members
    kl.fill_diagonal_(0.0)
    return {"mean": float(kl.sum()) / (n_members * (n_members - 1)), "matrix": kl.tolist()}


def ensemble_diversity(member_logits_id: np.ndarray, labels: np.ndarray,
                       member_logits_ood: np.ndarray | None, seed: int) -> dict[str, Any]:
    """Disagreement, pairwise KL and the ensemble gain (paired-bootstrap 95% CIs) of ``[N, M, C]`` logits."""
    from toolchain.metrics.gain import ensemble_gain

    by_member = torch.as_tensor(np.ascontiguousarray(member_logits_id.transpose(1, 0, 2)))
    dis = prediction_disagreement(by_member)
    return {
        "disagreement": {k: v for k, v in dis.items() if k != "ensemble_pred"},
        "kl": pairwise_kl(by_member),
        "gain": ensemble_gain(member_logits_id, labels, member_logits_ood, seed=seed),
    }
