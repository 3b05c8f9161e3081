"""benchmarks/diversity/rule.py: the selection rule against the baselines a user would deploy instead."""

from __future__ import annotations

import pytest
from bench_scripts import load_script


@pytest.fixture(scope="module")
def rule():
    return load_script("benchmarks/diversity/rule.py", "diversity_rule")


SINGLE = {"accuracy": 0.740, "nll": 0.600, "auroc_msp": 0.720}
DEEP = {"accuracy": 0.760, "nll": 0.585, "auroc_msp": 0.740}


def test_the_highest_utility_among_accurate_enough_candidates_wins(rule):
    candidates = {
        "sharp-but-inaccurate": {"accuracy": 0.700, "nll": 0.650, "auroc_msp": 0.900},  # 4 points below single
        "good-detector": {"accuracy": 0.736, "nll": 0.610, "auroc_msp": 0.780},        # U +0.170
        "a-point-below": {"accuracy": 0.730, "nll": 0.600, "auroc_msp": 0.950},        # 1 point below: out
        "well-calibrated": {"accuracy": 0.750, "nll": 0.590, "auroc_msp": 0.740},      # U +0.150
    }
    out = rule.select(candidates, {"single": SINGLE, "deep-ensemble": DEEP})
    assert rule.SLACK == 0.005  # half a point (issue 33): fixed before the benchmark runs
    assert out["eligible"] == ["good-detector", "well-calibrated"]  # 0.736 >= 0.740 - 0.005; 0.730 is not
    assert out["selected"] == "good-detector"
    assert out["utility"]["good-detector"] == pytest.approx(0.780 - 0.610)
    assert out["margins"]["good-detector"]["single"] == pytest.approx(0.170 - 0.120)
    assert out["margins"]["good-detector"]["deep-ensemble"] == pytest.approx(0.170 - 0.155)
    assert out["beats"] == {"single": True, "deep-ensemble": True}
    assert "beats single" in out["why"] and "beats deep-ensemble" in out["why"]


def test_the_gain_over_members_plays_no_part_and_losing_to_a_baseline_is_said(rule):
    # a candidate that beats the single model but not the deep ensemble is still selected, and the verdict says so
    candidates = {"a": {"accuracy": 0.745, "nll": 0.600, "auroc_msp": 0.740, "gain": {"nll": -1.0}},
                  "b": {"accuracy": 0.745, "nll": 0.620, "auroc_msp": 0.745}}
    out = rule.select(candidates, {"single": SINGLE, "deep-ensemble": DEEP})
    assert out["selected"] == "a" and out["beats"] == {"single": True, "deep-ensemble": False}
    assert "does not beat deep-ensemble" in out["why"]


def test_slack_ties_and_no_eligible_candidate(rule):
    tie = {"x": {"accuracy": 0.74, "nll": 0.70, "auroc_msp": 0.80},
           "y": {"accuracy": 0.74, "nll": 0.60, "auroc_msp": 0.70}}
    assert rule.select(tie, {"single": SINGLE})["selected"] == "y"  # equal U: the lower NLL
    poor = {"z": {"accuracy": 0.70, "nll": 0.5, "auroc_msp": 0.9}}
    out = rule.select(poor, {"single": SINGLE})
    assert out["selected"] is None and out["beats"] == {} and "deploy the single model" in out["why"]
    assert rule.select(poor, {"single": SINGLE}, slack=0.05)["selected"] == "z"
    exactly = {"w": {"accuracy": 0.735, "nll": 0.6, "auroc_msp": 0.7}}  # exactly half a point below is in
    assert rule.select(exactly, {"single": SINGLE})["selected"] == "w"
    same = {n: {"accuracy": 0.74, "nll": 0.6, "auroc_msp": 0.7} for n in ("q", "p")}
    assert rule.select(same, {"single": SINGLE})["selected"] == "p"  # a full tie: the first name


def test_a_calibrated_candidate_is_compared_with_calibrated_baselines(rule):
    """Temperature scaling lowers every variant's NLL: a calibrated Hydra's margins are against calibrated baselines."""
    cands = {"ts": {"accuracy": 0.745, "nll": 0.570, "auroc_msp": 0.760},   # U 0.190
             "raw": {"accuracy": 0.745, "nll": 0.600, "auroc_msp": 0.760}}  # U 0.160
    scaled = {"single": {**SINGLE, "nll": 0.560}, "deep-ensemble": {**DEEP, "nll": 0.545}}  # U 0.160, 0.195
    out = rule.select(cands, {"single": SINGLE, "deep-ensemble": DEEP}, baselines_for={"ts": scaled})
    assert out["selected"] == "ts"
    assert out["margins"]["ts"] == pytest.approx({"single": 0.030, "deep-ensemble": -0.005})
    assert out["margins"]["raw"] == pytest.approx({"single": 0.040, "deep-ensemble": 0.005})
    assert out["beats"] == {"single": True, "deep-ensemble": False}
    with pytest.raises(ValueError, match="same baselines"):
        rule.select(cands, {"single": SINGLE, "deep-ensemble": DEEP}, baselines_for={"ts": {"single": SINGLE}})


def test_bad_inputs_name_what_is_missing(rule):
    with pytest.raises(ValueError, match="single model"):
        rule.select({"x": SINGLE}, {"deep-ensemble": DEEP})
    with pytest.raises(ValueError, match="candidate 'x' lacks validation auroc_msp"):
        rule.select({"x": {"accuracy": 0.7, "nll": 0.6}}, {"single": SINGLE})


def test_budget_candidates_are_the_two_other_budgets(diversity_run):
    run = diversity_run
    name = "partition-core0-recovery-prune{}".format
    assert sorted(run.budget_strategies(0.5)) == [name(25), name(75)]
    assert sorted(run.budget_strategies(0.25)) == [name(50), name(75)]
    assert run.budget_strategies(0.5)["partition-core0-recovery-prune75"]["pruning"]["ratio"] == 0.75
    assert run.STRATEGIES["partition-core0-distill"]["pruning"]["recovery"]["distill"] == 0.5
