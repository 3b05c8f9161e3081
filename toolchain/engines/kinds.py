"""The built-in engine kinds.

``torch``, ``onnxrt-cpu``, ``onnxrt-cpu-bf16emu``, ``onnxrt-cuda``, ``tensorrt``, ``openvino-cpu``.

Each is one :class:`~toolchain.engines.registry.EngineKind`; the backends are imported inside
the factories, when a kind is used.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from toolchain.engines.base import Runner
from toolchain.engines.registry import EngineKind, EngineUnavailable, Entry, EntryArgs, register_kind


# ------------------------------------------------------------------------------- factories
def _torch(**kw: Any) -> Runner:
    from toolchain.engines.torch_ref import TorchRunner

    return TorchRunner(**kw)


def _onnxrt_cpu(**kw: Any) -> Runner:
    from toolchain.engines.onnxrt import OnnxrtRunner

    return OnnxrtRunner(provider="cpu", **kw)


def _onnxrt_cpu_bf16emu(**kw: Any) -> Runner:
    from toolchain.engines.onnxrt.bf16emu import OnnxrtBf16EmuRunner

    return OnnxrtBf16EmuRunner(**kw)


def _onnxrt_cuda(**kw: Any) -> Runner:
    from toolchain.engines.onnxrt import OnnxrtRunner

    return OnnxrtRunner(provider="cuda", **kw)


def _tensorrt(**kw: Any) -> Runner:
    from toolchain.engines.tensorrt import TrtRunner

    return TrtRunner(**kw)


def _openvino_cpu(**kw: Any) -> Runner:
    from toolchain.engines.openvino import OvRunner

    return OvRunner(**kw)


# ---------------------------------------------------------------------- from export entries
def _entry_path(base: Path | None, relative: str) -> Path:
    return Path(base) / relative if base is not None else Path(relative)


def _onnx_entry(factory: Any) -> Any:
    def build(entry: Entry, args: EntryArgs) -> Runner:
        return factory(path=_entry_path(args.export_dir, entry["path"]), intra_op_threads=args.threads,
                       inter_op_threads=1, name=args.name)

    return build


def _torch_entry(entry: Entry, args: EntryArgs) -> Runner:
    if args.module is None:
        raise EngineUnavailable("no torch module given for this graph")
    return _torch(module=args.module, input_specs=args.input_specs,
                  output_names=list(entry.get("outputs") or []) or None, name=args.name)


def _source_of(entry: Entry, args: EntryArgs) -> Path | None:
    """The graph an engine entry was built from (``onnx``: in the export folder, or an absolute path given with it)."""
    onnx = entry.get("onnx")
    if not onnx or (args.export_dir is None and not Path(onnx).is_absolute()):
        return None  # a bare name without its folder is no graph at hand
    return _entry_path(args.export_dir, onnx)


def _tensorrt_entry(entry: Entry, args: EntryArgs) -> Runner:
    if "engine" not in entry:
        raise EngineUnavailable("no TensorRT engine built for this graph")
    return _tensorrt(engine_path=_entry_path(args.build_dir, entry["engine"]), onnx_path=_source_of(entry, args),
                     name=args.name)


def _openvino_entry(entry: Entry, args: EntryArgs) -> Runner:
    """A compiled file (``engine``, from the build stage) or, failing that, the graph compiled at its ``precision``."""
    if "engine" in entry:
        return _openvino_cpu(engine_path=_entry_path(args.build_dir, entry["engine"]), threads=args.threads,
                             name=args.name, source=_source_of(entry, args))
    return _openvino_cpu(onnx_path=_entry_path(args.export_dir, entry["path"]),
                         precision=entry.get("precision", "fp32"), threads=args.threads, name=args.name)


@contextlib.contextmanager
def _torch_threads(threads: int) -> Iterator[None]:
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


# ------------------------------------------------------------------------ files for infer
def _inspect_onnx(path: Path) -> tuple[dict[str, Any], Any]:
    from toolchain.engines.inputs import onnx_value_limits

    return {}, onnx_value_limits(path)  # vocabulary and sequence limits from the graph's embedding tables


def _inspect_engine(path: Path) -> tuple[dict[str, Any], Any]:
    from toolchain.engines.inputs import engine_value_limits
    from toolchain.engines.tensorrt import feed_specs, read_sidecar

    sidecar = read_sidecar(path)  # missing or malformed: a clear error; it describes the inputs
    return feed_specs(sidecar)[0], engine_value_limits(path, sidecar.onnx_file, sidecar.onnx_sha256,
                                                       sidecar.onnx_path)


def _inspect_openvino(path: Path) -> tuple[dict[str, Any], Any]:
    from toolchain.engines.base import recorded_specs
    from toolchain.engines.inputs import engine_value_limits
    from toolchain.engines.openvino import read_sidecar

    sidecar = read_sidecar(path)  # missing or malformed: a clear error; it describes the inputs
    return recorded_specs(sidecar.profile, sidecar.inputs)[0], engine_value_limits(
        path, sidecar.onnx_file, sidecar.onnx_sha256, sidecar.onnx_path)


def _with_source(path: Path, description: dict[str, Any]) -> dict[str, Any]:
    """``source`` (is the graph at hand, current or stale) and ``rebuild`` (the command) added to a description."""
    from toolchain.engines.source import rebuild_command, source_status

    d = description
    source = source_status(path, d["onnx_file"], d["onnx_sha256"], d["onnx_path"])
    graph = source["graph"] or d["onnx_path"] or d["onnx_file"]
    return {**d, "source": source, "rebuild": rebuild_command(graph, path, d["kind"], d["precision"], d["profile"])}


def _describe_engine(path: Path) -> dict[str, Any]:
    from toolchain.engines.tensorrt import read_sidecar

    return _with_source(path, read_sidecar(path).describe())


def _describe_openvino(path: Path) -> dict[str, Any]:
    from toolchain.engines.openvino import read_sidecar

    return _with_source(path, read_sidecar(path).describe())


def _build_openvino(onnx_path: Path, out_path: Path, **kw: Any) -> Path:
    from toolchain.engines.openvino import build_ov_engine

    return build_ov_engine(onnx_path, out_path, **kw)


def _openvino_unavailable(precision: str) -> str | None:
    from toolchain.engines.openvino import unavailable_reason
    from toolchain.errors import MissingDependencyError

    try:
        return unavailable_reason(precision)
    except MissingDependencyError as exc:  # openvino not importable
        return str(exc)


def _build_tensorrt(onnx_path: Path, out_path: Path, **kw: Any) -> Path:
    from toolchain.engines.tensorrt.builder import build_engine

    return build_engine(onnx_path, out_path, **kw)


# ------------------------------------------------------------------------------ the kinds
_ONNX = {"suffixes": (".onnx",), "file_label": "ONNX file", "runtime": "ONNX Runtime", "inspect_file": _inspect_onnx}

TORCH = register_kind(EngineKind(
    "torch", _torch, _torch_entry, runtime="PyTorch", default=True, reference=True, thread_scope=_torch_threads))
ONNXRT_CPU = register_kind(EngineKind(
    "onnxrt-cpu", _onnxrt_cpu, _onnx_entry(_onnxrt_cpu), **_ONNX, precisions=("fp32", "fp16", "int8"),
    substitutes={"bf16": "onnxrt-cpu-bf16emu"}, default=True, rescuable=True))
ONNXRT_CPU_BF16EMU = register_kind(EngineKind(  # BF16 graphs on the CPU provider, exact BF16 rounding
    "onnxrt-cpu-bf16emu", _onnxrt_cpu_bf16emu, _onnx_entry(_onnxrt_cpu_bf16emu), **_ONNX, precisions=("bf16",),
    selectable=False))
ONNXRT_CUDA = register_kind(EngineKind(
    "onnxrt-cuda", _onnxrt_cuda, _onnx_entry(_onnxrt_cuda), **_ONNX, gpu=True, clock="cuda-event",
    precisions=("fp32", "fp16"),
    unsupported={"bf16": "BF16 graphs are checked on CPU (onnxrt-cpu-bf16emu); ONNX Runtime's CUDA provider lacks "
                         "BF16 kernels for some ops"}))
TENSORRT = register_kind(EngineKind(
    "tensorrt", _tensorrt, _tensorrt_entry, suffixes=(".engine", ".plan", ".trt"), file_label="engine",
    runtime="TensorRT", gpu=True, clock="cuda-event", needs_build=True, builder=_build_tensorrt,
    precisions=("fp32", "fp16", "bf16", "int8"),
    build_filter=lambda g: g.get("kind") == "hydra" and g.get("lowering") == "conv",  # TensorRT wants grouped Conv
    inspect_file=_inspect_engine, describe=_describe_engine))
OPENVINO_CPU = register_kind(EngineKind(  # real BF16/FP16 on CPUs that have it; compiles FP32 graphs at a precision
    "openvino-cpu", _openvino_cpu, _openvino_entry, suffixes=(".blob",), file_label="OpenVINO compiled model",
    runtime="OpenVINO", needs_build=True, builder=_build_openvino, precision_from="build",
    precisions=("fp32", "fp16", "bf16", "int8"),
    build_filter=lambda g: g.get("precision", "fp32") in ("fp32", "int8"), available=_openvino_unavailable,
    inspect_file=_inspect_openvino, describe=_describe_openvino))
