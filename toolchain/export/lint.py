"""TensorRT compatibility lint that runs on a CPU: find what the ONNX-TensorRT parser will reject.

:func:`lint_tensorrt` reads the graph (never the weights), runs shape inference, and reports
:class:`Finding` s, each with a severity, the node, its op and a message saying what to change:

* ``opset`` - the default-domain opset is outside the parser's range (:data:`trt_ops.OPSET_RANGE`);
* ``unsupported-op`` / ``custom-op`` / ``min-version`` - an op the parser does not import
  (operators.md ``N``, or not listed), a custom-domain op (needs a plugin), an op that needs a
  newer TensorRT minor;
* ``op-dtype`` - the op's data input has a type its operators.md row does not list;
* ``grouped-conv`` - a ``Conv`` with ``group > 1`` whose weights are not an initializer or whose
  input channel dimension is not static (TensorRT needs both to build the grouped kernel);
* ``constant-input`` - ``axes``/``K``/``axis`` inputs that must be build-time constants;
* ``dtype`` - float64, string, complex, uint16/32/64 or int16 tensors (int64 is fine);
* ``profile`` - a dynamic input dim not covered by the optimisation profile, a profile entry for
  an unknown input, a rank mismatch, or a static dim the profile does not pin;
* ``restriction`` (info) - a restriction from operators.md this lint cannot check.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import onnx
from onnx import TensorProto

from toolchain.errors import CheckFailed, GraphError
from toolchain.export import trt_ops
from toolchain.export.graph import dims_of, load_checked

Severity = Literal["error", "warning", "info"]
Shape = Sequence[int]
Profile = Mapping[str, tuple[Shape, Shape, Shape]]

_BAD_DTYPES = {
    TensorProto.DOUBLE: "float64 (TensorRT casts it down to float32 with clamping; export in float32)",
    TensorProto.STRING: "string (TensorRT has no string tensors; move tokenisation out of the graph)",
    TensorProto.COMPLEX64: "complex64 (not a TensorRT type)",
    TensorProto.COMPLEX128: "complex128 (not a TensorRT type)",
    TensorProto.UINT16: "uint16 (not a TensorRT type)",
    TensorProto.UINT32: "uint32 (not a TensorRT type)",
    TensorProto.UINT64: "uint64 (not a TensorRT type)",
    TensorProto.INT16: "int16 (not a TensorRT type)",
}
#: Input index that must be a build-time constant, per op (opset >= 13 forms).
_CONST_INPUTS = {
    **{op: (1, "axes") for op in trt_ops.SUPPORTED if op.startswith("Reduce")},
    "Squeeze": (1, "axes"), "Unsqueeze": (1, "axes"), "CumSum": (1, "axis"), "TopK": (1, "K"),
}
_CHECKED_RESTRICTIONS = {
    "Conv", "ConvTranspose", "LayerNormalization", "Squeeze", "Unsqueeze", "CumSum", "Constant",
    *(op for op in trt_ops.SUPPORTED if op.startswith("Reduce")),
}


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


def _parse_version(trt_version: str) -> tuple[int, int | None]:
    parts = str(trt_version).split(".")
    try:
        major = int(parts[0])
        minor = int(parts[1]) if len(parts) > 1 else None
    except ValueError:
        raise GraphError(f"lint_tensorrt: trt_version must look like '10' or '10.15', got '{trt_version}'.") from None
    if major not in trt_ops.OPSET_RANGE:
        raise GraphError(f"lint_tensorrt: trt_version {trt_version} is not supported; use 10.x or 11.x.")
    return major, minor


class _Graph:
    """Lookups over one graph: types, producers, constants."""

    def __init__(self, model: onnx.ModelProto) -> None:
        g = model.graph
        self.graph = g
        self.inits = {i.name: i for i in g.initializer}
        self.constants = set(self.inits) | {n.output[0] for n in g.node if n.op_type == "Constant"}
        values = [*g.input, *g.output, *g.value_info]
        self.types = {v.name: v.type.tensor_type.elem_type for v in values}
        self.types.update({i.name: i.data_type for i in g.initializer})
        self.dims = {v.name: dims_of(v) for v in values}
        self.consumed = {t for n in g.node for t in n.input} | {o.name for o in g.output}


def _check_opset(model: onnx.ModelProto, major: int, minor: int | None, out: list[Finding]) -> None:
    low, early_max, late_max = trt_ops.OPSET_RANGE[major]
    opset = next((i.version for i in model.opset_import if i.domain in ("", "ai.onnx")), 0)
    if not low <= opset <= late_max:
        msg = f"opset {opset} is outside TensorRT {major}.x's {low}..{late_max}; re-export in that range (17 is safe)."
        out.append(_graph_finding("error", "opset", msg))
    elif opset > early_max and (minor is None or minor < 15):
        msg = f"opset {opset} needs a recent TensorRT {major}.x parser (10.0 parses up to {early_max}); check yours."
        out.append(_graph_finding("warning", "opset", msg))


def _check_node_support(node: onnx.NodeProto, g: _Graph, major: int, minor: int | None, out: list[Finding]) -> None:
    op = node.op_type
    if node.domain not in ("", "ai.onnx"):
        out.append(Finding("error", "custom-op", node.name, op,
                           f"custom domain '{node.domain}' needs a TensorRT plugin; replace the op or register one."))
        return
    if op in trt_ops.UNSUPPORTED or op not in trt_ops.SUPPORTED:
        listed = "marked unsupported" if op in trt_ops.UNSUPPORTED else "not listed"
        out.append(Finding("error", "unsupported-op", node.name, op,
                           f"{op} is {listed} in onnx-tensorrt docs/operators.md; rewrite it with supported ops."))
        return
    need = trt_ops.MIN_VERSION.get(op)
    if need and (major, minor if minor is not None else -1) < need:
        sev: Severity = "error" if minor is not None or major < need[0] else "warning"
        out.append(Finding(sev, "min-version", node.name, op, f"{op} needs TensorRT >= {need[0]}.{need[1]}."))
    support = trt_ops.SUPPORTED[op]
    first = node.input[0] if node.input else ""
    if first and op not in ("Cast", "CastLike", "Shape", "Size") and first in g.types:
        column = trt_ops.TYPE_COLUMN.get(TensorProto.DataType.Name(g.types[first]))
        if column is not None and column not in support.types:
            out.append(Finding("error", "op-dtype", node.name, op,
                               f"input '{first}' is {column}; the parser supports {op} for "
                               f"{', '.join(sorted(support.types))} only; cast it first."))
    if support.restriction and op not in _CHECKED_RESTRICTIONS:
        out.append(Finding("info", "restriction", node.name, op, f"operators.md restriction: {support.restriction}"))


def _check_conv(node: onnx.NodeProto, g: _Graph, out: list[Finding]) -> None:
    group = next((a.i for a in node.attribute if a.name == "group"), 1)
    weight = node.input[1]
    is_const = weight in g.constants
    if group > 1 and not is_const:
        out.append(Finding("error", "grouped-conv", node.name, node.op_type,
                           f"grouped {node.op_type} (group={group}) weight '{weight}' is computed at run time; "
                           "TensorRT needs it as an initializer: fold it (export with constant folding)."))
    elif not is_const:
        out.append(Finding("warning", "conv-weights", node.name, node.op_type,
                           f"weight '{weight}' is not an initializer; TensorRT may build a slower kernel."))
    if group > 1:
        channels = g.dims.get(node.input[0], [])
        channel = channels[1] if len(channels) > 1 else None
        if not isinstance(channel, int):
            out.append(Finding("error", "grouped-conv", node.name, node.op_type,
                               f"input '{node.input[0]}' channel dim is {channel!r}, not static; grouped "
                               f"convolution (group={group}) needs a static channel count: make dim 1 static."))
        elif weight in g.inits and len(g.inits[weight].dims) > 1 and channel != group * g.inits[weight].dims[1]:
            out.append(Finding("error", "grouped-conv", node.name, node.op_type,
                               f"input channels {channel} != group {group} x weight in-channels "
                               f"{g.inits[weight].dims[1]}."))


def _check_restrictions(node: onnx.NodeProto, g: _Graph, out: list[Finding]) -> None:
    op = node.op_type
    if op in ("Conv", "ConvTranspose") and len(node.input) > 1:
        _check_conv(node, g, out)
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


def _check_dtypes(model: onnx.ModelProto, g: _Graph, out: list[Finding]) -> None:
    io = {v.name for v in [*model.graph.input, *model.graph.output]}
    for name, dtype in sorted(g.types.items()):
        if dtype in _BAD_DTYPES:
            out.append(_graph_finding("error", "dtype", f"tensor '{name}' is {_BAD_DTYPES[dtype]}."))
        elif dtype == TensorProto.UINT8 and name not in io:
            msg = f"tensor '{name}' is uint8 inside the graph; TensorRT allows uint8 only at network inputs/outputs."
            out.append(_graph_finding("warning", "dtype", msg))
    for node in model.graph.node:
        to = next((a.i for a in node.attribute if a.name == "to"), None) if node.op_type == "Cast" else None
        if to in _BAD_DTYPES:
            out.append(Finding("error", "dtype", node.name, node.op_type, f"casts to {_BAD_DTYPES[to]}."))


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


def lint_tensorrt(path: Path, trt_version: str = "10", profile: Profile | None = None) -> LintReport:
    """Lint an ONNX file for the TensorRT ``trt_version`` ONNX parser (on CPU, weights not read).

    Args:
        path: the ``.onnx`` file.
        trt_version: ``"10"``, ``"11"`` or a minor such as ``"10.15"``.
        profile: input name -> ``(min, opt, max)`` shapes, e.g.
            ``{"input_ids": ((1, 8), (8, 128), (32, 512))}``; dynamic dims must be covered.

    Returns:
        :class:`LintReport`; ``report.ok`` is False when any finding is an error.
    """
    path = Path(path)
    major, minor = _parse_version(trt_version)
    model = load_checked(path, load_weights=False, check=False)
    try:
        model = onnx.shape_inference.infer_shapes(model, data_prop=True)
    except onnx.shape_inference.InferenceError as exc:
        raise GraphError(f"shape inference failed on {path}: {exc}; fix the graph before linting.") from exc
    g = _Graph(model)
    findings: list[Finding] = []
    _check_opset(model, major, minor, findings)
    for node in model.graph.node:
        _check_node_support(node, g, major, minor, findings)
        _check_restrictions(node, g, findings)
    _check_dtypes(model, g, findings)
    _check_profile(model, g, profile, findings)
    order = {"error": 0, "warning": 1, "info": 2}
    findings.sort(key=lambda f: order[f.severity])
    return LintReport(path=path, trt_version=str(trt_version), findings=findings)
