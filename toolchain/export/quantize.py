"""INT8 (explicit Q/DQ) variants of an FP32 ONNX graph, calibrated on labelled rows.

One Q/DQ file serves every target that takes explicit quantization: TensorRT 10 and 11 (11 has no
implicit INT8 at all: no builder flag, no calibrator), OpenVINO (its low-precision transformations
turn each ``QuantizeLinear -> DequantizeLinear`` pair into a FakeQuantize and run the layer behind
it in INT8) and ONNX Runtime (QDQ node units fused into integer kernels).

The quantizer (:mod:`toolchain.engines.onnxrt.quantize`) is ONNX Runtime's ``quantize_static`` in
QDQ format rather than a hand-written one or NNCF: it ships with the runtime we already depend on,
writes standard ONNX ``QuantizeLinear`` / ``DequantizeLinear`` pairs with zero zero-points (what
TensorRT requires), takes an explicit list of nodes to quantize and keeps everything else in float,
which is what the float fallback (:mod:`toolchain.parity.rescue`) and ``keep_float_nodes`` need.
NNCF would add a large dependency whose ONNX path runs SmoothQuant and its own ignored patterns on
top; its accuracy control ranks by one scalar metric, while our gate decides by the uncertainty
metrics (docs/quantization.md).

What is quantized (defaults): the matrix layers, i.e. every ``MatMul``, ``Gemm`` and ``Conv``
(Hydra's grouped Conv included) whose weight is a constant: per-output-channel symmetric INT8
weights, per-tensor symmetric INT8 activations (zero point 0) at the layers' inputs only (their
outputs stay float, as TensorRT places Q/DQ: ONNX Runtime's default also quantizes a matrix layer's
output, a second rounding that cost the fine-tuned MiniLM 4 points of accuracy, argmax agreement
0.86 instead of 0.96 on 300 tweets), scales from the calibration rows' min/max
(``calibrate="minmax"``; ``percentile`` and ``entropy`` on request). What stays float: LayerNorm,
Softmax, GELU, residual adds, the attention score products (two activations), embedding gathers,
and the classifier heads (the matrix layers a graph output is reached from without crossing
another matrix layer: :func:`head_layers`). ``keep_float_nodes`` keeps more;
:func:`keep_float_layers` turns layers of a written Q/DQ graph back to float (the float fallback).

Hydra's grouped layers read the M members' streams as one tensor, so one activation scale covers
all members: :func:`~toolchain.engines.onnxrt.quantize.member_ranges` measures, per grouped layer,
each member's share of the shared range on the calibration rows (a member whose absolute maximum is
a quarter of the shared one keeps two bits fewer); the report records it. Quantizing per member
would split each grouped layer into M layers (a scale each): not done (TensorRT takes per-tensor
activation scales only).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import onnx

from toolchain.errors import GraphError

__all__ = [
    "CALIBRATION_METHODS",
    "QUANTIZED_OPS",
    "QuantResult",
    "check_feeds",
    "confine_qdq",
    "dequantized_weights",
    "head_layers",
    "is_quantized",
    "keep_float_layers",
    "matrix_layers",
    "quantized_layers",
    "same_shapes",
]

log = logging.getLogger(__name__)

#: operator types quantized when their weight input is a constant (the "matrix layers")
QUANTIZED_OPS: tuple[str, ...] = ("MatMul", "Gemm", "Conv")
CALIBRATION_METHODS: tuple[str, ...] = ("minmax", "percentile", "entropy")
Calibration = Literal["minmax", "percentile", "entropy"]
_Q_OPS = ("QuantizeLinear", "DequantizeLinear")


def is_quantized(model: onnx.ModelProto) -> bool:
    """True when the graph holds explicit quantization (a ``QuantizeLinear`` or ``DequantizeLinear`` node)."""
    return any(n.op_type in _Q_OPS for n in model.graph.node)


def _constants(graph: onnx.GraphProto) -> set[str]:
    """Tensor names whose value is fixed: initializers and ``Constant`` outputs (through ``Identity``)."""
    known = {i.name for i in graph.initializer}
    for node in graph.node:
        if node.op_type == "Constant" or (node.op_type == "Identity" and node.input and node.input[0] in known):
            known.update(node.output)
    return known


def matrix_layers(model: onnx.ModelProto) -> list[str]:
    """Names of the nodes INT8 applies to, in graph order: ``MatMul``/``Gemm``/``Conv`` with a constant weight.

    Raises :class:`GraphError` when a node has no name (the decisions are keyed by name; every graph our
    exporter writes names its nodes).
    """
    fixed = _constants(model.graph)
    out = []
    for node in model.graph.node:
        if node.op_type in QUANTIZED_OPS and len(node.input) > 1 and node.input[1] in fixed:
            if not node.name:
                raise GraphError(f"a {node.op_type} node has no name; INT8 decisions are keyed by node name.")
            out.append(node.name)
    return out


def head_layers(model: onnx.ModelProto) -> list[str]:
    """The matrix layers a graph output is reached from without crossing another matrix layer.

    The classifier of a single model (the pooler is not one: its path to the logits crosses the
    classifier), each Hydra member's classifier. These stay float by default: the logits are what
    every uncertainty metric reads, and one layer costs nothing measurable.
    """
    graph = model.graph
    layers = set(matrix_layers(model))
    outputs = {o.name for o in graph.output}
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for t in node.input:
            consumers.setdefault(t, []).append(node)
    heads = []
    for node in graph.node:
        if node.name not in layers:
            continue
        stack, seen, hit = list(node.output), set(), False
        while stack and not hit:
            t = stack.pop()
            if t in seen:
                continue
            seen.add(t)
            if t in outputs:
                hit = True
                break
            for c in consumers.get(t, []):
                if c.name not in layers:
                    stack.extend(c.output)
        if hit:
            heads.append(node.name)
    return heads


@dataclass(frozen=True)
class QuantResult:
    """The INT8 graph's decisions: what was quantized, what stayed float and why, how it was calibrated."""

    quantized: tuple[str, ...]
    kept_float: dict[str, str]
    calibration: dict[str, Any]
    member_ranges: dict[str, list[float]] = field(default_factory=dict)

    def report(self) -> dict[str, Any]:
        """JSON-ready: ``target``, the quantized node count and names, kept-float nodes with reasons."""
        return {"target": "int8", "quantized": list(self.quantized), "quantized_count": len(self.quantized),
                "kept_float": dict(sorted(self.kept_float.items())), "calibration": self.calibration,
                "member_ranges": self.member_ranges}


def same_shapes(feeds: Sequence[Mapping[str, np.ndarray]]) -> list[dict[str, np.ndarray]]:
    """The rows of ``feeds`` re-cut into batches of one shape per input.

    The histogram calibrators stack every batch's tensors into one array.
    Padded with zeros to the longest sequence (token ids, attention masks and token types pad with 0: [PAD],
    masked, segment 0, as in any padded batch), then cut into batches of the first feed's size; the last rows
    that do not fill a batch are left out (fewer than one batch).
    """
    names = list(feeds[0])
    widest = {n: np.max([np.asarray(f[n]).shape for f in feeds], axis=0) for n in names}
    size = int(np.asarray(feeds[0][names[0]]).shape[0])
    joined = {}
    for n in names:
        parts = []
        for f in feeds:
            a = np.asarray(f[n])
            pad = [(0, 0)] + [(0, int(w) - s) for s, w in zip(a.shape[1:], widest[n][1:], strict=True)]
            parts.append(np.pad(a, pad) if any(p[1] for p in pad) else a)
        joined[n] = np.concatenate(parts)
    rows = len(joined[names[0]]) // size * size
    return [{n: joined[n][i:i + size] for n in names} for i in range(0, rows, size)]


def check_feeds(model: onnx.ModelProto, feeds: Sequence[Mapping[str, np.ndarray]]) -> list[str]:
    """The graph's input names, once every feed is checked to hold them all (GraphError: none or a missing one)."""
    fixed = {i.name for i in model.graph.initializer}
    names = [i.name for i in model.graph.input if i.name not in fixed]
    if not feeds:
        raise GraphError("INT8 calibration needs at least one feed (rows of the calibration data).")
    missing = sorted({n for f in feeds for n in names if n not in f})
    if missing:
        raise GraphError(f"INT8 calibration feeds lack the graph inputs {missing} (the graph reads {names}).")
    return names


def quantized_layers(model: onnx.ModelProto) -> list[str]:
    """The layers of a Q/DQ graph that read an INT8 weight (through a ``DequantizeLinear``), in graph order."""
    inits = {i.name for i in model.graph.initializer}
    weights = {n.output[0] for n in model.graph.node if n.op_type == "DequantizeLinear" and n.input[0] in inits}
    return [n.name for n in model.graph.node if n.op_type in QUANTIZED_OPS and any(t in weights for t in n.input)]


def keep_float_layers(qdq: onnx.ModelProto, fp32: onnx.ModelProto, layers: Iterable[str]) -> onnx.ModelProto:
    """A copy of the Q/DQ graph ``qdq`` whose ``layers`` (quantized matrix layers) read float inputs again.

    Each such layer reads the FP32 graph's own weight (``fp32``, loaded with its weights) instead of the
    dequantized INT8 one, and the float activation before its ``QuantizeLinear`` instead of the dequantized
    one; every other consumer of a shared activation stays quantized at the same scale, and Q/DQ pairs and
    INT8 weights nobody reads any more are dropped. No recalibration: the scales of the rest are the ones
    the quantizer chose, so the float fallback evaluates exactly the graph it writes.
    """
    wanted = set(layers)
    out = onnx.ModelProto()
    out.CopyFrom(qdq)
    originals = {n.name: n for n in fp32.graph.node}
    absent = sorted(n for n in wanted if n not in originals or n not in {m.name for m in out.graph.node})
    if absent:
        raise GraphError(f"keep_float_layers: {absent[:5]} are not layers of both graphs.")
    _read_float(out.graph, lambda node: node.name in wanted, originals, {i.name: i for i in fp32.graph.initializer})
    return out


def confine_qdq(model: onnx.ModelProto, layers: Iterable[str]) -> int:
    """Make only ``layers`` (the quantized matrix layers) read dequantized activations; in place.

    ONNX Runtime's quantizer rewires every consumer of a quantized tensor to its ``DequantizeLinear``: the
    residual ``Add`` beside a layer's input, a ``Tanh``, a ``Shape``. The residual stream would then carry
    INT8-rounded values although residual adds are meant to stay float; each such consumer reads the
    float tensor again. Returns how many inputs were rewired.
    """
    keep = set(layers)
    return _read_float(model.graph, lambda node: node.name not in keep, {}, {}, weights=False)


def _read_float(graph: onnx.GraphProto, pick: Any, originals: Mapping[str, onnx.NodeProto],
                fp32_inits: Mapping[str, onnx.TensorProto], weights: bool = True) -> int:
    """Rewire the dequantized inputs of the nodes ``pick`` selects to float; drop what nobody reads.

    An activation to the tensor its ``QuantizeLinear`` read, an INT8 weight (``weights``) to the FP32
    graph's own.
    """
    producers = {o: n for n in graph.node for o in n.output}
    inits = {i.name for i in graph.initializer}
    rewired = 0
    for node in graph.node:
        if node.op_type in ("QuantizeLinear", "DequantizeLinear") or not pick(node):
            continue
        for i, tensor in enumerate(node.input):
            dq = producers.get(tensor)
            if dq is None or dq.op_type != "DequantizeLinear":
                continue
            if dq.input[0] in inits:  # an INT8 weight: the FP32 graph's own tensor
                if not weights:
                    continue
                name = originals[node.name].input[i]
                if name not in inits:
                    if name not in fp32_inits:
                        raise GraphError(f"keep_float_layers: the FP32 graph has no weight '{name}' for {node.name}.")
                    graph.initializer.append(fp32_inits[name])
                    inits.add(name)
                node.input[i] = name
                rewired += 1
            else:  # a quantized activation: the float tensor its QuantizeLinear read
                q = producers.get(dq.input[0])
                if q is not None and q.op_type == "QuantizeLinear":
                    node.input[i] = q.input[0]
                    rewired += 1
    _drop_unread(graph)
    return rewired


def _drop_unread(graph: onnx.GraphProto) -> None:
    """Remove nodes whose outputs nobody reads (not graph outputs) and initializers nobody reads, repeatedly."""
    outputs = {o.name for o in graph.output}
    while True:
        read = {t for n in graph.node for t in n.input} | outputs
        dead = [n for n in graph.node if n.output and not any(o in read for o in n.output)]
        if not dead:
            break
        for n in dead:
            graph.node.remove(n)
    read = {t for n in graph.node for t in n.input} | outputs
    for init in [i for i in graph.initializer if i.name not in read]:
        graph.initializer.remove(init)


def dequantized_weights(model: onnx.ModelProto) -> tuple[dict[str, tuple[np.ndarray, np.ndarray, tuple[int, ...]]],
                                                         set[str]]:
    """INT8 weights of a Q/DQ graph, and the names the float matching must skip.

    ``{initializer: (dequantized values, step per element, shape)}`` (flat arrays), and every
    quantization parameter (the INT8 weights, their scales and zero points, activation scales).
    """
    inits = {i.name: i for i in model.graph.initializer}
    weights: dict[str, tuple[np.ndarray, np.ndarray, tuple[int, ...]]] = {}
    params: set[str] = set()
    for node in model.graph.node:
        if node.op_type not in ("QuantizeLinear", "DequantizeLinear"):
            continue
        params.update(t for t in node.input[1:] if t in inits)
        if node.op_type != "DequantizeLinear" or node.input[0] not in inits:
            continue
        init = inits[node.input[0]]
        if init.data_type not in (onnx.TensorProto.INT8, onnx.TensorProto.UINT8):
            continue
        q = onnx.numpy_helper.to_array(init).astype(np.float64)
        scale = onnx.numpy_helper.to_array(inits[node.input[1]]).astype(np.float64)
        zero = (onnx.numpy_helper.to_array(inits[node.input[2]]).astype(np.float64)
                if len(node.input) > 2 and node.input[2] in inits else np.zeros_like(scale))
        axis = next((a.i for a in node.attribute if a.name == "axis"), 1)
        if scale.size > 1:  # per channel: broadcast along ``axis``
            view = [1] * q.ndim
            view[axis % q.ndim] = -1
            scale, zero = scale.reshape(view), zero.reshape(view)
        deq = (q - zero) * scale
        params.add(init.name)
        weights[init.name] = (deq.reshape(-1), np.broadcast_to(scale, q.shape).reshape(-1), tuple(q.shape))
    return weights, params
