"""Grouped multi-head attention of the M member streams (channels-first layout).

The stream is ``[B, M * D, T]`` (see :mod:`toolchain.hydra.gfc`). Q, K, V and O are GFC layers
(:class:`~toolchain.hydra.gfc.GroupedLinear`), one group per member. After the Q/K/V GFCs the
channels are ``[member, head slot, head_dim]``, so a free reshape gives ``M * Hp`` independent
heads ``[B, M * Hp, d, T]``: a member's heads never see another member's, and the O GFC only
mixes the heads of its own member.

Scores and context use the channels-first tensors as they are: ``S = Q^T K`` and
``C = V P^T``. Both transposes act on a MatMul operand only, so torch passes them to BLAS as
flags and ONNX Runtime / TensorRT fold them into the MatMul (``FusedMatMul`` / op transpose);
no ``[B, T, D]`` <-> ``[B, D, T]`` round trip happens inside a layer. The key bias (padding,
``[B, 1, 1, T]``, additive) is added to the scores exactly as in the original model.

**Unequal head counts.** Members may keep different numbers of heads in a layer, but a GFC
wants equal group sizes. Every member is padded to the layer's largest kept count ``Hp`` with
*zero heads*: their Q, K, V weights and biases and their O columns are zero. A zero head has
``V = 0``, so its context is 0 whatever its (uniform) attention is, and its zero O columns add
nothing: the padding is exact, not approximate. Cost: each zero head spends the FLOPs of a real
head (Q/K/V/O projections ``8 * T * D * d`` and scores + context ``4 * T^2 * d`` per sample) and
its weights are stored; :mod:`toolchain.hydra.cost` counts them. With equal counts (the usual
case: a fixed number of heads per layer and member) there is no padding at all.
"""

from __future__ import annotations

import torch
from torch import nn

from toolchain.hydra.gfc import GroupedLinear, check_lowering, merge_channels, split_channels


def grouped_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    key_bias: torch.Tensor | None,
    heads: int,
    head_dim: int,
) -> torch.Tensor:
    """Scaled dot-product attention of ``heads`` independent heads, channels-first.

    Args:
        q: ``[B, heads * d, T]`` queries, already multiplied by the head scaling.
        k: ``[B, heads * d, T]`` keys.
        v: ``[B, heads * d, T]`` values.
        key_bias: additive, broadcastable to ``[B, heads, T, T]`` (``[B, 1, 1, T]``), or ``None``.
        heads: total number of heads (members x head slots).
        head_dim: channels per head ``d`` (a Python int: the exported graph keeps it static).

    Returns:
        Context ``[B, heads * d, T]``.
    """
    qh = split_channels(q, heads, head_dim)  # [B, G, d, T]
    kh = split_channels(k, heads, head_dim)
    vh = split_channels(v, heads, head_dim)
    scores = torch.matmul(qh.transpose(-1, -2), kh)  # [B, G, Tq, Tk]
    if key_bias is not None:
        scores = scores + key_bias
    probs = torch.softmax(scores, dim=-1)
    context = torch.matmul(vh, probs.transpose(-1, -2))  # [B, G, d, Tq]
    return merge_channels(context, heads * head_dim)


class HydraAttention(nn.Module):
    """Q/K/V/O GFC layers over ``members`` streams, ``heads`` head slots per member.

    ``q``, ``k``, ``v``: ``GroupedLinear(members, hidden, heads * head_dim)``; ``o``:
    ``GroupedLinear(members, heads * head_dim, hidden)``. The score scaling (the source's
    ``1 / sqrt(head_dim)``, kept in :class:`~toolchain.hydra.config.LayerSpec`) is folded into
    the Q weights and bias when the model is filled, so no multiply runs at inference.
    """

    def __init__(self, members: int, hidden: int, heads: int, head_dim: int, *, lowering: str = "conv") -> None:
        super().__init__()
        check_lowering(lowering)
        self.members = members
        self.heads = heads
        self.head_dim = head_dim
        inner = heads * head_dim
        self.q = GroupedLinear(members, hidden, inner, lowering=lowering)
        self.k = GroupedLinear(members, hidden, inner, lowering=lowering)
        self.v = GroupedLinear(members, hidden, inner, lowering=lowering)
        self.o = GroupedLinear(members, inner, hidden, lowering=lowering)

    def forward(self, x: torch.Tensor, key_bias: torch.Tensor | None) -> torch.Tensor:
        """``x [B, M * D, T]`` -> attention output ``[B, M * D, T]`` (before the residual)."""
        context = grouped_attention(self.q(x), self.k(x), self.v(x), key_bias, self.members * self.heads, self.head_dim)
        return self.o(context)

    def extra_repr(self) -> str:
        """Sizes shown by ``repr``."""
        return f"members={self.members}, heads={self.heads}, head_dim={self.head_dim}"
