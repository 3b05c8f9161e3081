"""``build_engine``: ONNX file -> serialized TensorRT engine, for TensorRT 10.x and 11.x.

Steps: parse by path with ``OnnxParser.parse_from_file`` (so external ``.onnx.data`` weights
are found), one optimisation profile (min/opt/max per input), a persistent timing cache (loaded
before and saved after the build), ``build_serialized_network``, then the engine and its JSON
sidecar are written atomically.

Precision:

* TensorRT 11 is always strongly typed (the ``STRONGLY_TYPED`` creation flag is accepted and
  ignored; ``BuilderFlag.FP16/BF16`` no longer exist): the graph decides. ``precision`` must
  match the graph's type; make FP16/BF16 graphs with
  :func:`toolchain.export.precision.write_precision_variant`.
* TensorRT 10.x: a low-precision graph is built strongly typed (its casts are obeyed); an FP32
  graph with ``precision="fp16"/"bf16"`` falls back to the weakly typed builder flags
  (deprecated since 10.12; a warning says to convert the graph instead).
* INT8: explicit quantization only (TensorRT 11 removed the INT8 flag and the calibrators): an INT8
  (Q/DQ) graph from ``export --precision int8``, built strongly typed on 10.x and 11.x alike; an FP32
  graph asked for ``int8`` is refused.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from toolchain.artifacts import atomic_write_bytes, atomic_write_json, sha256_file
from toolchain.engines.inputs import graph_inputs
from toolchain.engines.source import pads_neutral
from toolchain.engines.tensorrt._deps import current_identity, import_tensorrt, require_cuda
from toolchain.engines.tensorrt.sidecar import EngineSidecar, sidecar_path
from toolchain.errors import EngineError, GraphError
from toolchain.export.graph import load_checked
from toolchain.export.precision import graph_precision

log = logging.getLogger(__name__)

Precision = Literal["fp32", "fp16", "bf16", "int8"]
ProfileShapes = Mapping[str, tuple[Sequence[int], Sequence[int], Sequence[int]]]
def _validate(precision: str, profile: ProfileShapes, workspace_gb: float) -> dict[str, list[list[int]]]:
    if precision not in ("fp32", "fp16", "bf16", "int8"):
        raise EngineError(f"build_engine: precision must be 'fp32', 'fp16', 'bf16' or 'int8', got '{precision}'.")
    if workspace_gb <= 0:
        raise EngineError(f"build_engine: workspace_gb must be > 0, got {workspace_gb}.")
    if not profile:
        raise EngineError("build_engine: profile is empty; give (min, opt, max) shapes for every input.")
    shapes: dict[str, list[list[int]]] = {}
    for name, triple in profile.items():
        if len(triple) != 3:
            raise EngineError(f"build_engine: profile['{name}'] must be (min, opt, max), got {triple}.")
        lo, opt, hi = (list(map(int, s)) for s in triple)
        if not len(lo) == len(opt) == len(hi) or any(not 1 <= a <= b <= c for a, b, c in zip(lo, opt, hi)):
            raise EngineError(f"build_engine: profile['{name}'] needs 1 <= min <= opt <= max per axis "
                              f"and equal ranks, got {lo}, {opt}, {hi}.")
        shapes[name] = [lo, opt, hi]
    return shapes


def _parse(trt: Any, builder: Any, onnx_path: Path, strongly_typed: bool, logger: Any) -> tuple[Any, Any]:
    flags = 0
    if strongly_typed and hasattr(trt.NetworkDefinitionCreationFlag, "STRONGLY_TYPED"):
        flags |= 1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED)
    network = builder.create_network(flags)
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(onnx_path)):
        errors = []
        for i in range(parser.num_errors):
            err = parser.get_error(i)
            node = err.node_name() if hasattr(err, "node_name") else err.node()
            op = err.node_operator() if hasattr(err, "node_operator") else ""
            errors.append(f"node {node} {op}: {err.desc()}".strip())
        raise GraphError(f"TensorRT cannot parse {onnx_path.name}: " + "; ".join(errors or ["unknown error"])
                         + ". Run lint_tensorrt on it for a CPU-side diagnosis.")
    return network, parser


def _add_profile(builder: Any, config: Any, network: Any, shapes: Mapping[str, list[list[int]]]) -> None:
    profile = builder.create_optimization_profile()
    names = set()
    for i in range(network.num_inputs):
        tensor = network.get_input(i)
        names.add(tensor.name)
        dims = list(tensor.shape)
        if tensor.name not in shapes:
            if any(d < 0 for d in dims):
                raise EngineError(
                    f"build_engine: input '{tensor.name}' has dynamic dims {dims}; add it to the profile."
                )
            continue
        lo, opt, hi = shapes[tensor.name]
        if len(lo) != len(dims):
            raise EngineError(
                f"build_engine: profile for '{tensor.name}' has rank {len(lo)}, the input has {len(dims)}."
            )
        for axis, d in enumerate(dims):
            if d >= 0 and not lo[axis] == opt[axis] == hi[axis] == d:
                raise EngineError(f"build_engine: input '{tensor.name}' axis {axis} is static ({d}); "
                                  f"the profile must use {d} there, got {lo[axis]}..{hi[axis]}.")
        profile.set_shape(tensor.name, lo, opt, hi)
    extra = sorted(set(shapes) - names)
    if extra:
        raise EngineError(f"build_engine: profile names {extra}, which are not network inputs {sorted(names)}.")
    if config.add_optimization_profile(profile) < 0:  # IBuilderConfig::addOptimizationProfile: -1 if invalid
        raise EngineError("build_engine: TensorRT rejected the optimisation profile "
                          f"{ {n: shapes[n] for n in sorted(shapes)} } as invalid (see the TensorRT log above); "
                          "check min <= opt <= max and that every dynamic input has an entry.")


def _create_cache(config: Any, data: bytes) -> Any:
    """``config.create_timing_cache(data)``, None when TensorRT cannot read ``data``.

    The header documents a null result for a blob it cannot deserialise (another TensorRT's cache,
    a truncated or corrupt file); the Python bindings return None, or may raise, for it.
    """
    try:
        return config.create_timing_cache(data)
    except (RuntimeError, TypeError, ValueError) as exc:
        log.debug("create_timing_cache raised %s", exc)
        return None


def _load_timing_cache(config: Any, path: Path | None) -> None:
    """Attach the timing cache from ``path`` (or a fresh one when it is unusable) to the builder config.

    A cache TensorRT cannot read (another TensorRT version's, or corrupt) makes ``create_timing_cache``
    return None; one made on another device makes ``set_timing_cache(..., ignore_mismatch=False)``
    return False (the only case the header documents). Both fall back to a fresh cache with a warning,
    and the file is overwritten with this build's timings.
    """
    data = path.read_bytes() if path is not None and path.is_file() else b""
    if data:
        cache = _create_cache(config, data)
        if cache is None:
            log.warning("timing cache %s cannot be read by this TensorRT (another version's, or corrupt); "
                        "starting a fresh one, which will replace it", path)
        elif config.set_timing_cache(cache, ignore_mismatch=False):
            return
        else:
            log.warning("timing cache %s was made on another device; starting a fresh one, which will replace it",
                        path)
    fresh = _create_cache(config, b"")
    if fresh is None or not config.set_timing_cache(fresh, ignore_mismatch=False):
        raise EngineError("build_engine: TensorRT could not create or attach an empty timing cache; "
                          "this TensorRT installation looks broken (see the TensorRT log above).")


def build_engine(
    onnx_path: Path,
    engine_path: Path,
    *,
    precision: Precision = "fp32",
    profile: ProfileShapes,
    timing_cache: Path | None = None,
    workspace_gb: float = 4.0,
    device: int = 0,
    tf32: bool = True,
) -> Path:
    """Build a TensorRT engine from an ONNX file; write it and ``<engine>.json`` atomically.

    Args:
        onnx_path: the ``.onnx`` file (FP32, or an FP16/BF16 variant from the precision pass).
        engine_path: where to write the serialized engine.
        precision: ``"fp32"``, ``"fp16"``, ``"bf16"`` or ``"int8"`` (a Q/DQ graph); see the module docstring.
        profile: input name -> ``(min, opt, max)`` shapes, e.g.
            ``{"input_ids": ((1, 8), (8, 128), (32, 256))}``.
        timing_cache: a file to load kernel timings from and save them back to (None: no cache).
        workspace_gb: builder workspace memory pool limit in GiB.
        device: CUDA device index.
        tf32: allow TF32 tactics for FP32 layers (False for bit-closer FP32 parity).

    Returns:
        ``engine_path``.
    """
    onnx_path, engine_path = Path(onnx_path), Path(engine_path)
    shapes = _validate(precision, profile, workspace_gb)
    model = load_checked(onnx_path, load_weights=False, check=False)
    graph = graph_precision(model)
    if precision == "int8" and graph != "int8":
        raise EngineError(f"build_engine: INT8 is explicit quantization only (TensorRT 11 has no INT8 flag or "
                          f"calibrator); {onnx_path.name} is a {graph} graph: export its Q/DQ graph with "
                          "hydra-toolchain export --precision int8 --data CALIB.")
    inputs = graph_inputs(model)
    trt = import_tensorrt()
    require_cuda(device)
    major = int(str(trt.__version__).split(".")[0])
    if graph != "fp32" and precision != graph:
        raise EngineError(f"build_engine: {onnx_path.name} is a {graph} graph but precision='{precision}'; "
                          f"pass precision='{graph}' (strongly typed: the graph decides).")
    if major >= 11 and precision != graph:
        raise EngineError(f"build_engine: TensorRT {trt.__version__} is strongly typed and has no {precision} flag; "
                          f"convert {onnx_path.name} with write_precision_variant(..., '{precision}') first.")
    strongly_typed = major >= 11 or graph != "fp32"
    notes = []
    import torch

    with torch.cuda.device(device):
        logger = trt.Logger(trt.Logger.WARNING)
        builder = trt.Builder(logger)
        network, _parser = _parse(trt, builder, onnx_path, strongly_typed, logger)
        config = builder.create_builder_config()
        config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, int(workspace_gb * (1 << 30)))
        if not strongly_typed and precision != "fp32":
            flag = {"fp16": "FP16", "bf16": "BF16"}[precision]
            config.set_flag(getattr(trt.BuilderFlag, flag))
            notes.append(f"weakly typed BuilderFlag.{flag} (deprecated since TensorRT 10.12)")
            log.warning("build_engine: using BuilderFlag.%s on an FP32 graph (deprecated, gone in TensorRT 11); "
                        "prefer write_precision_variant(..., '%s') and a strongly typed build", flag, precision)
        if not tf32 and hasattr(trt.BuilderFlag, "TF32"):
            config.clear_flag(trt.BuilderFlag.TF32)
        _add_profile(builder, config, network, shapes)
        _load_timing_cache(config, timing_cache)
        serialized = builder.build_serialized_network(network, config)
        if serialized is None:
            raise EngineError(f"TensorRT failed to build an engine from {onnx_path.name}; see the TensorRT log above.")
        if timing_cache is not None:
            atomic_write_bytes(timing_cache, bytes(memoryview(config.get_timing_cache().serialize())))
        identity = current_identity(trt, device)
    atomic_write_bytes(engine_path, bytes(memoryview(serialized)))
    sidecar = EngineSidecar(
        tensorrt_version=identity.tensorrt_version, gpu_name=identity.gpu_name,
        compute_capability=identity.compute_capability, precision=precision, strongly_typed=strongly_typed,
        profile=shapes, onnx_file=onnx_path.name, onnx_sha256=sha256_file(onnx_path), workspace_gb=workspace_gb,
        built_at=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"), notes=notes, inputs=inputs,
        onnx_path=str(onnx_path.resolve()), pad_neutral=pads_neutral(onnx_path),
    )
    atomic_write_json(sidecar_path(engine_path), sidecar.to_json())
    log.info("built %s (%s, TensorRT %s, %s)", engine_path, precision, identity.tensorrt_version, identity.gpu_name)
    return engine_path
