"""ONNX Runtime backend: CPU provider always; CUDA provider where onnxruntime-gpu is installed."""

from toolchain.engines.onnxrt.loader import SessionFromOnnx, build_session_options
from toolchain.engines.onnxrt.runner import OnnxrtRunner

__all__ = ["OnnxrtRunner", "SessionFromOnnx", "build_session_options"]
