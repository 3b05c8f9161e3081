"""``OnnxrtRunner``: an ONNX Runtime session behind the runner contract."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from toolchain.engines.base import Runner, TensorSpec
from toolchain.engines.onnxrt.loader import OptLevel, Provider, SessionFromOnnx
from toolchain.errors import EngineError

_ORT_TYPES = {
    "tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(double)": np.float64,
    "tensor(int64)": np.int64, "tensor(int32)": np.int32, "tensor(int8)": np.int8, "tensor(uint8)": np.uint8,
    "tensor(bool)": np.bool_,
}


class OnnxrtRunner(Runner):
    """Run an ONNX file with ONNX Runtime (CPU, or CUDA with onnxruntime-gpu).

    Args:
        path: the ``.onnx`` file.
        provider: ``"cpu"`` or ``"cuda"``.
        intra_op_threads, inter_op_threads: 0 = ORT's default.
        optimization_level: ``"disable" | "basic" | "extended" | "layout" | "all"``.
        allow_spinning: keep worker threads spinning between runs (off: fair interleaved benchmarks).
        optimized_model_path: where ORT saves the optimised graph, or None.
        max_batch: reject feeds whose axis 0 is larger.
    """

    def __init__(
        self,
        path: Path,
        *,
        provider: Provider = "cpu",
        intra_op_threads: int = 0,
        inter_op_threads: int = 0,
        optimization_level: OptLevel = "all",
        allow_spinning: bool = False,
        optimized_model_path: Path | None = None,
        max_batch: int | None = None,
        name: str | None = None,
    ) -> None:
        self.kind = f"onnxrt-{provider}"
        super().__init__(name=name, max_batch=max_batch)
        self.loader = SessionFromOnnx(
            path, provider, intra_op_threads=intra_op_threads, inter_op_threads=inter_op_threads,
            optimization_level=optimization_level, allow_spinning=allow_spinning,
            optimized_model_path=optimized_model_path,
        )
        self.session: Any = None

    def _activate_impl(self) -> None:
        self.session = self.loader()

    def _deactivate_impl(self) -> None:
        self.session = None

    def _input_specs_impl(self) -> dict[str, TensorSpec]:
        specs = {}
        for arg in self.session.get_inputs():
            if arg.type not in _ORT_TYPES:
                raise EngineError(f"{self.name}: input '{arg.name}' has type {arg.type}, which numpy cannot feed.")
            shape = tuple(d if isinstance(d, int | str) else None for d in (arg.shape or []))
            specs[arg.name] = TensorSpec(np.dtype(_ORT_TYPES[arg.type]), shape)
        return specs

    def output_names(self) -> list[str]:
        """Graph output names in order."""
        self._require_active("output_names()")
        return [o.name for o in self.session.get_outputs()]

    def _infer_impl(self, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        names = [o.name for o in self.session.get_outputs()]
        try:
            values = self.session.run(names, feed)
        except Exception as exc:  # ORT pybind errors: a shape the graph cannot take, etc.
            raise EngineError(f"{self.name}: ONNX Runtime failed on {self.loader.path.name}: "
                              f"{str(exc).splitlines()[0]}") from exc
        return dict(zip(names, values))
