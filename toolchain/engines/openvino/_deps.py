"""Lazy access to ``openvino`` and what this CPU can run, read at run time (never assumed).

OpenVINO's CPU plugin lists what the processor supports in ``OPTIMIZATION_CAPABILITIES``
(``BF16`` with AVX512-BF16 or AMX-BF16, ``FP16`` with AVX512-FP16 or AMX-FP16). A precision hint
the CPU cannot honour is not refused by OpenVINO: it is silently replaced (seen here: an FP16 hint
on a CPU without FP16 ran BF16), so the kind asks the plugin first and reads back what each layer
ran in after compiling (:mod:`toolchain.engines.openvino.compile`).
"""

from __future__ import annotations

import functools
from pathlib import Path
from types import ModuleType
from typing import NamedTuple

from toolchain.errors import MissingDependencyError

#: toolchain precision -> OpenVINO element type name of the inference-precision hint
OV_TYPES = {"fp32": "f32", "fp16": "f16", "bf16": "bf16",
            # an INT8 (Q/DQ) graph: the Q/DQ pairs make the matrix layers INT8; everything else stays f32
            "int8": "f32"}
#: the CPU plugin capability each low precision needs
CAPABILITY = {"fp16": "FP16", "bf16": "BF16", "int8": "INT8"}
#: /proc/cpuinfo flags recorded in a sidecar (what the kernels can use; informational)
CPU_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_fp16", "amx_bf16", "amx_fp16", "amx_int8", "amx_tile")


class PrecisionUnavailable(MissingDependencyError):
    """The CPU (or the OpenVINO build) cannot run the precision asked for: recorded, not a failure (exit 3)."""


class CpuIdentity(NamedTuple):
    """What a compiled OpenVINO CPU model is tied to."""

    openvino_version: str
    device_name: str
    capabilities: tuple[str, ...]
    cpu_flags: tuple[str, ...]


def import_openvino() -> ModuleType:
    """Import ``openvino`` or raise MissingDependencyError saying how to get it."""
    try:
        import openvino
    except ImportError as exc:
        raise MissingDependencyError(
            f"OpenVINO is not installed (import openvino failed: {exc}); it is a dependency of hydra-toolchain: "
            "rerun bash scripts/setup.sh, or pip install openvino."
        ) from exc
    return openvino


@functools.lru_cache(maxsize=1)
def core() -> object:
    """One ``openvino.Core`` per process (creating one loads the plugins)."""
    return import_openvino().Core()


def _cpu_flags() -> tuple[str, ...]:
    path = Path("/proc/cpuinfo")
    if not path.is_file():
        return ()
    for line in path.read_text(errors="replace").splitlines():
        if line.startswith("flags"):
            present = set(line.partition(":")[2].split())
            return tuple(f for f in CPU_FLAGS if f in present)
    return ()


@functools.lru_cache(maxsize=1)
def current_identity() -> CpuIdentity:
    """OpenVINO version, CPU name, the CPU plugin's optimisation capabilities and the CPU's flags."""
    ov = import_openvino()
    c = core()
    return CpuIdentity(
        openvino_version=str(ov.get_version()),
        device_name=str(c.get_property("CPU", "FULL_DEVICE_NAME")),
        capabilities=tuple(str(x) for x in c.get_property("CPU", "OPTIMIZATION_CAPABILITIES")),
        cpu_flags=_cpu_flags(),
    )


def unavailable_reason(precision: str, identity: CpuIdentity | None = None) -> str | None:
    """Why this CPU cannot run ``precision`` with OpenVINO (None: it can)."""
    if precision not in OV_TYPES:
        return f"OpenVINO's CPU plugin runs fp32, fp16, bf16 or int8, not '{precision}'"
    needed = CAPABILITY.get(precision)
    if needed is None:
        return None
    identity = identity or current_identity()
    if needed in identity.capabilities:
        return None
    return (f"this CPU ({identity.device_name}) has no {needed} support in OpenVINO {identity.openvino_version} "
            f"(OPTIMIZATION_CAPABILITIES {list(identity.capabilities)}); {precision} engines run on CPUs with "
            + {"bf16": "AVX512-BF16 or AMX-BF16", "fp16": "AVX512-FP16 or AMX-FP16"}.get(precision, "INT8 kernels"))


def require_precision(precision: str) -> CpuIdentity:
    """The identity of this CPU, or PrecisionUnavailable when it cannot run ``precision``."""
    identity = current_identity()
    reason = unavailable_reason(precision, identity)
    if reason is not None:
        raise PrecisionUnavailable(reason)
    return identity
