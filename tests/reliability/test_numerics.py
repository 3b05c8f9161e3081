"""NaN or Inf in any output of a real engine is a parity failure naming the output and the first
offending index (feed by feed, row-major), with exit code 1 - never averaged away by a tolerance.

A real ONNX graph run by ONNX Runtime (the candidate) against the PyTorch reference, through the
public :func:`toolchain.parity.run_parity` and :meth:`Verdict.raise_for_status`.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from toolchain.engines import make_runner
from toolchain.errors import CheckFailed
from toolchain.export.onnx_export import export_onnx
from toolchain.parity import run_parity
from toolchain.parity.tolerances import Tolerance


class Candidate(nn.Module):
    """``root = sqrt(x)`` (NaN where x < 0), ``recip = 1 / x`` (Inf where x == 0), ``probs`` finite."""

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"probs": torch.softmax(x, -1), "root": torch.sqrt(x), "recip": 1.0 / x}


class Reference(nn.Module):
    """The same outputs kept finite: what the engine should have produced."""

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"probs": torch.softmax(x, -1), "root": torch.sqrt(x.abs()),
                "recip": 1.0 / torch.where(x == 0, torch.ones_like(x), x)}


# the cosine statistic of toolchain.parity.numeric squares nan_to_num(inf) = float max: a harmless overflow
@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")
def test_nan_and_inf_fail_parity_naming_output_and_first_index(tmp_path):
    path = tmp_path / "candidate.onnx"
    outputs = ["probs", "root", "recip"]
    export_onnx(Candidate(), {"x": torch.rand(2, 5) + 0.5}, outputs, path,
                dynamic_axes={n: {0: "batch"} for n in ["x", *outputs]})
    rng = np.random.default_rng(0)
    clean = {"x": rng.uniform(0.5, 1.5, (2, 5)).astype(np.float32)}
    poisoned = {"x": rng.uniform(0.5, 1.5, (3, 5)).astype(np.float32)}
    poisoned["x"][1, 2] = -1.0  # NaN in root at (1, 2)
    poisoned["x"][2, 0] = -4.0  # a later NaN: not the first one
    poisoned["x"][0, 3] = 0.0  # Inf in recip at (0, 3)
    reference = make_runner("torch", module=Reference(), input_specs={"x": (np.float32, ("batch", 5))},
                            output_names=outputs)
    candidate = make_runner("onnxrt-cpu", path=path, intra_op_threads=1)
    loose = {"": Tolerance(1e6, 1e6, "median")}  # no tolerance may hide a NaN or an Inf
    verdict = run_parity(reference, {"ort": candidate}, [clean, poisoned], [], [], tolerances=loose,
                         cross_check=False)

    failed = {c.name: c for c in verdict.failures}
    assert set(failed) == {"numeric/root", "numeric/recip"}, [c.name for c in verdict.checks]
    root, recip = failed["numeric/root"], failed["numeric/recip"]
    assert "nan at feed generated[1]" in root.message and "index (1, 2)" in root.message
    assert root.data["nonfinite"]["index"] == [1, 2]
    assert "inf at feed generated[1]" in recip.message and "index (0, 3)" in recip.message
    assert verdict.exit_code == 1
    with pytest.raises(CheckFailed) as info:
        verdict.raise_for_status()
    assert info.value.exit_code == 1
    assert "root" in str(info.value) and "index (1, 2)" in str(info.value) and "index (0, 3)" in str(info.value)
