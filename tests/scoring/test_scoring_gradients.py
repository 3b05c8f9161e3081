"""HIS and Taylor against brute-force per-sample autograd loops."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from toolchain.scoring import his_scores, score_heads, taylor_scores


def _rows(batch, labels, i):
    n = labels.shape[0]
    return {k: v[i : i + 1] if v.dim() and v.shape[0] == n else v for k, v in batch.items()}, labels[i : i + 1]


def _per_sample_signed_grads(adapter, calib):
    """One forward per sample, batch gates of ones: dL_i/dm for every sample (signed)."""
    grads = []
    for batch, labels in calib:
        for i in range(labels.shape[0]):
            b, y = _rows(batch, labels, i)
            gates = torch.ones(adapter.num_layers, adapter.max_heads, requires_grad=True)
            loss = F.cross_entropy(adapter.gated_logits(b, gates), y)
            loss.backward()
            grads.append(gates.grad.double().clone())
    return torch.stack(grads)  # [N, L, H]


def test_his_matches_per_sample_brute_force(tiny, calib):
    expected = _per_sample_signed_grads(tiny.adapter, calib).abs().mean(dim=0)
    got = his_scores(tiny.adapter, calib)
    assert got.scores.dtype == torch.float64
    torch.testing.assert_close(got.scores, expected, rtol=1e-4, atol=1e-8)
    assert got.params["mode_used"] == "batched"


def test_his_takes_abs_per_sample_not_of_batch_sum(bert, make_calib):
    calib = make_calib(bert, sizes=(6,))
    signed = _per_sample_signed_grads(bert.adapter, calib)
    got = his_scores(bert.adapter, calib).scores
    of_mean = signed.mean(dim=0).abs()
    # mean|g| >= |mean g|, with equality where all six gradients share a sign (head (1, 3) of this
    # model): there the two sides are one float32 quantity computed in two summation orders (the
    # thread count changes them), so the bound allows float32 rounding relative to the value
    assert bool((got >= of_mean * (1 - 1e-5)).all())
    assert bool((got > of_mean + 1e-6).any()), "per-sample abs must differ from abs of the summed gradient"


def test_his_looped_equals_batched(bert, make_calib):
    calib = make_calib(bert)
    a = his_scores(bert.adapter, calib, mode="batched").scores
    b = his_scores(bert.adapter, calib, mode="looped").scores
    torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-8)


def test_his_token_norm_divides_by_real_tokens(bert, make_calib):
    calib = make_calib(bert, sizes=(5,))
    signed = _per_sample_signed_grads(bert.adapter, calib)
    tokens = calib[0][0]["attention_mask"].sum(dim=1).double()
    expected = (signed.abs() / tokens[:, None, None]).mean(dim=0)
    got = his_scores(bert.adapter, calib, token_norm=True).scores
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-9)


def test_taylor_matches_mean_of_squared_batch_gradients(tiny, make_calib):
    calib = make_calib(tiny, sizes=(4, 3, 2))
    signed = _per_sample_signed_grads(tiny.adapter, calib)
    expected, start = [], 0
    for _, labels in calib:  # dL_b/dm of the batch-mean loss = mean of the per-sample gradients
        n = labels.shape[0]
        expected.append(signed[start : start + n].mean(dim=0).square())
        start += n
    got = taylor_scores(tiny.adapter, calib)
    torch.testing.assert_close(got.scores, torch.stack(expected).mean(dim=0), rtol=1e-4, atol=1e-12)


def test_gradient_criteria_reject_bad_labels(bert):
    batch = bert.make_batch(3, 0)
    for labels in (torch.tensor([0, 1, 7]), torch.tensor([0, -1, 1])):
        for crit in ("his", "taylor"):
            with pytest.raises(ValueError, match="labels"):
                score_heads(bert.adapter, [(batch, labels)], crit)


def test_his_restores_training_mode(bert, make_calib):
    bert.model.train()
    his_scores(bert.adapter, make_calib(bert, sizes=(2,)))
    assert bert.model.training
    bert.model.eval()


def test_clip_text_tower_falls_back_to_one_sample_per_forward(make_calib):
    from toolchain.models import adapter_for
    from toolchain.models.tiny import tiny_clip
    from toolchain.scoring import circuit_scores

    tiny = tiny_clip()
    text = adapter_for(tiny.model, prompts=tiny.adapter.prompts, tower="text")
    calib = make_calib(tiny, sizes=(4,))  # 4 images and 4 class prompts: the shapes alone cannot tell
    auto = his_scores(text, calib)
    assert auto.params["mode_used"] == "looped"
    torch.testing.assert_close(auto.scores, _per_sample_signed_grads(text, calib).abs().mean(dim=0), rtol=1e-4,
                               atol=1e-8)
    with pytest.raises(ValueError, match="batched"):
        his_scores(text, calib, mode="batched")
    assert circuit_scores(text, calib, n_heads=1).params["mode_used"] == "looped"
