"""``make_runner(kind, **kw)``: one place that maps a runner kind to its backend.

Backends are imported only when their kind is asked for, so ``import toolchain.engines`` works
on a CPU machine without tensorrt or onnxruntime-gpu.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from toolchain.engines.base import Runner
from toolchain.errors import EngineError

Factory = Callable[..., Runner]


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


_REGISTRY: dict[str, Factory] = {
    "torch": _torch,
    "onnxrt-cpu": _onnxrt_cpu,
    "onnxrt-cpu-bf16emu": _onnxrt_cpu_bf16emu,
    "onnxrt-cuda": _onnxrt_cuda,
    "tensorrt": _tensorrt,
}


def runner_kinds() -> list[str]:
    """The registered runner kinds."""
    return sorted(_REGISTRY)


def register_runner(kind: str, factory: Factory) -> None:
    """Add a backend; ``factory(**kw)`` returns a :class:`Runner`."""
    if kind in _REGISTRY:
        raise EngineError(f"runner kind '{kind}' is already registered.")
    _REGISTRY[kind] = factory


def make_runner(kind: str, **kw: Any) -> Runner:
    """Create a runner (not yet active).

    Examples::

        make_runner("torch", module=m, input_specs={"x": (np.float32, ("batch", 24, "time"))})
        make_runner("onnxrt-cpu", path=Path("model.onnx"), intra_op_threads=1)
        make_runner("onnxrt-cpu-bf16emu", path=Path("model.bf16.onnx"))  # BF16 graph, exact BF16 rounding
        make_runner("tensorrt", engine_path=Path("model.engine"))
    """
    factory = _REGISTRY.get(kind)
    if factory is None:
        raise EngineError(f"unknown runner kind '{kind}'; choose one of {runner_kinds()}.")
    return factory(**kw)
