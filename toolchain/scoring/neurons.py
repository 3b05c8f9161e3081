"""MLP neuron importance: Taylor, gate form, the neuron analogue of :mod:`toolchain.scoring.taylor`.

Each Hydra member may keep its own subset of every layer's MLP intermediate neurons (issue 45);
:func:`toolchain.pruning.neurons.split_neurons` deals them out by these scores.

* :func:`neuron_scores` - a ones-vector
  gate ``g_l`` ``[I_l]`` multiplies the input of each layer's ``fc2`` (``act(fc1(x))``; for a gated
  MLP (LLaMA, ``fc_up``) ``act(fc1(x)) * fc_up(x)``, still the input of ``fc2``) through a forward
  pre-hook. Per calibration batch ``b``, ``L_b`` is the **mean** cross-entropy over its samples;
  the score of neuron ``j`` is ``(1/|batches|) sum_b (dL_b/dg_j)^2`` (float64). As for heads, the
  square is taken per batch, so the scores depend on how the calibration data is batched.
  Labels must be classes: OOD rows (label -1) are rejected, as :func:`taylor_scores` does.
* :func:`neuron_gated` / :func:`batch_neuron_grads` - the gating context and one batch's gradients.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from toolchain.distributed import map_shards
from toolchain.scoring._checks import check_int
from toolchain.scoring.calibration import as_calibration, check_labels, eval_mode, gate_dtype

__all__ = ["batch_neuron_grads", "neuron_gated", "neuron_scores"]

log = logging.getLogger(__name__)

CRITERION = "neuron-taylor"


def _check_layers(layers: Sequence[int] | None, count: int) -> list[int]:
    """``layers`` as a list of distinct layer indices in ``[0, count)`` (None: every layer)."""
    if layers is None:
        return list(range(count))
    out = [check_int(f"layers[{i}]", v, lo=0, hi=count - 1) for i, v in enumerate(layers)]
    if len(set(out)) != len(out):
        raise ValueError(f"layers={list(layers)!r} names a layer twice; give each layer once")
    return out


def _scale_input(gate: torch.Tensor):
    def hook(_module: nn.Module, args: tuple) -> tuple:
        x = args[0]  # [..., I]: the fc2 input, one column per intermediate neuron
        return (x * gate.to(x.dtype), *args[1:])

    return hook


@contextlib.contextmanager
def neuron_gated(adapter: object, gates: dict[int, torch.Tensor]) -> Iterator[None]:
    """Multiply the MLP neurons of layer ``l`` by ``gates[l]`` (``[I_l]``) inside the ``with`` block.

    The gate multiplies the input of the layer's ``fc2`` (a forward pre-hook); it may require grad.
    """
    views = adapter.layers()
    for l, g in gates.items():
        if g.shape != (views[l].fc2.in_features,):
            raise ValueError(f"gates[{l}] must be [{views[l].fc2.in_features}] (the layer's MLP width); "
                             f"got {tuple(g.shape)}")
    handles = [views[l].fc2.register_forward_pre_hook(_scale_input(g)) for l, g in gates.items()]
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def batch_neuron_grads(adapter: object, batch: dict[str, torch.Tensor], labels: torch.Tensor,
                       layers: Sequence[int]) -> list[torch.Tensor]:
    """``dL_b/dg_l`` at ``g = 1`` for each of ``layers``: float64 ``[I_l]`` on the CPU (``L_b`` = mean CE)."""
    views = adapter.layers()
    dtype = gate_dtype(adapter.model)
    gates = {l: torch.ones(views[l].fc2.in_features, dtype=dtype, device=views[l].fc2.weight.device,
                           requires_grad=True) for l in layers}
    with neuron_gated(adapter, gates):
        logits = adapter.logits(batch)
    check_labels(labels, logits.shape[-1], criterion=CRITERION)
    loss = F.cross_entropy(logits.float(), labels.to(logits.device), reduction="mean")
    grads = torch.autograd.grad(loss, list(gates.values()), allow_unused=True)
    return [(torch.zeros_like(g) if d is None else d).detach().double().cpu()
            for g, d in zip(gates.values(), grads, strict=True)]


def neuron_scores(adapter: object, calib: object, *, layers: Sequence[int] | None = None) -> list[torch.Tensor]:
    """Taylor importance of every layer's MLP neurons: mean over batches of ``(dL_b/dg_j)^2``.

    Args:
        adapter: a :class:`~toolchain.models.base.ModelAdapter`.
        calib: calibration ``(batch, labels)`` pairs (see :mod:`toolchain.scoring.calibration`);
            labels must be classes (no OOD rows).
        layers: the layers to score (None: every layer). The others get NaN scores and their
            gradients are not computed (e.g. the shared layers before a late fork).

    Returns:
        One float64 tensor ``[I_l]`` per prunable layer (``I_l`` its MLP width), NaN where not scored.
    """
    data = as_calibration(calib)
    widths = adapter.mlp_per_layer()
    chosen = _check_layers(layers, len(widths))
    out = [torch.full((w,), float("nan"), dtype=torch.float64) for w in widths]
    if not chosen:
        return out
    with eval_mode(adapter.model):  # whole batches spread over the ranks under torch.distributed
        per_batch = map_shards(len(data), lambda i: [g.square() for g in batch_neuron_grads(adapter, *data[i], chosen)])
    for pos, l in enumerate(chosen):
        total = torch.zeros(widths[l], dtype=torch.float64)
        for squares in per_batch:  # in batch order on every rank (= the single-process sum)
            total += squares[pos]
        out[l] = total / len(data)
    samples = sum(int(lab.shape[0]) for _, lab in data)
    log.info("%s: scored %d neurons in %d layers on %d batches (%d samples)", CRITERION,
             sum(widths[l] for l in chosen), len(chosen), len(data), samples)
    return out
