"""HIES: formula, min-max scopes and edge cases."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from toolchain.scoring import HeadScores, combine_hies, entropy_scores, hies_scores, his_scores, minmax


def _scores(criterion, values, hpl=None, extras=None):
    t = torch.tensor(values, dtype=torch.float64)
    hpl = hpl or [t.shape[1]] * t.shape[0]
    return HeadScores(t, criterion, {}, "h", hpl, extras or {})


def test_minmax_global_and_layer():
    x = torch.tensor([[1.0, 3.0], [5.0, 9.0]], dtype=torch.float64)
    assert minmax(x, "global").tolist() == [[0.0, 0.25], [0.5, 1.0]]
    assert minmax(x, "layer").tolist() == [[0.0, 1.0], [0.0, 1.0]]


def test_minmax_all_equal_gives_half():
    x = torch.full((2, 3), 7.0, dtype=torch.float64)
    assert minmax(x, "global").tolist() == [[0.5] * 3] * 2
    y = torch.tensor([[2.0, 2.0], [1.0, 4.0]], dtype=torch.float64)
    assert minmax(y, "layer").tolist() == [[0.5, 0.5], [0.0, 1.0]]


def test_minmax_single_layer_scopes_agree():
    x = torch.tensor([[0.2, 0.8, 0.5]], dtype=torch.float64)
    assert torch.equal(minmax(x, "global"), minmax(x, "layer"))
    torch.testing.assert_close(minmax(x, "global"), torch.tensor([[0.0, 1.0, 0.5]], dtype=torch.float64))


def test_minmax_ignores_nan():
    x = torch.tensor([[1.0, 2.0, 3.0], [5.0, float("nan"), float("nan")]], dtype=torch.float64)
    out = minmax(x, "global")
    assert out[0].tolist() == [0.0, 0.25, 0.5] and out[1, 0] == 1.0 and math.isnan(out[1, 1])
    assert minmax(x, "layer")[1, 0] == 0.5  # a layer with one head: all values equal


def test_combine_hies_formula():
    his = np.array([[0.1, 0.4, 0.2], [0.3, 0.9, 0.0]])
    ae = np.array([[0.9, 0.5, 0.7], [0.2, 0.6, 0.8]])
    h = _scores("his", his)
    e = _scores("entropy", 1 - ae, extras={"attention_entropy": ae.tolist()})
    for alpha in (0.0, 0.25, 0.5, 1.0):
        got = combine_hies(h, e, alpha=alpha, norm_scope="global").scores.numpy()
        n_h = (his - his.min()) / (his.max() - his.min())
        n_a = (ae - ae.min()) / (ae.max() - ae.min())
        np.testing.assert_allclose(got, alpha * n_h + (1 - alpha) * (1 - n_a), atol=1e-15)
    got = combine_hies(h, e, alpha=0.5, norm_scope="layer").scores.numpy()
    lo_h, hi_h = his.min(1, keepdims=True), his.max(1, keepdims=True)
    lo_a, hi_a = ae.min(1, keepdims=True), ae.max(1, keepdims=True)
    want = 0.5 * (his - lo_h) / (hi_h - lo_h) + 0.5 * (1 - (ae - lo_a) / (hi_a - lo_a))
    np.testing.assert_allclose(got, want, atol=1e-15)


def test_combine_hies_flat_component_leaves_ranking_to_the_other():
    h = _scores("his", [[0.3, 0.3, 0.3]])
    ae = [[0.9, 0.1, 0.5]]
    e = _scores("entropy", (1 - np.array(ae)).tolist(), extras={"attention_entropy": ae})
    out = combine_hies(h, e, alpha=0.5).scores
    torch.testing.assert_close(out, torch.tensor([[0.25, 0.75, 0.5]], dtype=torch.float64))


def test_combine_hies_uses_one_minus_scores_without_extras():
    h = _scores("his", [[1.0, 2.0]])
    e = _scores("entropy", [[0.8, 0.1]])  # AE = 0.2, 0.9 -> head 0 more focused
    assert combine_hies(h, e, alpha=0.0).scores.tolist() == [[1.0, 0.0]]


@pytest.mark.parametrize("bad", [-0.1, 1.5, float("nan")])
def test_combine_hies_rejects_bad_alpha(bad):
    h, e = _scores("his", [[1.0, 2.0]]), _scores("entropy", [[0.1, 0.2]])
    with pytest.raises(ValueError, match="alpha"):
        combine_hies(h, e, alpha=bad)


def test_combine_hies_rejects_mismatch():
    h = _scores("his", [[1.0, 2.0]])
    with pytest.raises(ValueError, match="different models"):
        combine_hies(h, _scores("entropy", [[0.1, 0.2, 0.3]]))
    with pytest.raises(ValueError, match="norm_scope"):
        combine_hies(h, _scores("entropy", [[0.1, 0.2]]), norm_scope="row")
    with pytest.raises(ValueError, match="'his' and 'entropy'"):
        combine_hies(h, h)


def test_hies_scores_equals_combination_of_components(bert, make_calib):
    calib = make_calib(bert)
    direct = hies_scores(bert.adapter, calib, alpha=0.3, norm_scope="layer")
    combined = combine_hies(his_scores(bert.adapter, calib), entropy_scores(bert.adapter, calib), alpha=0.3,
                            norm_scope="layer")
    torch.testing.assert_close(direct.scores, combined.scores, rtol=1e-6, atol=1e-9)
    assert direct.params["alpha"] == 0.3 and direct.params["norm_scope"] == "layer"
    assert direct.criterion == "hies" and len(direct.data_hash) == 64
