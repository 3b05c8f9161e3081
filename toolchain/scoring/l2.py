"""L2-norm baseline: the norm of a head's slices of the Q, K, V and O weights (biases excluded).

``score_h = sqrt(||W_q[h]||^2 + ||W_k[h]||^2 + ||W_v[h]||^2 + ||W_o[:, h]||^2)`` where
``W_q[h]`` is the head's ``head_dim`` output rows of the query projection and ``W_o[:, h]`` its
``head_dim`` input columns of the output projection. Reads no data.
"""

from __future__ import annotations

import logging

import torch

from toolchain.scoring.calibration import as_calibration, data_hash
from toolchain.scoring.scores import HeadScores, nan_scores

__all__ = ["l2_scores"]

log = logging.getLogger(__name__)


def l2_scores(adapter: object, calib: object = None) -> HeadScores:
    """Frobenius norm of every head's Q/K/V/O weight slices; ``calib`` is ignored (hash only)."""
    data = as_calibration(calib, allow_empty=True)
    hpl = adapter.heads_per_layer()
    scores = nan_scores(hpl)
    for l, lv in enumerate(adapter.layers()):
        w = lv.head_weights()
        sq = torch.zeros(lv.num_heads, dtype=torch.float64)
        for key in ("q_w", "k_w", "v_w", "o_w"):
            sq += w[key].double().square().flatten(start_dim=1).sum(dim=1)
        scores[l, : lv.num_heads] = sq.sqrt()
    log.info("l2: scored %d heads", sum(hpl))
    return HeadScores(
        scores=scores,
        criterion="l2",
        params={"weights": "qkvo", "bias": False},
        data_hash=data_hash(data),
        heads_per_layer=hpl,
    )
