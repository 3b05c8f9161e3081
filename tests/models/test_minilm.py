"""The real packaged all-MiniLM-L6-v2: gating, pruning, attention and ONNX on real sentences."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
import torch

from toolchain.models import adapter_for, load_model, save_model
from toolchain.models.wrappers import SingleModel

pytestmark = pytest.mark.slow

SENTENCES = [
    "the service was great and the food even better",
    "worst flight ever, delayed four hours",
    "ok",
    "I am not sure what to think about the new phone, it is fine I guess",
]


@pytest.fixture(scope="module")
def minilm():
    loaded = load_model("packaged:all-MiniLM-L6-v2", num_labels=3, seed=0)
    with torch.no_grad():  # a random head gives ~uniform probabilities; scale it so errors show
        loaded.model.classifier.weight.mul_(50.0)
    batch = loaded.tokenizer(SENTENCES, padding=True, truncation=True, max_length=32, return_tensors="pt")
    return loaded, dict(batch)


def test_real_minilm_structure(minilm):
    loaded, _ = minilm
    assert loaded.adapter.family == "bert"
    assert loaded.adapter.heads_per_layer() == [12] * 6
    assert loaded.adapter.head_dims() == [32] * 6


def test_real_minilm_gates_attention_and_pruning(minilm, tmp_path):
    loaded, batch = minilm
    a = loaded.adapter
    assert batch["attention_mask"].sum(1).min() < batch["attention_mask"].shape[1], "need padding in batch"
    with torch.no_grad():
        ref = a.logits(batch)
        ones = a.gated_logits(batch, torch.ones(6, 12))
        atts = a.attentions(batch)
    assert (ref - ones).abs().max() <= 1e-6
    mask = batch["attention_mask"].bool()
    for att in atts:
        assert torch.allclose(att.sum(-1), torch.ones_like(att.sum(-1)), atol=1e-5)
        assert att.masked_select(~mask[:, None, None, :]).abs().max() == 0
    g = torch.Generator().manual_seed(1)
    keep = torch.rand(6, 12, generator=g) > 0.5
    keep[3] = False
    keep[3, 7] = True  # one head left in layer 3
    keep[0] = True  # all heads in layer 0
    pruned = a.prune(keep)
    pa = adapter_for(pruned)
    assert pa.heads_per_layer() == keep.sum(1).tolist()
    with torch.no_grad():
        gated = a.gated_logits(batch, keep.float())
        phys = pa.logits(batch)
    assert (gated - phys).abs().max() <= 1e-5
    folder = save_model(pruned, tmp_path / "pruned", tokenizer=loaded.tokenizer)
    again = load_model(folder)
    assert again.adapter.heads_per_layer() == keep.sum(1).tolist()
    wrapper = SingleModel(again.adapter).eval()
    names = ["input_ids", "attention_mask", "token_type_ids"]
    torch.onnx.export(
        wrapper, tuple(batch[n] for n in names), str(tmp_path / "m.onnx"), input_names=names,
        output_names=["logits", "probs"], opset_version=17, dynamo=False,
        dynamic_axes={n: {0: "batch", 1: "seq"} for n in names},
    )
    sess = ort.InferenceSession(str(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"])
    other = dict(again.tokenizer(SENTENCES[:2], padding="max_length", max_length=20, return_tensors="pt"))
    with torch.no_grad():
        expect = wrapper(**other)["logits"].numpy()
    got = sess.run(["logits"], {n: other[n].numpy() for n in names})[0]
    assert np.abs(got - expect).max() <= 1e-4
