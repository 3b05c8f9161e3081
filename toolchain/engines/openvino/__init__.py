"""OpenVINO CPU backend: compile an ONNX graph at FP32/BF16/FP16, write it with a sidecar, run it.

``openvino`` is imported only inside these modules' functions, when the ``openvino-cpu`` kind is
used. :mod:`.compile` builds (and reads back the precision each layer really ran in),
:mod:`.sidecar` records and checks what a compiled file needs, :mod:`.runner` runs it.
"""

from toolchain.engines.openvino._deps import (
    CpuIdentity,
    PrecisionUnavailable,
    current_identity,
    import_openvino,
    unavailable_reason,
)
from toolchain.engines.openvino.compile import build_ov_engine, precision_config, ran_precision, read_back
from toolchain.engines.openvino.runner import OvRunner
from toolchain.engines.openvino.sidecar import (
    OvSidecar,
    compatibility_problems,
    ensure_compatible,
    read_sidecar,
    sidecar_path,
)

__all__ = [
    "CpuIdentity", "OvRunner", "OvSidecar", "PrecisionUnavailable", "build_ov_engine", "compatibility_problems",
    "current_identity", "ensure_compatible", "import_openvino", "precision_config", "ran_precision", "read_back",
    "read_sidecar", "sidecar_path", "unavailable_reason",
]
