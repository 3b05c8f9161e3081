"""PyTorch reference backend: the FP32 truth every other backend is compared with."""

from toolchain.engines.torch_ref.runner import TorchRunner

__all__ = ["TorchRunner"]
