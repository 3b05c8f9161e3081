"""The real all-MiniLM-L6-v2 on 8 short sentences: HIS against the per-sample loop, AE range, HIES."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from toolchain.models import load_model
from toolchain.pruning import keep_mask
from toolchain.scoring import combine_hies, entropy_scores, his_scores

pytestmark = pytest.mark.slow

SENTENCES = [
    "the service was great and the food even better",
    "worst flight ever, delayed four hours",
    "ok",
    "I am not sure what to think about the new phone",
    "love it",
    "the train was on time for once",
    "meh, nothing special today",
    "terrible customer support, never again",
]
LABELS = torch.tensor([2, 0, 1, 1, 2, 2, 1, 0])


def test_real_minilm_his_entropy_hies():
    loaded = load_model("packaged:all-MiniLM-L6-v2", num_labels=3, seed=0)
    adapter = loaded.adapter
    enc = loaded.tokenizer(SENTENCES, padding=True, truncation=True, max_length=24, return_tensors="pt")
    batch = dict(enc)
    calib = [(batch, LABELS)]

    his = his_scores(adapter, calib)
    assert his.scores.shape == (6, 12)
    brute = torch.zeros(6, 12, dtype=torch.float64)
    for i in (0, 2, 7):  # spot-check three samples against one-sample forwards
        row = {k: v[i : i + 1] for k, v in batch.items()}
        gates = torch.ones(6, 12, requires_grad=True)
        F.cross_entropy(adapter.gated_logits(row, gates), LABELS[i : i + 1]).backward()
        brute += gates.grad.abs().double()
    one = his_scores(adapter, [({k: v[[0, 2, 7]] for k, v in batch.items()}, LABELS[[0, 2, 7]])])
    torch.testing.assert_close(one.scores, brute / 3, rtol=2e-3, atol=1e-7)

    ent = entropy_scores(adapter, calib)
    ae = torch.tensor(ent.extras["attention_entropy"])
    assert bool((ae > 0).all()) and bool((ae < 1).all())
    hies = combine_hies(his, ent, alpha=0.5)
    keep = keep_mask(hies, ratio=0.5)
    assert int(keep.sum()) == 36 and bool(keep.any(dim=1).all())
