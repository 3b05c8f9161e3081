"""Open and describe ONNX files: :func:`load_checked` (clear errors) and :func:`graph_summary`.

``load_checked`` turns every way an ONNX file goes bad in practice into one :class:`GraphError`
line that names the file and says what to do: the file is missing, empty, truncated (a copy cut
short), corrupted (bytes that are not an ONNX protobuf), or its external weights file
(``model.onnx.data``) is missing or shorter than the graph says.

``graph_summary`` reads only the graph (never the weights) and reports operators by count,
grouped convolutions (``Conv`` with ``group > 1``: the Hydra grouped fully-connected lowering),
parameter count, initializer bytes, file sizes and the inputs/outputs with their dims.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from google.protobuf.message import DecodeError
from onnx import TensorProto, helper

from toolchain.artifacts import atomic_write_json
from toolchain.errors import GraphError

#: Metadata key under which :func:`export_onnx` records the example (export) input shapes.
EXPORT_SHAPES_KEY = "hydra.export_input_shapes"

_FLOAT_TYPES = {TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16, TensorProto.DOUBLE}


def dtype_name(elem_type: int) -> str:
    """ONNX element type number -> lower-case name (``1 -> "float"``, ``16 -> "bfloat16"``)."""
    return TensorProto.DataType.Name(elem_type).lower()


def dims_of(value_info: onnx.ValueInfoProto) -> list[int | str | None]:
    """Dims of a tensor value: ``int`` when static, the ``dim_param`` name, or ``None`` if unknown."""
    tensor_type = value_info.type.tensor_type
    if not tensor_type.HasField("shape"):
        return []
    out: list[int | str | None] = []
    for dim in tensor_type.shape.dim:
        if dim.HasField("dim_value"):
            out.append(int(dim.dim_value))
        elif dim.HasField("dim_param"):
            out.append(dim.dim_param)
        else:
            out.append(None)
    return out


def _external_locations(model: onnx.ModelProto) -> dict[str, list[tuple[str, int, int]]]:
    """Map each external data location to ``[(initializer name, offset, length)]``."""
    found: dict[str, list[tuple[str, int, int]]] = {}
    for init in model.graph.initializer:
        if init.data_location != TensorProto.EXTERNAL:
            continue
        info = {entry.key: entry.value for entry in init.external_data}
        offset = int(info.get("offset", 0))
        length = int(info.get("length", -1))
        found.setdefault(info.get("location", ""), []).append((init.name, offset, length))
    return found


def _parse(path: Path) -> onnx.ModelProto:
    """Parse the protobuf only (no external weights); raise GraphError when it cannot be read."""
    if not path.exists():
        raise GraphError(f"ONNX file not found: {path}; export the model first or fix the path.")
    if path.is_dir():
        raise GraphError(f"ONNX path is a folder, not a file: {path}; pass the .onnx file inside it.")
    size = path.stat().st_size
    if size == 0:
        raise GraphError(f"ONNX file is empty (0 bytes): {path}; the export or copy was interrupted, re-export it.")
    try:
        model = onnx.load_model(str(path), load_external_data=False)
    except DecodeError as exc:
        raise GraphError(
            f"ONNX file {path} ({size} bytes) is truncated or corrupted and cannot be parsed ({exc}); "
            "re-export it or copy it again."
        ) from exc
    except (OSError, ValueError) as exc:
        raise GraphError(f"cannot read ONNX file {path}: {exc}; check the file and re-export it.") from exc
    if model.ir_version <= 0 or len(model.graph.output) == 0 or not model.opset_import:
        raise GraphError(
            f"ONNX file {path} parsed but holds no usable graph (ir_version={model.ir_version}, "
            f"{len(model.graph.node)} nodes, {len(model.graph.output)} outputs): it is corrupted or "
            "truncated; re-export it."
        )
    return model


def _check_external_files(path: Path, model: onnx.ModelProto) -> None:
    """Every external weights file must exist next to the graph and be long enough."""
    for location, tensors in _external_locations(model).items():
        data_path = path.parent / location
        first = tensors[0][0]
        if not location or not data_path.is_file():
            raise GraphError(
                f"external weights file '{location}' for {path.name} is missing (expected at {data_path}; "
                f"{len(tensors)} initializers such as '{first}' live there); copy it next to the .onnx file."
            )
        need = max((off + length for _, off, length in tensors if length >= 0), default=0)
        have = data_path.stat().st_size
        if need > have:
            raise GraphError(
                f"external weights file {data_path} is truncated ({have} bytes, the graph needs {need}); "
                "copy it again or re-export the model."
            )


def load_checked(path: Path, *, load_weights: bool = True, check: bool = True) -> onnx.ModelProto:
    """Open an ONNX file, turning every failure into one clear :class:`GraphError`.

    Args:
        path: the ``.onnx`` file; external weights are looked up relative to its folder.
        load_weights: also read external weights into the returned proto (False: graph only).
        check: run ``onnx.checker.check_model`` (catches structurally corrupted graphs).

    Returns:
        The model proto.
    """
    path = Path(path)
    model = _parse(path)
    _check_external_files(path, model)
    has_external = bool(_external_locations(model))
    if check:
        try:  # by path when weights are external: the checker resolves them and handles > 2 GB
            onnx.checker.check_model(str(path) if has_external else model)
        except onnx.checker.ValidationError as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else repr(exc)
            raise GraphError(f"ONNX file {path} fails onnx.checker: {first}; re-export it.") from exc
    if load_weights and has_external:
        try:
            onnx.load_external_data_for_model(model, str(path.parent))
        except (OSError, ValueError) as exc:
            raise GraphError(f"cannot read the external weights of {path}: {exc}; copy them again.") from exc
    return model


def _initializer_elements(init: TensorProto) -> int:
    return int(np.prod(init.dims, dtype=np.int64)) if len(init.dims) else 1


def _initializer_bytes(init: TensorProto) -> int:
    np_type = helper.tensor_dtype_to_np_dtype(init.data_type)
    return _initializer_elements(init) * np.dtype(np_type).itemsize


def _io_entry(value_info: onnx.ValueInfoProto) -> dict[str, Any]:
    return {
        "name": value_info.name,
        "dtype": dtype_name(value_info.type.tensor_type.elem_type),
        "dims": dims_of(value_info),
    }


def graph_summary(path: Path) -> dict[str, Any]:
    """Describe an ONNX file without reading its weights.

    Returns:
        A JSON-ready dict: ``operators`` (op type -> count, most frequent first),
        ``grouped_conv`` (count of ``Conv`` with ``group > 1``), ``conv_groups`` (node -> group),
        ``parameters`` (elements of floating-point initializers), ``initializer_bytes``,
        ``file_bytes`` (the .onnx file), ``external_data_bytes`` (weights files), ``opset``,
        ``inputs``/``outputs`` (name, dtype, dims with ``int``/``str``/``None``) and
        ``export_input_shapes`` when the file was written by :func:`export_onnx`.
    """
    path = Path(path)
    model = _parse(path)
    graph = model.graph
    ops = Counter(node.op_type for node in graph.node)
    conv_groups: dict[str, int] = {}
    for node in graph.node:
        if node.op_type == "Conv":
            group = next((attr.i for attr in node.attribute if attr.name == "group"), 1)
            if group > 1:
                conv_groups[node.name] = int(group)
    initializer_names = {init.name for init in graph.initializer}
    params = sum(_initializer_elements(i) for i in graph.initializer if i.data_type in _FLOAT_TYPES)
    external = {loc: (path.parent / loc) for loc in _external_locations(model)}
    meta = {entry.key: entry.value for entry in model.metadata_props}
    return {
        "file": path.name,
        "file_bytes": path.stat().st_size,
        "external_data_files": sorted(external),
        "external_data_bytes": sum(p.stat().st_size for p in external.values() if p.is_file()),
        "ir_version": model.ir_version,
        "opset": {(imp.domain or "ai.onnx"): imp.version for imp in model.opset_import},
        "producer": f"{model.producer_name} {model.producer_version}".strip(),
        "nodes": len(graph.node),
        "operators": dict(sorted(ops.items(), key=lambda kv: (-kv[1], kv[0]))),
        "grouped_conv": len(conv_groups),
        "conv_groups": conv_groups,
        "parameters": params,
        "initializers": len(graph.initializer),
        "initializer_bytes": sum(_initializer_bytes(i) for i in graph.initializer),
        "inputs": [_io_entry(v) for v in graph.input if v.name not in initializer_names],
        "outputs": [_io_entry(v) for v in graph.output],
        "export_input_shapes": json.loads(meta[EXPORT_SHAPES_KEY]) if EXPORT_SHAPES_KEY in meta else None,
    }


def summary_path_for(path: Path) -> Path:
    """Where the summary JSON of ``model.onnx`` lives: ``model.summary.json`` next to it."""
    path = Path(path)
    return path.with_name(f"{path.stem}.summary.json")


def write_summary(path: Path) -> Path:
    """Compute :func:`graph_summary` and write it atomically next to the file; return its path."""
    return atomic_write_json(summary_path_for(path), graph_summary(path))
