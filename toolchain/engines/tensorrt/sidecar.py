"""The JSON sidecar written next to every engine, and the pure compatibility check.

A serialized TensorRT engine only runs with the TensorRT version that built it, on the same GPU
model. The sidecar (``<engine>.json``) records what the engine was built with; before
deserialising, :func:`ensure_compatible` compares it with the current machine and refuses with
an :class:`EngineError` that says what differs and what to do. The sidecar also records the
profile and the inputs, so that a feed can be checked (:func:`feed_specs`) before TensorRT is even
imported. Pure functions: tested on CPU.
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
    #: input name -> {"dtype": numpy dtype name, "shape": dims (int, or a name/None when dynamic)};
    #: empty in sidecars written before it was recorded
    inputs: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: the source graph's absolute path at build time (empty in older sidecars)
    onnx_path: str = ""
    pad_neutral: bool = False  # exported by hydra-toolchain: short rows may be padded up to the profile

    def needs(self) -> str:
        """``TensorRT 10.15.1 on a 'NVIDIA H200' GPU (compute capability 9.0)``: what the engine runs on."""
        return (f"TensorRT {self.tensorrt_version} on a '{self.gpu_name}' GPU "
                f"(compute capability {self.compute_capability})")

    @property
    def identity(self) -> RuntimeIdentity:
        """The (TensorRT version, GPU name, compute capability) the engine was built for."""
        return RuntimeIdentity(self.tensorrt_version, self.gpu_name, self.compute_capability)

    def to_json(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return asdict(self)

    def describe(self) -> dict[str, Any]:
        """What the engine is, in the kind-neutral terms of :attr:`toolchain.engines.registry.EngineKind.describe`.

        TensorRT is not asked which precision its layers chose: ``ran_precision`` is None.
        """
        return {"kind": "tensorrt", "precision": self.precision, "ran_precision": None,
                "runtime": f"TensorRT {self.tensorrt_version}",
                "device": f"{self.gpu_name} (compute capability {self.compute_capability})",
                "onnx_file": self.onnx_file, "onnx_sha256": self.onnx_sha256, "onnx_path": self.onnx_path,
                "profile": self.profile, "layers": {}, "kept_fp32": 0, "built_at": self.built_at,
                "notes": list(self.notes), "sidecar": self.to_json()}


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
        data = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(data, dict):
            raise TypeError(f"expected a JSON object, got {type(data).__name__}")
        sidecar = EngineSidecar(**data)
        _check_types(sidecar)
        return sidecar
    except (json.JSONDecodeError, UnicodeDecodeError, TypeError, ValueError) as exc:
        raise EngineError(f"engine sidecar {path} is malformed ({exc}); rebuild the engine with build_engine.") from exc
    except OSError as exc:
        raise EngineError(f"cannot read the engine sidecar {path}: {exc.strerror or exc}.") from exc


def _check_types(sidecar: EngineSidecar) -> None:
    """Reject a sidecar whose fields have the wrong JSON types (TypeError, reported as malformed)."""
    for name in ("tensorrt_version", "gpu_name", "compute_capability", "precision", "onnx_file", "onnx_path"):
        if not isinstance(getattr(sidecar, name), str):
            raise TypeError(f"field '{name}' must be a string, got {getattr(sidecar, name)!r}")
    if not isinstance(sidecar.profile, dict) or not isinstance(sidecar.inputs, dict):
        raise TypeError("fields 'profile' and 'inputs' must be JSON objects")
    for name, triple in sidecar.profile.items():
        ok = isinstance(triple, list) and len(triple) == 3 and all(
            isinstance(s, list) and len(s) == len(triple[0]) and all(isinstance(d, int) for d in s) for s in triple)
        if not ok:
            raise TypeError(f"profile['{name}'] must be [min, opt, max] shapes of equal rank, got {triple!r}")
    for name, spec in sidecar.inputs.items():
        if not isinstance(spec, dict) or not isinstance(spec.get("shape"), list):
            raise TypeError(f"inputs['{name}'] must be {{'dtype': ..., 'shape': [...]}}, got {spec!r}")


def feed_specs(sidecar: EngineSidecar) -> tuple[dict[str, Any], dict[str, Any], bool]:
    """What the sidecar says about the inputs: ``(specs, limits, complete)`` for :func:`check_feed`.

    :func:`~toolchain.engines.base.recorded_specs` of the sidecar's ``profile`` and ``inputs``.
    """
    from toolchain.engines.base import recorded_specs

    return recorded_specs(sidecar.profile, sidecar.inputs)


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
                          + f". It needs {sidecar.needs()}. Rebuild it here with build_engine "
                          "(hydra-toolchain build) - engines are not portable.")
