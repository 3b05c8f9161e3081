"""keep_mask: ratio/budget, global/layer scope, the per-layer floor, ties and errors."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from toolchain.pruning import keep_mask, layer_budgets, pruned_heads
from toolchain.scoring import HeadScores


def _s(values, hpl=None):
    t = torch.tensor(values, dtype=torch.float64)
    return HeadScores(t, "test", {}, "", hpl or [t.shape[1]] * t.shape[0])


SCORES = _s([[0.9, 0.1, 0.8, 0.2], [0.3, 0.7, 0.6, 0.5], [0.05, 0.04, 0.03, 0.02]])


def _kept(mask):
    return {tuple(x) for x in torch.nonzero(mask).tolist()}


def test_global_ratio_keeps_top_heads_with_floor():
    keep = keep_mask(SCORES, ratio=0.5)  # prune 6 of 12: top 6 globally would leave layer 2 empty
    assert keep.dtype == torch.bool and keep.shape == (3, 4)
    assert int(keep.sum()) == 6
    assert _kept(keep) == {(0, 0), (0, 2), (1, 1), (1, 2), (1, 3), (2, 0)}  # floor keeps layer 2's best


def test_layer_ratio_prunes_within_each_layer():
    keep = keep_mask(SCORES, ratio=0.5, scope="layer")
    assert _kept(keep) == {(0, 0), (0, 2), (1, 1), (1, 2), (2, 0), (2, 1)}


def test_ratio_rounds_the_pruned_count_down():
    assert int(keep_mask(SCORES, ratio=0.3).sum()) == 12 - 3  # floor(3.6) = 3 pruned
    assert int(keep_mask(SCORES, ratio=0.0).sum()) == 12
    assert int(keep_mask(_s([[float(i) for i in range(100)]]), ratio=0.29).sum()) == 71  # not 72 (fp)


def test_floor_takes_precedence_over_ratio():
    keep = keep_mask(SCORES, ratio=0.9, min_heads_per_layer=2)  # 12 - 10 = 2 < 3 layers * 2
    assert int(keep.sum()) == 6 and keep.sum(dim=1).tolist() == [2, 2, 2]


def test_budget_global_and_layer():
    keep = keep_mask(SCORES, budget=5)
    assert _kept(keep) == {(0, 0), (0, 2), (1, 1), (1, 2), (2, 0)}
    keep = keep_mask(SCORES, budget=7, scope="layer")
    assert keep.sum(dim=1).tolist() == [3, 2, 2]  # 7 over three equal layers: the extra head to layer 0
    assert _kept(keep) == {(0, 0), (0, 2), (0, 3), (1, 1), (1, 2), (2, 0), (2, 1)}


def test_floor_counts_toward_the_budget():
    keep = keep_mask(SCORES, budget=4, min_heads_per_layer=1)
    assert int(keep.sum()) == 4 and keep.any(dim=1).all()
    assert _kept(keep) == {(0, 0), (1, 1), (2, 0), (0, 2)}


def test_ties_are_broken_by_index():
    flat = _s([[1.0] * 4] * 3)
    assert _kept(keep_mask(flat, budget=5)) == {(0, 0), (1, 0), (2, 0), (0, 1), (0, 2)}
    assert _kept(keep_mask(flat, ratio=0.5, scope="layer")) == {(l, h) for l in range(3) for h in (0, 1)}


def test_unequal_layers_of_a_pruned_model():
    s = _s([[0.5, float("nan"), float("nan")], [0.1, 0.9, 0.4]], hpl=[1, 3])
    keep = keep_mask(s, ratio=0.5)  # 4 heads, prune 2
    assert keep.tolist() == [[True, False, False], [False, True, False]]
    assert pruned_heads(keep, [1, 3]) == {0: [], 1: [0, 2]}
    assert layer_budgets([1, 3], 3, 1) == [1, 2]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"ratio": 1.0}, "ratio=1.0"),
        ({"ratio": -0.1}, "ratio=-0.1"),
        ({"ratio": float("nan")}, "ratio"),
        ({"budget": 2}, "budget=2"),
        ({"budget": 13}, "budget=13"),
        ({"budget": 3.5}, "budget"),
        ({}, "exactly one of ratio and budget"),
        ({"ratio": 0.5, "budget": 4}, "exactly one"),
        ({"ratio": 0.5, "scope": "row"}, "scope='row'"),
        ({"ratio": 0.5, "min_heads_per_layer": 0}, "min_heads_per_layer=0"),
        ({"ratio": 0.5, "min_heads_per_layer": 5}, "min_heads_per_layer=5"),
        ({"budget": 5, "min_heads_per_layer": 2}, "budget=5"),
    ],
)
def test_errors_name_the_argument(kwargs, match):
    with pytest.raises(ValueError, match=match):
        keep_mask(SCORES, **kwargs)


def test_nan_score_on_an_existing_head_is_an_error():
    with pytest.raises(ValueError, match="NaN"):
        keep_mask(_s([[0.1, float("nan")]]), budget=1)


@settings(max_examples=60, deadline=None)
@given(
    st.integers(1, 4),
    st.integers(1, 5),
    st.data(),
)
def test_global_budget_property(layers, heads, data):
    values = data.draw(st.lists(st.integers(0, 5), min_size=layers * heads, max_size=layers * heads))
    floor = data.draw(st.integers(1, heads))
    budget = data.draw(st.integers(layers * floor, layers * heads))
    s = _s([[float(v) for v in values[l * heads : (l + 1) * heads]] for l in range(layers)])
    keep = keep_mask(s, budget=budget, min_heads_per_layer=floor)
    assert int(keep.sum()) == budget
    assert bool((keep.sum(dim=1) >= floor).all())
    # apart from the floor, every kept head scores at least as high as every pruned head
    floor_heads = set()
    for l in range(layers):
        order = sorted(range(heads), key=lambda h, l=l: (-s.scores[l, h].item(), h))
        floor_heads |= {(l, h) for h in order[:floor]}
    extra = [s.scores[lh].item() for lh in _kept(keep) - floor_heads]
    pruned = [s.scores[l, h].item() for l in range(layers) for h in range(heads) if not keep[l, h]]
    if extra and pruned:
        assert min(extra) >= max(pruned)
    assert keep_mask(s, budget=budget, min_heads_per_layer=floor).equal(keep)  # deterministic


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(1, 6), min_size=1, max_size=5), st.data())
def test_layer_budget_property(hpl, data):
    budget = data.draw(st.integers(len(hpl), sum(hpl)))
    out = layer_budgets(hpl, budget, 1)
    assert sum(out) == budget and all(1 <= b <= n for b, n in zip(out, hpl))
    assert all(abs(b - budget * n / sum(hpl)) < 1 + n for b, n in zip(out, hpl))
    assert not math.isnan(sum(out))
