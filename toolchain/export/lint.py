"""TensorRT compatibility lint that runs on a CPU: find what the ONNX-TensorRT parser will reject.

:func:`lint_tensorrt` reads the graph (never the weights), runs shape inference, and reports
:class:`Finding` s, each with a severity, the node, its op and a message saying what to change.
Every rule that changed between releases is gated by the target TensorRT version, from the tables
of :mod:`toolchain.export.trt_ops` (each row names its source); the target defaults to the
installed TensorRT's version, else the newest rules (:data:`trt_ops.NEWEST`). A target given as a
major only (``"10"``) makes rules added within that major warnings ("check your minor").

* ``opset`` - the default-domain opset is outside the target's range (:data:`trt_ops.OPSET_MAX`);
* ``unsupported-op`` / ``custom-op`` / ``min-version`` - an op the parser does not import
  (operators.md ``N``, or not listed), a custom-domain op that no local function defines (needs a
  plugin), an op or op form that needs a newer TensorRT (:data:`trt_ops.OP_SINCE`,
  :data:`trt_ops.FEATURE_SINCE`); the nodes of ONNX local functions are checked as well;
* ``op-dtype`` - the op's data input has a type its operators.md row does not list;
* ``conv-shape`` - a grouped ``Conv`` whose input channels are not group x weight in-channels;
* ``constant-input`` - ``axes``/``axis`` inputs that must be build-time constants; ``topk-k`` - a
  constant TopK K of 3840 or more;
* ``dtype`` - string, complex, uint16/32/64 or int16 tensors (errors); float64 (a warning: the
  parser casts it down to float32);
* ``profile`` - a dynamic input dim not covered by the optimisation profile, a profile entry for
  an unknown input, a rank mismatch, or a static dim the profile does not pin;
* ``qdq`` - explicit quantization (an INT8 Q/DQ graph, the only INT8 TensorRT 11 builds, and what
  TensorRT 10 builds strongly typed without the INT8 flag): a ``QuantizeLinear``/``DequantizeLinear``
  whose scale is not a build-time constant or whose zero point is not 0 (TensorRT quantizes
  symmetrically) is an error; an info line counts the pairs;
* ``restriction`` (info) - a restriction from operators.md this lint cannot check.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import onnx
from onnx import TensorProto, numpy_helper

from toolchain.errors import CheckFailed, GraphError
from toolchain.export import trt_ops
from toolchain.export.graph import dims_of, load_checked

log = logging.getLogger(__name__)

Severity = Literal["error", "warning", "info"]
Shape = Sequence[int]
Profile = Mapping[str, tuple[Shape, Shape, Shape]]
Target = tuple[int, int | None]

_BAD_DTYPES = {
    TensorProto.STRING: "string (TensorRT has no string tensors; move tokenisation out of the graph)",
    TensorProto.COMPLEX64: "complex64 (not a TensorRT type)",
    TensorProto.COMPLEX128: "complex128 (not a TensorRT type)",
    TensorProto.UINT16: "uint16 (not a TensorRT type)",
    TensorProto.UINT32: "uint32 (not a TensorRT type)",
    TensorProto.UINT64: "uint64 (not a TensorRT type)",
    TensorProto.INT16: "int16 (not a TensorRT type)",
}
_FLOAT64 = ("float64: TensorRT casts it down to float32, clamping to +-FLT_MAX "
            f"({trt_ops.FEATURE_SINCE['float64'].source}); export in float32 to keep parity exact")
#: Input index that must be a build-time constant, per op (opset >= 13 forms). TopK's K is not
#: here: a run-time K is imported (trt_ops.FEATURE_SINCE["topk-runtime-k"]).
_CONST_INPUTS = {
    **{op: (1, "axes") for op in trt_ops.SUPPORTED if op.startswith("Reduce")},
    "Squeeze": (1, "axes"), "Unsqueeze": (1, "axes"), "CumSum": (1, "axis"),
}
_CHECKED_RESTRICTIONS = {
    "Conv", "ConvTranspose", "LayerNormalization", "Squeeze", "Unsqueeze", "CumSum", "Constant", "TopK",
    "QuantizeLinear", "DequantizeLinear",
    *(op for op in trt_ops.SUPPORTED if op.startswith("Reduce")),
}
_INT_TYPES = {TensorProto.INT32, TensorProto.INT64}
#: Ops whose first input is not the data the operators.md type column describes (it describes the
#: output: window ops take an integer size, ConstantOfShape a shape; casts and shape ops any type).
_NO_DATA_INPUT = {"Cast", "CastLike", "Shape", "Size", "ConstantOfShape", "BlackmanWindow", "HammingWindow",
                  "HannWindow"}


@dataclass(frozen=True)
class Finding:
    """One lint result; ``node`` is empty for graph-level findings."""

    severity: Severity
    code: str
    node: str
    op: str
    message: str

    def __str__(self) -> str:
        where = f"{self.node} ({self.op})" if self.node else "graph"
        return f"{self.severity}: [{self.code}] {where}: {self.message}"


@dataclass
class LintReport:
    """All findings for one file and target; ``ok`` is True when there is no error."""

    path: Path
    trt_version: str
    findings: list[Finding] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when no finding is an error (warnings and infos do not fail the lint)."""
        return not self.errors

    @property
    def errors(self) -> list[Finding]:
        """Findings of severity ``error``."""
        return [f for f in self.findings if f.severity == "error"]

    @property
    def warnings(self) -> list[Finding]:
        """Findings of severity ``warning``."""
        return [f for f in self.findings if f.severity == "warning"]

    def codes(self, severity: Severity = "error") -> set[str]:
        """The distinct codes of findings of one severity."""
        return {f.code for f in self.findings if f.severity == severity}

    def raise_if_failed(self) -> None:
        """Raise :class:`CheckFailed` listing every error (exit code 1)."""
        if self.errors:
            lines = "; ".join(str(f) for f in self.errors)
            raise CheckFailed(f"{self.path.name} fails the TensorRT {self.trt_version} lint: {lines}")


def _graph_finding(severity: Severity, code: str, message: str) -> Finding:
    return Finding(severity, code, "", "", message)


def _parse_version(trt_version: str) -> Target:
    """``"10"`` -> (10, None); ``"10.3"`` / ``"10.3.0.26"`` -> (10, 3); GraphError on anything else."""
    parts = str(trt_version).strip().split(".")
    try:
        major = int(parts[0])
        minor = int(parts[1]) if len(parts) > 1 else None
    except ValueError:
        raise GraphError(f"lint_tensorrt: trt_version must look like '10' or '10.15', got '{trt_version}'.") from None
    if major not in trt_ops.MAJORS:
        raise GraphError(f"lint_tensorrt: trt_version {trt_version} is not supported; use 10.x or 11.x "
                         f"(rules up to {trt_ops.NEWEST[0]}.{trt_ops.NEWEST[1]}).")
    return major, minor


def default_trt_version() -> str:
    """The installed TensorRT's ``major.minor`` when ``import tensorrt`` works, else the newest rules."""
    try:
        import tensorrt

        version = str(tensorrt.__version__)
        _parse_version(version)
        return ".".join(version.split(".")[:2])
    except Exception as exc:  # not installed, no CUDA libraries, or a version this lint does not know
        log.debug("lint: no usable installed TensorRT (%s); using the newest rules", exc)
        return "{}.{}".format(*trt_ops.NEWEST)


def _gate(rule: trt_ops.Rule, target: Target) -> Severity | None:
    """None when ``target`` accepts what ``rule`` describes; else the severity of the finding.

    A major-only target (minor None) cannot tell whether a rule from a later minor of the same
    major applies: a warning. A later major, or a known older minor: an error.
    """
    major, minor = target
    if rule.since[0] < major or (minor is not None and rule.since <= (major, minor)):
        return None
    if minor is None and rule.since[0] == major:
        return None if rule.since[1] == 0 else "warning"
    return "error"


def _needs(rule: trt_ops.Rule, target: Target) -> str:
    have = f"{target[0]}.{target[1]}" if target[1] is not None else f"{target[0]}.x (minor not given)"
    return (f"{rule.what} needs TensorRT >= {rule.since[0]}.{rule.since[1]}, the target is {have} "
            f"[{rule.source}]")


class _Graph:
    """Lookups over one graph: types, producers, constants, local functions."""

    def __init__(self, model: onnx.ModelProto) -> None:
        g = model.graph
        self.graph = g
        self.inits = {i.name: i for i in g.initializer}
        self.constant_nodes = {n.output[0]: n for n in g.node if n.op_type == "Constant" and n.output}
        self.constants = set(self.inits) | set(self.constant_nodes)
        values = [*g.input, *g.output, *g.value_info]
        self.types = {v.name: v.type.tensor_type.elem_type for v in values}
        self.types.update({i.name: i.data_type for i in g.initializer})
        self.dims = {v.name: dims_of(v) for v in values}
        self.consumed = {t for n in g.node for t in n.input} | {o.name for o in g.output}
        self.functions = {(f.domain, f.name): f for f in model.functions}
        self.opset = next((i.version for i in model.opset_import if i.domain in ("", "ai.onnx")), 0)

    def constant_value(self, name: str) -> list[int] | None:
        """The integer values of an initializer or Constant output, None when not readable here."""
        tensor = self.inits.get(name)
        if tensor is None and name in self.constant_nodes:
            tensor = next((a.t for a in self.constant_nodes[name].attribute if a.name == "value"), None)
        if tensor is None or tensor.data_location == TensorProto.EXTERNAL:
            return None
        try:
            return [int(v) for v in numpy_helper.to_array(tensor).reshape(-1)]
        except (ValueError, TypeError):
            return None


def _check_opset(g: _Graph, target: Target, out: list[Finding]) -> None:
    major, minor = target
    opset = g.opset
    rows = [r for r in trt_ops.OPSET_MAX if r[0][0] == major]
    if minor is None:  # a major only: its first release is certain, later ones are "check yours"
        accepted, possible = rows[0], rows[-1]
    else:
        accepted = [r for r in rows if r[0] <= (major, minor)][-1]
        later = [r for r in rows if r[0] > (major, minor)]
        # a release after the row's own one, before an inexact step: that step may already be in it
        gap = later and not later[0][2] and accepted[0] < (major, minor)
        possible = later[0] if gap else accepted
    if opset < trt_ops.OPSET_MIN or opset > possible[1]:
        msg = (f"opset {opset} is outside TensorRT {major}.{'x' if minor is None else minor}'s "
               f"{trt_ops.OPSET_MIN}..{accepted[1]} [{accepted[3]}]; re-export in that range (17 is safe).")
        out.append(_graph_finding("error", "opset", msg))
    elif opset > accepted[1]:
        msg = (f"opset {opset} needs a newer parser than TensorRT {accepted[0][0]}.{accepted[0][1]} "
               f"(up to {accepted[1]}); TensorRT {possible[0][0]}.{possible[0][1]} parses up to {possible[1]} "
               f"[{possible[3]}]; check your TensorRT or re-export at opset {accepted[1]}.")
        out.append(_graph_finding("warning", "opset", msg))


def _gated(rule: trt_ops.Rule, target: Target, node: onnx.NodeProto, fix: str, out: list[Finding]) -> None:
    severity = _gate(rule, target)
    if severity is not None:
        out.append(Finding(severity, "min-version", node.name, node.op_type, f"{_needs(rule, target)}; {fix}"))


def _check_node_support(node: onnx.NodeProto, g: _Graph, target: Target, out: list[Finding],
                        seen: set[tuple[str, str]] | None = None, where: str = "") -> None:
    op = node.op_type
    function = g.functions.get((node.domain, op))
    if function is not None:
        _gated(trt_ops.FEATURE_SINCE["local-function"], target, node, "inline the function.", out)
        seen = set() if seen is None else seen
        if (node.domain, op) not in seen:  # the parser imports the body: check its nodes once
            seen.add((node.domain, op))
            for inner in function.node:
                _check_node_support(inner, g, target, out, seen, f"{where}{function.name}/")
        return
    name = f"{where}{node.name}" if where else node.name
    if node.domain not in ("", "ai.onnx"):
        out.append(Finding("error", "custom-op", name, op, f"custom domain '{node.domain}' needs a TensorRT "
                           "plugin (no local function defines it); replace the op or register one."))
        return
    if op in trt_ops.UNSUPPORTED or op not in trt_ops.SUPPORTED:
        listed = "marked unsupported" if op in trt_ops.UNSUPPORTED else "not listed"
        out.append(Finding("error", "unsupported-op", name, op,
                           f"{op} is {listed} in onnx-tensorrt docs/operators.md; rewrite it with supported ops."))
        return
    if op in trt_ops.OP_SINCE:
        _gated(trt_ops.OP_SINCE[op], target, node, "upgrade TensorRT or rewrite it with older ops.", out)
    support = trt_ops.SUPPORTED[op]
    first = node.input[0] if node.input else ""
    if first and op not in _NO_DATA_INPUT and first in g.types:
        column = trt_ops.TYPE_COLUMN.get(TensorProto.DataType.Name(g.types[first]))
        if column is not None and column not in support.types:
            out.append(Finding("error", "op-dtype", name, op,
                               f"input '{first}' is {column}; the parser supports {op} for "
                               f"{', '.join(sorted(support.types))} only; cast it first."))
    if not where and support.restriction and op not in _CHECKED_RESTRICTIONS:
        out.append(Finding("info", "restriction", name, op, f"operators.md restriction: {support.restriction}"))


def _check_forms(node: onnx.NodeProto, g: _Graph, target: Target, out: list[Finding]) -> None:
    """Version-gated forms of supported ops (trt_ops.FEATURE_SINCE)."""
    op, rules = node.op_type, trt_ops.FEATURE_SINCE
    if op == "Einsum":
        equation = next((a.s.decode() for a in node.attribute if a.name == "equation"), "")
        if "..." in equation:
            _gated(rules["einsum-ellipsis"], target, node, "write the batch dims out explicitly.", out)
    elif op == "Pow" and node.input and g.types.get(node.input[0]) in _INT_TYPES:
        _gated(rules["pow-integer-base"], target, node, "cast the base to float first.", out)
    elif op == "Squeeze":
        has_axes = (len(node.input) > 1 and node.input[1]) or any(a.name == "axes" for a in node.attribute)
        if not has_axes:
            _gated(rules["squeeze-no-axes"], target, node, "give the axes to squeeze explicitly.", out)


def _check_conv(node: onnx.NodeProto, g: _Graph, out: list[Finding]) -> None:
    """Weights computed at run time: a warning (imported as a tensor input, maybe a slower kernel)."""
    group = next((a.i for a in node.attribute if a.name == "group"), 1)
    weight = node.input[1]
    if weight not in g.constants:
        out.append(Finding("warning", "conv-weights", node.name, node.op_type,
                           f"weight '{weight}' is not an initializer; TensorRT imports it as a tensor input and "
                           "may build a slower kernel (fold it with constant folding)."))
    channels = g.dims.get(node.input[0], [])
    channel = channels[1] if len(channels) > 1 else None
    if (node.op_type == "Conv" and group > 1 and isinstance(channel, int) and weight in g.inits
            and len(g.inits[weight].dims) > 1 and channel != group * g.inits[weight].dims[1]):
        out.append(Finding("error", "conv-shape", node.name, node.op_type,
                           f"input channels {channel} != group {group} x weight in-channels "
                           f"{g.inits[weight].dims[1]} (the ONNX Conv definition); the graph is invalid."))


def _check_topk(node: onnx.NodeProto, g: _Graph, target: Target, out: list[Finding]) -> None:
    if len(node.input) < 2 or not node.input[1]:
        return  # opset < 10: K is an attribute
    k = node.input[1]
    values = g.constant_value(k) if k in g.constants else None
    if values is not None:
        if values and values[0] >= trt_ops.TOPK_MAX_K:
            out.append(Finding("error", "topk-k", node.name, node.op_type,
                               f"K = {values[0]}; TensorRT's TopK needs K < {trt_ops.TOPK_MAX_K} "
                               "(operators.md TopK row); split the selection or reduce K."))
        return
    if k not in g.constants:
        _gated(trt_ops.FEATURE_SINCE["topk-runtime-k"], target, node, "make K an initializer.", out)
        out.append(Finding("info", "restriction", node.name, node.op_type,
                           f"K '{k}' is computed at run time; it must stay below {trt_ops.TOPK_MAX_K}."))


def _check_restrictions(node: onnx.NodeProto, g: _Graph, target: Target, out: list[Finding]) -> None:
    op = node.op_type
    if op in ("Conv", "ConvTranspose") and len(node.input) > 1:
        _check_conv(node, g, out)
    if op == "TopK":
        _check_topk(node, g, target, out)
    if op in ("QuantizeLinear", "DequantizeLinear"):
        _check_qdq(node, g, out)
    if op == "LayerNormalization" and any(t and t in g.consumed for t in node.output[1:]):
        out.append(Finding("error", "restriction", node.name, op,
                           "only output Y of LayerNormalization is supported; do not use Mean/InvStdDev."))
    if op == "Constant" and any(a.name in ("sparse_value", "value_string", "value_strings") for a in node.attribute):
        out.append(Finding("error", "restriction", node.name, op,
                           "sparse or string Constant values are not supported; use a dense numeric value."))
    if op in _CONST_INPUTS:
        index, what = _CONST_INPUTS[op]
        if len(node.input) > index and node.input[index] and node.input[index] not in g.constants:
            out.append(Finding("error", "constant-input", node.name, op,
                               f"`{what}` input '{node.input[index]}' must be a build-time constant (initializer)."))
    _check_forms(node, g, target, out)


def _check_qdq(node: onnx.NodeProto, g: _Graph, out: list[Finding]) -> None:
    """Explicit quantization as TensorRT builds it: a constant scale, a zero point of 0 (symmetric)."""
    scale = node.input[1] if len(node.input) > 1 else ""
    if scale not in g.constants:
        out.append(Finding("error", "qdq", node.name, node.op_type,
                           f"scale '{scale}' must be a build-time constant (initializer) for TensorRT."))
    zero = node.input[2] if len(node.input) > 2 else ""
    if not zero:
        return
    values = g.constant_value(zero) if zero in g.constants else None
    if zero not in g.constants or values is None:
        out.append(Finding("info", "restriction", node.name, node.op_type,
                           f"zero point '{zero}' cannot be read here; TensorRT needs it to be 0."))
    elif any(values):
        out.append(Finding("error", "qdq", node.name, node.op_type,
                           f"zero point '{zero}' is not 0; TensorRT quantizes symmetrically (re-quantize with "
                           "symmetric activations: hydra-toolchain export --precision int8)."))


def _check_dtypes(model: onnx.ModelProto, g: _Graph, out: list[Finding]) -> None:
    io = {v.name for v in [*model.graph.input, *model.graph.output]}
    for name, dtype in sorted(g.types.items()):
        if dtype in _BAD_DTYPES:
            out.append(_graph_finding("error", "dtype", f"tensor '{name}' is {_BAD_DTYPES[dtype]}."))
        elif dtype == TensorProto.DOUBLE:
            out.append(_graph_finding("warning", "dtype", f"tensor '{name}' is {_FLOAT64}."))
        elif dtype == TensorProto.UINT8 and name not in io:
            msg = f"tensor '{name}' is uint8 inside the graph; TensorRT allows uint8 only at network inputs/outputs."
            out.append(_graph_finding("warning", "dtype", msg))
    for node in model.graph.node:
        to = next((a.i for a in node.attribute if a.name == "to"), None) if node.op_type == "Cast" else None
        if to in _BAD_DTYPES:
            out.append(Finding("error", "dtype", node.name, node.op_type, f"casts to {_BAD_DTYPES[to]}."))
        elif to == TensorProto.DOUBLE:
            out.append(Finding("warning", "dtype", node.name, node.op_type, f"casts to {_FLOAT64}."))


def _profile_axis(name: str, axis: int, dim: int | str | None, lo: int, opt: int, hi: int) -> Finding | None:
    """Check one axis of one input against its (min, opt, max) entry."""
    if not 0 <= lo <= opt <= hi:
        return _graph_finding("error", "profile", f"profile for '{name}' axis {axis} needs 0 <= min <= opt <= max, "
                              f"got {lo}, {opt}, {hi}.")
    if isinstance(dim, int) and not lo == opt == hi == dim:
        return _graph_finding("error", "profile", f"input '{name}' axis {axis} is static ({dim}) but the profile "
                              f"gives {lo}..{hi}; use {dim} for min, opt and max.")
    if not isinstance(dim, int) and lo == hi:
        return _graph_finding("info", "profile", f"input '{name}' axis {axis} ({dim!r}) is dynamic but the profile "
                              f"pins it to {lo}.")
    return None


def _check_profile(model: onnx.ModelProto, g: _Graph, profile: Profile | None, out: list[Finding]) -> None:
    inputs = {v.name: dims_of(v) for v in model.graph.input if v.name not in g.inits}
    dynamic = {name for name, dims in inputs.items() if any(not isinstance(d, int) for d in dims)}
    if profile is None:
        for name in sorted(dynamic):
            out.append(_graph_finding("warning", "profile", f"input '{name}' has dynamic dims {inputs[name]} and "
                                      "no profile was given; build_engine will need one."))
        return
    for name in sorted(set(profile) - set(inputs)):
        out.append(_graph_finding("error", "profile", f"profile names '{name}', which is not a graph input "
                                  f"(inputs: {sorted(inputs)})."))
    for name, dims in inputs.items():
        if name not in profile:
            if name in dynamic:
                out.append(_graph_finding("error", "profile", f"input '{name}' has dynamic dims {dims} but the "
                                          "profile has no (min, opt, max) entry for it."))
            continue
        shapes = [tuple(s) for s in profile[name]]
        if len(shapes) != 3 or any(len(s) != len(dims) for s in shapes):
            out.append(_graph_finding("error", "profile", f"profile for '{name}' must be 3 shapes of rank "
                                      f"{len(dims)}, got {shapes}."))
            continue
        for axis, dim in enumerate(dims):
            finding = _profile_axis(name, axis, dim, shapes[0][axis], shapes[1][axis], shapes[2][axis])
            if finding is not None:
                out.append(finding)


def lint_tensorrt(path: Path, trt_version: str | None = None, profile: Profile | None = None) -> LintReport:
    """Lint an ONNX file for the TensorRT ``trt_version`` ONNX parser (on CPU, weights not read).

    Args:
        path: the ``.onnx`` file.
        trt_version: the target, ``"10.3"``, ``"11.5"`` or a major only (``"10"``: rules added within
            10.x become warnings); None: the installed TensorRT's version when ``tensorrt`` imports,
            else the newest rules (:data:`trt_ops.NEWEST`).
        profile: input name -> ``(min, opt, max)`` shapes, e.g.
            ``{"input_ids": ((1, 8), (8, 128), (32, 512))}``; dynamic dims must be covered.

    Returns:
        :class:`LintReport` (``trt_version`` is the target used); ``report.ok`` is False when any
        finding is an error.
    """
    path = Path(path)
    version = default_trt_version() if trt_version is None else str(trt_version)
    target = _parse_version(version)
    model = load_checked(path, load_weights=False, check=False)
    try:
        model = onnx.shape_inference.infer_shapes(model, data_prop=True)
    except onnx.shape_inference.InferenceError as exc:
        raise GraphError(f"shape inference failed on {path}: {exc}; fix the graph before linting.") from exc
    g = _Graph(model)
    findings: list[Finding] = []
    _check_opset(g, target, findings)
    seen: set[tuple[str, str]] = set()
    for node in model.graph.node:
        _check_node_support(node, g, target, findings, seen)
        if (node.domain, node.op_type) not in g.functions:
            _check_restrictions(node, g, target, findings)
    _check_dtypes(model, g, findings)
    _check_profile(model, g, profile, findings)
    qdq = sum(n.op_type == "DequantizeLinear" for n in model.graph.node)
    if qdq:
        findings.append(Finding("info", "qdq", "", "",
                                f"explicit quantization: {qdq} DequantizeLinear nodes; TensorRT 10 and 11 build it "
                                "strongly typed (no INT8 builder flag, no calibrator)."))
    order = {"error": 0, "warning": 1, "info": 2}
    findings.sort(key=lambda f: order[f.severity])
    return LintReport(path=path, trt_version=version, findings=findings)
