"""ONNX Runtime backend: CPU provider always; CUDA provider where onnxruntime-gpu is installed.

Every ONNX Runtime session of the toolchain is created here: runners (:class:`OnnxrtRunner`) and,
for code that needs a raw session (the roofline's MatMul kernel, the operator profiler),
:func:`open_session`.
"""

from toolchain.engines.onnxrt.loader import SessionFromOnnx, available_providers, build_session_options, open_session
from toolchain.engines.onnxrt.runner import OnnxrtRunner

__all__ = ["OnnxrtRunner", "SessionFromOnnx", "available_providers", "build_session_options", "open_session"]
