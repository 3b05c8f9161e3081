"""Run an ONNX graph with ``onnx.reference`` (pure numpy): the CPU check for BF16 graphs.

ONNX Runtime's CPU provider has no BF16 kernels for MatMul, Conv, Gemm, Add, Softmax ... (checked
on ORT 1.32), so a BF16 graph cannot run there. ``ReferenceEvaluator`` executes bfloat16 through
``ml_dtypes``; it is slow (use tiny graphs only). Its ``GatherElements`` in onnx 1.23 breaks on
the index pattern the TorchScript exporter emits for BERT's ``token_type_ids`` buffer, so a
corrected implementation is supplied here.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import onnx
from onnx.reference import ReferenceEvaluator
from onnx.reference.op_run import OpRun


class GatherElements(OpRun):
    """``GatherElements`` via ``np.take_along_axis``; the evaluator matches overrides by class name."""

    op_domain = ""

    def _run(self, data: np.ndarray, indices: np.ndarray, axis: int | None = None) -> tuple[np.ndarray]:
        axis = 0 if axis is None else int(axis)
        idx = np.where(indices < 0, indices + data.shape[axis], indices)
        return (np.take_along_axis(data, idx, axis=axis),)


def reference_run(model: onnx.ModelProto, feed: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Execute ``model`` on ``feed`` with the ONNX reference evaluator; outputs by name as float32.

    Args:
        model: any ONNX model (FP32, FP16 or BF16 inside; graph IO as declared).
        feed: input name -> array, e.g. ``input_ids`` int64 ``[B, S]``.
    """
    evaluator = ReferenceEvaluator(model, new_ops=[GatherElements])
    names = [o.name for o in model.graph.output]
    values = evaluator.run(None, dict(feed))
    return {
        name: np.asarray(v).astype(np.float32) if np.asarray(v).dtype.kind == "f" or "bfloat16" in str(
            np.asarray(v).dtype) else np.asarray(v)
        for name, v in zip(names, values)
    }
