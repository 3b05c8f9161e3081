"""Every family through fuse -> ONNX (conv and matmul; FP32, FP16, BF16) -> ONNX Runtime.

The invariants BERT and ViT have had since the start, for every registered family: the fused
model with ``mlp: grouped`` equals the members run separately (test_hydra_fuse.py), the two
lowerings agree (test_hydra_fuse.py), and here: the exported graph run by ONNX Runtime equals
PyTorch at batch and sequence sizes other than the export's, and its FP16 and BF16 variants
stay finite and close (FP16 on the CPU provider, BF16 through the exact-rounding emulation).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from toolchain.engines import make_runner
from toolchain.export import write_precision_variant
from toolchain.export.onnx_export import export_onnx
from toolchain.hydra import fuse
from toolchain.models.tiny import TINY_MODELS

from .conftest import FAMILIES, make_unequal_masks

OUTPUTS = ["probs", "member_logits"]
#: bounds on the probability error of the low-precision graphs of these tiny models (measured over the
#: eight families and both lowerings: FP16 at most 1.3e-3, BF16 at most 1.2e-2, both XLM-RoBERTa)
LOW_PRECISION_PROBS = {"fp16": 1e-2, "bf16": 5e-2}


def _feed(tiny, batch: int, seq: int, seed: int) -> dict[str, torch.Tensor]:
    out = tiny.make_batch(batch, seed=seed)
    return {k: (v[:, :seq] if k != "pixel_values" else v) for k, v in out.items()}


@pytest.mark.filterwarnings("ignore:You are using the legacy TorchScript-based ONNX export:DeprecationWarning")
@pytest.mark.parametrize("lowering", ["conv", "matmul"])
@pytest.mark.parametrize("family", FAMILIES)
def test_exported_hydra_matches_pytorch_at_other_shapes_in_every_precision(tmp_path, family, lowering):
    tiny = TINY_MODELS[family]()
    model = fuse(tiny.adapter, make_unequal_masks(), lowering=lowering).eval()
    names = list(model.input_names)
    specs = type(tiny.adapter).input_specs()
    axes = {n: specs[n].dynamic_axes() for n in names} | {o: {0: "batch"} for o in OUTPUTS}
    example = _feed(tiny, 2, 12, seed=0)
    fp32 = export_onnx(model, {n: example[n] for n in names}, OUTPUTS, tmp_path / "h.onnx", dynamic_axes=axes).path
    shapes = [(3, 9), (1, 5), (4, 12)]  # neither the export's batch (2) nor, for text, its length (12)
    feeds = [_feed(tiny, b, s, seed=10 + i) for i, (b, s) in enumerate(shapes)]
    with torch.no_grad():
        want = [{k: v.numpy() for k, v in model(**f).items()} for f in feeds]
    with make_runner("onnxrt-cpu", path=fp32) as run:
        for f, w, (b, _s) in zip(feeds, want, shapes, strict=True):
            got = run.infer({n: f[n].numpy() for n in names})
            assert got["member_logits"].shape == (b, 3, w["probs"].shape[-1])
            assert np.abs(got["probs"] - w["probs"]).max() <= 1e-5, (family, lowering)
            assert np.abs(got["member_logits"] - w["member_logits"]).max() <= 1e-4, (family, lowering)
    for precision, bound in LOW_PRECISION_PROBS.items():
        low = tmp_path / f"h.{precision}.onnx"
        write_precision_variant(fp32, low, precision)
        kind = "onnxrt-cpu" if precision == "fp16" else "onnxrt-cpu-bf16emu"
        with make_runner(kind, path=low) as run:
            for f, w in zip(feeds, want, strict=True):
                got = run.infer({n: f[n].numpy() for n in names})
                probs = np.asarray(got["probs"], dtype=np.float32)
                assert np.isfinite(probs).all(), (family, lowering, precision)
                assert np.abs(probs - w["probs"]).max() <= bound, (family, lowering, precision)
