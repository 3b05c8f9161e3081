"""The JSON sidecar written next to every compiled OpenVINO model, and the pure compatibility check.

An exported OpenVINO CPU model (``<graph>[.<precision>].blob``) is imported by the OpenVINO
version that wrote it, and its precision needs the CPU capability it was built with (BF16, FP16).
The sidecar (``<blob>.json``) records both, the precision asked for AND the precision the layers
really ran in (read back from the compiled model, :func:`toolchain.engines.openvino.compile.read_back`),
the source graph's sha256, the input profile and the inputs, so that :func:`ensure_compatible`
refuses a file this machine cannot run as built (exit 2) and a feed can be checked before
OpenVINO is imported. Pure functions: tested without OpenVINO.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from toolchain.engines.openvino._deps import CAPABILITY, CpuIdentity
from toolchain.errors import EngineError

SIDECAR_SCHEMA = 1
KIND = "openvino-cpu"


@dataclass(frozen=True)
class OvSidecar:
    """Build record of one compiled OpenVINO model (JSON next to it).

    Attributes:
        precision: the precision asked for (``fp32`` | ``fp16`` | ``bf16``).
        ran_precision: the lowest precision the matrix layers (FullyConnected, MatMul,
            Convolution ...) really ran in, read back from the compiled model.
        layers: runtime layer type -> precision -> count (the compiled model's ``runtimePrecision``).
        kept_fp32: matrix layers left in FP32 although a lower precision was asked for.
        config: the OpenVINO properties it was compiled with (and must be imported with).
        profile: input name -> ``[min, opt, max]`` shapes (every feed must lie within min..max).
        inputs: input name -> ``{"dtype", "shape"}`` (dims: int, or a name/None when dynamic).
        onnx_file, onnx_sha256: the source graph's file name and sha256 (checked at load where the
            graph is at hand: :mod:`toolchain.engines.source`).
        onnx_path: the source graph's absolute path at build time (empty in older sidecars).
        pad_neutral: the source graph was exported by hydra-toolchain, so short text rows may be
            padded up to the profile's minimum (:func:`toolchain.engines.base.pad_to_profile`).
    """

    openvino_version: str
    device_name: str
    capabilities: list[str]
    cpu_flags: list[str]
    precision: str
    ran_precision: str
    layers: dict[str, dict[str, int]]
    kept_fp32: int
    config: dict[str, Any]
    profile: dict[str, list[list[int]]]
    inputs: dict[str, dict[str, Any]]
    onnx_file: str
    onnx_sha256: str
    built_at: str
    kind: str = KIND
    schema: int = SIDECAR_SCHEMA
    notes: list[str] = field(default_factory=list)
    onnx_path: str = ""
    pad_neutral: bool = False

    def needs(self) -> str:
        """``OpenVINO 2026.4.1 on a CPU with BF16``: what the file runs on."""
        cap = CAPABILITY.get(self.precision)
        return f"OpenVINO {self.openvino_version} on a CPU" + (f" with {cap}" if cap else "")

    def describe(self) -> dict[str, Any]:
        """What the file is, in the kind-neutral terms of :attr:`toolchain.engines.registry.EngineKind.describe`."""
        return {"kind": self.kind, "precision": self.precision, "ran_precision": self.ran_precision,
                "runtime": f"OpenVINO {self.openvino_version}", "device": self.device_name,
                "onnx_file": self.onnx_file, "onnx_sha256": self.onnx_sha256, "onnx_path": self.onnx_path,
                "profile": self.profile, "layers": self.layers, "kept_fp32": self.kept_fp32,
                "built_at": self.built_at, "notes": list(self.notes), "sidecar": self.to_json()}

    def to_json(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return asdict(self)


def sidecar_path(engine_path: Path) -> Path:
    """``single.bf16.blob`` -> ``single.bf16.blob.json``."""
    engine_path = Path(engine_path)
    return engine_path.with_name(engine_path.name + ".json")


_STRINGS = ("openvino_version", "device_name", "precision", "ran_precision", "onnx_file", "onnx_sha256", "kind",
            "onnx_path")


def read_sidecar(engine_path: Path) -> OvSidecar:
    """Read and validate the sidecar of ``engine_path``; EngineError (exit 2) when missing or malformed."""
    path = sidecar_path(engine_path)
    if not path.is_file():
        raise EngineError(f"sidecar {path} is missing, so {Path(engine_path).name} cannot be checked against this "
                          "OpenVINO and CPU; rebuild it (hydra-toolchain build GRAPH --engine openvino-cpu).")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(data, dict):
            raise TypeError(f"expected a JSON object, got {type(data).__name__}")
        if data.get("kind", KIND) != KIND:
            raise TypeError(f"field 'kind' is {data.get('kind')!r}, not {KIND!r}")
        sidecar = OvSidecar(**data)
        for name in _STRINGS:
            if not isinstance(getattr(sidecar, name), str):
                raise TypeError(f"field '{name}' must be a string, got {getattr(sidecar, name)!r}")
        for name in ("layers", "config", "profile", "inputs"):
            if not isinstance(getattr(sidecar, name), dict):
                raise TypeError(f"field '{name}' must be a JSON object")
        for name, triple in sidecar.profile.items():
            if not (isinstance(triple, list) and len(triple) == 3
                    and all(isinstance(s, list) and all(isinstance(d, int) for d in s) for s in triple)):
                raise TypeError(f"profile['{name}'] must be [min, opt, max] shapes, got {triple!r}")
        return sidecar
    except (json.JSONDecodeError, UnicodeDecodeError, TypeError, ValueError) as exc:
        raise EngineError(f"sidecar {path} is malformed ({exc}); rebuild {Path(engine_path).name} "
                          "(hydra-toolchain build GRAPH --engine openvino-cpu).") from exc
    except OSError as exc:
        raise EngineError(f"cannot read the sidecar {path}: {exc.strerror or exc}.") from exc


def compatibility_problems(sidecar: OvSidecar, current: CpuIdentity) -> list[str]:
    """What stops this machine from running the file as built (empty list: compatible)."""
    problems = []
    if sidecar.openvino_version != current.openvino_version:
        problems.append(f"OpenVINO {sidecar.openvino_version} built it, this machine has {current.openvino_version}")
    needed = CAPABILITY.get(sidecar.precision)
    if needed is not None and needed not in current.capabilities:
        problems.append(f"it was built for {sidecar.precision}, and this CPU ({current.device_name}) has no {needed} "
                        f"support (OPTIMIZATION_CAPABILITIES {list(current.capabilities)})")
    return problems


def ensure_compatible(sidecar: OvSidecar, current: CpuIdentity, engine_path: Path) -> None:
    """Raise EngineError (exit 2) when the file was built by another OpenVINO or for a precision this CPU lacks."""
    problems = compatibility_problems(sidecar, current)
    if problems:
        raise EngineError(f"{Path(engine_path).name} does not match this machine: " + "; ".join(problems)
                          + f". It needs {sidecar.needs()}. Rebuild it here from {sidecar.onnx_file} "
                          "(hydra-toolchain build GRAPH --engine openvino-cpu) - compiled models are not portable "
                          "across OpenVINO versions.")
