"""The cost-aware selection rule of benchmarks/cost_levers (rule.py): each condition binds, ties, none eligible."""

from __future__ import annotations

import math

import pytest
from bench_scripts import load_script


@pytest.fixture(scope="module")
def rule():
    return load_script("benchmarks/cost_levers/rule.py", "cost_levers_rule")


BASE = {"single": {"accuracy": 0.80, "nll": 0.60, "auroc_msp": 0.70},
        "deep-ensemble": {"accuracy": 0.81, "nll": 0.50, "auroc_msp": 0.80}}


def row(acc=0.80, nll=0.49, auroc=0.81, ratio=1.2):
    return {"accuracy": acc, "nll": nll, "auroc_msp": auroc, "flops_ratio": ratio}


def test_the_cheapest_row_that_clears_both_baselines_is_selected(rule):
    out = rule.select_by_cost({"a": row(ratio=1.5), "b": row(ratio=1.1), "c": row(ratio=2.4)}, BASE)
    assert out["selected"] == "b"
    assert out["eligible"] == ["b", "a", "c"]
    assert out["failing"] == {"a": {}, "b": {}, "c": {}}
    assert out["within_target"] is True
    assert "b at 1.10x" in out["why"]
    over = rule.select_by_cost({"a": row(ratio=1.5)}, BASE)
    assert over["selected"] == "a" and over["within_target"] is False and "over the 1.3x" in over["why"]


@pytest.mark.parametrize(("condition", "cheap", "margin"), [
    ("accuracy", row(acc=0.80 - 0.0051), -0.0001),   # half a point below the single model is the floor
    ("nll", row(nll=0.51), -0.01),                    # NLL above the deep ensemble's
    ("auroc_msp", row(auroc=0.79), -0.01),            # AUROC below the deep ensemble's
])
def test_each_condition_alone_excludes_a_cheaper_row(rule, condition, cheap, margin):
    cheap["flops_ratio"] = 1.0
    out = rule.select_by_cost({"cheap": cheap, "dear": row(ratio=2.0)}, BASE)
    assert out["selected"] == "dear"
    assert set(out["failing"]["cheap"]) == {condition}
    assert out["failing"]["cheap"][condition] == pytest.approx(margin, abs=1e-9)
    assert out["binding"][condition] == ["cheap"]
    assert all(out["binding"][c] == [] for c in rule.CONDITIONS if c != condition)


def test_the_bounds_are_inclusive(rule):
    """Exactly the floor and exactly the deep ensemble's numbers clear (float rounding included)."""
    edge = row(acc=0.80 - 0.005, nll=0.50, auroc=0.80, ratio=1.0)
    out = rule.select_by_cost({"edge": edge}, BASE)
    assert out["selected"] == "edge"
    assert out["thresholds"] == pytest.approx({"accuracy": 0.795, "nll": 0.50, "auroc_msp": 0.80})


def test_the_bounds_come_from_the_right_baseline(rule):
    """Accuracy from the single model (not the deep ensemble's 0.81); NLL and AUROC from the deep ensemble."""
    out = rule.select_by_cost({"r": row(acc=0.796)}, BASE)
    assert out["selected"] == "r"  # 0.796 < 0.81 - 0.005 but >= 0.80 - 0.005
    swapped = {"single": BASE["deep-ensemble"], "deep-ensemble": BASE["single"]}
    out = rule.select_by_cost({"r": row(acc=0.796, nll=0.55, auroc=0.75)}, swapped)
    assert set(out["failing"]["r"]) == {"accuracy"}  # 0.796 < 0.805; NLL 0.55 <= 0.60, AUROC 0.75 >= 0.70


def test_ties_on_cost_go_to_the_lower_nll_then_the_name(rule):
    out = rule.select_by_cost({"x": row(nll=0.45), "y": row(nll=0.40), "z": row(ratio=1.0, nll=0.49)}, BASE)
    assert out["selected"] == "z"  # cheaper wins over a lower NLL
    out = rule.select_by_cost({"x": row(nll=0.45), "y": row(nll=0.40)}, BASE)
    assert out["selected"] == "y"
    out = rule.select_by_cost({"b": row(), "a": row()}, BASE)
    assert out["selected"] == "a"
    # a ratio equal up to float rounding is a tie too
    out = rule.select_by_cost({"x": row(ratio=1.2, nll=0.45), "y": row(ratio=1.2 + 1e-12, nll=0.40)}, BASE)
    assert out["selected"] == "y"


def test_none_eligible_names_what_binds_each_row(rule):
    cands = {"cheap": row(acc=0.70, ratio=1.0), "mid": row(nll=0.55, auroc=0.75, ratio=1.2),
             "dear": row(nll=0.52, ratio=2.5), "worse": row(acc=0.70, nll=0.9, auroc=0.5, ratio=2.6)}
    out = rule.select_by_cost(cands, BASE)
    assert out["selected"] is None and out["eligible"] == [] and out["within_target"] is None
    assert set(out["failing"]["cheap"]) == {"accuracy"}
    assert set(out["failing"]["mid"]) == {"nll", "auroc_msp"}
    assert set(out["failing"]["dear"]) == {"nll"}
    assert out["binding"] == {"accuracy": ["cheap", "worse"], "nll": ["mid", "dear", "worse"],
                              "auroc_msp": ["mid", "worse"]}
    assert out["frontier"] == ["cheap", "mid", "dear"]  # 'worse' is dominated by 'dear'
    why = out["why"]
    assert "deploy the single model" in why and "nll fails 3 of 4" in why
    assert "cheap (1.00x): accuracy (-0.0950)" in why and "worse" not in why.split("what binds")[1]


def test_a_missing_metric_fails_its_condition(rule):
    out = rule.select_by_cost({"no-ood": {"accuracy": 0.8, "nll": 0.4, "flops_ratio": 1.0}}, BASE)
    assert out["selected"] is None
    assert list(out["failing"]["no-ood"]) == ["auroc_msp"] and math.isnan(out["failing"]["no-ood"]["auroc_msp"])
    assert "auroc_msp (missing)" in out["why"]


@pytest.mark.parametrize(("baselines", "field"), [
    ({"deep-ensemble": BASE["deep-ensemble"]}, "baselines['single']"),
    ({"single": BASE["single"]}, "baselines['deep-ensemble']"),
    ({"single": BASE["single"], "deep-ensemble": {"accuracy": 0.8, "nll": 0.5}}, "'auroc_msp'"),
    ({"single": {"nll": 0.5}, "deep-ensemble": BASE["deep-ensemble"]}, "'accuracy'"),
])
def test_a_missing_baseline_is_an_error_that_names_it(rule, baselines, field):
    with pytest.raises(ValueError, match=field.replace("[", r"\[").replace("]", r"\]")):
        rule.select_by_cost({"a": row()}, baselines)


@pytest.mark.parametrize("ratio", [None, 0.0, float("nan"), float("inf")])
def test_a_row_without_a_cost_is_an_error(rule, ratio):
    bad = row()
    bad["flops_ratio"] = ratio
    with pytest.raises(ValueError, match="candidate 'bad' has flops_ratio"):
        rule.select_by_cost({"bad": bad}, BASE)


def test_the_rule_text_states_every_condition(rule):
    for words in ("single model's - 0.005", "NLL <= the deep ensemble's", "AUROC (MSP) >= the deep ensemble's",
                  "smallest analytic FLOPs ratio", "ties: lower NLL, then name"):
        assert words in rule.RULE
