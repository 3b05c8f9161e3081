"""An exported graph's values by module scope, for :mod:`toolchain.parity.localize`.

The TorchScript exporter names every node after the module that made it
(``/module/model/bert/encoder/layer.1/attention/self/query/MatMul``: scope
``module.model.bert.encoder.layer.1.attention.self.query``, the leading ``module`` being the export
wrapper's attribute). :class:`Graph` loads a graph and indexes every value: its producer, readers,
element type and inferred shape, its place in graph order (node order, which ONNX keeps
topological) and whether it is computed from the inputs; :func:`scope_outputs` gives each scope's
outputs (the float values its nodes produce and a node outside it reads); :func:`upstream` the
nearest values of a kind that a value is computed from.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

from toolchain.errors import GraphError

__all__ = ["LARGEST", "Graph", "Site", "block_of", "fp32_weight_mismatches", "module_weight_mismatches",
           "scope_outputs", "sites_from", "under", "upstream", "weights_differ"]

_FLOATS = {TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16, TensorProto.DOUBLE}


@dataclass(frozen=True)
class Site:
    """A value that can be checked: its producer, the module path it is reported under, its place in graph order."""

    value: str
    node: str
    op_type: str
    layer: str
    position: int


class Graph:
    """A loaded graph: producers, consumers, types, scopes and graph order of every value."""

    def __init__(self, path: Path, module_paths: Iterable[str] | None = None) -> None:
        from toolchain.export.graph import load_checked

        self.path = Path(path)
        self.model = load_checked(self.path)
        g = self.model.graph
        self.nodes = list(g.node)
        self.inputs = [i.name for i in g.input]
        self.outputs = [o.name for o in g.output]
        self.inits = {i.name: i for i in g.initializer}
        self.producer: dict[str, int] = {}
        self.position: dict[str, int] = {}
        self.consumers: dict[str, list[int]] = {}
        for i, node in enumerate(self.nodes):
            for name in node.input:
                if name:
                    self.consumers.setdefault(name, []).append(i)
            for name in node.output:
                if name:
                    self.producer[name] = i
                    self.position[name] = len(self.position)
        self.types, self.infos = _value_types(self.model)
        self.ranks = {k: len(v.type.tensor_type.shape.dim) for k, v in self.infos.items()}
        self.dynamic = self._dynamic_values()
        self.scopes = _node_paths(self.nodes, module_paths)

    def _dynamic_values(self) -> set[str]:
        """Values computed from the graph inputs (the rest are constants)."""
        live = {n for n in self.inputs if n not in self.inits}
        for node in self.nodes:
            if any(n in live for n in node.input):
                live.update(n for n in node.output if n)
        return live

    def is_float(self, name: str) -> bool:
        """A floating-point value computed from the inputs, of a known shape (it can be marked)."""
        return name in self.dynamic and self.types.get(name) in _FLOATS and name in self.infos

    def site(self, value: str, layer: str | None = None) -> Site:
        """The :class:`Site` of a produced value."""
        node = self.nodes[self.producer[value]]
        scope = self.scopes[self.producer[value]] or ""
        return Site(value, node.name, node.op_type, scope if layer is None else layer, self.position[value])

    def weight(self, name: str) -> np.ndarray | None:
        """The initializer ``name`` reads, through ``Identity`` chains (None: not a weight); BF16 as FP32."""
        for _ in range(8):
            if name in self.inits:
                array = numpy_helper.to_array(self.inits[name])
                return array.astype(np.float32) if self.inits[name].data_type == TensorProto.BFLOAT16 else array
            index = self.producer.get(name)
            if index is None or self.nodes[index].op_type != "Identity":
                return None
            name = self.nodes[index].input[0]
        return None


def _value_types(model: onnx.ModelProto) -> tuple[dict[str, int], dict[str, onnx.ValueInfoProto]]:
    """Element type of every value, and the inferred type and shape of those that have one."""
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception as exc:  # onnx raises InferenceError and friends
        raise GraphError(f"localize: ONNX shape inference failed: {str(exc).splitlines()[0]}") from exc
    g = inferred.graph
    infos = [*g.value_info, *g.input, *g.output]
    types = {v.name: v.type.tensor_type.elem_type for v in infos}
    types.update({i.name: i.data_type for i in g.initializer})
    shaped = {v.name: v for v in infos if v.type.tensor_type.HasField("shape")}
    return {k: v for k, v in types.items() if v}, shaped


def _node_paths(nodes: Sequence[onnx.NodeProto], module_paths: Iterable[str] | None) -> list[str | None]:
    """Each node's module path from its scoped name (None: an unscoped node, e.g. a pass's ``Cast``).

    With ``module_paths`` the exporter's wrapper prefix is the one (0-3 leading components) under which
    most scopes are module paths; without, a leading ``module`` (the export wrapper's attribute) is dropped.
    """
    scopes = [".".join(n.name.strip("/").split("/")[:-1]) if n.name.startswith("/") else None for n in nodes]
    known = set(module_paths) if module_paths is not None else None

    def strip(scope: str, k: int) -> str:
        return ".".join(scope.split(".")[k:]) if scope else scope

    if known is not None:
        found = [s for s in scopes if s]
        best = max(range(4), key=lambda k: (sum(strip(s, k) in known for s in found), -k))
    else:
        heads = {s.split(".")[0] for s in scopes if s is not None}
        best = 1 if heads == {"module"} else 0
    return [strip(s, best) if s is not None else None for s in scopes]


def under(path: str | None, scope: str) -> bool:
    """``path`` is ``scope`` or inside it (None, an unscoped node, is inside nothing)."""
    return path is not None and (path == scope or path.startswith(scope + "."))


def block_of(layer: str) -> str:
    """The module path up to its last numbered component (a ModuleList entry), else the path."""
    parts = layer.split(".")
    last = max((i for i, p in enumerate(parts) if p.isdigit()), default=-1)
    return ".".join(parts[:last + 1]) if last >= 0 else layer


def scope_outputs(g: Graph, allowed: Callable[[str], bool]) -> dict[str, list[str]]:
    """Module path -> the float values its scope produces and a node outside it (or the graph) reads.

    Unscoped nodes (casts a precision pass inserted) are transparent: their readers count.
    """
    memo: dict[str, list[str | None]] = {}
    outputs = set(g.outputs)

    def readers(value: str) -> list[str | None]:
        if value not in memo:
            memo[value] = []  # cycle guard
            found: list[str | None] = [None] if value in outputs else []
            for i in g.consumers.get(value, []):
                if g.scopes[i] is None:
                    found += [r for out in g.nodes[i].output if out for r in readers(out)]
                else:
                    found.append(g.scopes[i])
            memo[value] = found
        return memo[value]

    escapes: dict[str, list[str]] = {}
    for i, node in enumerate(g.nodes):
        path = g.scopes[i]
        if not path:
            continue
        parts = path.split(".")
        scopes = [s for s in (".".join(parts[:k]) for k in range(1, len(parts) + 1)) if allowed(s)]
        for value in node.output:
            if not value or not g.is_float(value):
                continue
            seen = readers(value)
            for scope in scopes:
                if any(not under(r, scope) for r in seen):
                    escapes.setdefault(scope, []).append(value)
    return escapes


def sites_from(g: Graph, chosen: Mapping[str, str], available: Callable[[str], bool]) -> list[Site]:
    """One site per value (the innermost module whose output it is), in graph order."""
    by_value: dict[str, str] = {}
    for scope, value in chosen.items():
        if available(value) and (value not in by_value or len(scope) > len(by_value[value])):
            by_value[value] = scope
    return sorted((g.site(v, layer) for v, layer in by_value.items()), key=lambda s: s.position)


def upstream(g: Graph, value: str, checkable: Callable[[str], bool],
              limit: int = 20000) -> tuple[list[str], list[int]]:
    """The nearest checkable values ``value`` is computed from, and the nodes in between (graph order).

    Constants and graph inputs end the search.
    """
    found: list[str] = []
    nodes: set[int] = set()
    seen = {value}
    stack = [value]
    while stack and len(seen) < limit:
        index = g.producer.get(stack.pop())
        if index is None:
            continue
        nodes.add(index)
        for name in g.nodes[index].input:
            if not name or name in seen or name not in g.dynamic:
                continue
            seen.add(name)
            if checkable(name):
                found.append(name)
            else:
                stack.append(name)
    return sorted(found, key=lambda v: g.position.get(v, -1)), sorted(nodes)


# ------------------------------------------------------------------------------------ weights
_LOW_SUFFIX = re.compile(r"__(fp16|bf16)$")
#: elementwise rounding allowed when a graph weight is compared with a parameter (fp16: 2^-11, bf16: 2^-8)
_WEIGHT_RTOL = {"fp32": 1e-6, "fp16": 1e-3, "bf16": 4e-3}
_WEIGHT_ATOL = {"fp32": 1e-12, "fp16": 6e-8, "bf16": 1e-30}
#: the largest finite value of each precision (BF16: 0x7F7F)
LARGEST = {"fp32": float(np.finfo(np.float32).max), "fp16": 65504.0, "bf16": 3.3895313892515355e38}


def weights_differ(found: np.ndarray, wanted: np.ndarray, precision: str) -> float | None:
    """Max |diff| when ``found`` (or its transpose) has ``wanted``'s shape but not its values; else None.

    Unit dimensions are dropped first (a Conv kernel ``[O, I, 1]`` is a linear weight ``[O, I]``).
    """
    a = np.squeeze(np.asarray(found, dtype=np.float64))
    b = np.squeeze(np.asarray(wanted, dtype=np.float64))
    options = [a] + ([a.T] if a.ndim == 2 else [])
    shaped = [x for x in options if x.shape == b.shape]
    if not shaped:
        return None
    rtol, atol = _WEIGHT_RTOL.get(precision, 1e-6), _WEIGHT_ATOL.get(precision, 1e-12)
    largest = LARGEST.get(precision, LARGEST["fp32"])
    diffs = []
    for x in shaped:
        ok = np.abs(x - b) <= atol + rtol * np.abs(b)
        ok |= (np.abs(b) >= largest) & (np.abs(x) >= largest)  # clamped to the precision's range
        if ok.all():
            return 0.0
        diffs.append(float(np.max(np.abs(x - b))))
    return min(diffs)


def module_weight_mismatches(g: Graph, module: Any, nodes: Sequence[int], precision: str) -> list[dict[str, Any]]:
    """Initializers read by ``nodes`` that match none of their module's parameters but have one's shape.

    A node's module is the nearest existing module of its scope; its parameters include its children's.
    """
    found = []
    cache: dict[str, dict[str, np.ndarray]] = {}
    for i in nodes:
        node, scope = g.nodes[i], g.scopes[i] or ""
        parts = scope.split(".") if scope else []
        while parts and ".".join(parts) not in cache:
            try:
                sub = module.get_submodule(".".join(parts))
            except AttributeError:
                parts.pop()
                continue
            prefix = ".".join(parts)
            cache[prefix] = {f"{prefix}.{k}": v.detach().float().cpu().numpy()
                             for k, v in [*sub.named_parameters(), *sub.named_buffers()]}
        params = cache.get(".".join(parts), {}) if parts else {}
        for name in node.input:
            array = g.weight(name) if name else None
            if array is None or array.dtype.kind != "f" or array.ndim == 0:
                continue
            diffs = {p: d for p, v in params.items() if (d := weights_differ(array, v, precision)) is not None}
            if diffs and min(diffs.values()) > 0:
                closest = min(diffs, key=lambda p: diffs[p])
                found.append({"node": node.name, "op_type": node.op_type, "layer": scope, "initializer": name,
                              "reference": closest, "max_abs_diff": diffs[closest]})
    return found


def fp32_weight_mismatches(cand: Graph, fp32: Graph, node_name: str, precision: str) -> list[dict[str, Any]]:
    """The node's weights that differ from the FP32 graph's beyond the precision's rounding."""
    index = next((i for i, n in enumerate(cand.nodes) if n.name == node_name), None)
    if index is None:
        return []
    found = []
    for name in cand.nodes[index].input:
        array = cand.weight(name) if name else None
        source = _LOW_SUFFIX.sub("", name) if name else ""
        wanted = fp32.weight(source) if source else None
        if array is None or wanted is None or array.shape != wanted.shape:
            continue
        diff = weights_differ(array, wanted, precision)
        if diff:
            found.append({"node": node_name, "op_type": cand.nodes[index].op_type, "initializer": name,
                          "reference": f"{source} (FP32 graph)", "max_abs_diff": diff})
    return found
