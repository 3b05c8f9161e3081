"""``parity --localize`` node by node: where a graph first diverges from a reference graph, in ONNX Runtime.

The reference is a ``--baseline GRAPH``, the FP32 graph beside an FP16/BF16 graph or the graph a
compiled engine was made from (:func:`localize_against_fp32`), or the low-precision graph itself cast
up to FP32 (:func:`cast_up`: the same weights, so only where 16-bit arithmetic loses digits shows).
Values are matched by name (a precision pass keeps them), else by structure (:func:`match_values`:
op, attributes and inputs, recursively). The rule, the bisection, the walk-back and the marked runs
are :mod:`toolchain.parity.localize`'s (its module docstring); the answer's weights are compared with
the matched reference node's.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

from toolchain.errors import ToolchainError
from toolchain.parity.localize import (
    _AGAINST,
    _LARGE_PROTO,
    Feed,
    Localization,
    RunMarked,
    Values,
    _baseline,
    _bisect,
    _finish,
    _Marked,
    _Probe,
    _record,
    _rows,
    _tolerances,
    _walk_back,
    map_scopes,
    onnx_runner,
)
from toolchain.parity.scopes import Graph, block_of, scope_outputs, sites_from, weights_differ
from toolchain.parity.tolerances import Tolerance

__all__ = ["cast_up", "localize_against_fp32", "localize_against_graph", "match_values"]

#: ops whose output is their input's value (a precision pass adds and drops them): transparent to matching
_TRANSPARENT = frozenset({"Cast", "Identity"})
_LOW_ELEM = {TensorProto.FLOAT16, TensorProto.BFLOAT16}


def cast_up(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of an FP16/BF16 graph computing in FP32: its weights, constants, casts and types made FP32.

    The same value names and nodes, the same weights (exactly, each low-precision value is an FP32
    value), so a node-by-node comparison with it shows only where low-precision arithmetic loses
    precision (it cannot show a wrong weight: both graphs hold it).
    """
    out = onnx.ModelProto()
    out.CopyFrom(model)

    def up(tensor: onnx.TensorProto) -> None:
        if tensor.data_type in _LOW_ELEM:
            array = numpy_helper.to_array(tensor).astype(np.float32)
            tensor.CopyFrom(numpy_helper.from_array(array, tensor.name))

    graphs = [out.graph]
    while graphs:
        g = graphs.pop()
        for init in g.initializer:
            up(init)
        for info in [*g.input, *g.output, *g.value_info]:
            if info.type.tensor_type.elem_type in _LOW_ELEM:
                info.type.tensor_type.elem_type = TensorProto.FLOAT
        for node in g.node:
            for attr in node.attribute:
                if node.op_type == "Cast" and attr.name == "to" and attr.i in _LOW_ELEM:
                    attr.i = TensorProto.FLOAT
                elif attr.type == onnx.AttributeProto.TENSOR:
                    up(attr.t)
                elif attr.type == onnx.AttributeProto.GRAPH:
                    graphs.append(attr.g)
    return out


def _signatures(g: Graph) -> dict[str, list[str]]:
    """Structural signature -> the values (graph order) with it: op, attributes and input signatures, recursively.

    Weights count by shape (not by name or value: a wrong or low-precision weight still matches),
    graph inputs by name; ``Cast``/``Identity`` pass their input's signature through and are not listed.
    """
    import hashlib

    def constant(t: onnx.TensorProto) -> str:
        """A weight or constant: floats by shape, integers (shapes, axes, indices) by value too."""
        if t.data_type in (TensorProto.FLOAT, TensorProto.DOUBLE, *_LOW_ELEM):
            return f"const:{list(t.dims)}"
        values = numpy_helper.to_array(t)
        text = str(values.tolist()) if values.size <= 64 else hashlib.sha1(values.tobytes()).hexdigest()
        return f"const:{list(t.dims)}:{text}"

    sig: dict[str, str] = {n: f"input:{n}" for n in g.inputs if n not in g.inits}
    sig.update({n: constant(i) for n, i in g.inits.items()})

    def attr_key(a: onnx.AttributeProto) -> str:
        if a.type == onnx.AttributeProto.TENSOR:
            return f"{a.name}={constant(a.t)}"
        if a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS):
            return f"{a.name}=G"
        return f"{a.name}={onnx.helper.get_attribute_value(a)!r}"

    groups: dict[str, list[str]] = {}
    for node in g.nodes:
        if node.op_type in _TRANSPARENT and node.input and node.input[0] in sig:
            for out in node.output:
                sig[out] = sig[node.input[0]]
            continue
        value = next((a.t for a in node.attribute if a.name == "value"), None)
        if node.op_type == "Constant" and value is not None and node.output:  # a constant node is a weight
            sig[node.output[0]] = constant(value)
            continue
        text = "|".join([node.domain, node.op_type, *sorted(attr_key(a) for a in node.attribute
                                                           if not (node.op_type == "Cast" and a.name == "to")),
                         *(sig.get(i, f"?{i}") if i else "" for i in node.input)])
        digest = hashlib.sha1(text.encode()).hexdigest()
        for k, out in enumerate(node.output):
            if out:
                sig[out] = f"{digest}:{k}"
                groups.setdefault(sig[out], []).append(out)
    return groups


def match_values(cand: Graph, ref: Graph) -> tuple[dict[str, str], str]:
    """Candidate value -> the reference graph's value computing the same thing; and how they were matched.

    By name when most of the candidate's float values are in the reference (a precision pass keeps
    the names); else by structure (:func:`_signatures`: a renamed graph, another exporter's
    numbering): values with one signature pair in graph order when both graphs have as many.
    """
    floats = [v for v in cand.position if cand.is_float(v)]
    named = {v: v for v in floats if ref.is_float(v)}
    if floats and len(named) * 2 >= len(floats):
        return named, "name"
    theirs = _signatures(ref)
    pairs: dict[str, str] = {}
    for key, ours in _signatures(cand).items():
        if len(theirs.get(key, ())) == len(ours):
            pairs.update((a, b) for a, b in zip(ours, theirs[key]) if cand.is_float(a) and ref.is_float(b))
    return pairs, "structure"


def _paired_weight_mismatches(cand: Graph, ref: Graph, node: int, ref_node: int | None, precision: str,
                              what: str) -> list[dict[str, Any]]:
    """The candidate node's weights that differ from the reference node's (same input slot) beyond the rounding."""
    if ref_node is None:
        return []
    found = []
    theirs = list(ref.nodes[ref_node].input)
    for slot, name in enumerate(cand.nodes[node].input):
        array = cand.weight(name) if name else None
        wanted = ref.weight(theirs[slot]) if slot < len(theirs) and theirs[slot] else None
        if array is None or wanted is None or array.shape != wanted.shape or array.dtype.kind != "f":
            continue
        diff = weights_differ(array, wanted, precision)
        if diff:
            found.append({"node": cand.nodes[node].name, "op_type": cand.nodes[node].op_type, "initializer": name,
                          "reference": f"{theirs[slot]} ({what})", "max_abs_diff": diff})
    return found


def _readers_first(g: Graph, weights: set[str]) -> list[int]:
    """Nodes reading any of ``weights`` (through ``Identity``/``Cast``), in graph order."""
    seen, found, todo = set(weights), set(), list(weights)
    while todo:
        for i in g.consumers.get(todo.pop(), []):
            if g.nodes[i].op_type in _TRANSPARENT:
                todo += [o for o in g.nodes[i].output if o and o not in seen]
                seen.update(g.nodes[i].output)
            else:
                found.add(i)
    return sorted(found)


def localize_against_graph(graph: str | Path, reference_graph: str | Path | onnx.ModelProto, feeds: Sequence[Feed],
                           *, precision: str, against: str = "baseline", run_marked: RunMarked | None = None,
                           run_reference: RunMarked | None = None, reference_outputs: Values | None = None,
                           tolerances: Mapping[str, Tolerance] | None = None, per_round: int = 4,
                           module_paths: Iterable[str] | None = None, labels: Sequence[str] = ()) -> Localization:
    """Where ``graph`` first diverges, node by node, from a reference graph run in ONNX Runtime.

    Needs no module-scoped node names: the candidate's values are matched with the reference's by
    name, else by structure (:func:`match_values`), and every matched float value is a site (block
    boundaries first when the nodes are scoped). The answer is the first node in graph order whose
    output fails the rule while the values it is computed from pass; its weights are compared with
    the matched reference node's.

    Args:
        graph: the candidate's ONNX graph.
        reference_graph: the reference: the FP32 graph the candidate was made from, a ``--baseline``
            graph, or a proto (:func:`cast_up` of the candidate).
        feeds: inputs (:func:`~toolchain.parity.localize.pick_feeds`).
        precision: the candidate's precision (its rule judges every value).
        against: ``fp32-graph`` | ``baseline`` | ``fp32-cast``, for the report.
        run_marked: ``path -> Runner`` for the candidate with extra outputs (default: ``onnx_runner(None,
            precision)``, the CPU kind).
        run_reference: ``path -> Runner`` for the reference (default: ``onnx_runner()`` of its precision).
        reference_outputs: the gate's reference outputs on ``feeds`` (PyTorch's): whether a marked run
            still fails is judged against them; None: against the reference graph's outputs.
        tolerances: per-output tolerances of the gate (``""`` default key); None: the precision's defaults.
        per_round: values exposed per marked run.
        module_paths: the source module's paths (layer names without the exporter's prefix).
        labels: the feeds' labels, for the report.
    """
    from toolchain.export.precision import graph_precision

    if against not in _AGAINST:
        raise ToolchainError(f"localize: against must be one of {sorted(_AGAINST)}, got {against!r}.")
    value_tol, output_tols = _tolerances(precision, tolerances, per_round)
    run_marked = run_marked or onnx_runner(None, precision)
    paths = list(module_paths) if module_paths is not None else None
    loc = Localization(against, Path(graph).name, precision, value_tol.describe(), feeds=list(labels),
                       rows=_rows(feeds))
    with tempfile.TemporaryDirectory(prefix="localize-") as tmp:
        if isinstance(reference_graph, onnx.ModelProto):
            ref_path = Path(tmp) / "reference.onnx"
            onnx.save_model(reference_graph, str(ref_path), save_as_external_data=reference_graph.ByteSize()
                            > _LARGE_PROTO, all_tensors_to_one_file=True, location="reference.onnx.data")
        else:
            ref_path = Path(reference_graph)
        ref_graph = Graph(ref_path, paths)
        cand = ref_graph if ref_path.resolve() == Path(graph).resolve() else Graph(Path(graph), paths)
        if paths:
            for each in {id(ref_graph): ref_graph, id(cand): cand}.values():
                map_scopes(each, paths)
        run_reference = run_reference or onnx_runner(None, graph_precision(ref_graph.model))
        pairs, how = match_values(cand, ref_graph) if cand is not ref_graph else (
            {v: v for v in cand.position if cand.is_float(v)}, "name")
        if how == "structure":
            loc.notes.append(f"the graphs' value names differ: {len(pairs)} values matched by structure")
        ref_run = _Marked(ref_graph, run_reference, feeds, Path(tmp))
        ref_outputs = [o for o in cand.outputs if pairs.get(o) in ref_graph.outputs or o in ref_graph.outputs]

        def reference(names: Sequence[str]) -> tuple[Values, Values]:
            out = ref_run.run([pairs[n] for n in names])
            got = [{n: o[pairs[n]] for n in names} for o in out]
            finals = [{n: o[pairs.get(n, n)] for n in ref_outputs if pairs.get(n, n) in o} for o in out]
            return got, finals

        final = reference_outputs if reference_outputs is not None else reference([])[1]
        if not _baseline(loc, cand, run_marked, feeds, final, output_tols, Path(tmp)):
            return loc
        node_sites = {v: cand.site(v) for v in cand.position if v in pairs and v in cand.producer}
        if not node_sites:
            loc.notes.append(f"no value of {Path(graph).name} could be matched with {ref_path.name} (by name or "
                             "structure): give the graph it was made from")
            return loc
        escapes = scope_outputs(cand, lambda s: True)
        chosen = {scope: max(values, key=lambda v: cand.position[v]) for scope, values in escapes.items()}
        sites = sites_from(cand, chosen, lambda v: v in node_sites) or list(node_sites.values())
        probe = _Probe(_Marked(cand, run_marked, feeds, Path(tmp)), reference, final, value_tol, output_tols,
                       precision, per_round)
        loc.rule = probe.rule()
        first = _bisect(sites, probe)
        if first is None:
            outputs = [node_sites[o] for o in cand.outputs if o in node_sites]
            judged = probe.check(outputs)
            if all(c.status == "pass" for c in judged.values()):  # it computes what its reference computes
                own = {"fp32-graph": "the FP32 graph's own", "baseline": "the baseline graph's own",
                       "fp32-cast": "not where 16-bit arithmetic loses digits but in the graph's weights or nodes"}
                loc.notes.append(f"every value, outputs included, matches {_AGAINST[against]} within the rule: the "
                                 f"engine computes its reference faithfully, so the failure against PyTorch is "
                                 f"{own[against]} (see the PyTorch path)")
                return _record(loc, probe)
            first = next(s for s in outputs if judged[s.value].status == "fail")
        passed = [c.position for c in probe.results.values() if c.status == "pass" and c.position < first.position]
        lo = max(passed, default=-1)  # node by node between the last passing boundary and the first failing one
        first = _bisect([s for s in node_sites.values() if lo < s.position <= first.position], probe) or first
        origin, nodes = _walk_back(cand, node_sites.get(first.value, first), probe, node_sites.get, loc.notes,
                                   follow_moves=True)
        _finish(loc, probe, origin, cand, nodes)
        node = cand.producer[origin.value]
        what = "FP32 graph" if against == "fp32-graph" else ref_path.name
        loc.weights = _paired_weight_mismatches(cand, ref_graph, node, ref_graph.producer.get(pairs[origin.value]),
                                                precision, what)
        if not loc.weights:  # a wrong weight read earlier by a node whose output cannot be checked
            loc.weights = [w for i in nodes if i != node for w in _paired_weight_mismatches(
                cand, ref_graph, i, _partner(cand, ref_graph, i, pairs), precision, what)][:4]
            if loc.weights:
                hit = next(i for i, n in enumerate(cand.nodes) if n.name == loc.weights[0]["node"])
                loc.node, loc.op_type = cand.nodes[hit].name, cand.nodes[hit].op_type
                loc.layer = cand.scopes[hit] or None
                loc.block = block_of(loc.layer) if loc.layer else None
        if loc.weights:
            shared = _readers_first(cand, {w["initializer"] for w in loc.weights})
            if len(shared) > 1:
                loc.notes.append(f"the differing weight {loc.weights[0]['initializer']} is read by {len(shared)} "
                                 f"nodes; the first diverging one is named")
        return _record(loc, probe)


def _partner(cand: Graph, ref: Graph, node: int, pairs: Mapping[str, str]) -> int | None:
    """The reference node producing the match of ``node``'s first matched output."""
    for out in cand.nodes[node].output:
        if out in pairs:
            return ref.producer.get(pairs[out])
    return None


def localize_against_fp32(graph: str | Path, fp32_graph: str | Path, feeds: Sequence[Feed], *,
                          precision: str, run_marked: RunMarked | None = None, run_fp32: RunMarked | None = None,
                          reference_outputs: Values | None = None, tolerances: Mapping[str, Tolerance] | None = None,
                          per_round: int = 4, module_paths: Iterable[str] | None = None,
                          labels: Sequence[str] = ()) -> Localization:
    """Where ``graph`` (an FP16/BF16 graph, or the graph an engine is compiled from) first diverges from the FP32 graph.

    :func:`localize_against_graph` with ``against="fp32-graph"``: ``fp32_graph`` is the FP32 graph it
    was made from (``graph`` itself for an engine compiled from it at a low-precision hint);
    ``run_fp32`` runs it (default: ``onnx_runner()``).
    """
    return localize_against_graph(graph, fp32_graph, feeds, precision=precision, against="fp32-graph",
                                  run_marked=run_marked, run_reference=run_fp32 or onnx_runner(None, "fp32"),
                                  reference_outputs=reference_outputs, tolerances=tolerances, per_round=per_round,
                                  module_paths=module_paths, labels=labels)
