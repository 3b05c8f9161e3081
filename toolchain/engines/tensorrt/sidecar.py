"""The JSON sidecar written next to every engine, and the pure compatibility check.

A serialized TensorRT engine only runs with the TensorRT version that built it, on the same GPU
model. The sidecar (``<engine>.json``) records what the engine was built with; before
deserialising, :func:`ensure_compatible` compares it with the current machine and refuses with
an :class:`EngineError` that says what differs and what to do. Pure functions: tested on CPU.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from toolchain.errors import EngineError

SIDECAR_SCHEMA = 1


class RuntimeIdentity(NamedTuple):
    """What an engine is tied to: the TensorRT version and the GPU (name, compute capability)."""

    tensorrt_version: str
    gpu_name: str
    compute_capability: str


@dataclass(frozen=True)
class EngineSidecar:
    """Build record of one engine (written as JSON next to it)."""

    tensorrt_version: str
    gpu_name: str
    compute_capability: str
    precision: str
    strongly_typed: bool
    profile: dict[str, list[list[int]]]
    onnx_file: str
    onnx_sha256: str
    workspace_gb: float
    built_at: str
    schema: int = SIDECAR_SCHEMA
    notes: list[str] = field(default_factory=list)

    @property
    def identity(self) -> RuntimeIdentity:
        """The (TensorRT version, GPU name, compute capability) the engine was built for."""
        return RuntimeIdentity(self.tensorrt_version, self.gpu_name, self.compute_capability)

    def to_json(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return asdict(self)


def sidecar_path(engine_path: Path) -> Path:
    """``model.engine`` -> ``model.engine.json``."""
    engine_path = Path(engine_path)
    return engine_path.with_name(engine_path.name + ".json")


def read_sidecar(engine_path: Path) -> EngineSidecar:
    """Read and validate the sidecar of ``engine_path``; EngineError when missing or malformed."""
    path = sidecar_path(engine_path)
    if not path.is_file():
        raise EngineError(f"engine sidecar {path} is missing, so {Path(engine_path).name} cannot be checked "
                          "against this TensorRT/GPU; rebuild the engine with build_engine.")
    try:
        data = json.loads(path.read_text())
        return EngineSidecar(**data)
    except (json.JSONDecodeError, TypeError) as exc:
        raise EngineError(f"engine sidecar {path} is malformed ({exc}); rebuild the engine with build_engine.") from exc


def compatibility_problems(built: RuntimeIdentity, current: RuntimeIdentity) -> list[str]:
    """What differs between the build machine and this one (empty list: compatible)."""
    problems = []
    if built.tensorrt_version != current.tensorrt_version:
        problems.append(f"TensorRT {built.tensorrt_version} built it, this machine has {current.tensorrt_version}")
    if built.compute_capability != current.compute_capability:
        problems.append(f"built for compute capability {built.compute_capability}, "
                        f"this GPU is {current.compute_capability}")
    if built.gpu_name != current.gpu_name:
        problems.append(f"built on '{built.gpu_name}', this GPU is '{current.gpu_name}'")
    return problems


def ensure_compatible(sidecar: EngineSidecar, current: RuntimeIdentity, engine_path: Path) -> None:
    """Raise EngineError when the engine was built with another TensorRT version or GPU."""
    problems = compatibility_problems(sidecar.identity, current)
    if problems:
        raise EngineError(f"engine {Path(engine_path).name} does not match this machine: " + "; ".join(problems)
                          + ". Rebuild it here with build_engine (engines are not portable).")
