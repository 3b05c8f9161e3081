"""``hydra-toolchain inspect``: what an ONNX graph, an engine file or a Hydra folder holds.

* a graph (``.onnx``): inputs and outputs with their dynamic dimensions, opset, node count and
  operator histogram, grouped convolutions, weight bytes, and for an FP16/BF16 graph its FP32
  islands (nodes that compute in float32: the precision pass kept them there);
* an engine file (a suffix an engine kind registers: a TensorRT plan, an OpenVINO compiled model):
  its kind, size, what its kind's ``describe`` hook reads from its sidecar (runtime version,
  device, the precision asked for and, where the kind reads it back, the precision its layers ran
  in; whether its source graph is at hand and current or stale) and the inputs its kind records
  (no GPU needed);
* a Hydra folder (``hydra_config.json``): members, kept heads per layer and member, lowering,
  MLP/LayerNorm/head modes, parameters against the single model and the deep ensemble.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from toolchain.errors import GraphError

#: runtime layers that move or reshape data (not shown among the layers an engine computes in)
_PLUMBING = {"Const", "Input", "Output", "Reorder", "Reshape", "Transpose", "ShapeOf", "Convert", "Broadcast",
             "Concatenation", "Gather", "StridedSlice", "Range"}


def _inspect_graph(path: Path) -> dict[str, Any]:
    from toolchain.export.graph import graph_summary, load_checked
    from toolchain.export.precision import compute_dtypes

    info = {"kind": "onnx", **graph_summary(path)}
    dtypes = compute_dtypes(load_checked(path, load_weights=False, check=False))
    by_dtype = Counter(dtypes.values())
    info["compute_dtypes"] = dict(by_dtype)
    low = {"float16", "bfloat16"} & set(by_dtype)
    if low:
        model = load_checked(path, load_weights=False, check=False)
        ops = {n.name: n.op_type for n in model.graph.node}
        islands = Counter(ops[name] for name, dt in dtypes.items() if dt == "float" and ops.get(name) != "Cast")
        info["fp32_islands"] = {"nodes": sum(islands.values()), "ops": dict(islands.most_common())}
    return info


def _inspect_engine(path: Path, kind: Any) -> dict[str, Any]:
    """An engine file of ``kind`` (from the registry, by suffix): its size, its kind's description, its inputs."""
    import dataclasses

    from toolchain.errors import ToolchainError

    info: dict[str, Any] = {"kind": "engine", "engine_kind": kind.name, "file": path.name,
                            "file_bytes": path.stat().st_size}
    if kind.describe is not None:
        try:
            described = dict(kind.describe(path))
        except ToolchainError as exc:  # a missing or malformed sidecar: said (by inspect_file too), the rest shown
            info["note"] = f"build record unreadable: {exc}"
        else:
            info["sidecar"] = described.pop("sidecar", {})  # the record as written, for --json
            info["build"] = described
    if kind.inspect_file is None:
        return info
    try:
        specs, _limits = kind.inspect_file(path)
    except ToolchainError as exc:
        info["note"] = f"inputs unknown: {exc}"  # the same record: one note
        return info
    info["inputs"] = {name: (dataclasses.asdict(spec) if dataclasses.is_dataclass(spec) else str(spec))
                      for name, spec in specs.items()}
    return info


def _inspect_hydra(path: Path) -> dict[str, Any]:
    from toolchain.hydra.io import load_hydra, summary

    model = load_hydra(path)
    c = model.config
    return {"kind": "hydra", "folder": str(path), "family": c.family, "model_class": c.model_class,
            "members": c.members, "lowering": c.lowering, "mlp": c.mlp, "layernorm": c.layernorm, "head": c.head,
            "source": c.source, "inputs": list(c.input_names),
            "heads_per_layer": [list(spec.heads) for spec in c.layers],
            "kept_heads": [[spec.heads[m] for spec in c.layers] for m in range(c.members)],
            "original_heads": c.original_heads, "fork": c.fork,
            "mlp_neurons": c.neurons_per_member() if c.sliced else None, "summary": summary(model)}


def inspect_path(path: str | Path) -> dict[str, Any]:
    """Describe ``path``: an ``.onnx`` graph, a TensorRT engine, or a Hydra folder (see the module docstring)."""
    from toolchain.hydra.io import CONFIG_FILE

    path = Path(path)
    if path.is_dir():
        if (path / CONFIG_FILE).is_file():
            return _inspect_hydra(path)
        raise GraphError(f"folder '{path}' has no {CONFIG_FILE}: inspect takes a Hydra folder, an .onnx graph or a "
                         "TensorRT engine.")
    if not path.is_file():
        raise GraphError(f"'{path}' does not exist.")
    from toolchain.engines import engine_kind, kinds_for_suffix, known_suffixes

    if path.suffix == ".onnx":
        return _inspect_graph(path)
    kinds = kinds_for_suffix(path.suffix)
    if kinds:
        return _inspect_engine(path, engine_kind(kinds[0]))
    raise GraphError(f"'{path}': inspect takes an .onnx graph, an engine file ({', '.join(known_suffixes())}) or a "
                     "Hydra folder.")


def _dims(dims: list) -> str:
    return "[" + ", ".join("?" if d is None else str(d) for d in dims) + "]"


def format_inspection(info: dict[str, Any]) -> str:
    """Human-readable lines of :func:`inspect_path`'s result."""
    if info["kind"] == "hydra":
        lines = [f"Hydra folder {info['folder']}: {info['family']} ({info['model_class']}), M = {info['members']} "
                 f"members, lowering {info['lowering']}, mlp {info['mlp']}, layernorm {info['layernorm']}, "
                 f"head {info['head']}, fused from {info['source']}",
                 f"inputs: {', '.join(info['inputs'])}",
                 f"kept heads per layer (of {info['original_heads']}):"]
        lines += [f"  member {m}: {heads}" for m, heads in enumerate(info["kept_heads"])]
        if info.get("fork"):
            lines.append(f"fork: layers 0-{info['fork'] - 1} run once on one stream (the source's), the members "
                         f"split at layer {info['fork']}")
        if info.get("mlp_neurons"):
            widths = info["summary"].get("mlp_source_width", [])
            lines.append(f"MLP neurons kept per layer (of {widths}):")
            lines += [f"  member {m}: {row}" for m, row in enumerate(info["mlp_neurons"])]
        params = info["summary"].get("params", {})
        if params:
            lines.append("parameters: " + ", ".join(f"{k} {v:,}" for k, v in params.items()))
        return "\n".join(lines)
    if info["kind"] == "engine":
        lines = [f"{info['engine_kind']} engine {info['file']}: {info['file_bytes']:,} bytes"]
        build = info.get("build", {})
        if build:
            ran = build.get("ran_precision")
            lines.append(f"  built from {build.get('onnx_file')} with {build.get('runtime')} on {build.get('device')}: "
                         f"precision {build.get('precision')}" + (f", ran {ran}" if ran else "")
                         + (f" ({build.get('kept_fp32')} matrix layer(s) kept in fp32)" if build.get("kept_fp32")
                            else ""))
            source = build.get("source") or {}
            if source.get("status") == "stale":
                lines.append(f"  STALE: its source graph {source.get('graph')} has sha256 {source.get('sha256')}, "
                             f"it was built from {build.get('onnx_sha256')}; rebuild it: {build.get('rebuild')}")
            elif source.get("status") == "current":
                lines.append(f"  source graph {source.get('graph')}: current (sha256 matches)")
            compute = {k: {p: n for p, n in v.items() if p in ("fp32", "fp16", "bf16")}
                       for k, v in (build.get("layers") or {}).items() if k not in _PLUMBING}
            compute = {k: v for k, v in compute.items() if v}
            if compute:
                lines.append("  layers ran in: " + ", ".join(f"{k} " + "/".join(f"{p} {n}" for p, n in v.items())
                                                             for k, v in compute.items()))
        lines += [f"  input {name}: {spec}" for name, spec in info.get("inputs", {}).items()]
        if "note" in info:
            lines.append(info["note"])
        return "\n".join(lines)
    opset = ", ".join(f"{k} {v}" for k, v in info["opset"].items())
    lines = [f"ONNX graph {info['file']}: opset {opset}, {info['nodes']} nodes, {info['parameters']:,} parameters, "
             f"{info['initializer_bytes'] / 1e6:.1f} MB of weights"]
    lines += [f"  input  {e['name']}: {e['dtype']} {_dims(e['dims'])}" for e in info["inputs"]]
    lines += [f"  output {e['name']}: {e['dtype']} {_dims(e['dims'])}" for e in info["outputs"]]
    lines.append("operators: " + ", ".join(f"{op} {n}" for op, n in list(info["operators"].items())[:12]))
    if info["grouped_conv"]:
        lines.append(f"grouped Conv: {info['grouped_conv']} (groups {sorted(set(info['conv_groups'].values()))})")
    lines.append("computes in: " + ", ".join(f"{k} {v}" for k, v in info["compute_dtypes"].items()))
    if "fp32_islands" in info:
        isl = info["fp32_islands"]
        lines.append(f"FP32 islands: {isl['nodes']} nodes (" + ", ".join(f"{op} {n}" for op, n in isl["ops"].items())
                     + ")")
    return "\n".join(lines)
