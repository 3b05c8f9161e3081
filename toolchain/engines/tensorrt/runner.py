"""``TrtRunner``: a serialized TensorRT engine behind the runner contract.

Activation reads the sidecar first (before importing TensorRT, so that a machine without it is
told which TensorRT version and GPU the engine needs) and refuses an engine built with another
TensorRT version or GPU (:func:`~toolchain.engines.tensorrt.sidecar.ensure_compatible`) and an engine
built from another version of its source graph where that graph is at hand
(:mod:`toolchain.engines.source`, checked before TensorRT is imported), then deserialises it and
creates one execution context. Inference uses torch CUDA tensors as device buffers
(:func:`~toolchain.engines.tensorrt.outputs.run_context`): ``context.set_input_shape`` (checked)
and ``set_tensor_address`` per input, output buffers sized from ``context.get_tensor_shape``, an
``IOutputAllocator`` for outputs whose shape depends on the data (NonZero, NonMaxSuppression),
``execute_async_v3`` on a torch CUDA stream, then one synchronise.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from toolchain.engines.base import Runner, ShapeLimits, TensorSpec, check_feed_why, pad_to_profile
from toolchain.engines.source import check_source
from toolchain.engines.tensorrt._deps import current_identity, import_tensorrt, require_cuda
from toolchain.engines.tensorrt.outputs import make_output_allocator, run_context
from toolchain.engines.tensorrt.sidecar import EngineSidecar, ensure_compatible, feed_specs, read_sidecar, sidecar_path
from toolchain.errors import EngineError, MissingDependencyError

_TORCH_TYPES = {  # tensorrt.DataType member name -> (torch dtype name, numpy dtype for specs)
    "FLOAT": ("float32", np.float32), "HALF": ("float16", np.float16), "BF16": ("bfloat16", np.float32),
    "INT32": ("int32", np.int32), "INT64": ("int64", np.int64), "INT8": ("int8", np.int8),
    "UINT8": ("uint8", np.uint8), "BOOL": ("bool", np.bool_),
}


class TrtRunner(Runner):
    """Run a TensorRT engine file built by :func:`build_engine`.

    Args:
        engine_path: the serialized engine; ``<engine>.json`` must sit next to it.
        device: CUDA device index.
        onnx_path: the ONNX file the engine must have been built from (sha256 checked); besides it, the
            graph is looked for where :func:`toolchain.engines.source.source_candidates` says.
        name: runner name in messages.
    """

    kind = "tensorrt"

    def __init__(self, engine_path: Path, *, device: int = 0, onnx_path: Path | None = None,
                 name: str | None = None) -> None:
        super().__init__(name=name)
        self.engine_path = Path(engine_path)
        self.device = device
        self.onnx_path = Path(onnx_path) if onnx_path is not None else None
        self._trt: Any = None
        self._runtime: Any = None
        self._engine: Any = None
        self._context: Any = None
        self._stream: Any = None
        self._allocator: Any = None
        self._inputs: list[str] = []
        self._outputs: list[str] = []

    def _sidecar(self) -> EngineSidecar:
        """The engine's sidecar (EngineError when the engine or its sidecar is missing or malformed)."""
        if not self.engine_path.is_file():
            raise EngineError(f"engine file not found: {self.engine_path}; build it with build_engine "
                              "(hydra-toolchain build) or fix the path.")
        return read_sidecar(self.engine_path)

    def precheck(self, feed: Mapping[str, object]) -> bool:
        """Check ``feed`` against the sidecar (inputs, profile) without TensorRT or a GPU."""
        sidecar = self._sidecar()
        specs, limits, complete = feed_specs(sidecar)
        if not specs:
            return False
        padded, _padding, why = pad_to_profile(feed, limits, neutral=sidecar.pad_neutral)  # as infer() pads it
        check_feed_why(padded, specs, why, limits=limits, runner=self.name, complete=complete)
        return True

    def _activate_impl(self) -> None:
        # the sidecar first (when the engine exists): it needs neither TensorRT nor a GPU, and
        # a machine without them is told which TensorRT version and GPU the engine needs
        sidecar = self._sidecar() if self.engine_path.is_file() else None
        if sidecar is not None:  # a stale engine is refused whatever the machine (exit 2)
            given = self.onnx_path if self.onnx_path is not None and self.onnx_path.is_file() else None
            check_source(self.engine_path, kind=self.kind, onnx_file=sidecar.onnx_file,
                         onnx_sha256=sidecar.onnx_sha256, precision=sidecar.precision, profile=sidecar.profile,
                         recorded_path=sidecar.onnx_path, given=given)
        try:
            trt = import_tensorrt()
            require_cuda(self.device)
        except MissingDependencyError as exc:
            if sidecar is None:
                raise
            needs = (f" The engine {self.engine_path.name} needs {sidecar.needs()} "
                     f"(from {sidecar_path(self.engine_path).name}).")
            raise MissingDependencyError(exc.message + needs, hint=exc.hint) from exc
        import torch

        if sidecar is None:
            sidecar = self._sidecar()  # the engine file is missing: a clear EngineError
        ensure_compatible(sidecar, current_identity(trt, self.device), self.engine_path)
        logger = trt.Logger(trt.Logger.WARNING)
        with torch.cuda.device(self.device):
            runtime = trt.Runtime(logger)
            engine = runtime.deserialize_cuda_engine(self.engine_path.read_bytes())
            if engine is None:
                raise EngineError(f"TensorRT could not deserialise {self.engine_path}; rebuild it on this machine.")
            context = engine.create_execution_context()
            if context is None:
                raise EngineError(f"TensorRT could not create an execution context for {self.engine_path.name} "
                                  "(out of GPU memory?).")
            self._stream = torch.cuda.Stream(device=self.device)
            self._allocator = make_output_allocator(trt, torch.device(f"cuda:{self.device}"))
        self._trt, self._runtime, self._engine, self._context = trt, runtime, engine, context
        names = [engine.get_tensor_name(i) for i in range(engine.num_io_tensors)]
        self._inputs = [n for n in names if engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT]
        self._outputs = [n for n in names if n not in self._inputs]

    def _deactivate_impl(self) -> None:
        self._context = self._engine = self._runtime = self._stream = self._allocator = None

    def _dtype(self, name: str) -> tuple[str, Any]:
        kind = self._engine.get_tensor_dtype(name).name
        if kind not in _TORCH_TYPES:
            raise EngineError(f"{self.name}: tensor '{name}' has TensorRT type {kind}, which this runner cannot feed.")
        return _TORCH_TYPES[kind]

    def _input_specs_impl(self) -> dict[str, TensorSpec]:
        specs = {}
        for name in self._inputs:
            dims = tuple(None if d < 0 else int(d) for d in self._engine.get_tensor_shape(name))
            specs[name] = TensorSpec(np.dtype(self._dtype(name)[1]), dims)
        return specs

    def _shape_limits(self) -> dict[str, ShapeLimits]:
        limits = {}
        for name in self._inputs:
            lo, _opt, hi = self._engine.get_tensor_profile_shape(name, 0)
            limits[name] = ShapeLimits(tuple(int(d) for d in lo), tuple(int(d) for d in hi))
        return limits

    def _output_dims(self) -> dict[str, tuple[int | None, ...]]:
        return {n: tuple(None if d < 0 else int(d) for d in self._engine.get_tensor_shape(n)) for n in self._outputs}

    def _pads_neutral(self) -> bool:
        if getattr(self, "_neutral", None) is None:
            self._neutral = bool(self._sidecar().pad_neutral)
        return self._neutral

    def output_names(self) -> list[str]:
        """Engine output names in order."""
        self._require_active("output_names()")
        return list(self._outputs)

    def _infer_impl(self, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        import torch

        device = torch.device(f"cuda:{self.device}")
        with torch.cuda.device(self.device), torch.cuda.stream(self._stream):
            inputs = {}
            for name in self._inputs:
                tensor = torch.from_numpy(np.ascontiguousarray(feed[name])).to(device)
                if self._dtype(name)[0] == "bfloat16":
                    tensor = tensor.to(torch.bfloat16)
                inputs[name] = tensor
            outputs = run_context(self._context, inputs, self._outputs, lambda n: getattr(torch, self._dtype(n)[0]),
                                  allocator=self._allocator, device=device, stream_handle=self._stream.cuda_stream,
                                  synchronize=self._stream.synchronize, who=f"{self.name} ({self.engine_path.name})")
        return {n: (t.float() if t.dtype == torch.bfloat16 else t).cpu().numpy() for n, t in outputs.items()}
