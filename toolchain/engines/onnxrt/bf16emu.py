"""BF16 on the ONNX Runtime CPU provider: the graph rewritten to FP32 kernels with exact BF16 rounding.

ONNX Runtime's CPU provider has no BF16 MatMul, Gemm, Add, Mul ... kernels, so a BF16 graph does
not load there. :func:`emulate_bf16` rewrites it so that it computes what a BF16 engine computes:

* every BF16 tensor becomes an FP32 tensor that holds a BF16 value (BF16 is a subset of FP32:
  the conversion of weights and constants is exact);
* every node that computes in BF16 runs its FP32 kernel and its BF16 outputs are rounded to
  BF16 with ``Cast(to=BFLOAT16) -> Cast(to=FLOAT)`` (ONNX Runtime's Cast rounds to nearest even,
  bit-identical to ``ml_dtypes``; checked in the tests);
* a ``Cast(to=BFLOAT16)`` keeps its rounding and is followed by the cast back to FP32; a
  ``Cast(to=FLOAT)`` of a BF16 tensor is then the identity it is in the original graph;
* nodes that only move or select values (Reshape, Transpose, Gather, Concat, Max ...) need no
  rounding: their outputs are inputs' values, already BF16;
* graph inputs/outputs declared BF16 become FP32 (inputs are rounded to BF16 on entry).

What this computes: elementwise ops (Add, Mul, Div, Tanh ...) give the correctly rounded BF16
result (the FP32 result rounded once more to BF16: with 24 >= 2 * 8 + 2 significand bits the
double rounding is innocuous for +, -, x, /, sqrt); MatMul/Gemm/Conv multiply BF16 operands
exactly in FP32, accumulate in FP32 and round the sum to BF16 once, which is what GPU tensor
cores and TensorRT's BF16 kernels do. Only the summation order differs between implementations,
as it does between any two FP32 engines. :class:`~toolchain.parity.ReferenceEvaluatorRunner`
(``onnx.reference`` with ``ml_dtypes``) computes the same graph in pure numpy and is used in the
tests to check this rewrite (bit-identical where summation order cannot matter); on the real
MiniLM Hydra graphs (3 members, 6 layers) the emulation took 30-60 ms per row and onnx.reference
260-850 ms per row on 2 CPU threads (FP32 on ORT: 17-28 ms).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import AttributeProto, TensorProto, helper, numpy_helper

from toolchain.engines.onnxrt.runner import OnnxrtRunner
from toolchain.errors import GraphError

__all__ = ["VALUE_PRESERVING_OPS", "Bf16Emulation", "OnnxrtBf16EmuRunner", "emulate_bf16"]

BF16 = TensorProto.BFLOAT16
FP32 = TensorProto.FLOAT

#: ops whose outputs are (copies of) input values: a BF16 input gives a BF16-representable output.
VALUE_PRESERVING_OPS = frozenset({
    "Identity", "Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "Expand", "Tile", "Concat",
    "Split", "Slice", "Gather", "GatherElements", "GatherND", "Where", "Pad", "DepthToSpace", "SpaceToDepth",
    "Max", "Min", "Relu", "Neg", "Abs", "ReduceMax", "ReduceMin", "MaxPool", "Shape", "Size",
})
_SUFFIX = "__bf16emu"


@dataclass
class Bf16Emulation:
    """The rewritten model and what the rewrite did (for reports and tests)."""

    model: onnx.ModelProto
    initializers: int = 0  # BF16 initializers stored as FP32
    constants: int = 0  # BF16 tensor attributes (Constant, ConstantOfShape) stored as FP32
    rounded_outputs: int = 0  # node outputs followed by a BF16 rounding
    casts_to_bf16: int = 0  # Cast(to=BF16) nodes kept as rounding
    io: list[str] = field(default_factory=list)  # graph inputs/outputs retyped from BF16

    def report(self) -> dict[str, Any]:
        """JSON-ready counts."""
        return {"initializers": self.initializers, "constants": self.constants,
                "rounded_outputs": self.rounded_outputs, "casts_to_bf16": self.casts_to_bf16, "io": self.io}


def _elem_types(model: onnx.ModelProto) -> dict[str, int]:
    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    except Exception as exc:  # onnx raises InferenceError and friends
        raise GraphError(f"bf16 emulation: ONNX shape inference failed, so BF16 tensors cannot be found: "
                         f"{str(exc).splitlines()[0]}") from exc
    g = inferred.graph
    types = {v.name: v.type.tensor_type.elem_type for v in [*g.value_info, *g.input, *g.output]}
    types.update({i.name: i.data_type for i in g.initializer})
    return types


def _round_pair(src: str, dst: str, name: str) -> list[onnx.NodeProto]:
    """``dst = float32(bfloat16(src))``: round an FP32 tensor to the nearest BF16, ties to even."""
    mid = f"{dst}{_SUFFIX}_b"
    return [helper.make_node("Cast", [src], [mid], to=BF16, name=f"{name}{_SUFFIX}_to_bf16"),
            helper.make_node("Cast", [mid], [dst], to=FP32, name=f"{name}{_SUFFIX}_to_fp32")]


def _to_fp32_tensor(tensor: TensorProto) -> TensorProto:
    values = numpy_helper.to_array(tensor).astype(np.float32)  # exact: every BF16 value is an FP32 value
    return numpy_helper.from_array(values, tensor.name)


def emulate_bf16(model: onnx.ModelProto) -> Bf16Emulation:
    """Rewrite a BF16 (or mixed BF16/FP32) graph to FP32 kernels with exact BF16 rounding.

    Args:
        model: the graph with its weights loaded (not modified; a copy is rewritten).

    Returns:
        :class:`Bf16Emulation`; a graph without BF16 comes back unchanged (every count 0).

    Raises:
        GraphError: shape inference fails, a control-flow subgraph is present alongside BF16, or
            an op other than Cast creates BF16 from an attribute (``to``/``dtype``), which this
            rewrite does not know how to round.
    """
    out = onnx.ModelProto()
    out.CopyFrom(model)
    g = out.graph
    types = _elem_types(model)
    result = Bf16Emulation(out)
    if BF16 not in types.values() and not any(
            a.type == AttributeProto.TENSOR and a.t.data_type == BF16 for n in g.node for a in n.attribute):
        return result
    for i, init in enumerate(g.initializer):
        if init.data_type == BF16:
            g.initializer[i].CopyFrom(_to_fp32_tensor(init))
            result.initializers += 1
    nodes: list[onnx.NodeProto] = []
    entry: dict[str, str] = {}  # BF16 graph input -> its value rounded to BF16 (the feed is FP32)
    weights = {i.name for i in g.initializer}
    for value in g.input:
        if value.type.tensor_type.elem_type != BF16:
            continue
        value.type.tensor_type.elem_type = FP32
        if value.name not in weights:  # an initializer listed as an input (IR < 4) is already converted
            result.io.append(value.name)
            entry[value.name] = f"{value.name}{_SUFFIX}_in"
            nodes += _round_pair(value.name, entry[value.name], value.name)
    for index, node in enumerate(g.node):
        label = node.name or f"{node.op_type}_{index}"
        for k, name in enumerate(node.input):
            if name in entry:
                node.input[k] = entry[name]
        for attr in node.attribute:
            if attr.type in (AttributeProto.GRAPH, AttributeProto.GRAPHS):
                raise GraphError(f"bf16 emulation: node '{label}' ({node.op_type}) has a subgraph; control flow in "
                                 "a BF16 graph is not supported by the rewrite.")
            if attr.type == AttributeProto.TENSOR and attr.t.data_type == BF16:
                attr.t.CopyFrom(_to_fp32_tensor(attr.t))
                result.constants += 1
            if attr.name in ("to", "dtype") and attr.type == AttributeProto.INT and attr.i == BF16 \
                    and node.op_type != "Cast":
                raise GraphError(f"bf16 emulation: node '{label}' ({node.op_type}) creates BF16 through its "
                                 f"'{attr.name}' attribute; only Cast is supported.")
        nodes.append(node)
        if node.op_type == "Cast" and node.attribute and any(a.name == "to" and a.i == BF16 for a in node.attribute):
            final = node.output[0]
            node.output[0] = f"{final}{_SUFFIX}_c"
            nodes.append(helper.make_node("Cast", [node.output[0]], [final], to=FP32, name=f"{label}{_SUFFIX}_back"))
            result.casts_to_bf16 += 1
            continue
        if node.op_type in VALUE_PRESERVING_OPS or node.op_type == "Constant":
            continue
        for k, name in enumerate(node.output):
            if name and types.get(name) == BF16:
                node.output[k] = f"{name}{_SUFFIX}_r"
                nodes += _round_pair(node.output[k], name, f"{label}_{k}")
                result.rounded_outputs += 1
    del g.node[:]
    g.node.extend(nodes)
    for value in [*g.value_info, *g.output]:
        if value.type.tensor_type.elem_type == BF16:
            value.type.tensor_type.elem_type = FP32
            if any(value is o for o in g.output):
                result.io.append(value.name)
    return result


class OnnxrtBf16EmuRunner(OnnxrtRunner):
    """A BF16 ONNX graph on the ONNX Runtime CPU provider through :func:`emulate_bf16`.

    Args:
        path: the BF16 ``.onnx`` file (external weights next to it).
        intra_op_threads, inter_op_threads: 0 = ORT's default.
        optimization_level: ORT graph optimisations (``basic`` default: constant folding and
            redundant-node removal only, so no fusion can skip a rounding step).
        max_batch: reject feeds whose axis 0 is larger.
        name: runner name in reports.
    """

    def __init__(self, path: Path, *, intra_op_threads: int = 0, inter_op_threads: int = 0,
                 optimization_level: Any = "basic", max_batch: int | None = None, name: str | None = None) -> None:
        super().__init__(path, provider="cpu", intra_op_threads=intra_op_threads, inter_op_threads=inter_op_threads,
                         optimization_level=optimization_level, max_batch=max_batch, name=name)
        self.kind = "onnxrt-cpu-bf16emu"
        self.name = name or self.kind
        self.emulation: dict[str, Any] = {}

    def _activate_impl(self) -> None:
        def rewrite(model: onnx.ModelProto) -> onnx.ModelProto:
            done = emulate_bf16(model)
            self.emulation = done.report()
            return done.model

        self.session = self.loader(transform=rewrite)
