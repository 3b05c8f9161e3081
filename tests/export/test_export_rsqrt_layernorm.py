"""The rsqrt-form LayerNorm (Hydra's per-member LayerNorm) stays FP32 in FP16/BF16 graphs."""

from __future__ import annotations

import onnx
import torch

from toolchain.export.onnx_export import export_onnx
from toolchain.export.precision import convert_precision
from toolchain.hydra.block import stream_layer_norm


class _RsqrtNorm(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Conv1d(8, 8, 1)
        self.weight = torch.nn.Parameter(torch.ones(2, 4))
        self.bias = torch.nn.Parameter(torch.zeros(2, 4))

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"y": stream_layer_norm(self.proj(x), self.weight, self.bias, 2, 1e-5)}


def test_rsqrt_layernorm_nodes_stay_fp32(tmp_path):
    res = export_onnx(_RsqrtNorm().eval(), {"x": torch.randn(2, 8, 5)}, ["y"], tmp_path / "n.onnx",
                      dynamic_axes={"x": {0: "b", 2: "t"}})
    model = onnx.load(res.path)
    ops = {n.name: n.op_type for n in model.graph.node}
    out = convert_precision(model, "fp16")
    ln_kept = {name for name, why in out.kept_fp32.items() if "decomposed LayerNorm" in why}
    # the squared deviation, the variance, eps add, sqrt and the normalising divide/multiply
    kept_ops = sorted(ops[n] for n in ln_kept if n in ops)
    assert {"Mul", "ReduceMean", "Add", "Sqrt", "Sub"} <= set(kept_ops), kept_ops
    assert kept_ops.count("Mul") >= 2  # Mul(d, d) and Mul(d, rsqrt)
