"""Inference backends behind one runner contract (torch, ONNX Runtime, TensorRT).

Importing this package never imports tensorrt, onnxruntime-gpu or CUDA: each backend lives in
its own sub-package and is loaded by :func:`make_runner` when its kind is asked for.
"""

from toolchain.engines.base import Runner, ShapeLimits, TensorSpec, check_feed
from toolchain.engines.registry import make_runner, register_runner, runner_kinds

__all__ = ["Runner", "ShapeLimits", "TensorSpec", "check_feed", "make_runner", "register_runner", "runner_kinds"]
