"""TensorRT backend (10.x and 11.x): build engines from ONNX, run them with ``TrtRunner``.

Nothing here imports ``tensorrt`` or touches CUDA at import time; both happen inside
:func:`build_engine` and :meth:`TrtRunner.activate`, which raise
:class:`~toolchain.errors.MissingDependencyError` (exit code 3) on machines without them.
"""

from toolchain.engines.tensorrt.builder import build_engine, graph_precision
from toolchain.engines.tensorrt.runner import TrtRunner
from toolchain.engines.tensorrt.sidecar import (
    EngineSidecar,
    RuntimeIdentity,
    compatibility_problems,
    ensure_compatible,
    feed_specs,
    read_sidecar,
    sidecar_path,
)

__all__ = [
    "EngineSidecar",
    "RuntimeIdentity",
    "TrtRunner",
    "build_engine",
    "compatibility_problems",
    "ensure_compatible",
    "feed_specs",
    "graph_precision",
    "read_sidecar",
    "sidecar_path",
]
