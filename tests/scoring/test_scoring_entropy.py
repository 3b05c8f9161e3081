"""Attention entropy against a direct numpy computation, with padding and edge cases."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from toolchain.scoring import attention_entropy, entropy_scores


def _numpy_ae(probs: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Per sample and head: mean over real query rows of H(row over real keys) / log n."""
    b, h = probs.shape[:2]
    out = np.zeros((b, h))
    for i in range(b):
        real = np.flatnonzero(mask[i])
        n = len(real)
        for j in range(h):
            vals = []
            for t in real:
                p = probs[i, j, t, real]
                ent = -sum(x * math.log(x) for x in p if x > 0)
                vals.append(0.0 if n == 1 else ent / math.log(n))
            out[i, j] = np.mean(vals) if vals else 0.0
    return out


def _random_probs(b, h, t, lengths, seed=0):
    rng = np.random.default_rng(seed)
    probs = rng.random((b, h, t, t))  # garbage in padded query rows on purpose
    mask = np.zeros((b, t), dtype=bool)
    for i, n in enumerate(lengths):
        mask[i, :n] = True
        if n:
            probs[i, :, :, :n] = rng.dirichlet(np.full(n, 0.7), size=(h, t))
        probs[i, :, :, n:] = 0.0
    return probs, mask


def test_attention_entropy_matches_numpy_with_padding():
    probs, mask = _random_probs(4, 3, 6, lengths=[6, 4, 1, 2])
    ae, has = attention_entropy(torch.from_numpy(probs), torch.from_numpy(mask))
    np.testing.assert_allclose(ae.numpy(), _numpy_ae(probs, mask), rtol=1e-12, atol=1e-12)
    assert ae.dtype == torch.float64 and bool(has.all())
    assert ae[2].abs().max() == 0.0  # a single real key: defined as 0


def test_uniform_rows_score_one_and_one_hot_rows_zero():
    t = 5
    uniform = torch.full((1, 2, t, t), 1.0 / t)
    one_hot = torch.eye(t)[None, None].expand(1, 2, t, t)
    mask = torch.ones(1, t, dtype=torch.bool)
    assert attention_entropy(uniform, mask)[0] == pytest.approx(torch.ones(1, 2, dtype=torch.float64))
    assert attention_entropy(one_hot, mask)[0].abs().max() == 0.0


def test_entropy_of_rows_not_of_the_averaged_map():
    # two one-hot rows on different keys: row entropies are 0, the averaged map's would be log 2
    probs = torch.tensor([[[[1.0, 0.0], [0.0, 1.0]]]])
    ae, _ = attention_entropy(probs, torch.ones(1, 2, dtype=torch.bool))
    assert float(ae) == 0.0


def test_sample_without_tokens_is_left_out():
    probs, mask = _random_probs(2, 1, 3, lengths=[3, 0])
    ae, has = attention_entropy(torch.from_numpy(probs), torch.from_numpy(mask))
    assert has.tolist() == [True, False] and float(ae[1].abs().max()) == 0.0


def test_entropy_criterion_on_padded_bert_batches(bert, make_calib):
    calib = make_calib(bert, sizes=(5, 3))
    expected = []
    for batch, _ in calib:
        probs = bert.adapter.attentions(batch)
        mask = batch["attention_mask"].bool().numpy()
        expected.append(np.stack([_numpy_ae(p.double().numpy(), mask) for p in probs], axis=1))  # [B, L, H]
    ae = np.concatenate(expected).mean(axis=0)
    got = entropy_scores(bert.adapter, calib)
    np.testing.assert_allclose(np.array(got.extras["attention_entropy"]), ae, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(got.scores.numpy(), 1.0 - ae, rtol=1e-10, atol=1e-12)
    assert 0.0 <= ae.min() and ae.max() <= 1.0 + 1e-12


def test_attention_entropy_rejects_mismatched_shapes():
    with pytest.raises(ValueError, match="token_mask"):
        attention_entropy(torch.zeros(2, 1, 3, 3), torch.ones(2, 4, dtype=torch.bool))
