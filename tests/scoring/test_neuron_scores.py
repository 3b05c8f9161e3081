"""MLP neuron Taylor scores against independent references, and the split of neurons among members."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from toolchain.models import adapter_for
from toolchain.models.tiny import TINY_MODELS
from toolchain.pruning.neurons import split_neurons
from toolchain.scoring import taylor_scores
from toolchain.scoring.neurons import neuron_gated, neuron_scores


def test_scores_have_one_float64_entry_per_neuron(tiny, calib):
    scores = neuron_scores(tiny.adapter, calib)
    assert [s.shape for s in scores] == [(w,) for w in tiny.adapter.mlp_per_layer()]
    assert all(s.dtype == torch.float64 for s in scores)
    assert all(bool(torch.isfinite(s).all()) and bool((s >= 0).all()) for s in scores)
    assert all(float(s.max()) > 0 for s in scores)


def test_a_neuron_without_fc2_column_scores_zero(tiny, calib):
    fc2 = tiny.adapter.layers()[1].fc2
    with torch.no_grad():
        fc2.weight[:, 7] = 0.0
    scores = neuron_scores(tiny.adapter, calib)
    assert float(scores[1][7]) == 0.0
    assert float(scores[1].max()) > 0 and float(scores[0][7]) > 0


def _column_scaled_grad(adapter, batch, labels, layer):
    """``dL/dg`` with ``g`` scaling fc2's weight columns (not its input): the same function, another graph."""
    fc2 = adapter.layers()[layer].fc2
    weight = fc2.weight
    gate = torch.ones(fc2.in_features, dtype=weight.dtype, requires_grad=True)
    del fc2.weight
    fc2.weight = weight * gate  # a plain tensor attribute for this forward
    try:
        loss = F.cross_entropy(adapter.logits(batch).float(), labels)
    finally:
        del fc2.weight
        fc2.weight = weight
    (grad,) = torch.autograd.grad(loss, gate)
    return grad.double()


@pytest.mark.parametrize("family", ["bert", "vit", "llama", "distilbert"])
def test_scores_match_an_autograd_reference(family, make_calib):
    tiny = TINY_MODELS[family]()
    calib = make_calib(tiny, sizes=(4, 3, 2))
    got = neuron_scores(tiny.adapter, calib)
    for layer in range(tiny.adapter.num_layers):
        want = torch.stack([_column_scaled_grad(tiny.adapter, b, y, layer).square() for b, y in calib]).mean(0)
        torch.testing.assert_close(got[layer], want, rtol=1e-4, atol=1e-12)


def test_scores_match_finite_differences_in_float64(make_calib):
    tiny = TINY_MODELS["bert"]()
    tiny.model.double()
    calib = make_calib(tiny, sizes=(4, 3))
    got = neuron_scores(tiny.adapter, calib)
    layer, eps = 1, 1e-6
    width = tiny.adapter.mlp_per_layer()[layer]
    for j in (0, 13, 40):
        grads = []
        for batch, labels in calib:
            losses = []
            for sign in (1.0, -1.0):
                gate = torch.ones(width, dtype=torch.float64)
                gate[j] += sign * eps
                with torch.no_grad(), neuron_gated(tiny.adapter, {layer: gate}):
                    losses.append(float(F.cross_entropy(tiny.adapter.logits(batch), labels)))
            grads.append((losses[0] - losses[1]) / (2 * eps))
        want = sum(g * g for g in grads) / len(grads)
        assert float(got[layer][j]) == pytest.approx(want, rel=1e-5, abs=1e-14)


def test_the_square_is_per_batch_not_of_the_batch_mean(bert, make_calib):
    """Mean of squares over batches, as for heads: one batch of 7 scores differently from batches of 4 and 3."""
    split = make_calib(bert, sizes=(4, 3))
    joined = [({k: torch.cat([split[0][0][k], split[1][0][k]]) for k in split[0][0]},
               torch.cat([split[0][1], split[1][1]]))]
    a, b = neuron_scores(bert.adapter, split), neuron_scores(bert.adapter, joined)
    assert not torch.allclose(a[0], b[0])


def test_layers_argument_scores_only_those_layers(tiny, calib):
    full = neuron_scores(tiny.adapter, calib)
    part = neuron_scores(tiny.adapter, calib, layers=[1])
    assert bool(torch.isnan(part[0]).all()) and part[0].shape == full[0].shape
    torch.testing.assert_close(part[1], full[1], rtol=1e-6, atol=1e-15)
    none = neuron_scores(tiny.adapter, calib, layers=[])
    assert all(bool(torch.isnan(s).all()) for s in none)


@pytest.mark.parametrize(("layers", "match"), [([2], r"layers\[0\]=2 is out of range"),
                                               ([1, 1], "names a layer twice"),
                                               (["0"], r"layers\[0\] must be an integer")])
def test_bad_layers_are_rejected(bert, make_calib, layers, match):
    with pytest.raises(ValueError, match=match):
        neuron_scores(bert.adapter, make_calib(bert), layers=layers)


def test_ood_rows_are_rejected_as_taylor_rejects_them(bert):
    calib = bert.labelled_batches((4, 3), ood_every=2)
    with pytest.raises(ValueError, match=r"calib labels \[-1\] are invalid for criterion 'taylor'"):
        taylor_scores(bert.adapter, calib)
    with pytest.raises(ValueError, match=r"calib labels \[-1\] are invalid for criterion 'neuron-taylor'"):
        neuron_scores(bert.adapter, calib)


def test_scoring_leaves_the_model_as_it_was(bert, make_calib):
    bert.model.train()
    batch = bert.make_batch(2)
    neuron_scores(bert.adapter, make_calib(bert))
    assert bert.model.training
    bert.model.eval()
    assert all(not m._forward_pre_hooks for m in bert.model.modules())
    assert all(p.grad is None for p in bert.model.parameters())
    with torch.no_grad():
        torch.testing.assert_close(bert.adapter.logits(batch), TINY_MODELS["bert"]().adapter.logits(batch))


# -------------------------------------------------------------------------- split_neurons
def _scores(widths=(64, 64, 48), seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.rand(w, generator=g, dtype=torch.float64) for w in widths]


def test_share_one_over_m_partitions_every_layer():
    scores = _scores()
    split = split_neurons(scores, members=4, share=0.25)
    assert len(split) == 4 and all(len(member) == 3 for member in split)
    for l, s in enumerate(scores):
        layer = [member[l] for member in split]
        assert all(kept == sorted(kept) for kept in layer)
        assert [len(kept) for kept in layer] == [round(0.25 * s.numel())] * 4
        union = [j for kept in layer for j in kept]
        assert sorted(union) == list(range(s.numel())), "disjoint and covering"


def test_core_is_the_best_neurons_and_shared_by_all():
    scores = _scores()
    split = split_neurons(scores, members=3, share=0.3, core=0.1)
    for l, s in enumerate(scores):
        width = s.numel()
        n, c = round(0.3 * width), round(0.1 * width)
        best = set(torch.argsort(s, descending=True)[:c].tolist())
        layer = [set(member[l]) for member in split]
        assert all(len(kept) == n for kept in layer)
        assert set.intersection(*layer) == best
        rest = [kept - best for kept in layer]
        assert all(not (rest[i] & rest[j]) for i in range(3) for j in range(i + 1, 3))  # 3 * (n - c) <= width - c
        assert set().union(*layer) == set(torch.argsort(s, descending=True)[: c + 3 * (n - c)].tolist())


def test_fork_layers_keep_every_neuron_and_may_be_unscored():
    scores = _scores()
    scores[0] = torch.full((64,), float("nan"), dtype=torch.float64)
    split = split_neurons(scores, members=2, share=0.5, fork=1)
    assert all(member[0] == list(range(64)) for member in split)
    assert all(len(member[1]) == 32 and len(member[2]) == 24 for member in split)
    assert not set(split[0][1]) & set(split[1][1])
    every = split_neurons(scores[1:], members=2, share=0.5, fork=2)
    assert every == [[list(range(64)), list(range(48))]] * 2
    with pytest.raises(ValueError, match=r"scores\[0\] has NaN scores but layer 0 is split \(fork=0\)"):
        split_neurons(scores, members=2, share=0.5)


def test_overlap_and_one_neuron_minimum():
    scores = _scores((10,))
    split = split_neurons(scores, members=3, share=0.5)  # 3 * 5 > 10: overlap, each member still keeps 5
    assert [len(m[0]) for m in split] == [5, 5, 5] and all(len(set(m[0])) == 5 for m in split)
    assert [len(m[0]) for m in split_neurons(scores, members=2, share=0.01)] == [1, 1]
    assert split_neurons(scores, members=1, share=1.0) == [[list(range(10))]]


def test_ties_rank_by_index():
    split = split_neurons([torch.zeros(8, dtype=torch.float64)], members=2, share=0.25, core=0.125)
    assert split == [[[0, 1]], [[0, 2]]]  # core: neuron 0; then 1 and 2 dealt in rank order


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"share": 0.0}, r"share=0.0 is out of range; it must lie in \(0.0, 1.0\]"),
    ({"share": 1.5}, r"share=1.5 is out of range"),
    ({"share": 0.5, "core": 0.6}, r"core=0.6 is out of range; it must lie in \[0.0, 0.5\]"),
    ({"share": 0.5, "core": -0.1}, r"core=-0.1 is out of range"),
    ({"share": 0.5, "fork": -1}, r"fork=-1 is out of range"),
    ({"share": 0.5, "fork": 4}, r"fork=4 is out of range; it must lie in \[0, 3\]"),
    ({"share": 0.5, "members": 0}, r"members=0 is out of range"),
    ({"share": "half"}, r"share must be a number, got 'half'"),
])
def test_split_validation_names_the_argument(kwargs, match):
    args = {"members": 2, **kwargs}
    with pytest.raises(ValueError, match=match):
        split_neurons(_scores(), **args)


def test_bad_score_shapes_are_rejected():
    with pytest.raises(ValueError, match=r"scores\[1\] must be a non-empty 1-D tensor"):
        split_neurons([torch.rand(4), torch.rand(2, 2)], members=2, share=0.5)


def test_scores_split_and_prune_end_to_end(make_calib):
    """Score, split with a late fork, slice each member: members differ after the fork, not before."""
    tiny = TINY_MODELS["llama"]()
    a = tiny.adapter
    scores = neuron_scores(a, make_calib(tiny), layers=[1])
    split = split_neurons(scores, members=2, share=0.5, core=0.125, fork=1)
    keep = torch.ones(a.num_layers, a.max_heads, dtype=torch.bool)
    members = [adapter_for(a.prune(keep, neurons)) for neurons in split]
    for member, neurons in zip(members, split, strict=True):
        assert member.mlp_per_layer() == [48, 24]
        assert torch.equal(member.layers()[1].fc2.weight, a.layers()[1].fc2.weight[:, neurons[1]])
    assert set(split[0][1]) & set(split[1][1]) == set(torch.argsort(scores[1], descending=True)[:6].tolist())
