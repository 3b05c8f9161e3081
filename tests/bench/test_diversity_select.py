"""The diversity benchmark's strategies are spelled out, and the recipes build what it selected.

The selection rule itself is tested in test_selection_rule.py."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_every_strategy_spells_out_its_scoring_and_recovery(diversity_run):
    """The table must not move with the default recipe's own choices (criterion, recovery steps)."""
    from toolchain.recipe import CompareEntry, load_recipe

    recipe = load_recipe(ROOT / "recipes" / "minilm-tweets.yaml")
    every = diversity_run.candidates(None)  # the budget rows at every ratio too
    for name, over in every.items():
        assert "criterion" in over["scoring"], name
        steps = over["pruning"]["recovery"]["steps"]
        own = ("-recovery" in name or "-distill" in name) and not name.endswith("-e2e-only")  # e2e: fused only
        assert steps == (100 if own else 0), name
        # a recipe's own distillation (the ViT recipe's) must not leak into a row that does not say so
        assert over["pruning"]["recovery"]["distill"] == (0.5 if "-distill" in name else 0.0), name
        # the levers after pruning say so in their names, and only they move the fusion section
        fusion = over.get("fusion", {})
        assert fusion.get("temperature", False) == name.endswith("-ts"), name
        assert fusion.get("recovery_steps", 0) == (300 if "-fused300" in name else 0), name
        assert over["scoring"].get("task_weight", 0.0) == (1.0 if "-task1" in name else 0.0), name
        variant = recipe.variant(CompareEntry(name=name, **over))
        assert variant.pruning.recovery.steps == steps and variant.scoring.criterion == over["scoring"]["criterion"]
        # the recipe's own fusion (the default recipe's 300 end-to-end steps) must not leak into a row either
        assert variant.fusion.recovery_steps == (300 if "-fused300" in name else 0), name
        assert variant.fusion.temperature == name.endswith("-ts"), name
        assert variant.fusion.mlp == ("grouped" if "-mlp-grouped" in name else "average"), name
        # nor the recipe's cost levers (the default recipe's MLP slices would not even fuse with an averaged MLP)
        assert (variant.pruning.mlp_share, variant.pruning.mlp_core, variant.pruning.fork) == (None, 0.0, 0), name


def test_the_rows_a_recipe_leaves_out_are_strategies_far_below_the_floor(diversity_run):
    """A left-out row names a real strategy, and no lever row is left out (they are what issue 33 measures)."""
    for recipe, skipped in diversity_run.SKIP.items():
        assert skipped and set(skipped) <= set(diversity_run.STRATEGIES), recipe
        assert not set(skipped) & set(diversity_run.LEVERS), recipe


@pytest.mark.parametrize(("recipe_file", "results", "cost"), [
    ("minilm-tweets.yaml", "benchmarks/diversity/results.json", "benchmarks/cost_levers/results.json"),
    ("vit-fashion-mnist.yaml", "benchmarks/diversity/vit/results.json", None),
])
def test_the_recipe_builds_the_strategy_its_benchmark_selected(diversity_run, recipe_file, results, cost):
    """The committed results name the selected strategy; the recipe's Hydra must be exactly it, with the cost
    levers the cost benchmark then selected on top (``benchmarks/cost_levers``: the MLP slices, the fork)."""
    import json

    from bench_scripts import load_script

    from toolchain.recipe import CompareEntry, load_recipe

    selected = json.loads((ROOT / results).read_text())["selected"]
    recipe = load_recipe(ROOT / "recipes" / recipe_file)
    every = diversity_run.candidates(None)  # all three budget rows: a budget row may have won
    variant = recipe.variant(CompareEntry(name=selected, **every[selected]))
    if cost:  # the cost row's levers merged over the strategy, as a variant merges over a recipe
        row = json.loads((ROOT / cost).read_text())["verdict"]["selected"]
        levers = load_script("benchmarks/cost_levers/rows.py", "cost_levers_rows").ROWS[row]
        variant = variant.variant(CompareEntry(name=row, **levers))
    for section in ("model", "data", "finetune", "scoring", "pruning", "fusion"):
        assert variant.digest(section) == recipe.digest(section), (selected, section)
    # a temperature-scaled Hydra is deployed beside temperature-scaled baselines, as the rule compared them
    assert recipe.baselines.temperature == variant.fusion.temperature


def test_a_row_takes_the_stages_whose_keys_another_row_or_the_recipe_has(diversity_run, tmp_path):
    """reuse_stages links a folder only where the manifest key equals the row's own key, stage by stage."""
    import json
    from types import SimpleNamespace

    from rich.console import Console

    root = tmp_path / "minilm-tweets"

    def folder(path, key, payload):
        path.mkdir(parents=True)
        (path / "manifest.json").write_text(json.dumps({"key": key}))
        (path / "out.txt").write_text(payload)

    folder(root / "prune", "p1", "recipe prune")                      # the recipe's own: same prune key
    folder(root / "variants" / "other" / "fuse", "f1", "other fuse")  # another row's: same fuse key
    folder(root / "variants" / "other" / "evaluate", "e-other", "x")  # another key: not taken
    keys = {"prune": "p1", "fuse": "f1", "evaluate": "e1"}
    ctx = SimpleNamespace(root=root, stage_dir=lambda s: root / s)
    sub = SimpleNamespace(stage_dir=lambda s: root / "variants" / "row" / s, key=keys.__getitem__)
    reused = diversity_run.reuse_stages(ctx, sub, Console(file=None, quiet=True))
    assert reused == {"prune": "prune", "fuse": "variants/other/fuse"}
    row = root / "variants" / "row"
    assert (row / "prune" / "out.txt").read_text() == "recipe prune"
    assert (row / "fuse" / "out.txt").read_text() == "other fuse"
    assert not (row / "evaluate").exists()
    index = json.loads((row / "pipeline.json").read_text())["stages"]  # what `verify` checks the row's folder by
    assert index == {"prune": {"key": "p1", "folder": "prune"}, "fuse": {"key": "f1", "folder": "fuse"}}
    assert diversity_run.reuse_stages(ctx, sub, Console(quiet=True)) == {}  # already in place: nothing to do
