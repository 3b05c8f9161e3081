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

from toolchain.hydra.gfc import (
    GroupedLinear,
    check_lowering,
    grouped_linear,
    grouped_linear_tokens,
    merge_channels,
    reshape,
    split_channels,
)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, dim: int) -> torch.Tensor:
    """Rotary position embedding of heads ``x`` along their ``head_dim`` axis ``dim`` (Hugging Face's ``rotate_half``).

    ``x * cos + rotate_half(x) * sin`` with ``rotate_half([x1, x2]) = [-x2, x1]`` (halves of the
    head); ``cos``/``sin`` broadcast to ``x``. Linear in ``x``, so the score scaling folded into Q
    commutes with it, and a zero (padding) head stays zero.
    """
    half = x.shape[dim] // 2
    x1, x2 = torch.split(x, [half, half], dim=dim)
    return x * cos + torch.cat([-x2, x1], dim=dim) * sin


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_bias: torch.Tensor | None) -> torch.Tensor:
    """Scaled dot-product attention of independent heads, channels-first.

    Args:
        q: ``[..., d, T]``, e.g. ``[B, G, d, T]`` or ``[B, M, Hp, d, T]``, already multiplied by
            the head scaling.
        k: keys, shaped like ``q``.
        v: values, shaped like ``q``.
        key_bias: additive, broadcastable to the scores ``[..., T, T]`` (``[B, 1, 1, T]`` for
            4-D heads, ``[B, 1, 1, 1, T]`` for 5-D), or ``None``.

    Returns:
        Context, shaped like ``v``.
    """
    scores = torch.matmul(q.transpose(-1, -2), k)  # [B, G, Tq, Tk]
    if key_bias is not None:
        scores = scores + key_bias
    probs = torch.softmax(scores, dim=-1)
    return torch.matmul(v, probs.transpose(-1, -2))  # [B, G, d, Tq]


def grouped_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    key_bias: torch.Tensor | None,
    heads: int,
    head_dim: int,
) -> torch.Tensor:
    """:func:`attend` on channels-first streams.

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
    qh, kh, vh = (split_channels(t, heads, head_dim) for t in (q, k, v))  # [B, G, d, T]
    return merge_channels(attend(qh, kh, vh, key_bias), heads * head_dim)


class HydraAttention(nn.Module):
    """Q/K/V/O GFC layers over ``members`` streams, ``heads`` head slots per member.

    ``q``, ``k``, ``v``: ``GroupedLinear(members, hidden, heads * head_dim)``; ``o``:
    ``GroupedLinear(members, heads * head_dim, hidden)``. The score scaling (the source's
    ``1 / sqrt(head_dim)``, kept in :class:`~toolchain.hydra.config.LayerSpec`) is folded into
    the Q weights and bias when the model is filled, so no multiply runs at inference.

    Q, K and V run as **one** GFC: their weights are concatenated per member (``[M, 3 * Hp * d,
    D]``; the ONNX exporter folds the concatenation into one initializer), its output is viewed
    as ``[B, M, 3 * Hp, d, T]`` (one ``Reshape``) and split into Q, K and V (one ``Split``);
    the heads stay 5-D ``[B, M, Hp, d, T]`` through the attention and the O GFC reads the
    context as it is (one ``Reshape`` back to its own layout). Against three GFCs this is one
    grouped GEMM instead of three (small models pay per kernel) and, for the MatMul lowering,
    one input reshape and one bias ``Add`` instead of three. The parameters stay three modules,
    so saved models load unchanged.
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

    def forward(self, x: torch.Tensor, key_bias: torch.Tensor | None,
                rope: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        """Attention output (before the residual), in the stream layout of the lowering.

        ``x``: ``[B, M * D, T]`` (``conv``) or ``[B, M, T, D]`` (``matmul``, see
        :data:`~toolchain.hydra.gfc.LAYOUTS`); the output has the same shape. ``key_bias``:
        ``[B, 1, 1, 1, T]`` (what :class:`~toolchain.hydra.model.HydraModel` passes: unsqueezed
        once for all layers), ``[B, 1, 1, T]``, a causal ``[B, 1, 1, T, T]`` or ``None``.
        ``rope``: ``(cos, sin)`` shaped ``[., 1, 1, d, T]`` (``conv``) or ``[., 1, T, 1, d]``
        (``matmul``): every member's Q and K heads are rotated, after the score scaling.
        """
        m, hp, d = self.members, self.heads, self.head_dim
        weight = torch.cat([self.q.weight, self.k.weight, self.v.weight], dim=1)  # [M, 3 * Hp * d, D]
        bias = torch.cat([self.q.bias, self.k.bias, self.v.bias], dim=1)
        if key_bias is not None and key_bias.dim() == 4:
            key_bias = key_bias.unsqueeze(1)
        if self.q.lowering == "conv":
            qkv = grouped_linear(x, weight, bias, "conv", sizes=(m, 3 * hp * d, self.q.in_features))
            qkv = reshape(qkv, (0, m, 3 * hp, d, -1))  # [B, M, 3 * Hp, d, T]: heads of each member
            q, k, v = torch.split(qkv, [hp] * 3, dim=2)  # [B, M, Hp, d, T] each
            if rope is not None:
                q, k = apply_rope(q, *rope, dim=3), apply_rope(k, *rope, dim=3)
            return self.o(attend(q, k, v, key_bias))  # the O GFC reads the [B, M, Hp, d, T] context as it is
        qkv = grouped_linear_tokens(x, weight, bias)  # [B, M, T, 3 * Hp * d]
        qkv = reshape(qkv, (0, m, -1, 3 * hp, d))  # [B, M, T, 3 * Hp, d]
        q, k, v = torch.split(qkv, [hp] * 3, dim=3)  # [B, M, T, Hp, d] each
        if rope is not None:
            q, k = apply_rope(q, *rope, dim=4), apply_rope(k, *rope, dim=4)
        # token-major heads, as the source model lays them out: 4 Transposes per layer
        scores = torch.matmul(q.permute(0, 1, 3, 2, 4), k.permute(0, 1, 3, 4, 2))  # [B, M, Hp, Tq, Tk]
        if key_bias is not None:
            scores = scores + key_bias
        context = torch.matmul(torch.softmax(scores, dim=-1), v.permute(0, 1, 3, 2, 4))  # [B, M, Hp, T, d]
        context = reshape(context.permute(0, 1, 3, 2, 4), (0, m, -1, hp * d))  # [B, M, T, Hp * d]
        return grouped_linear_tokens(context, self.o.weight, self.o.bias)

    def extra_repr(self) -> str:
        """Sizes shown by ``repr``."""
        return f"members={self.members}, heads={self.heads}, head_dim={self.head_dim}"
