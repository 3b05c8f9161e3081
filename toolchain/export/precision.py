"""FP16 and BF16 variants of an FP32 ONNX graph, for strongly typed TensorRT (10.x and 11).

TensorRT 11 has no FP16/BF16 builder flags: the precision of every layer is the type in the
graph. This pass writes that type. It is one shared pass for both targets, in single-purpose
stages (modelled on TensorRT Model Optimizer's ``onnx/autocast``):

1. :func:`name_nodes` - give every node a unique name (decisions are keyed by name), and
   :func:`drop_constant_identities` - read shared weights directly, not through ``Identity``;
2. :func:`infer_types` - strict shape inference; the element type of every tensor;
3. :func:`~toolchain.export.precision_rules.classify_nodes` - low precision, or FP32 with a
   reason (LayerNorm, Softmax, reductions, Exp/Log/Erf..., ``keep_fp32_ops``, ``keep_fp32_nodes``,
   types the ONNX schema does not allow at this opset);
4. :func:`insert_casts` - a ``Cast`` wherever a tensor crosses between FP32 and low precision,
   graph inputs and outputs stay FP32;
5. :func:`convert_initializers` - low-precision copies of the weights and ``Constant`` values
   that low-precision nodes read: FP16 by clamping to +-65504 then numpy's round-to-nearest-even,
   BF16 by clamping to the largest finite bfloat16 (+-3.3895e38; ``finfo(float32).min``, BERT's
   attention-mask fill, would round to -inf and make ``0 * -inf`` NaN) then round-to-nearest-even
   on the FP32 bits (:func:`float32_to_bfloat16_bits`);
6. strict shape inference and ``onnx.checker`` (full) on the result.

ONNX schemas limit the types: ``Conv`` accepts bfloat16 only from opset 22, so at opset 17 a BF16
pass keeps Conv in FP32 and says so; pass ``opset=22`` to convert the graph first. ONNX Runtime's
CPU provider runs FP16 graphs (MatMul, Conv, Gemm, LayerNorm, Softmax ... in float16) but has
almost no BF16 kernels (LayerNormalization, Transpose, Cast only); BF16 graphs are checked with
:func:`toolchain.export.reference.reference_run`.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from toolchain.artifacts import atomic_write_json
from toolchain.errors import GraphError
from toolchain.export.graph import load_checked, write_summary
from toolchain.export.precision_rules import (
    DEFAULT_KEEP_FP32_OPS,
    LOW_TYPES,
    NodeDecision,
    RuleContext,
    classify_nodes,
)

__all__ = [
    "DEFAULT_KEEP_FP32_OPS",
    "PrecisionResult",
    "compute_dtypes",
    "convert_precision",
    "float32_to_bfloat16_bits",
    "graph_precision",
    "write_precision_variant",
]

log = logging.getLogger(__name__)

Target = Literal["fp16", "bf16"]
FP16_MAX = 65504.0
#: largest finite bfloat16 (0x7F7F)
BF16_MAX = 3.3895313892515355e38
_PROTO_LIMIT = 2**31 - 1
_SUFFIX = {"fp16": "fp16", "bf16": "bf16"}


@dataclass(frozen=True)
class PrecisionResult:
    """The converted model and the decisions that shaped it."""

    model: onnx.ModelProto
    target: str
    kept_fp32: dict[str, str]
    low_nodes: tuple[str, ...]
    casts_inserted: int
    converted_constants: int
    clamped_values: int

    def report(self) -> dict[str, object]:
        """JSON-ready summary: the reasons per FP32 node and the counts."""
        return {
            "target": self.target,
            "kept_fp32": dict(sorted(self.kept_fp32.items())),
            "low_nodes": len(self.low_nodes),
            "casts_inserted": self.casts_inserted,
            "converted_constants": self.converted_constants,
            "clamped_values": self.clamped_values,
        }


_LOW = {TensorProto.FLOAT16: "fp16", TensorProto.BFLOAT16: "bf16"}


def graph_precision(model: onnx.ModelProto) -> str:
    """The graph's precision: ``int8``, ``fp16``, ``bf16`` or ``fp32``.

    ``int8`` for an explicitly quantized graph (Q/DQ nodes), ``fp16``/``bf16`` when the graph holds
    low-precision weights or casts, else ``fp32``.
    """
    if any(n.op_type in ("QuantizeLinear", "DequantizeLinear") for n in model.graph.node):
        return "int8"
    found = {_LOW[i.data_type] for i in model.graph.initializer if i.data_type in _LOW}
    for node in model.graph.node:
        if node.op_type == "Cast":
            to = next((a.i for a in node.attribute if a.name == "to"), None)
            if to in _LOW:
                found.add(_LOW[to])
    if len(found) > 1:
        raise GraphError(f"the graph mixes fp16 and bf16 ({sorted(found)}); convert it with one target.")
    return found.pop() if found else "fp32"


def float32_to_bfloat16_bits(values: np.ndarray) -> np.ndarray:
    """Round FP32 values to BF16 (round to nearest, ties to even) and return the raw uint16 bits.

    NaN stays a quiet NaN with its sign; infinities stay infinite; finite values that round
    past the largest BF16 become infinity, as IEEE rounding prescribes.
    """
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    nan = np.isnan(np.asarray(values, dtype=np.float32))
    rounded = np.where(nan, ((bits >> 16) & 0x8000) | 0x7FC0, rounded)
    return rounded.astype(np.uint16)


def _low_tensor(array: np.ndarray, name: str, target: str) -> tuple[TensorProto, int]:
    """Low-precision TensorProto of an FP32 array, and how many finite values were clamped."""
    array = np.asarray(array, dtype=np.float32)
    if target == "fp16":
        finite = np.isfinite(array)
        clamped = int(np.count_nonzero(finite & (np.abs(array) > FP16_MAX)))
        safe = np.where(finite, np.clip(array, -FP16_MAX, FP16_MAX), array)
        return numpy_helper.from_array(safe.astype(np.float16), name), clamped
    # finite values beyond BF16's largest finite value would round to +-inf: BERT's attention-mask
    # constant finfo(float32).min became -inf, and (1 - mask) * -inf is NaN on every kept token
    finite = np.isfinite(array)
    clamped = int(np.count_nonzero(finite & (np.abs(array) > BF16_MAX)))
    safe = np.where(finite, np.clip(array, -BF16_MAX, BF16_MAX), array)
    bits = float32_to_bfloat16_bits(safe)
    tensor = helper.make_tensor(name, TensorProto.BFLOAT16, array.shape, bits.astype("<u2").tobytes(), raw=True)
    return tensor, clamped


# ----------------------------------------------------------------------------------------- stages


def name_nodes(graph: onnx.GraphProto) -> int:
    """Stage 0: give unnamed or duplicate-named nodes a unique ``<op>_<index>`` name; return how many."""
    seen: set[str] = set()
    renamed = 0
    for index, node in enumerate(graph.node):
        if not node.name or node.name in seen:
            base = f"{node.op_type}_{index}"
            node.name = base if base not in seen else f"{base}_{renamed}"
            renamed += 1
        seen.add(node.name)
    return renamed


def drop_constant_identities(graph: onnx.GraphProto) -> int:
    """Stage 0b: bypass ``Identity`` nodes that forward an initializer (TorchScript's weight sharing).

    Otherwise the shared weight would be classified with the Identity, converted to 16 bits and
    cast back for an FP32 consumer such as LayerNormalization, losing its precision.
    """
    inits = {i.name for i in graph.initializer}
    outputs = {o.name for o in graph.output}
    alias = {
        n.output[0]: n.input[0] for n in graph.node
        if n.op_type == "Identity" and n.input[0] in inits and n.output[0] not in outputs
    }
    if not alias:
        return 0
    kept = [n for n in graph.node if not (n.op_type == "Identity" and n.output[0] in alias)]
    for node in kept:
        node.input[:] = [alias.get(t, t) for t in node.input]
    graph.ClearField("node")
    graph.node.extend(kept)
    return len(alias)


def infer_types(model: onnx.ModelProto) -> dict[str, int]:
    """Stage 1: element type of every tensor (graph IO, initializers, inferred intermediates)."""
    try:
        inferred = onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True)
    except onnx.shape_inference.InferenceError as exc:
        raise GraphError(f"shape inference failed before the precision pass: {exc}") from exc
    graph = inferred.graph
    dtypes = {v.name: v.type.tensor_type.elem_type for v in [*graph.input, *graph.output, *graph.value_info]}
    dtypes.update({init.name: init.data_type for init in graph.initializer})
    for node in graph.node:
        if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
            dtypes[node.output[0]] = node.attribute[0].t.data_type
    return {k: v for k, v in dtypes.items() if v}


def compute_dtypes(model: onnx.ModelProto) -> dict[str, str]:
    """Node name -> element type its first floating-point input is computed in (for inspection)."""
    dtypes = infer_types(model)
    floats = {TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16, TensorProto.DOUBLE}
    out = {}
    for node in model.graph.node:
        first = next((dtypes[n] for n in node.input if n and dtypes.get(n) in floats), None)
        if first is not None:
            out[node.name] = TensorProto.DataType.Name(first).lower()
    return out


def insert_casts(
    graph: onnx.GraphProto, decisions: Mapping[str, NodeDecision], dtypes: Mapping[str, int], target: str
) -> tuple[int, dict[str, str]]:
    """Stage 3: rewire inputs so every node reads the type it computes in.

    Low-precision nodes read a low copy of FP32 tensors (a ``Cast``, or for weights and
    ``Constant`` values a converted copy made by :func:`convert_initializers`); FP32 nodes read
    FP32 (a ``Cast`` back). Graph outputs produced in low precision are renamed and cast back
    to FP32 under their original names.

    Returns:
        ``(casts inserted, {fp32 constant name: name of its low copy})``.
    """
    low_type, suffix = LOW_TYPES[target], _SUFFIX[target]
    constants = {i.name for i in graph.initializer} | {
        n.output[0] for n in graph.node if n.op_type == "Constant" and dtypes.get(n.output[0]) == TensorProto.FLOAT
    }
    low_tensors = {
        node.output[i] for node in graph.node
        if (d := decisions.get(node.name)) and d.low for i in d.low_outputs
    }
    outputs = {o.name for o in graph.output}
    rename = {name: f"{name}__{suffix}" for name in low_tensors & outputs}
    low_tensors = {rename.get(t, t) for t in low_tensors}
    for node in graph.node:
        node.output[:] = [rename.get(t, t) for t in node.output]
        node.input[:] = [rename.get(t, t) for t in node.input]

    copies: dict[str, str] = {}
    casts: dict[tuple[str, int], str] = {}
    new_nodes: list[onnx.NodeProto] = []

    def cast(tensor: str, to: int) -> str:
        key = (tensor, to)
        if key not in casts:
            casts[key] = f"{tensor}__to_{TensorProto.DataType.Name(to).lower()}"
            new_nodes.append(helper.make_node("Cast", [tensor], [casts[key]], name=f"Cast__{casts[key]}", to=to))
        return casts[key]

    for node in list(graph.node):
        decision = decisions.get(node.name)
        wanted_low = set(decision.low_inputs) if decision is not None and decision.low else set()
        for i, tensor in enumerate(node.input):
            if not tensor:
                continue
            if i in wanted_low and tensor not in low_tensors:
                if tensor in constants:
                    node.input[i] = copies.setdefault(tensor, f"{tensor}__{suffix}")
                else:
                    node.input[i] = cast(tensor, low_type)
            elif i not in wanted_low and tensor in low_tensors:
                node.input[i] = cast(tensor, TensorProto.FLOAT)
        new_nodes.append(node)
    for original, low_name in rename.items():
        new_nodes.append(helper.make_node("Cast", [low_name], [original], name=f"Cast__{original}__out",
                                          to=TensorProto.FLOAT))
    graph.ClearField("node")
    graph.node.extend(new_nodes)
    return len(casts) + len(rename), copies


def convert_initializers(graph: onnx.GraphProto, copies: Mapping[str, str], target: str) -> int:
    """Stage 4: materialise the low-precision copies of weights/``Constant`` values; drop unused FP32.

    Returns:
        How many finite values were clamped to the FP16 (+-65504) or BF16 (+-3.39e38) range.
    """
    inits = {i.name: i for i in graph.initializer}
    const_nodes = {n.output[0]: n for n in graph.node if n.op_type == "Constant"}
    clamped = 0
    for original, low_name in copies.items():
        if original in inits:
            array = numpy_helper.to_array(inits[original])
        else:  # a Constant node: ``value`` (a tensor) or ``value_float(s)``
            attr = const_nodes[original].attribute[0]
            value = attr.t if attr.name == "value" else helper.get_attribute_value(attr)
            array = numpy_helper.to_array(value) if attr.name == "value" else np.asarray(value, dtype=np.float32)
        tensor, count = _low_tensor(array, low_name, target)
        clamped += count
        graph.initializer.append(tensor)
        if count:
            log.info("%s: clamped %d values of '%s' to +-%g", target, count, original, FP16_MAX)
    used = {t for n in graph.node for t in n.input} | {o.name for o in graph.output}
    keep_inits = [i for i in graph.initializer if i.name in used]
    graph.ClearField("initializer")
    graph.initializer.extend(keep_inits)
    keep_nodes = [n for n in graph.node if n.op_type != "Constant" or n.output[0] in used]
    graph.ClearField("node")
    graph.node.extend(keep_nodes)
    return clamped


# ------------------------------------------------------------------------------------ orchestrator


def convert_precision(
    model: onnx.ModelProto | Path,
    target: Target,
    *,
    keep_fp32_ops: Iterable[str] | Mapping[str, str] | None = None,
    keep_fp32_nodes: Iterable[str] = (),
    opset: int | None = None,
) -> PrecisionResult:
    """Make an FP16 or BF16 variant of an FP32 graph (graph inputs and outputs stay FP32).

    Args:
        model: an FP32 model proto (not modified) or a path to one.
        target: ``"fp16"`` or ``"bf16"``.
        keep_fp32_ops: operator types kept in FP32; None means :data:`DEFAULT_KEEP_FP32_OPS`.
            A mapping gives the reason per op; to extend the defaults pass
            ``{**DEFAULT_KEEP_FP32_OPS, "Tanh": "why"}``.
        keep_fp32_nodes: node names kept in FP32.
        opset: convert the default-domain opset first (e.g. 22 so that Conv accepts bfloat16).

    Returns:
        :class:`PrecisionResult` with the new model and ``kept_fp32`` (node name -> reason).
    """
    if target not in LOW_TYPES:
        raise GraphError(f"convert_precision: target must be 'fp16' or 'bf16', got '{target}'.")
    source = load_checked(Path(model)) if isinstance(model, str | Path) else model
    if source.ByteSize() > _PROTO_LIMIT:
        raise GraphError("convert_precision: the model is over 2 GB in memory; in-memory shape inference cannot "
                         "handle it. Convert a smaller model, or split its weights first.")
    work = onnx.ModelProto()
    work.CopyFrom(source)
    if opset is not None:
        try:
            work = onnx.version_converter.convert_version(work, opset)
        except Exception as exc:  # the C++ converter raises RuntimeError/ValidationError alike
            raise GraphError(f"convert_precision: cannot convert the graph to opset {opset}: {exc}") from exc
    graph = work.graph
    name_nodes(graph)
    drop_constant_identities(graph)
    dtypes = infer_types(work)
    if isinstance(keep_fp32_ops, Mapping):
        keep_ops: Mapping[str, str] = dict(keep_fp32_ops)
    elif keep_fp32_ops is None:
        keep_ops = DEFAULT_KEEP_FP32_OPS
    else:
        keep_ops = {op: DEFAULT_KEEP_FP32_OPS.get(op, "listed by the caller") for op in keep_fp32_ops}
    ctx = RuleContext(
        target=target, opsets={(i.domain if i.domain != "ai.onnx" else ""): i.version for i in work.opset_import},
        dtypes=dtypes, keep_ops=keep_ops, keep_nodes=frozenset(keep_fp32_nodes),
    )
    unknown = set(ctx.keep_nodes) - {n.name for n in graph.node}
    if unknown:
        raise GraphError(f"convert_precision: keep_fp32_nodes names no node in the graph: {sorted(unknown)}")
    decisions = classify_nodes(graph, ctx)
    casts, copies = insert_casts(graph, decisions, dtypes, target)
    clamped = convert_initializers(graph, copies, target)
    graph.ClearField("value_info")
    try:
        work = onnx.shape_inference.infer_shapes(work, check_type=True, strict_mode=True)
        onnx.checker.check_model(work, full_check=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as exc:
        raise GraphError(f"the {target} graph fails the ONNX checks: {str(exc).splitlines()[0]}") from exc
    kept = {name: d.reason for name, d in decisions.items() if not d.low}
    low = tuple(name for name, d in decisions.items() if d.low)
    reasons = Counter(reason.split(":")[0] for reason in kept.values())
    log.info("%s pass: %d nodes low precision, %d kept FP32 (%s), %d casts, %d constants converted",
             target, len(low), len(kept), dict(reasons), casts, len(copies))
    for name, reason in kept.items():
        log.debug("%s: keep %s in FP32: %s", target, name, reason)
    return PrecisionResult(work, target, kept, low, casts, len(copies), clamped)


def write_precision_variant(src: Path, dst: Path, target: Target, **kwargs: object) -> PrecisionResult:
    """Convert the FP32 file ``src`` and write ``dst`` atomically, with its summary and reasons.

    ``dst`` gets ``<stem>.summary.json`` (:func:`graph_summary`) and ``<stem>.precision.json``
    (kept-FP32 nodes with reasons). Weights go to ``<dst name>.data`` when ``src`` used an
    external weights file. Keyword arguments go to :func:`convert_precision`.
    """
    src, dst = Path(src), Path(dst)
    source = load_checked(src)
    external = any(i.data_location == TensorProto.EXTERNAL for i in onnx.load_model(str(src), load_external_data=False)
                   .graph.initializer)
    result = convert_precision(source, target, **kwargs)  # type: ignore[arg-type]
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_name(f".{dst.name}.tmp")
    data_name = f"{dst.name}.data"
    try:
        onnx.save_model(result.model, str(tmp), save_as_external_data=external, all_tensors_to_one_file=True,
                        location=data_name if external else None, size_threshold=1024)
        tmp.replace(dst)
    finally:
        tmp.unlink(missing_ok=True)
    if not external:
        (dst.parent / data_name).unlink(missing_ok=True)
    onnx.checker.check_model(str(dst), full_check=True)
    write_summary(dst)
    atomic_write_json(dst.with_name(f"{dst.stem}.precision.json"), result.report())
    return result
