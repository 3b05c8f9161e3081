"""The diversity benchmark's selection rule (validation data only), on hand-made validation numbers."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _row(acc: float, auroc: float, nll: float, gain_nll: tuple, gain_auroc: tuple) -> dict:
    def g(lo_hi):
        return {"gain": sum(lo_hi) / 2, "ci": list(lo_hi), "excludes_zero": lo_hi[0] > 0 or lo_hi[1] < 0}

    return {"selection": {"hydra": {"accuracy": acc, "auroc_msp": auroc, "nll": nll},
                          "gain": {"nll": g(gain_nll), "auroc_msp": g(gain_auroc)}}}


def test_a_strategy_whose_diversity_pays_off_wins_over_a_more_accurate_one(diversity_run):
    rows = {
        "accurate": _row(0.76, 0.62, 0.60, (0.005, 0.007), (-0.01, -0.002)),  # OOD gain below 0
        "diverse": _row(0.70, 0.75, 0.70, (0.004, 0.006), (0.003, 0.015)),
        "diverse-worse": _row(0.69, 0.80, 0.72, (0.004, 0.006), (0.001, 0.010)),  # > slack below "diverse"
    }
    name, why = diversity_run.select(rows, slack=0.005)
    assert name == "diverse"
    assert "diverse, diverse-worse" in why and "accurate" not in why.split(":")[1]


def test_without_a_qualified_strategy_accuracy_then_ood_auroc_decide(diversity_run):
    rows = {
        "a": _row(0.760, 0.60, 0.60, (0.005, 0.007), (-0.01, 0.004)),  # interval includes 0
        "b": _row(0.755, 0.64, 0.62, (0.005, 0.007), (-0.02, -0.01)),
        "c": _row(0.700, 0.90, 0.70, (-0.001, 0.002), (0.01, 0.02)),  # NLL interval includes 0
    }
    name, why = diversity_run.select(rows, slack=0.01)
    assert name == "b"
    assert "none, so every strategy stays in" in why


def test_rows_without_validation_numbers_are_not_selectable(diversity_run):
    rows = {"old": {"selection": {}}, "new": _row(0.7, 0.7, 0.7, (0.001, 0.002), (0.001, 0.002))}
    assert diversity_run.select(rows, slack=0.01)[0] == "new"
    assert not diversity_run._pays_off({"gain": {"nll": {"ci": [0.001, 0.002]}}})  # no OOD gain: does not qualify


def test_every_strategy_spells_out_its_scoring_and_recovery(diversity_run):
    """The table must not move with the default recipe's own choices (criterion, recovery steps)."""
    from toolchain.recipe import CompareEntry, load_recipe

    recipe = load_recipe(ROOT / "recipes" / "minilm-tweets.yaml")
    for name, over in diversity_run.STRATEGIES.items():
        assert "criterion" in over["scoring"], name
        steps = over["pruning"]["recovery"]["steps"]
        assert steps == (100 if name.endswith("-recovery") else 0), name
        variant = recipe.variant(CompareEntry(name=name, **over))
        assert variant.pruning.recovery.steps == steps and variant.scoring.criterion == over["scoring"]["criterion"]


def test_the_default_recipe_builds_the_strategy_the_benchmark_selected(diversity_run):
    """The committed results name the selected strategy; the default recipe's Hydra must be exactly it."""
    import json

    from toolchain.recipe import CompareEntry, load_recipe

    selected = json.loads((ROOT / "benchmarks" / "diversity" / "results.json").read_text())["selected"]
    recipe = load_recipe(ROOT / "recipes" / "minilm-tweets.yaml")
    variant = recipe.variant(CompareEntry(name=selected, **diversity_run.STRATEGIES[selected]))
    for section in ("model", "data", "finetune", "scoring", "pruning"):
        assert variant.digest(section) == recipe.digest(section), (selected, section)
