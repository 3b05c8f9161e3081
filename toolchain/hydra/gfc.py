"""Grouped fully-connected (GFC) layers: M independent linear maps run as one operation.

Stream layout (the whole fused model uses it): **channels-first** ``[batch, M * C, tokens]``,
member ``m`` owning channels ``m * C .. (m + 1) * C - 1``. On this layout a GFC is exactly a
grouped 1-D convolution with kernel size 1 and ``groups = M``, the form TensorRT maps to one
``IConvolutionLayer`` (measured on ONNX Runtime CPU: 1.0-1.6x the batched MatMul's time,
against 3-9x for a ``[N, C, 1]`` layout).

Shapes are only ever split or merged with :func:`reshape`, whose shape is a constant in ONNX
``Reshape`` semantics (``0`` keeps the input's dim, ``-1`` is inferred, the channel sizes are
Python ints): one ``Reshape`` node per split or merge, batch and tokens dynamic, channel dims
static (the grouped ``Conv`` needs them for TensorRT). Python ints read from ``x.shape`` would
trace into a ``Shape -> Gather -> Unsqueeze -> Concat`` chain per use.

Two lowerings, same numbers (tested against each other and against a dense block-diagonal
matrix):

* ``"conv"``: ``F.conv1d(x, w.reshape(M * out, in, 1), b.reshape(M * out), groups=M)``; ONNX
  ``Conv(group=M)`` whose weight is a constant initializer after export.
* ``"matmul"``: ``w [M, out, in] @ x.reshape(B, M, in, T)`` (broadcast batched MatMul) plus bias,
  reshaped back; ONNX ``Reshape -> MatMul -> Add -> Reshape``. :func:`grouped_linear`'s
  ``split`` keeps ``[B, M, out, T]`` so that chained GFCs reshape once.

:func:`stream_linear` is the shared-weight counterpart: one ``[out, in]`` weight applied to each
of the M streams (the averaged MLP of a Hydra model). It folds the member axis into the batch
axis (:func:`fold_streams`), so the weights are never copied M times.
"""

from __future__ import annotations

from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import nn

Lowering = Literal["conv", "matmul"]
LOWERINGS: tuple[str, ...] = ("conv", "matmul")


def check_lowering(lowering: str) -> str:
    """Return ``lowering`` if it is one of :data:`LOWERINGS`, else raise ``ValueError`` naming it."""
    if lowering not in LOWERINGS:
        raise ValueError(f"lowering must be one of {LOWERINGS}; got {lowering!r}")
    return lowering


class _OnnxReshape(torch.autograd.Function):
    """``reshape`` with ONNX semantics, exported as one ``Reshape`` node with a constant shape."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
        ctx.in_shape = x.shape
        return x.reshape([x.shape[i] if s == 0 else s for i, s in enumerate(shape)])

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad.reshape(ctx.in_shape), None

    @staticmethod
    def symbolic(g: Any, x: Any, shape: tuple[int, ...]) -> Any:
        from torch.onnx import symbolic_helper

        out = g.op("Reshape", x, g.op("Constant", value_t=torch.tensor(shape, dtype=torch.int64)))
        sizes = symbolic_helper._get_tensor_sizes(x)  # the exporter's own view: None where dynamic
        dims = [s if s > 0 else (sizes[i] if s == 0 and sizes is not None else None) for i, s in enumerate(shape)]
        out.setType(x.type().with_sizes(dims))  # later symbolics (transpose, split) need the rank
        return out


def reshape(x: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    """``x`` reshaped with ONNX ``Reshape`` semantics: ``0`` keeps the input's dim there, ``-1`` is inferred.

    Exported (TorchScript exporter) as **one** ``Reshape`` whose shape is a constant such as
    ``[0, M, C, -1]``; ``x.reshape(x.shape[0], M, C, x.shape[-1])`` would export a
    ``Shape -> Gather -> Unsqueeze -> Concat`` chain per dynamic dim and per call (measured on the
    ViT recipe's model: 94 ``Shape`` nodes in the Hydra graph, 23 in the single model). Batch and
    tokens stay dynamic; the channel sizes (Python ints) stay static, as the grouped ``Conv``
    needs for TensorRT. In eager mode it is ``torch.reshape`` (a view where possible).
    """
    if any(s < -1 for s in shape) or list(shape).count(-1) > 1 or (0 in shape and -1 not in shape):
        # the TorchScript exporter's shape inference asserts on a 0 without a -1
        raise ValueError(f"reshape: a shape holds sizes, 0 (keep) and one -1 (required with a 0); got {shape}")
    return _OnnxReshape.apply(x, tuple(int(s) for s in shape))


def split_channels(x: torch.Tensor, groups: int, per_group: int) -> torch.Tensor:
    """``[B, groups * per_group, T] -> [B, groups, per_group, T]`` (one ``Reshape [0, G, C, -1]``).

    Also accepts any ``[B, ..., T]`` holding ``groups * per_group`` channels in that order.
    """
    return reshape(x, (0, groups, per_group, -1))


def merge_channels(x: torch.Tensor, channels: int) -> torch.Tensor:
    """``[B, ..., T] -> [B, channels, T]`` (one ``Reshape [0, channels, -1]``)."""
    return reshape(x, (0, channels, -1))


def grouped_linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, lowering: str = "conv",
    *, split: bool = False, sizes: tuple[int, int, int] | None = None,
) -> torch.Tensor:
    """M linear maps on a channels-first stream, in the lowering's own layout.

    Args:
        x: ``[B, M * in, T]``, already split ``[B, M, in, T]``, or ``[B, M, a, b, T]`` with
            ``a * b = in`` (the attention's 5-D heads).
        weight: ``[M, out, in]``.
        bias: ``[M, out]`` or ``None``.
        lowering: ``conv`` (works on ``[B, M * in, T]``) or ``matmul`` (on ``[B, M, in, T]``).
        split: return ``[B, M, out, T]`` instead of ``[B, M * out, T]``.
        sizes: ``(M, out, in)`` as Python ints (modules pass theirs); ``None`` reads
            ``weight.shape``, which an exporter's tracer reports as a TracerWarning.

    A reshape is emitted only where the input or output form differs from the lowering's own,
    so chained GFCs (the grouped MLP) and the attention's head split add no reshape pairs.
    ``y[:, m*out:(m+1)*out] = weight[m] @ x[:, m*in:(m+1)*in] + bias[m]``.
    """
    groups, out_f, in_f = sizes if sizes is not None else (int(v) for v in weight.shape)
    if lowering == "conv":
        if x.dim() != 3:
            x = merge_channels(x, groups * in_f)
        w = weight.reshape(groups * out_f, in_f, 1)  # folded into the initializer at export
        b = bias.reshape(groups * out_f) if bias is not None else None
        y = F.conv1d(x, w, b, groups=groups)
        return split_channels(y, groups, out_f) if split else y
    if lowering == "matmul":
        if x.dim() != 4:
            x = split_channels(x, groups, in_f)
        y = torch.matmul(weight, x)  # [B, M, out, T]
        if bias is not None:
            y = y + bias.unsqueeze(-1)
        return y if split else merge_channels(y, groups * out_f)
    raise ValueError(f"lowering must be one of {LOWERINGS}; got {lowering!r}")


def gfc_conv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """Grouped linear as a grouped 1-D convolution: ``x [B, M * in, T]`` -> ``[B, M * out, T]``.

    ``weight [M, out, in]``, ``bias [M, out]`` or ``None``; ONNX ``Conv(group=M)``.
    """
    return grouped_linear(x, weight, bias, "conv")


def gfc_matmul(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """Grouped linear as reshape + broadcast batched MatMul (same contract as :func:`gfc_conv`)."""
    return grouped_linear(x, weight, bias, "matmul")


def fold_streams(x: torch.Tensor, streams: int, width: int) -> torch.Tensor:
    """``[B, streams * width, T] -> [B * streams, width, T]`` (members folded into the batch)."""
    del streams  # implied by the channel count; kept in the signature for the reader
    return reshape(x, (-1, width, 0))


def unfold_streams(x: torch.Tensor, streams: int, width: int) -> torch.Tensor:
    """``[B * streams, width, T] -> [B, streams * width, T]`` (inverse of :func:`fold_streams`)."""
    return reshape(x, (-1, streams * width, 0))


def shared_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, lowering: str) -> torch.Tensor:
    """One ``[out, in]`` map on a folded stream ``[N, in, T] -> [N, out, T]`` (1x1 conv or MatMul)."""
    if lowering == "conv":
        return F.conv1d(x, weight.unsqueeze(-1), bias)
    if lowering == "matmul":
        y = torch.matmul(weight, x)
        return y + bias.unsqueeze(-1) if bias is not None else y
    raise ValueError(f"lowering must be one of {LOWERINGS}; got {lowering!r}")


def stream_linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, streams: int, lowering: str = "conv",
    *, sizes: tuple[int, int] | None = None,
) -> torch.Tensor:
    """One linear map applied to every stream, weights stored once.

    Args:
        x: ``[B, streams * in, T]``.
        weight: ``[out, in]``.
        bias: ``[out]`` or ``None``.
        streams: M, the number of member streams.
        lowering: ``conv`` (1x1 convolution) or ``matmul``.
        sizes: ``(out, in)`` as Python ints (modules pass theirs); ``None`` reads ``weight.shape``.

    Returns:
        ``[B, streams * out, T]``. The member axis is folded into the batch
        (:func:`fold_streams`), so the weights are never copied M times; a chain of shared maps
        (the averaged MLP) folds once and unfolds once.
    """
    out_f, in_f = (int(v) for v in weight.shape) if sizes is None else sizes
    y = shared_linear(fold_streams(x, streams, in_f), weight, bias, lowering)
    return unfold_streams(y, streams, out_f)


def grouped_linear_tokens(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """M linear maps on a token-major stream: ``x [B, M, T, in]`` -> ``[B, M, T, out]``.

    ``x @ weight^T + bias`` with ``weight [M, out, in]`` (the exporter folds the transpose into
    the initializer) and ``bias [M, out]`` added along the last axis: ONNX ``MatMul -> Add``.
    This is the MatMul lowering's form inside :class:`~toolchain.hydra.model.HydraModel`
    (see :data:`LAYOUTS`): a bias along the channels-first stream's *middle* axis broadcasts over
    short token rows, which ONNX Runtime's CPU ``Add`` runs at a fraction of its speed (measured
    on the ViT recipe's model: 16 such adds took 0.8 ms of a 5.3 ms batch-8 run).
    """
    y = torch.matmul(x, weight.transpose(1, 2))
    return y + bias.unsqueeze(1) if bias is not None else y


#: stream layout of the fused model per lowering: ``channels`` = ``[B, M * D, T]`` (the grouped
#: Conv's own layout), ``tokens`` = ``[B, M, T, D]`` (batched MatMul with the bias on the last axis,
#: LayerNorm over the last axis with no transposes, the attention laid out as in the source model)
LAYOUTS: dict[str, str] = {"conv": "channels", "matmul": "tokens"}


def block_diagonal(weight: torch.Tensor) -> torch.Tensor:
    """Dense ``[M * out, M * in]`` block-diagonal matrix of a ``[M, out, in]`` GFC weight (reference)."""
    return torch.block_diag(*weight.unbind(0))


class GroupedLinear(nn.Module):
    """M independent linear maps on a channels-first stream ``[B, M * in, T] -> [B, M * out, T]``.

    The weight is stored as ``[M, out, in]`` and the bias as ``[M, out]``; ``lowering`` ("conv" or
    "matmul") picks the implementation and may be changed after construction.
    """

    def __init__(
        self, groups: int, in_features: int, out_features: int, *, bias: bool = True, lowering: str = "conv"
    ) -> None:
        super().__init__()
        for name, value in (("groups", groups), ("in_features", in_features), ("out_features", out_features)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"GroupedLinear {name} must be a positive int; got {value!r}")
        self.groups = groups
        self.in_features = in_features
        self.out_features = out_features
        self.lowering = check_lowering(lowering)
        self.weight = nn.Parameter(torch.zeros(groups, out_features, in_features))
        self.bias = nn.Parameter(torch.zeros(groups, out_features)) if bias else None

    def forward(self, x: torch.Tensor, *, split: bool = False) -> torch.Tensor:
        """``x [B, M * in, T]`` (or a split form, see :func:`grouped_linear`) -> ``[B, M * out, T]``.

        ``split``: return ``[B, M, out, T]``.
        """
        sizes = (self.groups, self.out_features, self.in_features)
        return grouped_linear(x, self.weight, self.bias, self.lowering, split=split, sizes=sizes)

    def extra_repr(self) -> str:
        """Sizes and lowering shown by ``repr``."""
        return (
            f"groups={self.groups}, in_features={self.in_features}, out_features={self.out_features}, "
            f"bias={self.bias is not None}, lowering={self.lowering!r}"
        )


class StreamLinear(nn.Module):
    """One linear map shared by M streams ``[B, M * in, T] -> [B, M * out, T]`` (weight ``[out, in]``)."""

    def __init__(
        self, streams: int, in_features: int, out_features: int, *, bias: bool = True, lowering: str = "conv"
    ) -> None:
        super().__init__()
        for name, value in (("streams", streams), ("in_features", in_features), ("out_features", out_features)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"StreamLinear {name} must be a positive int; got {value!r}")
        self.streams = streams
        self.in_features = in_features
        self.out_features = out_features
        self.lowering = check_lowering(lowering)
        self.weight = nn.Parameter(torch.zeros(out_features, in_features))
        self.bias = nn.Parameter(torch.zeros(out_features)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x [B, M * in, T]`` -> ``[B, M * out, T]``."""
        return stream_linear(x, self.weight, self.bias, self.streams, self.lowering,
                             sizes=(self.out_features, self.in_features))

    def extra_repr(self) -> str:
        """Sizes and lowering shown by ``repr``."""
        return (
            f"streams={self.streams}, in_features={self.in_features}, out_features={self.out_features}, "
            f"bias={self.bias is not None}, lowering={self.lowering!r}"
        )
