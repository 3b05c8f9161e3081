"""Compile an ONNX graph with OpenVINO's CPU plugin at a precision, read back what ran, write the file.

Steps (:func:`build_ov_engine`): read the FP32 ONNX graph (``Core.read_model``, external weights
found next to it), bound its dynamic dims to the input profile (``Model.reshape`` with
``Dimension(min, max)``), compile it for ``CPU`` with the precision's properties
(:func:`precision_config`: FP32 in ``ACCURACY`` execution mode, BF16/FP16 as the
``INFERENCE_PRECISION_HINT``), read back the precision every layer of the compiled model really
runs in (:func:`read_back`: ``get_runtime_model()``, each node's ``runtimePrecision`` and
``layerType``), then write the exported model and its sidecar atomically.

Why the read-back: the hint is a request. OpenVINO keeps layers in FP32 where it judges a kernel
unsafe (openvino PR #22994 kept BF16 MatMul in FP32) and replaces a precision the CPU lacks (an
FP16 hint on a CPU with BF16 but no FP16 ran BF16 here) without an error. :func:`ran_precision`
reduces the read-back to the lowest precision any matrix layer (FullyConnected, MatMul, (Group)
Convolution) ran in, which is what bounds the engine's error; the parity gate judges the engine
at that precision and reports a mismatch with the one asked for.
"""

from __future__ import annotations

import datetime as dt
import io
import logging
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from toolchain.artifacts import atomic_write_bytes, atomic_write_json, sha256_file
from toolchain.engines.openvino._deps import OV_TYPES, core, import_openvino, require_precision
from toolchain.engines.openvino.sidecar import OvSidecar, sidecar_path
from toolchain.engines.source import pads_neutral
from toolchain.errors import EngineError, GraphError

log = logging.getLogger(__name__)

ProfileShapes = Mapping[str, tuple[Sequence[int], Sequence[int], Sequence[int]]]
#: layers whose precision decides an engine's error (the matrix products)
MATRIX_LAYERS = ("FullyConnected", "MatMul", "Convolution", "GroupConvolution", "Deconvolution",
                 "FullyConnectedCompressed")
_FROM_OV = {"f32": "fp32", "f16": "fp16", "bf16": "bf16", "i8": "int8", "u8": "int8"}
_RANK = {"fp32": 2, "fp16": 1, "bf16": 1, "int8": 0}  # lower = less precise


def precision_config(precision: str) -> dict[str, Any]:
    """The OpenVINO CPU properties that make ``precision`` (also passed when the file is imported).

    ``int8`` is a Q/DQ graph: its QuantizeLinear/DequantizeLinear pairs, not a hint, make the matrix layers
    INT8 (OpenVINO's low-precision transformations); the rest runs at the f32 hint, in ``PERFORMANCE`` mode
    (``ACCURACY`` would keep the quantized layers in float).
    """
    if precision not in OV_TYPES:
        raise EngineError(f"openvino-cpu: precision must be fp32, fp16, bf16 or int8, got '{precision}'.")
    mode = "ACCURACY" if precision == "fp32" else "PERFORMANCE"
    return {"INFERENCE_PRECISION_HINT": OV_TYPES[precision], "EXECUTION_MODE_HINT": mode}


def run_config(threads: int = 0) -> dict[str, Any]:
    """Run-time properties: latency hint, one stream, ``threads`` inference threads (0: OpenVINO's choice)."""
    config: dict[str, Any] = {"PERFORMANCE_HINT": "LATENCY", "NUM_STREAMS": 1}
    if threads > 0:
        config["INFERENCE_NUM_THREADS"] = int(threads)
    return config


def read_back(compiled: Any) -> dict[str, dict[str, int]]:
    """Runtime layer type -> precision (``fp32``/``bf16``/``fp16``/``i32`` ...) -> count, from the compiled model."""
    layers: dict[str, dict[str, int]] = {}
    for node in compiled.get_runtime_model().get_ordered_ops():
        info = node.get_rt_info()
        kind = info["layerType"].astype(str) if "layerType" in info else node.get_type_name()
        raw = info["runtimePrecision"].astype(str) if "runtimePrecision" in info else "unknown"
        precision = _FROM_OV.get(raw, raw)
        per = layers.setdefault(kind, {})
        per[precision] = per.get(precision, 0) + 1
    return {k: dict(sorted(v.items())) for k, v in sorted(layers.items())}


def ran_precision(layers: Mapping[str, Mapping[str, int]], asked: str) -> tuple[str, int]:
    """``(precision the engine ran in, matrix layers kept in FP32)`` from :func:`read_back`'s counts.

    The lowest precision of the matrix layers (of every floating layer when the graph has none):
    ``int8`` when any ran in i8/u8; the number of matrix layers left in FP32 when a lower precision was
    asked for (for ``int8``: the matrix layers that did not run in INT8, the float heads and the
    attention products of two activations included). An INT8 graph whose matrix layers all ran in
    float reads back ``fp32``: the engine fell back, and the gate reports it.
    """
    def counts(kinds: Iterable[str]) -> dict[str, int]:  # per precision, summed over the layer kinds
        out: dict[str, int] = {}
        for kind in kinds:
            for p, n in layers[kind].items():
                if p in _RANK:
                    out[p] = out.get(p, 0) + n
        return out

    matrix = counts(k for k in layers if k in MATRIX_LAYERS) or counts(layers)
    if not matrix:
        return asked, 0
    lowest = min(matrix, key=lambda p: (_RANK[p], p != asked))
    if asked == "int8":
        return lowest, sum(n for p, n in matrix.items() if p != "int8")
    kept = matrix.get("fp32", 0) if asked != "fp32" else 0
    return lowest, kept


def read_model(onnx_path: Path, profile: ProfileShapes | None = None) -> Any:
    """The ONNX graph as an ``openvino.Model``, its inputs bounded to the profile's min..max."""
    ov = import_openvino()
    onnx_path = Path(onnx_path)
    if not onnx_path.is_file():
        raise GraphError(f"ONNX file '{onnx_path}' does not exist; export it first (hydra-toolchain export).")
    try:
        model = core().read_model(str(onnx_path))
    except RuntimeError as exc:
        raise GraphError(f"OpenVINO cannot read {onnx_path.name}: {str(exc).splitlines()[0]}") from exc
    if profile:
        names = {i.get_any_name() for i in model.inputs}
        extra = sorted(set(profile) - names)
        if extra:
            raise EngineError(f"openvino-cpu: the profile names {extra}, which are not inputs of {onnx_path.name} "
                              f"({sorted(names)}).")
        shapes = {}
        for name, (lo, _opt, hi) in profile.items():
            shapes[name] = ov.PartialShape([ov.Dimension(int(a), int(b)) for a, b in zip(lo, hi)])
        try:
            model.reshape(shapes)
        except RuntimeError as exc:
            raise EngineError(f"openvino-cpu: {onnx_path.name} does not take the profile "
                              f"{ {k: [list(v[0]), list(v[2])] for k, v in profile.items()} }: "
                              f"{str(exc).splitlines()[0]}") from exc
    return model


def compile_model(model: Any, precision: str, threads: int = 0) -> Any:
    """Compile ``model`` for the CPU at ``precision`` (PrecisionUnavailable when this CPU lacks it)."""
    require_precision(precision)
    try:
        return core().compile_model(model, "CPU", {**precision_config(precision), **run_config(threads)})
    except RuntimeError as exc:
        raise EngineError(f"OpenVINO could not compile the model at {precision}: {str(exc).splitlines()[0]}") from exc


def _profile_lists(profile: ProfileShapes | None) -> dict[str, list[list[int]]]:
    return {name: [list(map(int, s)) for s in triple] for name, triple in (profile or {}).items()}


def build_ov_engine(
    onnx_path: Path,
    engine_path: Path,
    *,
    precision: str = "fp32",
    profile: ProfileShapes | None = None,
    threads: int = 0,
    timing_cache: Path | None = None,
) -> Path:
    """Compile ``onnx_path`` at ``precision``; write the exported model and ``<engine>.json`` atomically.

    Args:
        onnx_path: an FP32 ``.onnx`` graph (the precision is OpenVINO's, not the graph's).
        engine_path: where to write the compiled model (``.blob``).
        precision: ``fp32`` | ``fp16`` | ``bf16``.
        profile: input name -> ``(min, opt, max)`` shapes; dynamic dims are bounded to min..max.
        threads: inference threads while compiling (the runner sets its own when it imports).
        timing_cache: unused (TensorRT's builders take it; OpenVINO has none).

    Returns:
        ``engine_path``.

    Raises:
        PrecisionUnavailable: this CPU cannot run ``precision`` (exit 3; the build stage records it).
    """
    from toolchain.engines.inputs import graph_inputs
    from toolchain.export.graph import load_checked

    del timing_cache
    onnx_path, engine_path = Path(onnx_path), Path(engine_path)
    identity = require_precision(precision)
    inputs = graph_inputs(load_checked(onnx_path, load_weights=False, check=False))
    compiled = compile_model(read_model(onnx_path, profile), precision, threads)
    layers = read_back(compiled)
    ran, kept = ran_precision(layers, precision)
    notes = []
    if ran != precision:
        notes.append(f"asked for {precision}, the matrix layers ran {ran}")
    if kept:
        notes.append(f"{kept} matrix layer(s) kept in fp32")
    buffer = io.BytesIO()
    compiled.export_model(buffer)
    atomic_write_bytes(engine_path, buffer.getvalue())
    sidecar = OvSidecar(
        openvino_version=identity.openvino_version, device_name=identity.device_name,
        capabilities=list(identity.capabilities), cpu_flags=list(identity.cpu_flags), precision=precision,
        ran_precision=ran, layers=layers, kept_fp32=kept, config=precision_config(precision),
        profile=_profile_lists(profile), inputs=inputs, onnx_file=onnx_path.name,
        onnx_sha256=sha256_file(onnx_path), built_at=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        notes=notes, onnx_path=str(onnx_path.resolve()), pad_neutral=pads_neutral(onnx_path),
    )
    atomic_write_json(sidecar_path(engine_path), sidecar.to_json())
    log.info("built %s (%s asked, %s ran, OpenVINO %s)", engine_path, precision, ran, identity.openvino_version)
    return engine_path
