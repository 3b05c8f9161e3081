"""Plans with a fork (issue 45): the trunk keeps every head, the plan covers the layers from the fork on."""

from __future__ import annotations

import pytest
import torch

from toolchain.pruning.members import make_members
from toolchain.pruning.plan import keep_mask
from toolchain.scoring.scores import HeadScores


def scores(layers: int = 4, heads: int = 6, seed: int = 0) -> HeadScores:
    s = torch.rand(layers, heads, generator=torch.Generator().manual_seed(seed)).double()
    return HeadScores(scores=s, criterion="x", params={}, data_hash="x", heads_per_layer=[heads] * layers)


@pytest.mark.parametrize("scope", ["global", "layer"])
def test_the_trunk_is_whole_and_the_ratio_counts_the_member_layers(scope):
    s = scores()
    keep = keep_mask(s, ratio=0.5, scope=scope, fork=2)
    assert bool(keep[:2].all())
    assert int(keep[2:].sum()) == 6  # half of the 12 heads from the fork on
    tail = HeadScores(scores=s.scores[2:].clone(), criterion="x", params={}, data_hash="x", heads_per_layer=[6, 6])
    assert torch.equal(keep[2:], keep_mask(tail, ratio=0.5, scope=scope))  # the same plan as on those layers alone
    assert int(keep_mask(s, budget=5, fork=3)[3:].sum()) == 5


def test_fork_out_of_range_is_an_error_naming_it():
    with pytest.raises(ValueError, match="fork"):
        keep_mask(scores(), ratio=0.5, fork=4)


@pytest.mark.parametrize("strategy", ["partition", "sampled"])
def test_members_keep_the_trunk_whole(strategy):
    from toolchain.models.tiny import TINY_MODELS

    tiny = TINY_MODELS["bert"]()
    members = make_members(tiny.adapter, tiny.labelled_batches(), m=3, criterion="taylor", strategy=strategy,
                           ratio=0.5, fork=1, seed=0)
    for mb in members:
        assert bool(mb.keep[0].all()) and int(mb.keep[1].sum()) == 2


def test_circuit_members_search_after_the_fork_only():
    from toolchain.models.tiny import TINY_MODELS

    tiny = TINY_MODELS["bert"]()
    members = make_members(tiny.adapter, tiny.labelled_batches(sizes=(4, 4, 3)), m=2, criterion="circuit",
                           strategy="circuit-samples", ratio=0.5, n_heads=2, fork=1, seed=0)
    for mb in members:
        assert bool(mb.keep[0].all()) and int(mb.keep[1].sum()) == 2
        assert mb.scores.params["fork"] == 1 and all(l >= 1 for l, _ in mb.scores.extras["circuit"])
