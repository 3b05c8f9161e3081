"""Ensemble members: every strategy reproducible, different across seeds, argument errors."""

from __future__ import annotations

import pytest
import torch

from toolchain.models.tiny import tiny_bert
from toolchain.pruning import make_members, member_seed, pairwise_jaccard


@pytest.fixture(scope="module")
def setup():
    tiny = tiny_bert(layers=2, heads=8)
    calib = []
    for i, n in enumerate((6, 6)):
        g = torch.Generator().manual_seed(i)
        calib.append((tiny.make_batch(n, i), torch.randint(0, 3, (n,), generator=g)))
    return tiny, calib


def _masks(members):
    return [m.keep for m in members]


def test_member_seeds_are_distinct_and_stable():
    assert member_seed(0, 0) == member_seed(0, 0)
    seeds = {member_seed(s, i) for s in range(3) for i in range(3)}
    assert len(seeds) == 9


@pytest.mark.parametrize(
    ("criterion", "strategy", "extra"),
    [
        ("his", "bootstrap", {"ratio": 0.5}),
        ("random", "seeds", {"ratio": 0.5}),
        ("circuit", "circuit-samples", {"budget": 4, "n_heads": 2, "scope": "layer"}),
    ],
)
def test_members_reproducible_and_seed_dependent(setup, criterion, strategy, extra):
    tiny, calib = setup
    a = make_members(tiny.adapter, calib, m=3, criterion=criterion, strategy=strategy, seed=7, **extra)
    b = make_members(tiny.adapter, calib, m=3, criterion=criterion, strategy=strategy, seed=7, **extra)
    c = make_members(tiny.adapter, calib, m=3, criterion=criterion, strategy=strategy, seed=8, **extra)
    assert len(a) == 3 and [m.index for m in a] == [0, 1, 2]
    for x, y in zip(a, b):
        assert torch.equal(x.keep, y.keep) and torch.equal(x.scores.scores, y.scores.scores)
        assert x.seed == y.seed and x.sample_indices == y.sample_indices
    assert [m.seed for m in a] != [m.seed for m in c]
    # members of one ensemble differ in their data or scores, and so do ensembles of different seeds
    assert not torch.equal(a[0].scores.scores, a[1].scores.scores)
    assert any(not torch.equal(x.scores.scores, y.scores.scores) for x, y in zip(a, c))
    for m in a:
        assert m.keep.any(dim=1).all()


def test_random_seed_members_keep_different_heads(setup):
    tiny, _ = setup
    members = make_members(tiny.adapter, None, m=3, criterion="random", strategy="seeds", ratio=0.5, seed=0)
    assert pairwise_jaccard(_masks(members))["overall"] < 1.0
    assert all(m.num_kept == 8 for m in members)


def test_bootstrap_resamples_with_replacement(setup):
    tiny, calib = setup
    members = make_members(tiny.adapter, calib, m=2, criterion="his", strategy="bootstrap", ratio=0.5, seed=1)
    for m in members:
        assert len(m.sample_indices) == 12 and len(set(m.sample_indices)) < 12
        assert m.scores.data_hash != members[0].scores.data_hash or m.index == 0


def test_circuit_samples_members_keep_their_circuit(setup):
    tiny, calib = setup
    members = make_members(tiny.adapter, calib, m=2, criterion="circuit", strategy="circuit-samples", budget=4,
                           n_heads=2, subset_size=5, seed=0)
    for m in members:
        assert len(m.sample_indices) == 5 == len(set(m.sample_indices))
        assert m.kept_heads() == sorted(tuple(x) for x in m.scores.extras["circuit"])


def test_ratios_strategy_plans_each_member_differently(setup):
    tiny, calib = setup
    members = make_members(tiny.adapter, calib, m=3, criterion="l2", strategy="ratios", ratio=[0.1, 0.3, 0.5])
    assert [m.num_kept for m in members] == [15, 12, 8]
    assert members[0].scores is members[2].scores
    # nested: a member that prunes more keeps a subset of the heads of one that prunes less
    assert bool((members[2].keep <= members[1].keep).all())
    d = members[0].to_dict()
    assert d["ratio"] == 0.1 and d["num_kept"] == 15 and d["scores"]["criterion"] == "l2"


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"criterion": "his", "strategy": "seeds", "ratio": 0.5}, "deterministic"),
        ({"criterion": "l2", "strategy": "ratios", "ratio": 0.5}, "sequence of m=3"),
        ({"criterion": "l2", "strategy": "ratios", "ratio": [0.1, 0.2]}, "one per member"),
        ({"criterion": "l2", "strategy": "bootstrap", "ratio": [0.1, 0.2, 0.3]}, "only allowed"),
        ({"criterion": "l2", "strategy": "shuffle", "ratio": 0.5}, "strategy='shuffle'"),
        ({"criterion": "l2", "strategy": "bootstrap"}, "exactly one"),
        ({"criterion": "l2", "strategy": "bootstrap", "ratio": 0.5, "subset_size": 3}, "subset_size"),
        ({"criterion": "random", "strategy": "seeds", "ratio": 0.5, "seed": -1}, "seed=-1"),
        ({"criterion": "nope", "strategy": "bootstrap", "ratio": 0.5}, "known criteria"),
    ],
)
def test_argument_errors(setup, kwargs, match):
    tiny, calib = setup
    with pytest.raises(ValueError, match=match):
        make_members(tiny.adapter, calib, m=3, **kwargs)
