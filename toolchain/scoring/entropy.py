"""Attention entropy AE (HIES App. B) and the ``entropy`` criterion.

For sample ``b``, head ``h`` and real query row ``t``:
``H_t = -sum_j p_tj log p_tj`` over the ``n`` real keys of the sample, normalised by ``log n``
so it lies in ``[0, 1]``. ``AE_{b,h}`` is the mean over the real query rows; ``AE_h`` the mean
over samples. The entropy is taken per row, never of an averaged attention map. Padded keys
and padded query rows are excluded (``0 log 0 = 0``).

Edge cases: a sample with ``n = 1`` real key has ``H_t / log n = 0/0``: defined as **0** (the
only possible distribution is one-hot, i.e. fully focused). A sample with no real token has no
row and is left out of the sample average. Causal layers (a CLIP text tower) are still
normalised by the number of real keys of the sample, so their rows stay below 1.

Score convention: every criterion scores "higher = more important", and HIES keeps focused
(low-entropy) heads, so the ``entropy`` criterion's ``scores`` are ``1 - AE``; the raw ``AE``
is in ``extras["attention_entropy"]``.
"""

from __future__ import annotations

import logging

import torch

from toolchain.distributed import map_shards
from toolchain.scoring.calibration import as_calibration, data_hash, eval_mode
from toolchain.scoring.scores import HeadScores, nan_scores

__all__ = ["attention_entropy", "entropy_scores", "mean_attention_entropy"]

log = logging.getLogger(__name__)


def attention_entropy(probs: torch.Tensor, token_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-sample, per-head normalised attention entropy.

    Args:
        probs: ``[B, heads, T, T]`` attention probabilities (padded keys 0).
        token_mask: ``[B, T]`` bool, the real tokens.

    Returns:
        ``ae [B, heads]`` float64 (mean over real query rows of ``H_t / log n``) and
        ``has_rows [B]`` bool (False for a sample without real tokens; its ``ae`` is 0).
    """
    if probs.dim() != 4 or token_mask.dim() != 2:
        raise ValueError(
            f"probs must be [B, heads, T, T] and token_mask [B, T]; got {tuple(probs.shape)}, "
            f"{tuple(token_mask.shape)}"
        )
    b, _, tq, tk = probs.shape
    if token_mask.shape != (b, tk) or tq != tk:
        raise ValueError(
            f"token_mask {tuple(token_mask.shape)} does not match attention {tuple(probs.shape)}"
        )
    mask = token_mask.bool()
    p = probs.double() * mask[:, None, None, :]
    row_h = -torch.special.xlogy(p, p).sum(dim=-1)  # [B, H, T]
    n = mask.sum(dim=1).double()  # [B]
    log_n = torch.log(n.clamp(min=1.0))
    norm = torch.where(
        n[:, None, None] > 1, row_h / log_n.clamp(min=1e-300)[:, None, None], torch.zeros_like(row_h)
    )
    rows = mask[:, None, :].double()
    ae = (norm * rows).sum(dim=-1) / rows.sum(dim=-1).clamp(min=1.0)
    return ae, n > 0


def mean_attention_entropy(adapter: object, calib: object) -> tuple[torch.Tensor, int]:
    """``AE`` per head, averaged over the calibration samples: float64 ``[layers, max_heads]`` (NaN padded).

    Returns the tensor and the number of samples that had real tokens.
    """
    data = as_calibration(calib)
    hpl = adapter.heads_per_layer()

    def one_batch(i: int) -> tuple[torch.Tensor, int]:
        batch = data[i][0]
        probs = adapter.attentions(batch)
        mask = adapter.token_mask(batch)
        if len(probs) != len(hpl):
            raise RuntimeError(f"captured {len(probs)} attention maps for {len(hpl)} layers")
        part = torch.zeros(len(hpl), max(hpl), dtype=torch.float64)
        has = None
        for l, p in enumerate(probs):
            ae, has = attention_entropy(p, mask)
            part[l, : hpl[l]] = ae[has].sum(dim=0)
        return part, int(has.sum())

    # whole batches spread over the ranks under torch.distributed; float64 sums added in batch order
    with eval_mode(adapter.model), torch.no_grad():
        per_batch = map_shards(len(data), one_batch)
    total = torch.zeros(len(hpl), max(hpl), dtype=torch.float64)
    count = 0
    for part, n in per_batch:
        total += part
        count += n
    if count == 0:
        raise ValueError("calib has no sample with a real token: attention entropy is undefined")
    out = nan_scores(hpl)
    for l, n in enumerate(hpl):
        out[l, :n] = total[l, :n] / count
    return out, count


def entropy_scores(adapter: object, calib: object) -> HeadScores:
    """The ``entropy`` criterion: ``scores = 1 - AE`` (focused heads score high); AE in extras."""
    data = as_calibration(calib)
    ae, count = mean_attention_entropy(adapter, data)
    hpl = adapter.heads_per_layer()
    log.info("entropy: scored %d heads on %d samples", sum(hpl), count)
    return HeadScores(
        scores=1.0 - ae,
        criterion="entropy",
        params={"score": "1 - AE", "row_n1": 0.0},
        data_hash=data_hash(data),
        heads_per_layer=hpl,
        extras={"attention_entropy": ae.tolist(), "num_samples": count},
    )
