"""One fused transformer layer: LayerNorms, grouped attention and the merged MLP of M streams.

All tensors are channels-first streams ``[B, M * D, T]``. Residual layout follows the source
family's ``norm_style`` (a Python constant, no data-dependent control flow):

* ``post`` (BERT): ``x = LN1(x + O(attn(x)))``; ``x = LN2(x + fc2(act(fc1(x))))``
* ``pre`` (ViT, CLIP): ``x = x + O(attn(LN1(x)))``; ``x = x + fc2(act(fc1(LN2(x))))``

LayerNorm modes (:class:`StreamLayerNorm`): ``grouped`` keeps every member's own affine
parameters ``[M, D]``; ``average`` stores one ``[D]`` set, the mean over members. Either way
the statistics are per member and per token (over that member's D channels).

MLP modes (:class:`HydraMLP`): ``average`` stores one fc1/fc2 weight set, the mean of the
members' (when fused from one model, that model's MLP) and applies it to every stream without
copying it (:func:`~toolchain.hydra.gfc.stream_linear`); ``grouped`` keeps each member's MLP
as GFC layers (an exact ensemble at M times the MLP weights). Both cost M MLPs of FLOPs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

import torch
from torch import nn
from transformers.activations import ACT2FN

from toolchain.hydra.attention import HydraAttention
from toolchain.hydra.gfc import GroupedLinear, StreamLinear, merge_channels, split_channels

if TYPE_CHECKING:
    from toolchain.hydra.config import LayerSpec

MergeMode = Literal["average", "grouped"]
MERGE_MODES: tuple[str, ...] = ("average", "grouped")


def check_mode(field: str, mode: str) -> str:
    """Return ``mode`` if it is ``average`` or ``grouped``; else raise naming ``field``."""
    if mode not in MERGE_MODES:
        raise ValueError(f"{field} must be one of {MERGE_MODES}; got {mode!r}")
    return mode


def stream_layer_norm(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, streams: int, eps: float
) -> torch.Tensor:
    """LayerNorm over each member's channels of a channels-first stream.

    Args:
        x: ``[B, M * D, T]``.
        weight: ``[M, D]`` (per member) or ``[D]`` (shared by the members).
        bias: same shape as ``weight``.
        streams: M.
        eps: added to the variance (biased, as ``nn.LayerNorm``).

    Returns:
        ``[B, M * D, T]``.
    """
    width = int(weight.shape[-1])
    y = split_channels(x, streams, width)  # [B, M, D, T]
    centred = y - y.mean(dim=2, keepdim=True)
    var = (centred * centred).mean(dim=2, keepdim=True)  # two-pass variance, as nn.LayerNorm
    # addcmul: the affine in one pass (half the time of ``* weight + bias`` in eager torch)
    out = torch.addcmul(bias.unsqueeze(-1), centred * torch.rsqrt(var + eps), weight.unsqueeze(-1))
    return merge_channels(out, streams * width)


class StreamLayerNorm(nn.Module):
    """LayerNorm of M streams: affine ``[M, D]`` (``grouped``) or ``[D]`` (``average``)."""

    def __init__(self, streams: int, hidden: int, eps: float, mode: str = "grouped") -> None:
        super().__init__()
        self.streams = streams
        self.eps = float(eps)
        self.mode = check_mode("layernorm", mode)
        shape = (streams, hidden) if mode == "grouped" else (hidden,)
        self.weight = nn.Parameter(torch.ones(shape))
        self.bias = nn.Parameter(torch.zeros(shape))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x [B, M * D, T]`` -> normalised ``[B, M * D, T]``."""
        return stream_layer_norm(x, self.weight, self.bias, self.streams, self.eps)

    def extra_repr(self) -> str:
        """Options shown by ``repr``."""
        return f"streams={self.streams}, mode={self.mode!r}, eps={self.eps:g}"


class HydraMLP(nn.Module):
    """fc1 -> activation -> fc2 on M streams, merged (``average``) or per member (``grouped``)."""

    def __init__(
        self, streams: int, hidden: int, intermediate: int, act_name: str, *, mode: str = "average",
        lowering: str = "conv",
    ) -> None:
        super().__init__()
        self.mode = check_mode("mlp", mode)
        if act_name not in ACT2FN:
            raise ValueError(f"activation {act_name!r} is not a transformers activation (ACT2FN)")
        layer = StreamLinear if mode == "average" else GroupedLinear
        self.fc1 = layer(streams, hidden, intermediate, lowering=lowering)
        self.fc2 = layer(streams, intermediate, hidden, lowering=lowering)
        self.act = ACT2FN[act_name]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x [B, M * D, T]`` -> ``[B, M * D, T]``."""
        return self.fc2(self.act(self.fc1(x)))


class HydraBlock(nn.Module):
    """One fused layer; the structure comes from a :class:`~toolchain.hydra.model.LayerSpec`."""

    def __init__(
        self, spec: LayerSpec, members: int, hidden: int, *, mlp: str, layernorm: str, lowering: str
    ) -> None:
        super().__init__()
        self.norm_style = spec.norm_style
        if self.norm_style not in ("post", "pre"):
            raise ValueError(f"norm_style must be 'post' or 'pre'; got {self.norm_style!r}")
        self.attention = HydraAttention(
            members, hidden, spec.padded_heads, spec.head_dim, lowering=lowering
        )
        self.ln_attn = StreamLayerNorm(members, hidden, spec.ln_attn_eps, layernorm)
        self.ln_mlp = StreamLayerNorm(members, hidden, spec.ln_mlp_eps, layernorm)
        self.mlp = HydraMLP(members, hidden, spec.intermediate_size, spec.act_name, mode=mlp, lowering=lowering)

    def forward(self, x: torch.Tensor, key_bias: torch.Tensor | None) -> torch.Tensor:
        """``x [B, M * D, T]``, ``key_bias [B, 1, 1, T]`` or ``None`` -> ``[B, M * D, T]``."""
        if self.norm_style == "post":
            x = self.ln_attn(x + self.attention(x, key_bias))
            return self.ln_mlp(x + self.mlp(x))
        x = x + self.attention(self.ln_attn(x), key_bias)
        return x + self.mlp(self.ln_mlp(x))
