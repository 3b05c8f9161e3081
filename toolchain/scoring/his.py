"""HIS: head importance from per-sample gate gradients (Michel et al. 2019; HIES Eq. 2).

``HIS_h = (1/N) sum_i | dL_i / dm_{i,h} |`` with ``L_i`` the cross-entropy of sample ``i`` and
``m_{i,h}`` a gate on head ``h`` that only sample ``i`` sees. The absolute value is taken **per
sample** (never on a batch-summed gradient, where contributions of opposite sign would cancel).

How: per-sample gates ``[B, layers, max_heads]`` of ones with ``requires_grad``; the loss is the
*sum* of the per-sample losses, so one backward gives every sample's own gradient (sample ``i``'s
loss depends only on its own gates: the model runs in eval mode and mixes no samples).

"Averaged over real tokens": the classification loss is one number per sequence, and a gate
scales the head's output at every token, so ``dL_i/dm_{i,h}`` already sums the contributions
of all of the sample's tokens (``sum_t <dL_i/dctx_{t,h}, ctx_{t,h}>``); padded tokens contribute
exactly zero (they are masked as keys and never pooled). The default therefore averages over
samples. ``token_norm=True`` divides each sample's ``|gradient|`` by its number of real tokens
before the average (the per-token reading; it reweights towards short sequences). A gate per
token is not used: the absolute value per token would measure within-sequence cancellations
that are part of the sample's true sensitivity.

Modes: ``"batched"`` (per-sample gates, one backward per batch), ``"looped"`` (one sample per
forward, batch gates ``[layers, max_heads]``: the brute-force reference) and ``"auto"``
(batched when the prunable layers see the batch's samples, e.g. not for a CLIP text tower).
"""

from __future__ import annotations

import logging

import torch
import torch.nn.functional as F

from toolchain.distributed import map_shards
from toolchain.scoring._checks import check_choice
from toolchain.scoring.calibration import (
    as_calibration,
    check_labels,
    data_hash,
    eval_mode,
    gate_dtype,
    layers_see_batch,
    subset,
)
from toolchain.scoring.scores import HeadScores, nan_scores

__all__ = ["MODES", "his_scores", "per_sample_gate_grads"]

log = logging.getLogger(__name__)

MODES = ("auto", "batched", "looped")


def per_sample_gate_grads(
    adapter: object, batch: dict[str, torch.Tensor], labels: torch.Tensor, *, criterion: str = "his"
) -> torch.Tensor:
    """``|dL_i/dm_{i,h}|`` for every sample of one batch: float64 ``[B, layers, max_heads]``.

    One forward and one backward with per-sample gates; the model should be in eval mode.
    """
    n = int(labels.shape[0])
    shape = (n, adapter.num_layers, adapter.max_heads)
    gates = torch.ones(shape, dtype=gate_dtype(adapter.model), requires_grad=True)
    logits = adapter.gated_logits(batch, gates)
    check_labels(labels, logits.shape[-1], criterion=criterion)
    loss = F.cross_entropy(logits.float(), labels, reduction="sum")
    (grad,) = torch.autograd.grad(loss, gates)
    return grad.abs().double()


def _looped_grads(adapter: object, batch: dict[str, torch.Tensor], labels: torch.Tensor) -> torch.Tensor:
    """Same as :func:`per_sample_gate_grads`, one sample per forward with batch gates."""
    out = []
    for i in range(int(labels.shape[0])):
        ((row, lab),) = subset([(batch, labels)], [i])
        gates = torch.ones(
            adapter.num_layers, adapter.max_heads, dtype=gate_dtype(adapter.model), requires_grad=True
        )
        logits = adapter.gated_logits(row, gates)
        check_labels(lab, logits.shape[-1], criterion="his")
        loss = F.cross_entropy(logits.float(), lab, reduction="sum")
        (grad,) = torch.autograd.grad(loss, gates)
        out.append(grad.abs().double())
    return torch.stack(out)


def his_scores(adapter: object, calib: object, *, token_norm: bool = False, mode: str = "auto") -> HeadScores:
    """Mean over calibration samples of the per-sample ``|dL/dm_h|`` (see the module docstring).

    Args:
        adapter: a :class:`toolchain.models.ModelAdapter`.
        calib: iterable of ``(batch dict, labels [B])``; labels must be class indices.
        token_norm: divide each sample's gradient by its number of real tokens first.
        mode: ``"auto"``, ``"batched"`` or ``"looped"``.

    Returns:
        HeadScores with ``scores [layers, max_heads]`` (float64, NaN past a layer's heads).
    """
    check_choice("mode", mode, MODES)
    if not isinstance(token_norm, bool):
        raise ValueError(f"token_norm must be a bool, got {token_norm!r}")
    data = as_calibration(calib)
    hpl = adapter.heads_per_layer()

    def one_batch(i: int) -> tuple[torch.Tensor, int, str]:
        batch, labels = data[i]
        sees = layers_see_batch(adapter, batch, int(labels.shape[0]))
        if mode == "batched" and not sees:
            raise ValueError("mode='batched' needs layers that see the batch's samples; use mode='auto'")
        if token_norm and not sees:
            raise ValueError("token_norm=True needs layers that see the batch's samples (one row per sample)")
        batched = sees and mode != "looped"
        grads = per_sample_gate_grads(adapter, batch, labels) if batched else _looped_grads(adapter, batch, labels)
        if token_norm:
            tokens = adapter.token_mask(batch).sum(dim=1).clamp(min=1).double()
            grads = grads / tokens[:, None, None]
        return grads.sum(dim=0), int(labels.shape[0]), "batched" if batched else "looped"

    # per-batch float64 sums (whole batches spread over the ranks under torch.distributed), added
    # in batch order on every rank: the same numbers as one process computing every batch
    with eval_mode(adapter.model):
        per_batch = map_shards(len(data), one_batch)
    total = torch.zeros(len(hpl), max(hpl), dtype=torch.float64)
    count = 0
    used = set()
    for batch_sum, n, how in per_batch:
        total += batch_sum
        count += n
        used.add(how)
    scores = nan_scores(hpl)
    mean = total / count
    for l, n in enumerate(hpl):
        scores[l, :n] = mean[l, :n]
    result = HeadScores(
        scores=scores,
        criterion="his",
        params={"token_norm": token_norm, "mode": mode, "mode_used": "+".join(sorted(used))},
        data_hash=data_hash(data),
        heads_per_layer=hpl,
        extras={"num_samples": count},
    )
    log.info("his: scored %d heads on %d samples (mode %s)", sum(hpl), count, result.params["mode_used"])
    return result
