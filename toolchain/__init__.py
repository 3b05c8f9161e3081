"""hydra-toolchain: head pruning, Hydra ensembles, ONNX/TensorRT export, parity gates and latency reports."""

__version__ = "0.1.0"
