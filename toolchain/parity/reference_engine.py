"""``ReferenceEvaluatorRunner``: an ONNX graph run by ``onnx.reference`` behind the runner contract.

Why the parity gate needs it on CPU machines:

* BF16 graphs: ONNX Runtime's CPU provider has no BF16 MatMul/Conv/Add kernels;
* FP16 graphs: ONNX Runtime's CPU provider has almost no FP16 compute kernels either. It inserts
  ``Cast`` nodes, then removes the back-to-back casts between consecutive unsupported nodes, so
  whole FP16 chains run in FP32 (measured on ORT 1.32: an FP16 graph whose squared deviations
  reach 1e6 still gives correct outputs). ``onnx.reference`` runs FP16 in numpy float16 (every
  node's output rounded to FP16, reductions accumulated in FP32), which is what a strongly typed
  GPU engine does; an overflow that TensorRT would hit shows up here.

Slow (pure numpy): meant for tiny graphs, CI smoke sets and the precision rescue search.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx

from toolchain.engines.base import Runner, TensorSpec
from toolchain.errors import EngineError, GraphError

__all__ = ["ReferenceEvaluatorRunner"]

_ONNX_TO_NUMPY = {
    onnx.TensorProto.FLOAT: np.float32, onnx.TensorProto.FLOAT16: np.float16, onnx.TensorProto.DOUBLE: np.float64,
    onnx.TensorProto.INT64: np.int64, onnx.TensorProto.INT32: np.int32, onnx.TensorProto.INT8: np.int8,
    onnx.TensorProto.UINT8: np.uint8, onnx.TensorProto.BOOL: np.bool_,
}


class ReferenceEvaluatorRunner(Runner):
    """Run an ONNX file or model proto with ``onnx.reference`` (true FP16/BF16 arithmetic).

    Args:
        model: path to an ``.onnx`` file (external weights next to it) or a loaded model.
        name: runner name in reports.
        max_batch: reject feeds whose axis 0 is larger.
    """

    kind = "onnx-reference"

    def __init__(self, model: Path | onnx.ModelProto, *, name: str | None = None, max_batch: int | None = None) -> None:
        super().__init__(name=name, max_batch=max_batch)
        self.source = model if isinstance(model, onnx.ModelProto) else Path(model)
        self.model: onnx.ModelProto | None = None

    def _activate_impl(self) -> None:
        if isinstance(self.source, onnx.ModelProto):
            self.model = self.source
            return
        if not self.source.is_file():
            raise GraphError(f"{self.name}: ONNX file {self.source} does not exist.")
        from toolchain.export.graph import load_checked

        self.model = load_checked(self.source)

    def _deactivate_impl(self) -> None:
        self.model = None

    def _input_specs_impl(self) -> dict[str, TensorSpec]:
        assert self.model is not None
        inits = {i.name for i in self.model.graph.initializer}
        specs = {}
        for value in self.model.graph.input:
            if value.name in inits:
                continue
            ttype = value.type.tensor_type
            if ttype.elem_type not in _ONNX_TO_NUMPY:
                raise EngineError(f"{self.name}: input '{value.name}' has ONNX type {ttype.elem_type}, "
                                  "which numpy cannot feed.")
            shape = tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in ttype.shape.dim)
            specs[value.name] = TensorSpec(np.dtype(_ONNX_TO_NUMPY[ttype.elem_type]), shape)
        return specs

    def _infer_impl(self, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        from toolchain.export.reference import reference_run

        assert self.model is not None
        try:
            with np.errstate(over="ignore", invalid="ignore", divide="ignore"):  # overflow is reported as Inf/NaN
                return reference_run(self.model, feed)
        except Exception as exc:  # onnx.reference raises many types; report them as one engine failure
            raise EngineError(f"{self.name}: onnx.reference failed: {type(exc).__name__}: {exc}") from exc
