"""New member strategies (partition, sampled, mixed-criteria) and the pairwise-KL diversity measure.

The plan invariants (head count and per-layer floor) are checked on a tiny random BERT for both
scopes; the finer properties on hand-made :class:`HeadScores` (irregular layers, ties), which
replace the criterion through a monkeypatched ``score_heads``.
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from itertools import combinations

import numpy as np
import pytest
import torch

import toolchain.pruning.members as members_mod
from toolchain.models.tiny import tiny_bert
from toolchain.pruning import (
    gumbel_perturb,
    keep_mask,
    make_members,
    member_seed,
    pairwise_kl,
    partition_layer,
)
from toolchain.scoring import score_heads
from toolchain.scoring.scores import HeadScores, nan_scores

NAN = float("nan")


@pytest.fixture(scope="module")
def setup():
    tiny = tiny_bert(layers=2, heads=8)
    calib = []
    for i, n in enumerate((4, 3)):
        g = torch.Generator().manual_seed(i)
        calib.append((tiny.make_batch(n, i), torch.randint(0, 3, (n,), generator=g)))
    return tiny, calib


def _hand_scores(rows: list[list[float]], criterion: str = "hand") -> HeadScores:
    hpl = [len(r) for r in rows]
    s = nan_scores(hpl)
    for l, r in enumerate(rows):
        s[l, : len(r)] = torch.tensor(r, dtype=torch.float64)
    return HeadScores(s, criterion, {}, "", hpl)


# irregular layers (4, 6, 3 heads), distinct scores
HAND = _hand_scores([[0.9, 0.1, 0.5, 0.3], [2.0, 1.5, 0.2, 0.05, 1.1, 0.7], [0.4, 0.35, 0.6]])


@pytest.fixture
def fake(monkeypatch):
    """``fake(scores)``: make_members' criterion returns ``scores`` (a HeadScores, or {name: HeadScores})."""
    calls = []

    def install(scores):
        def score(adapter, calib, criterion, **params):
            calls.append((criterion, params))
            return scores[criterion] if isinstance(scores, dict) else scores

        monkeypatch.setattr(members_mod, "score_heads", score)
        return calls

    return install


def _layer_counts(mask: torch.Tensor) -> list[int]:
    return [int(v) for v in mask.sum(dim=1)]


RULES = [{"ratio": 0.5}, {"budget": 5}, {"ratio": 0.95}, {"budget": 2}]  # the last two hit the floor


# ----------------------------------------------------------------------- plan invariants, tiny model
@pytest.mark.parametrize("scope", ["global", "layer"])
@pytest.mark.parametrize("rule", RULES, ids=lambda r: "-".join(f"{k}{v}" for k, v in r.items()))
@pytest.mark.parametrize(
    ("strategy", "extra"),
    [
        ("partition", {"criterion": "l2", "core": 1}),
        ("sampled", {"criterion": "l2", "temperature": 1.0}),
        ("mixed-criteria", {"criteria": ["l2", "random", "his"]}),
    ],
)
def test_new_strategies_keep_the_plan_budget_and_floor(setup, strategy, extra, rule, scope):
    tiny, calib = setup
    members = make_members(tiny.adapter, calib, m=3, strategy=strategy, seed=3, scope=scope, **rule, **extra)
    ref = score_heads(tiny.adapter, calib, "l2")
    plan = keep_mask(ref, scope=scope, **rule)
    assert len(members) == 3
    for mb in members:
        assert mb.num_kept == int(plan.sum())
        assert min(_layer_counts(mb.keep)) >= 1
        if strategy == "partition" or scope == "layer":  # per-layer counts are the plan's
            assert _layer_counts(mb.keep) == _layer_counts(plan)
        assert mb.seed == member_seed(3, mb.index)


@pytest.mark.parametrize("scope", ["global", "layer"])
@pytest.mark.parametrize("strategy", ["partition", "sampled"])
def test_budget_and_floor_on_irregular_layers(fake, strategy, scope):
    fake(HAND)
    for rule in ({"budget": 3}, {"budget": 7}, {"ratio": 0.4}, {"ratio": 0.9}):
        plan = keep_mask(HAND, scope=scope, **rule)
        members = make_members(None, None, m=4, criterion="hand", strategy=strategy, scope=scope, **rule)
        for mb in members:
            assert mb.num_kept == int(plan.sum()), rule
            assert min(_layer_counts(mb.keep)) >= 1
            assert not mb.keep[~HAND.valid_mask()].any()  # nothing past a layer's heads
            if strategy == "partition":
                assert _layer_counts(mb.keep) == _layer_counts(plan)


# ------------------------------------------------------------------------------------- partition
def test_partition_layer_snake_by_hand():
    # core [7]; below it 6, 5, 4, 3, ... dealt m0, m1 | m1, m0
    assert partition_layer([7, 6, 5, 4, 3, 2, 1, 0], keep=3, m=2, core=1) == [[7, 6, 3], [7, 5, 4]]
    # core larger than the layer's count: everyone keeps the plan's heads
    assert partition_layer([2, 0, 1], keep=2, m=3, core=5) == [[2, 0]] * 3
    # overlap: 3 members x 3 heads over 5 heads: the best 4 twice, the last once; the copies
    # 0 0 1 1 2 2 3 3 4 are dealt round-robin m0, m1, m2, m0, ...
    out = partition_layer([0, 1, 2, 3, 4], keep=3, m=3, core=0)
    assert out == [[0, 1, 3], [0, 2, 3], [1, 2, 4]]


@pytest.mark.parametrize("heads", range(1, 9))
def test_partition_layer_properties(heads):
    ranked = list(range(heads))[::-1]
    for m in range(1, 6):
        for keep in range(1, heads + 1):
            for core in range(0, keep + 2):
                out = partition_layer(ranked, keep, m, core)
                c = min(core, keep)
                r, pool = keep - c, heads - c
                assert len(out) == m
                for heads_i in out:
                    assert len(heads_i) == keep == len(set(heads_i))
                    assert heads_i[:c] == ranked[:c]
                use = Counter(h for heads_i in out for h in heads_i[c:])
                if m * r <= pool:  # disjoint, from the best m * r heads below the core
                    assert all(v == 1 for v in use.values())
                    assert set(use) == set(ranked[c : c + m * r])
                else:  # every head below the core used q or q + 1 times
                    counts = [use.get(h, 0) for h in ranked[c:]]
                    assert max(counts) - min(counts) <= 1 and sum(counts) == m * r


def test_partition_members_share_the_core_and_split_the_rest(setup):
    tiny, calib = setup
    # 8 heads per layer, keep 3 per layer, core 1: 3 members x 2 dealt heads fit in the 7 below the core
    members = make_members(tiny.adapter, calib, m=3, criterion="l2", strategy="partition", budget=6,
                           scope="layer", core=1, seed=0)
    scores = score_heads(tiny.adapter, calib, "l2")
    top = scores.scores.argmax(dim=1)
    for l in range(2):
        for mb in members:
            assert bool(mb.keep[l, top[l]])
        rest = [set(torch.nonzero(mb.keep[l]).flatten().tolist()) - {int(top[l])} for mb in members]
        assert all(len(r) == 2 for r in rest)
        for a, b in combinations(rest, 2):
            assert not a & b
    assert members[0].extras["core"] == [[0, int(top[0])], [1, int(top[1])]]
    assert all(mb.scores is members[0].scores for mb in members)
    # core 0 and room for all: the members are pairwise disjoint
    disjoint = make_members(tiny.adapter, calib, m=2, criterion="l2", strategy="partition", budget=6, scope="layer")
    assert not (disjoint[0].keep & disjoint[1].keep).any()


def test_partition_is_deterministic_but_seeds_break_ties(fake):
    fake(_hand_scores([[1.0, 1.0, 1.0, 1.0, 1.0, 1.0]]))
    kw = {"m": 2, "criterion": "hand", "strategy": "partition", "budget": 2}
    masks = {s: [mb.keep for mb in make_members(None, None, seed=s, **kw)] for s in range(6)}
    again = make_members(None, None, seed=0, **kw)
    assert all(torch.equal(a.keep, b) for a, b in zip(again, masks[0]))
    assert len({tuple(masks[s][0].flatten().tolist()) for s in masks}) > 1  # ties go differently
    fake(HAND)
    a = make_members(None, None, m=2, criterion="hand", strategy="partition", budget=6, seed=0)
    b = make_members(None, None, m=2, criterion="hand", strategy="partition", budget=6, seed=9)
    assert all(torch.equal(x.keep, y.keep) for x, y in zip(a, b))  # no ties: the seed does not matter


# --------------------------------------------------------------------------------------- sampled
@pytest.mark.parametrize("scope", ["global", "layer"])
def test_sampled_temperature_zero_is_the_plan(fake, caplog, scope):
    fake(HAND)
    with caplog.at_level(logging.WARNING, logger="toolchain.pruning.members"):
        members = make_members(None, None, m=3, criterion="hand", strategy="sampled", temperature=0,
                               budget=6, scope=scope, seed=1)
    plan = keep_mask(HAND, budget=6, scope=scope)
    assert all(torch.equal(mb.keep, plan) for mb in members)
    assert "identical" in caplog.text


def test_sampled_is_reproducible_and_seed_dependent(setup):
    tiny, calib = setup
    kw = {"m": 4, "criterion": "l2", "strategy": "sampled", "temperature": 1.0, "ratio": 0.5}
    a = make_members(tiny.adapter, calib, seed=5, **kw)
    b = make_members(tiny.adapter, calib, seed=5, **kw)
    c = make_members(tiny.adapter, calib, seed=6, **kw)
    assert all(torch.equal(x.keep, y.keep) and x.extras == y.extras for x, y in zip(a, b))
    assert len({tuple(mb.keep.flatten().tolist()) for mb in a}) > 1  # members differ
    assert any(not torch.equal(x.keep, y.keep) for x, y in zip(a, c))  # ensembles differ
    for mb in a:  # the plan on the recorded perturbed scores is the member's mask
        pert = torch.tensor(mb.extras["perturbed"], dtype=torch.float64)
        assert torch.equal(keep_mask(HeadScores(pert, "l2", {}, "", [8, 8]), ratio=0.5), mb.keep)


def test_gumbel_perturb_by_hand():
    s = _hand_scores([[1.0, 3.0], [2.0]])
    out = gumbel_perturb(s, 0.5, seed=4)
    noise = np.random.default_rng(4).gumbel(size=3)
    expected = torch.tensor([[0.0 / 0.5 + noise[0], 1.0 / 0.5 + noise[1]], [0.5 / 0.5 + noise[2], NAN]])
    assert torch.allclose(out.scores, expected.double(), equal_nan=True)
    inf = gumbel_perturb(s, math.inf, seed=4)
    assert torch.allclose(inf.scores[s.valid_mask()], torch.from_numpy(noise))
    flat = gumbel_perturb(_hand_scores([[2.0, 2.0]]), 1.0, seed=4)  # all equal: noise only
    assert torch.allclose(flat.scores[0], torch.from_numpy(np.random.default_rng(4).gumbel(size=2)))


def test_sampled_infinite_temperature_is_uniform(fake):
    # one layer of 6 heads with very different scores; keep 2: each head kept ~1/3 of the time
    fake(_hand_scores([[100.0, 50.0, 10.0, 1.0, 0.1, 0.0]]))
    members = make_members(None, None, m=300, criterion="hand", strategy="sampled", temperature=math.inf,
                           budget=2, seed=0)
    freq = torch.stack([mb.keep[0] for mb in members]).double().mean(dim=0)
    assert bool((freq > 0.2).all() and (freq < 0.47).all()), freq
    assert members[0].extras["temperature"] is None
    # a low temperature follows the scores: the two best heads almost always
    cold = make_members(None, None, m=50, criterion="hand", strategy="sampled", temperature=0.01,
                        budget=2, seed=0)
    assert all(mb.kept_heads() == [(0, 0), (0, 1)] for mb in cold)


# -------------------------------------------------------------------------------- mixed-criteria
def test_mixed_criteria_members_use_their_own_criterion(setup):
    tiny, calib = setup
    criteria = ["his", "l2", "random", "random"]
    members = make_members(tiny.adapter, calib, m=4, strategy="mixed-criteria", criteria=criteria,
                           ratio=0.5, seed=2, token_norm=True, criterion_params={"l2": {}})
    for i, mb in enumerate(members):
        params = {"his": {"token_norm": True}, "l2": {}, "random": {"seed": member_seed(2, i)}}[criteria[i]]
        ref = score_heads(tiny.adapter, calib, criteria[i], **params)
        assert mb.scores.criterion == criteria[i]
        assert torch.equal(mb.scores.scores, ref.scores)
        assert torch.equal(mb.keep, keep_mask(ref, ratio=0.5))
    assert members[0].scores.params["token_norm"] is True
    assert not torch.equal(members[2].keep, members[3].keep)  # seeded criterion: member seeds
    fixed = make_members(tiny.adapter, calib, m=2, strategy="mixed-criteria", criteria=["random", "random"],
                         ratio=0.5, criterion_params={"random": {"seed": 7}})
    ref = keep_mask(score_heads(tiny.adapter, None, "random", seed=7), ratio=0.5)
    assert torch.equal(fixed[0].keep, ref) and torch.equal(fixed[1].keep, ref)


def test_mixed_criteria_scores_a_repeated_deterministic_criterion_once(fake, caplog):
    calls = fake({"his": HAND, "l2": _hand_scores([[1, 2, 3, 4], [1, 2, 3, 4, 5, 6], [3, 2, 1]], "l2")})
    with caplog.at_level(logging.WARNING, logger="toolchain.pruning.members"):
        members = make_members(None, None, m=3, strategy="mixed-criteria", criteria=["his", "l2", "l2"], budget=4)
    assert [c for c, _ in calls] == ["his", "l2"]
    assert torch.equal(members[0].keep, keep_mask(HAND, budget=4))
    assert members[1].scores is members[2].scores and "identical scores" in caplog.text


# ------------------------------------------------------------------------------- argument errors
@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"criterion": "l2", "strategy": "partition", "core": -1}, "core=-1"),
        ({"criterion": "l2", "strategy": "partition", "core": 1.5}, "core must be an integer"),
        ({"criterion": "l2", "strategy": "bootstrap", "core": 1}, "core=1 is only used by strategy='partition'"),
        ({"criterion": "l2", "strategy": "sampled", "temperature": -0.5}, "temperature=-0.5"),
        ({"criterion": "l2", "strategy": "sampled", "temperature": NAN}, "temperature=nan"),
        ({"criterion": "l2", "strategy": "sampled", "temperature": "hot"}, "temperature must be a number"),
        ({"criterion": "l2", "strategy": "partition", "temperature": 1.0}, "only used by strategy='sampled'"),
        ({"criterion": "l2", "strategy": "sampled", "criteria": ["l2"] * 3}, "only used by strategy='mixed-crit"),
        ({"strategy": "partition"}, "criterion is required"),
        ({"strategy": "mixed-criteria"}, "criteria as a sequence of m=3"),
        ({"strategy": "mixed-criteria", "criteria": "l2"}, "criteria as a sequence"),
        ({"strategy": "mixed-criteria", "criteria": ["l2", "his"]}, "has 2 names"),
        ({"strategy": "mixed-criteria", "criteria": ["l2", "his", "nope"]}, r"criteria\[2\]='nope' is unknown"),
        ({"strategy": "mixed-criteria", "criteria": ["l2"] * 3, "criterion": "l2"}, "criterion='l2'"),
        ({"strategy": "mixed-criteria", "criteria": ["l2", "random", "l2"], "alpha": 0.3}, r"\['alpha'\]"),
        ({"strategy": "mixed-criteria", "criteria": ["l2"] * 3, "criterion_params": {"his": {}}}, r"\['his'\]"),
        ({"strategy": "mixed-criteria", "criteria": ["l2"] * 3, "criterion_params": {"l2": 1}},
         r"criterion_params\['l2'\]"),
        ({"strategy": "mixed-criteria", "criteria": ["l2", "random", "his"], "criterion_params": {"his": {"x": 1}}},
         "unknown parameter"),
    ],
)
def test_argument_errors(setup, kwargs, match):
    tiny, calib = setup
    with pytest.raises(ValueError, match=match):
        make_members(tiny.adapter, calib, m=3, ratio=0.5, **kwargs)


# ------------------------------------------------------------------------------------ pairwise KL
def test_pairwise_kl_by_hand():
    # sample 0: p0 = (1/2, 1/2), p1 = (1/4, 3/4); sample 1: both (1/2, 1/2)
    logits = torch.log(torch.tensor([[[0.5, 0.5], [0.5, 0.5]], [[0.25, 0.75], [0.5, 0.5]]], dtype=torch.float64))
    kl01 = (0.5 * math.log(0.5 / 0.25) + 0.5 * math.log(0.5 / 0.75)) / 2
    kl10 = (0.25 * math.log(0.25 / 0.5) + 0.75 * math.log(0.75 / 0.5)) / 2
    out = pairwise_kl(logits)
    assert out["matrix"][0][1] == pytest.approx(kl01, rel=1e-12)
    assert out["matrix"][1][0] == pytest.approx(kl10, rel=1e-12)
    assert out["matrix"][0][0] == out["matrix"][1][1] == 0.0
    assert out["mean"] == pytest.approx((kl01 + kl10) / 2, rel=1e-12)
    # shifting logits changes nothing; a third, identical member adds zero pairs to the mean over 6
    three = torch.cat([logits + 3.0, logits[:1]])
    out3 = pairwise_kl(three)
    assert out3["matrix"][0][2] == 0.0 and out3["matrix"][1][2] == pytest.approx(kl10, rel=1e-9)
    assert out3["mean"] == pytest.approx(2 * (kl01 + kl10) / 6, rel=1e-9)


def test_pairwise_kl_is_stable_for_extreme_logits():
    logits = torch.tensor([[[1000.0, 0.0]], [[0.0, 1000.0]]])
    out = pairwise_kl(logits)
    assert out["matrix"][0][1] == pytest.approx(1000.0) and math.isfinite(out["mean"])


@pytest.mark.parametrize(
    "bad", [torch.zeros(1, 3, 2), torch.zeros(3, 2), torch.tensor([[[0.0, NAN]], [[0.0, 1.0]]])]
)
def test_pairwise_kl_errors(bad):
    with pytest.raises(ValueError, match="member_logits"):
        pairwise_kl(bad)
