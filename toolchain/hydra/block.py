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

Decoder layers (LLaMA): ``norm="rms"`` normalises by the root mean square (no mean, no bias);
a gated MLP (SwiGLU, ``fc2(act(gate(x)) * up(x))``) stores gate and up as one fc1 of twice the
width, split after it. ``average`` averages gate, up and down weights each, as it averages fc1
and fc2: exact when the members share the source MLP (fused from one model), the Hydra
approximation otherwise; ``grouped`` keeps each member's three matrices.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from transformers.activations import ACT2FN

from toolchain.hydra.attention import HydraAttention
from toolchain.hydra.config import MERGE_MODES, LayerSpec
from toolchain.hydra.gfc import (
    LAYOUTS,
    GroupedLinear,
    StreamLinear,
    check_lowering,
    fold_streams,
    grouped_linear_tokens,
    reshape,
    shared_linear,
    unfold_streams,
)


def check_mode(field: str, mode: str) -> str:
    """Return ``mode`` if it is ``average`` or ``grouped``; else raise naming ``field``."""
    if mode not in MERGE_MODES:
        raise ValueError(f"{field} must be one of {MERGE_MODES}; got {mode!r}")
    return mode


def stream_layer_norm(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, streams: int, eps: float, *,
    width: int | None = None, layout: str = "channels",
) -> torch.Tensor:
    """LayerNorm over each member's channels of a stream.

    Args:
        x: ``[B, M * D, T]`` (``layout="channels"``) or ``[B, M, T, D]`` (``"tokens"``).
        weight: ``[M, D]`` (per member) or ``[D]`` (shared by the members).
        bias: same shape as ``weight``.
        streams: M.
        eps: added to the variance (biased, as ``nn.LayerNorm``).
        width: D as a Python int (modules pass theirs); ``None`` reads ``weight.shape``.
        layout: the stream layout (:data:`~toolchain.hydra.gfc.LAYOUTS`).

    Returns:
        Normalised ``x``, same shape.

    ONNX: one ``LayerNormalization(axis=-1)``; a per-member affine ``[M, D]`` adds one ``Mul`` and
    one ``Add`` after the normalisation (a shared ``[D]`` affine is the node's own scale and
    bias). ``LayerNormalization`` normalises trailing axes only, so the channels-first stream is
    viewed token-major around it (``Transpose -> Reshape [0, -1, M, D]`` and back). The
    statistics-only node is the whole FP32 island of an FP16/BF16 graph
    (:mod:`toolchain.export.precision_rules`); the decomposed form it replaces (ReduceMean, Sub,
    Mul, ReduceMean, Add, Sqrt, Div plus the affine) needed a pattern match for that.
    """
    width = int(weight.shape[-1]) if width is None else width
    tokens = x if layout == "tokens" else reshape(x.transpose(1, 2), (0, -1, streams, width))  # [B, ., ., D]
    if weight.dim() == 1:
        y = F.layer_norm(tokens, (width,), weight, bias, eps)
    elif layout == "tokens":  # [B, M, T, D]: the affine broadcasts as [M, 1, D]
        y = F.layer_norm(tokens, (width,), None, None, eps) * weight.unsqueeze(1) + bias.unsqueeze(1)
    else:  # [B, T, M, D]
        y = F.layer_norm(tokens, (width,), None, None, eps) * weight + bias
    return y if layout == "tokens" else reshape(y, (0, -1, streams * width)).transpose(1, 2)


def stream_rms_norm(x: torch.Tensor, weight: torch.Tensor, streams: int, eps: float, *, width: int,
                    layout: str = "channels") -> torch.Tensor:
    """RMSNorm over each member's channels: ``x / sqrt(mean(x^2) + eps) * weight`` (``weight`` ``[M, D]`` or ``[D]``).

    Computed in float32 as Hugging Face's ``LlamaRMSNorm``; the ``ReduceMean`` is kept in FP32 by
    the precision pass of an FP16/BF16 graph, the square before it is not.
    """
    tokens = x if layout == "tokens" else reshape(x.transpose(1, 2), (0, -1, streams, width))  # [B, ., ., D]
    y = tokens * torch.rsqrt(tokens.pow(2).mean(dim=-1, keepdim=True) + eps)
    if weight.dim() == 1:
        y = y * weight
    elif layout == "tokens":
        y = y * weight.unsqueeze(1)
    else:
        y = y * weight
    return y if layout == "tokens" else reshape(y, (0, -1, streams * width)).transpose(1, 2)


class StreamLayerNorm(nn.Module):
    """LayerNorm (or RMSNorm, ``norm="rms"``) of M streams: affine ``[M, D]`` (``grouped``) or ``[D]`` (``average``).

    An RMSNorm keeps a zero ``bias`` parameter (unused) so every fused model has the same state-dict keys.
    """

    def __init__(self, streams: int, hidden: int, eps: float, mode: str = "grouped", *, lowering: str = "conv",
                 norm: str = "layer") -> None:
        super().__init__()
        if norm not in ("layer", "rms"):
            raise ValueError(f"norm must be 'layer' or 'rms'; got {norm!r}")
        self.norm = norm
        self.lowering = check_lowering(lowering)  # decides the stream layout (LAYOUTS)
        self.streams = streams
        self.hidden = hidden
        self.eps = float(eps)
        self.mode = check_mode("layernorm", mode)
        shape = (streams, hidden) if mode == "grouped" else (hidden,)
        self.weight = nn.Parameter(torch.ones(shape))
        self.bias = nn.Parameter(torch.zeros(shape))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x [B, M * D, T]`` (``conv``) or ``[B, M, T, D]`` (``matmul``) -> normalised, same shape."""
        if self.norm == "rms":
            return stream_rms_norm(x, self.weight, self.streams, self.eps, width=self.hidden,
                                   layout=LAYOUTS[self.lowering])
        return stream_layer_norm(x, self.weight, self.bias, self.streams, self.eps, width=self.hidden,
                                 layout=LAYOUTS[self.lowering])

    def extra_repr(self) -> str:
        """Options shown by ``repr``."""
        return f"streams={self.streams}, mode={self.mode!r}, norm={self.norm!r}, eps={self.eps:g}"


class HydraMLP(nn.Module):
    """fc1 -> activation -> fc2 on M streams, merged (``average``) or per member (``grouped``)."""

    def __init__(
        self, streams: int, hidden: int, intermediate: int, act_name: str, *, mode: str = "average",
        lowering: str = "conv", gated: bool = False,
    ) -> None:
        super().__init__()
        self.mode = check_mode("mlp", mode)
        if act_name not in ACT2FN:
            raise ValueError(f"activation {act_name!r} is not a transformers activation (ACT2FN)")
        layer = StreamLinear if mode == "average" else GroupedLinear
        self.gated = gated
        self.intermediate = intermediate
        self.fc1 = layer(streams, hidden, (2 if gated else 1) * intermediate, lowering=lowering)  # gated: [gate; up]
        self.fc2 = layer(streams, intermediate, hidden, lowering=lowering)
        self.act = ACT2FN[act_name]

    def _inner(self, h: torch.Tensor, dim: int) -> torch.Tensor:
        """``act(h)``, or ``act(gate) * up`` with gate and up the two halves of ``h`` along ``dim``."""
        if not self.gated:
            return self.act(h)
        gate, up = torch.split(h, [self.intermediate, self.intermediate], dim=dim)
        return self.act(gate) * up

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x [B, M * D, T]`` (``conv``) or ``[B, M, T, D]`` (``matmul``) -> same shape.

        Channels-first, the member layout changes once around the MLP, not around each layer:
        ``average`` folds the members into the batch, runs fc1 / act / fc2 on ``[B * M, ., T]``
        and unfolds; ``grouped`` runs two grouped Convs. Token-major, fc1 and fc2 are ``MatMul``
        + ``Add`` on ``[B, M, T, .]`` (broadcast over the members for ``average``).
        """
        fc1, fc2 = self.fc1, self.fc2
        if fc1.lowering == "matmul":
            if isinstance(fc1, StreamLinear):
                return F.linear(self._inner(F.linear(x, fc1.weight, fc1.bias), -1), fc2.weight, fc2.bias)
            inner = self._inner(grouped_linear_tokens(x, fc1.weight, fc1.bias), -1)
            return grouped_linear_tokens(inner, fc2.weight, fc2.bias)
        if isinstance(fc1, StreamLinear):
            h = fold_streams(x, fc1.streams, fc1.in_features)
            h = shared_linear(self._inner(shared_linear(h, fc1.weight, fc1.bias, "conv"), 1), fc2.weight, fc2.bias,
                              "conv")
            return unfold_streams(h, fc2.streams, fc2.out_features)
        if not self.gated:
            return fc2(self.act(fc1(x)))
        h = reshape(fc1(x), (0, fc1.groups, fc1.out_features, -1))  # [B, M, 2I, T]: each member's gate and up
        return fc2(reshape(self._inner(h, 2), (0, fc2.groups * fc2.in_features, -1)))


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
        self.ln_attn = StreamLayerNorm(members, hidden, spec.ln_attn_eps, layernorm, lowering=lowering,
                                       norm=spec.norm)
        self.ln_mlp = StreamLayerNorm(members, hidden, spec.ln_mlp_eps, layernorm, lowering=lowering, norm=spec.norm)
        self.mlp = HydraMLP(members, hidden, spec.intermediate_size, spec.act_name, mode=mlp, lowering=lowering,
                            gated=spec.mlp_gated)

    def forward(self, x: torch.Tensor, key_bias: torch.Tensor | None,
                rope: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        """Stream ``x`` (``[B, M * D, T]`` for ``conv``, ``[B, M, T, D]`` for ``matmul``) -> same shape.

        ``key_bias``: ``[B, 1, 1, 1, T]`` / ``[B, 1, 1, T]`` (or ``[.., T, T]``, causal) or ``None``.
        ``rope``: the RoPE ``(cos, sin)`` in the lowering's head layout (see :class:`HydraAttention`).
        """
        if self.norm_style == "post":
            x = self.ln_attn(x + self.attention(x, key_bias, rope))
            return self.ln_mlp(x + self.mlp(x))
        x = x + self.attention(self.ln_attn(x), key_bias, rope)
        return x + self.mlp(self.ln_mlp(x))
