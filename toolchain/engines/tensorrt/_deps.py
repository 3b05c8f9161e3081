"""Lazy access to ``tensorrt`` and the CUDA device, with clear MissingDependencyErrors."""

from __future__ import annotations

from types import ModuleType

from toolchain.engines.tensorrt.sidecar import RuntimeIdentity
from toolchain.errors import MissingDependencyError


def import_tensorrt() -> ModuleType:
    """Import ``tensorrt`` or raise MissingDependencyError saying how to get it."""
    try:
        import tensorrt
    except ImportError as exc:
        raise MissingDependencyError(
            "TensorRT is not installed (import tensorrt failed: "
            f"{exc}); install it on a CUDA machine with pip install 'hydra-toolchain[tensorrt]'."
        ) from exc
    return tensorrt


def require_cuda(device: int = 0) -> int:
    """Return ``device`` if torch sees that CUDA device, else raise MissingDependencyError."""
    import torch

    if not torch.cuda.is_available():
        raise MissingDependencyError(
            "no CUDA device is visible to torch (torch.cuda.is_available() is False); TensorRT engines "
            "are built and run on a GPU machine with a CUDA build of torch."
        )
    if not 0 <= device < torch.cuda.device_count():
        raise MissingDependencyError(f"CUDA device {device} does not exist ({torch.cuda.device_count()} visible).")
    return device


def current_identity(trt: ModuleType, device: int = 0) -> RuntimeIdentity:
    """TensorRT version, GPU name and compute capability of this machine."""
    import torch

    major, minor = torch.cuda.get_device_capability(device)
    return RuntimeIdentity(
        tensorrt_version=str(trt.__version__),
        gpu_name=torch.cuda.get_device_name(device),
        compute_capability=f"{major}.{minor}",
    )
