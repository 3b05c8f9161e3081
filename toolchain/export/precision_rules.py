"""Rules that decide which ONNX nodes stay FP32 in an FP16/BF16 graph, each with its reason.

Each rule is a small function ``rule(node, ctx) -> reason | None``; :func:`classify_nodes` applies
them in order and the first reason wins. A node that carries no ``float`` tensor (shape
arithmetic on int64, boolean masks) is not classified at all: it is untouched by the pass.

Default FP32 operators (:data:`DEFAULT_KEEP_FP32_OPS`) and why:

* normalisations (``LayerNormalization`` ...): the variance of activations overflows FP16
  (a field complaint on BERT/ViT) and the mean subtraction cancels digits;
* ``Softmax``/``LogSoftmax``: an exp and a long sum over the axis;
* reductions (``ReduceMean``, ``ReduceSum``, ``CumSum`` ...): long sums accumulate rounding;
* ``Exp``/``Log``/``Pow``/``Sqrt``/``Reciprocal``/``Erf``/``Softplus``: range-sensitive maths;
* ``Sin``/``Cos``: rotary position angles (see below).

Exporters below opset 17 decompose LayerNorm into ReduceMean/Sub/Pow/ReduceMean/Add/Sqrt/Div;
:func:`decomposed_layernorm_nodes` finds that pattern so its Sub/Add/Div stay FP32 too. At opset
17 the TorchScript exporter emits one ``LayerNormalization`` node (checked on tiny BERT).

Two more FP32 islands for decoder families (LLaMA), found by :func:`decomposed_rmsnorm_nodes` and
:func:`rotary_angle_nodes`:

* a decomposed RMSNorm (``Pow(x, 2) -> ReduceMean -> Add(eps) -> Sqrt -> Div(1, .) -> Mul(x, .)``)
  keeps its Add/Div/Mul in FP32 whenever ``RMSNormalization`` is kept: FP16's smallest normal value
  is 6.1e-5, so the mean square of a row whose activations are below ~8e-3 RMS (padding rows,
  untrained embeddings of unseen words) and an ``eps`` of 1e-6 are subnormal there, with a few
  significant bits left, and the reciprocal square root carries that error into every feature;
* the nodes computing the argument of ``Sin``/``Cos`` (RoPE's ``position x inv_freq`` and the
  ``Concat`` of the two halves) stay FP32 with them: FP16's spacing is 0.03 between 32 and 64 and
  0.06 up to 128, so at a late position the rotation angle (and so every query and key) is off by up
  to that much, far beyond FP16's relative rounding of the activations.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

import onnx
from onnx import TensorProto, defs

_NORM = "normalisation: activation variance overflows FP16 and the mean subtraction cancels digits"
_SOFTMAX = "softmax: exp and a sum over the axis; probabilities and their normaliser stay FP32"
_REDUCE = "reduction: long sums accumulate rounding error and can overflow in 16 bits"
_MATH = "range-sensitive maths: overflows (Exp, Pow) or loses relative precision (Log, Erf, Sqrt) in 16 bits"
_RMS = ("part of a decomposed RMSNorm: the mean square of small activations and eps are subnormal in FP16 "
        "(below 6.1e-5), and the reciprocal square root spreads their error over the row")
_ANGLE = ("rotary angle: position x frequency needs absolute precision (FP16's spacing is 0.03 at 32-64 rad) "
          "before Sin/Cos")

#: Operators kept in FP32 by default, with the reason recorded for each kept node.
DEFAULT_KEEP_FP32_OPS: Mapping[str, str] = MappingProxyType(
    {
        **dict.fromkeys(
            ["LayerNormalization", "GroupNormalization", "InstanceNormalization", "RMSNormalization",
             "MeanVarianceNormalization", "LpNormalization", "SimplifiedLayerNormalization"], _NORM),
        **dict.fromkeys(["Softmax", "LogSoftmax"], _SOFTMAX),
        **dict.fromkeys(
            ["ReduceMean", "ReduceSum", "ReduceSumSquare", "ReduceL1", "ReduceL2", "ReduceLogSum",
             "ReduceLogSumExp", "ReduceProd", "CumSum"], _REDUCE),
        **dict.fromkeys(["Exp", "Log", "Pow", "Sqrt", "Reciprocal", "Erf", "Softplus"], _MATH),
        **dict.fromkeys(["Sin", "Cos"], _ANGLE),
    }
)

#: ONNX element type of each low-precision target.
LOW_TYPES: Mapping[str, int] = MappingProxyType({"fp16": TensorProto.FLOAT16, "bf16": TensorProto.BFLOAT16})
_TYPE_STR = {TensorProto.FLOAT16: "tensor(float16)", TensorProto.BFLOAT16: "tensor(bfloat16)"}


@dataclass(frozen=True)
class NodeDecision:
    """Whether a float-carrying node runs in low precision; ``reason`` says why it stayed FP32."""

    low: bool
    reason: str = ""
    low_inputs: tuple[int, ...] = ()
    low_outputs: tuple[int, ...] = ()


@dataclass
class RuleContext:
    """What the rules may look at: tensor types, the opset, the target and the user's lists."""

    target: str
    opsets: dict[str, int]
    dtypes: dict[str, int]
    keep_ops: Mapping[str, str]
    keep_nodes: frozenset[str]
    layernorm_nodes: dict[str, str] = field(default_factory=dict)
    rmsnorm_nodes: dict[str, str] = field(default_factory=dict)
    angle_nodes: dict[str, str] = field(default_factory=dict)

    @property
    def low_type(self) -> int:
        """ONNX element type of the target (FLOAT16 or BFLOAT16)."""
        return LOW_TYPES[self.target]


def schema_for(node: onnx.NodeProto, opsets: Mapping[str, int]) -> defs.OpSchema | None:
    """The ONNX schema that applies to ``node`` at the model's opset, or None if unknown."""
    domain = "" if node.domain in ("", "ai.onnx") else node.domain
    version = opsets.get(domain)
    if version is None:
        return None
    try:
        return defs.get_schema(node.op_type, version, domain)
    except defs.SchemaError:
        return None


def _formal(params: list[defs.OpSchema.FormalParameter], index: int) -> defs.OpSchema.FormalParameter | None:
    if index < len(params):
        return params[index]
    if params and params[-1].option == defs.OpSchema.FormalParameterOption.Variadic:
        return params[-1]
    return None


def float_slots(
    node: onnx.NodeProto, schema: defs.OpSchema, ctx: RuleContext
) -> tuple[tuple[int, ...], tuple[int, ...], str | None]:
    """Which FP32 inputs/outputs of ``node`` can become low precision under its schema.

    Returns:
        ``(input indices, output indices, problem)``; ``problem`` explains why the node cannot
        run in the target type (a type variable without that type, or an untyped input).
    """
    allowed = {c.type_param_str: set(c.allowed_type_strs) for c in schema.type_constraints}
    want = _TYPE_STR[ctx.low_type]
    converted: set[str] = set()
    low_in: list[int] = []
    for i, name in enumerate(node.input):
        param = _formal(schema.inputs, i)
        if not name or param is None or param.type_str not in allowed:
            continue  # absent optional input, or a fixed type such as tensor(int64)
        dtype = ctx.dtypes.get(name)
        if dtype is None and want in allowed[param.type_str] and "tensor(float)" in allowed[param.type_str]:
            return (), (), f"type of input '{name}' is unknown after shape inference"
        if dtype != TensorProto.FLOAT:
            continue
        if want not in allowed[param.type_str]:
            opset = ctx.opsets.get(node.domain or "", 0)
            hint = "; convert the graph to opset >= 22 (opset=22) for bf16 Conv" if "Conv" in node.op_type else ""
            problem = f"ONNX {node.op_type}-{schema.since_version} (opset {opset}) has no {want} for '{param.name}'"
            return (), (), problem + hint
        converted.add(param.type_str)
        low_in.append(i)
    low_out = [
        i for i, name in enumerate(node.output)
        if name and ctx.dtypes.get(name) == TensorProto.FLOAT
        and (p := _formal(schema.outputs, i)) is not None and p.type_str in converted
    ]
    return tuple(low_in), tuple(low_out), None


def carries_float(node: onnx.NodeProto, dtypes: Mapping[str, int]) -> bool:
    """True when any input or output of ``node`` is an FP32 tensor."""
    return any(dtypes.get(n) == TensorProto.FLOAT for n in [*node.input, *node.output] if n)


# ------------------------------------------------------------------------------------------ rules

Rule = Callable[[onnx.NodeProto, RuleContext], "str | None"]


def rule_listed_node(node: onnx.NodeProto, ctx: RuleContext) -> str | None:
    """Nodes named in ``keep_fp32_nodes``."""
    return "listed in keep_fp32_nodes" if node.name in ctx.keep_nodes else None


def rule_listed_op(node: onnx.NodeProto, ctx: RuleContext) -> str | None:
    """Operators in ``keep_fp32_ops`` (defaults: :data:`DEFAULT_KEEP_FP32_OPS`)."""
    if node.op_type in ctx.keep_ops:
        return f"{node.op_type} in keep_fp32_ops: {ctx.keep_ops[node.op_type]}"
    return None


def rule_decomposed_layernorm(node: onnx.NodeProto, ctx: RuleContext) -> str | None:
    """Nodes of a decomposed LayerNorm, kept whenever ``LayerNormalization`` is kept FP32.

    A ``keep_fp32_ops`` list without ``LayerNormalization`` lets both forms go low precision.
    """
    if "LayerNormalization" not in ctx.keep_ops:
        return None
    return ctx.layernorm_nodes.get(node.name)


def rule_decomposed_rmsnorm(node: onnx.NodeProto, ctx: RuleContext) -> str | None:
    """Nodes of a decomposed RMSNorm, kept whenever ``RMSNormalization`` is kept FP32."""
    if "RMSNormalization" not in ctx.keep_ops:
        return None
    return ctx.rmsnorm_nodes.get(node.name)


def rule_rotary_angle(node: onnx.NodeProto, ctx: RuleContext) -> str | None:
    """Nodes computing the argument of a ``Sin``/``Cos``, kept whenever those are kept FP32."""
    if not ({"Sin", "Cos"} & set(ctx.keep_ops)):
        return None
    return ctx.angle_nodes.get(node.name)


def rule_subgraph(node: onnx.NodeProto, ctx: RuleContext) -> str | None:
    """Control flow (If/Loop/Scan): its body is not converted."""
    del ctx
    if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute):
        return "has a subgraph (control flow); its body is not converted"
    return None


def rule_schema(node: onnx.NodeProto, ctx: RuleContext) -> str | None:
    """Nodes without an ONNX schema (custom domains) or whose schema lacks the target type."""
    schema = schema_for(node, ctx.opsets)
    if schema is None:
        return f"no ONNX schema for {node.domain or 'ai.onnx'}::{node.op_type}; its type support is unknown"
    return float_slots(node, schema, ctx)[2]


#: Rules in the order they are tried.
DEFAULT_RULES: tuple[Rule, ...] = (
    rule_listed_node, rule_decomposed_layernorm, rule_decomposed_rmsnorm, rule_rotary_angle, rule_listed_op,
    rule_subgraph, rule_schema,
)


def _normalise_tails(
    sqrt: onnx.NodeProto, d: str, next_op: Callable[[str, str], list[onnx.NodeProto]]
) -> list[list[onnx.NodeProto]]:
    """List the ways ``d`` is divided by ``sqrt``'s output.

    ``Div(d, s)``, or the rsqrt form ``Div(1, s) | Reciprocal(s)`` then ``Mul(d, r)``.
    """
    s = sqrt.output[0]
    tails = [[div] for div in next_op(s, "Div") if list(div.input) == [d, s]]
    inverses = [div for div in next_op(s, "Div") if div.input[1] == s and div.input[0] != d]
    inverses += next_op(s, "Reciprocal")
    for inv in inverses:
        r = inv.output[0]
        tails += [[inv, mul] for mul in next_op(r, "Mul") if sorted(mul.input) == sorted([d, r])]
    return tails


def decomposed_layernorm_nodes(graph: onnx.GraphProto) -> dict[str, str]:
    """Find decomposed LayerNorms (the exporters' and the rsqrt form used by the Hydra model).

    ``ReduceMean -> Sub -> Pow|Mul -> ReduceMean -> Add -> Sqrt``, then ``Div(d, s)`` or the
    rsqrt form ``Div(1, s) | Reciprocal -> Mul(d, .)``.

    Returns:
        node name -> reason for every node of each match (the ReduceMeans included).
    """
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)

    def next_op(tensor: str, op: str) -> list[onnx.NodeProto]:
        return [c for c in consumers.get(tensor, []) if c.op_type == op]

    found: dict[str, str] = {}
    for mean in (n for n in graph.node if n.op_type == "ReduceMean"):
        x = mean.input[0]
        for sub in next_op(mean.output[0], "Sub"):
            if list(sub.input) != [x, mean.output[0]]:
                continue
            d = sub.output[0]
            squares = next_op(d, "Pow") + [m for m in next_op(d, "Mul") if list(m.input) == [d, d]]
            for sq in squares:
                for var in next_op(sq.output[0], "ReduceMean"):
                    for add in next_op(var.output[0], "Add"):
                        for sqrt in next_op(add.output[0], "Sqrt"):
                            for tail in _normalise_tails(sqrt, d, next_op):
                                chain = [mean, sub, sq, var, add, sqrt, *tail]
                                why = f"part of a decomposed LayerNorm ({mean.name} .. {tail[-1].name}): {_NORM}"
                                found.update({n.name: why for n in chain})
    return found


def _consumers(graph: onnx.GraphProto) -> dict[str, list[onnx.NodeProto]]:
    found: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for name in node.input:
            found.setdefault(name, []).append(node)
    return found


def decomposed_rmsnorm_nodes(graph: onnx.GraphProto) -> dict[str, str]:
    """Find decomposed RMSNorms (Hugging Face's ``LlamaRMSNorm`` under the TorchScript exporter).

    ``Pow(x, 2)|Mul(x, x) -> ReduceMean -> Add -> Sqrt``, then ``Div(x, s)`` or the rsqrt form
    ``Div(1, s)|Reciprocal -> Mul(x, .)``.

    Returns:
        node name -> reason for every node of each match.
    """
    consumers = _consumers(graph)

    def next_op(tensor: str, op: str) -> list[onnx.NodeProto]:
        return [c for c in consumers.get(tensor, []) if c.op_type == op]

    found: dict[str, str] = {}
    for sq in graph.node:
        if sq.op_type == "Pow":
            x = sq.input[0]
        elif sq.op_type == "Mul" and len(sq.input) == 2 and sq.input[0] == sq.input[1]:
            x = sq.input[0]
        else:
            continue
        for mean in next_op(sq.output[0], "ReduceMean"):
            for add in next_op(mean.output[0], "Add"):
                for sqrt in next_op(add.output[0], "Sqrt"):
                    for tail in _normalise_tails(sqrt, x, next_op):
                        chain = [sq, mean, add, sqrt, *tail]
                        why = f"{_RMS} ({sq.name} .. {tail[-1].name})"
                        found.update({n.name: why for n in chain})
    return found


#: ops a rotary angle passes through between the positions and Sin/Cos
_ANGLE_OPS = frozenset({"Mul", "MatMul", "Concat", "Transpose", "Reshape", "Unsqueeze", "Expand", "Identity", "Div",
                        "Add", "Squeeze", "Gather", "Slice", "Tile"})


def rotary_angle_nodes(graph: onnx.GraphProto, depth: int = 6) -> dict[str, str]:
    """The nodes computing the argument of each ``Sin``/``Cos`` (up to ``depth`` nodes back through :data:`_ANGLE_OPS`).

    Returns:
        node name -> reason.
    """
    producer = {out: node for node in graph.node for out in node.output if out}
    found: dict[str, str] = {}
    for trig in (n for n in graph.node if n.op_type in ("Sin", "Cos")):
        frontier = [(trig.input[0], 0)]
        while frontier:
            name, level = frontier.pop()
            node = producer.get(name)
            if node is None or level >= depth or node.op_type not in _ANGLE_OPS or node.name in found:
                continue
            found[node.name] = f"{_ANGLE} (the argument of {trig.name})"
            frontier += [(i, level + 1) for i in node.input if i]
    return found


def classify_nodes(
    graph: onnx.GraphProto, ctx: RuleContext, rules: Iterable[Rule] = DEFAULT_RULES
) -> dict[str, NodeDecision]:
    """Stage 1: decide, for every float-carrying node, low precision or FP32 with a reason.

    ``Constant`` nodes are sources, not compute: they are converted with the initializers.
    Node names must be unique (the pass names unnamed nodes first).
    """
    ctx.layernorm_nodes = decomposed_layernorm_nodes(graph)
    ctx.rmsnorm_nodes = decomposed_rmsnorm_nodes(graph)
    ctx.angle_nodes = rotary_angle_nodes(graph)
    decisions: dict[str, NodeDecision] = {}
    for node in graph.node:
        if node.op_type == "Constant" or not carries_float(node, ctx.dtypes):
            continue
        reason = next((r for rule in rules if (r := rule(node, ctx))), None)
        if reason:
            decisions[node.name] = NodeDecision(low=False, reason=reason)
            continue
        schema = schema_for(node, ctx.opsets)
        assert schema is not None  # rule_schema returned no reason, so a schema exists
        low_in, low_out, _ = float_slots(node, schema, ctx)
        if low_in or low_out:
            decisions[node.name] = NodeDecision(low=True, low_inputs=low_in, low_outputs=low_out)
        else:
            decisions[node.name] = NodeDecision(low=False, reason="its float tensors have fixed FP32 types")
    return decisions
