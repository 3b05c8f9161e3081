"""benchmarks/diversity/heldout.py: held-out rows (real tweets and BBC data) and the stage lookup by cache key."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from toolchain.data.containers import TextData
from toolchain.pipeline import Context
from toolchain.recipe import load_recipe

ROOT = Path(__file__).resolve().parents[2]


def test_fresh_rows_drops_texts_of_other_splits_and_repeats(diversity_heldout):
    part = TextData(["a", "b", "a", "c", "d", "c"], np.array([0, 1, 0, 1, 0, 1]), ["x", "y"], "t")
    keep, dropped = diversity_heldout._fresh_rows(part, {"d"})
    assert keep == [0, 1, 3] and dropped == 3


def test_heldout_rows_are_new_and_the_recipe_splits_unchanged(diversity_heldout):
    ctx = Context(load_recipe(ROOT / "recipes" / "minilm-tweets.yaml", profile="quick"))
    id_part, ood_part, info = diversity_heldout.heldout_splits(ctx, id_rows=500)
    assert 450 <= len(id_part) <= 500 and info["heldout"]["rows"] == len(id_part)
    used_id = {t for s in ("train", "val", "calib", "test") for t in ctx.data[s].texts}
    used_ood = {t for s in ("ood_val", "ood_test") for t in ctx.data[s].texts}
    assert not used_id & set(id_part.texts) and len(set(id_part.texts)) == len(id_part)
    assert not used_ood & set(ood_part.texts) and len(set(ood_part.texts)) == len(ood_part)
    # every BBC article the quick splits leave over, less the duplicates (the set has some)
    left = info["ood_heldout"]["left_after_splits"]
    assert left == 2225 - 32 - 64 and len(ood_part) == left - info["ood_heldout"]["dropped_duplicates"] > 2000
    # the same rows on a second call (seeded)
    again, _, _ = diversity_heldout.heldout_splits(ctx, id_rows=500)
    assert again.texts == id_part.texts


def test_stage_folder_finds_a_variant_with_the_recipes_key_and_nothing_else(diversity_heldout, tmp_path):
    recipe = load_recipe(ROOT / "recipes" / "minilm-tweets.yaml", profile="quick").model_copy(
        update={"artifacts_dir": str(tmp_path)})
    ctx = Context(recipe)
    own = ctx.stage_dir("fuse")
    other = ctx.root / "variants" / "b" / "fuse"
    same = ctx.root / "variants" / "c" / "fuse"
    for folder, key in [(own, "stale"), (other, "0123"), (same, ctx.key("fuse"))]:
        folder.mkdir(parents=True)
        (folder / "manifest.json").write_text(json.dumps({"key": key}))
    assert diversity_heldout.stage_folder(ctx, "fuse") == same
    with pytest.raises(SystemExit, match="no 'prune' stage with key"):
        diversity_heldout.stage_folder(ctx, "prune")
