"""Taylor importance, gate form (Molchanov et al. 2019): ``I_h = (m_h * dL/dm_h)^2``.

Per mini-batch ``b`` (one calibration batch), gates ``m`` of ones ``[layers, max_heads]`` shared
by the batch, ``L_b`` the **mean** cross-entropy over the batch's samples; the squared gate
gradient is **averaged** over the mini-batches: ``I_h = (1/|batches|) sum_b (dL_b/dm_h)^2``
(summing instead would only scale every score by the number of batches). Because the square is
taken per mini-batch, the result depends on how the calibration data is batched.

Hydra prunes "Taylor" members within each layer: plan them with ``scope="layer"``.
"""

from __future__ import annotations

import logging

import torch
import torch.nn.functional as F

from toolchain.distributed import map_shards
from toolchain.scoring.calibration import as_calibration, check_labels, data_hash, eval_mode, gate_dtype
from toolchain.scoring.scores import HeadScores, nan_scores

__all__ = ["batch_gate_grad", "taylor_scores"]

log = logging.getLogger(__name__)


def batch_gate_grad(adapter: object, batch: dict[str, torch.Tensor], labels: torch.Tensor) -> torch.Tensor:
    """``dL_b/dm`` for batch gates ``m = 1``: float64 ``[layers, max_heads]`` (``L_b`` = mean CE)."""
    gates = torch.ones(
        adapter.num_layers, adapter.max_heads, dtype=gate_dtype(adapter.model), requires_grad=True
    )
    logits = adapter.gated_logits(batch, gates)
    check_labels(labels, logits.shape[-1], criterion="taylor")
    loss = F.cross_entropy(logits.float(), labels, reduction="mean")
    (grad,) = torch.autograd.grad(loss, gates)
    return (gates.detach() * grad).double()


def taylor_scores(adapter: object, calib: object) -> HeadScores:
    """Mean over calibration batches of ``(m_h * dL_b/dm_h)^2`` (see the module docstring).

    Returns:
        HeadScores with ``scores [layers, max_heads]`` (float64, NaN past a layer's heads).
    """
    data = as_calibration(calib)
    hpl = adapter.heads_per_layer()
    with eval_mode(adapter.model):  # whole batches spread over the ranks under torch.distributed
        per_batch = map_shards(len(data), lambda i: batch_gate_grad(adapter, *data[i]).square())
    total = torch.zeros(len(hpl), max(hpl), dtype=torch.float64)
    for sq in per_batch:  # float64, in batch order on every rank (= the single-process sum)
        total += sq
    mean = total / len(data)
    scores = nan_scores(hpl)
    for l, n in enumerate(hpl):
        scores[l, :n] = mean[l, :n]
    samples = sum(int(lab.shape[0]) for _, lab in data)
    log.info("taylor: scored %d heads on %d batches (%d samples)", sum(hpl), len(data), samples)
    return HeadScores(
        scores=scores,
        criterion="taylor",
        params={"reduction": "mean-over-batches", "batch_loss": "mean"},
        data_hash=data_hash(data),
        heads_per_layer=hpl,
        extras={"num_batches": len(data), "num_samples": samples},
    )
