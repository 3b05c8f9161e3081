"""A BF16 Hydra graph of a BERT-family model runs without NaN on padded rows (the mask fill stays finite)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from toolchain.engines import make_runner
from toolchain.export import write_precision_variant
from toolchain.export.onnx_export import export_onnx
from toolchain.hydra import fuse
from toolchain.models.tiny import tiny_bert

NAMES = ["input_ids", "attention_mask", "token_type_ids"]


@pytest.mark.filterwarnings("ignore:You are using the legacy TorchScript-based ONNX export:DeprecationWarning")
def test_bf16_hydra_bert_graph_is_finite_on_padded_rows_and_close_to_fp32(tmp_path):
    tiny = tiny_bert()
    masks = torch.ones(2, 2, 4, dtype=torch.bool)
    masks[0, 0, :2] = False
    model = fuse(tiny.adapter, masks, lowering="conv")
    batch = tiny.make_batch(4, seed=0)  # rows padded to different lengths
    assert int((batch["attention_mask"] == 0).sum()) > 0
    axes = {n: {0: "batch", 1: "seq"} for n in NAMES}
    fp32 = export_onnx(model, {n: batch[n] for n in NAMES}, ["probs", "member_logits"], tmp_path / "h.onnx",
                       dynamic_axes=axes).path
    bf16 = write_precision_variant(fp32, tmp_path / "h.bf16.onnx", "bf16")
    assert bf16.clamped_values >= 1  # finfo(float32).min of the attention mask
    feed = {n: batch[n].numpy() for n in NAMES}
    with make_runner("onnxrt-cpu-bf16emu", path=tmp_path / "h.bf16.onnx") as emu, \
            make_runner("onnxrt-cpu", path=fp32) as ref:
        low, high = emu.infer(feed), ref.infer(feed)
    assert np.isfinite(low["probs"]).all() and np.isfinite(low["member_logits"]).all()
    assert np.abs(low["probs"] - high["probs"]).max() < 0.05
