"""The real all-MiniLM-L6-v2 (6 x 12 heads): M = 3 members on real tokenised sentences."""

from __future__ import annotations

import pytest
import torch

from toolchain.hydra import fuse, summary
from toolchain.hydra.reference import ensemble_outputs, member_adapters

pytestmark = pytest.mark.slow

SENTENCES = [
    "the service was great and the food even better",
    "worst flight ever, delayed four hours",
    "ok",
    "I am not sure what to think about the new phone, it is fine I guess",
    "can't wait for the weekend!!",
]


@pytest.fixture(scope="module")
def minilm():
    from toolchain.models import load_model

    loaded = load_model("packaged:all-MiniLM-L6-v2", num_labels=3, seed=0)
    with torch.no_grad():  # the new head is random and near uniform: scale it so errors show
        loaded.model.classifier.weight.mul_(100.0)
    batch = loaded.tokenizer(SENTENCES, padding=True, truncation=True, max_length=32, return_tensors="pt")
    return loaded, dict(batch)


def _masks():
    """Member m keeps 4 of 12 heads per layer; the three members partition each layer's heads,
    except member 2 whose last layer keeps a single head (unequal counts on real weights)."""
    g = torch.Generator().manual_seed(0)
    masks = torch.zeros(3, 6, 12, dtype=torch.bool)
    for layer in range(6):
        perm = torch.randperm(12, generator=g)
        for m in range(3):
            masks[m, layer, perm[4 * m:4 * m + 4]] = True
    masks[2, 5] = False
    masks[2, 5, 0] = True
    return masks


def test_fused_matches_members_one_by_one(minilm):
    loaded, batch = minilm
    assert batch["attention_mask"].sum(1).unique().numel() > 1, "the batch must mix padded lengths"
    masks = _masks()
    model = fuse(loaded.adapter, masks)
    assert summary(model)["heads_kept"][2] == [4, 4, 4, 4, 4, 1]
    ref = ensemble_outputs(member_adapters(loaded.adapter, masks), batch)
    assert float(torch.softmax(ref["member_logits"], -1).max()) > 0.5
    for lowering in ("conv", "matmul"):
        with torch.no_grad():
            out = model.set_lowering(lowering)(**batch)
        assert (out["probs"] - ref["probs"]).abs().max() <= 1e-5
        assert (out["member_logits"] - ref["member_logits"]).abs().max() <= 1e-4
