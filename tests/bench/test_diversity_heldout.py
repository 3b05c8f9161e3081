"""benchmarks/diversity/heldout.py: held-out rows (real tweets and BBC data) and the stage lookup by cache key."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from toolchain.data.containers import ImageData, TextData
from toolchain.data.overlap import row_keys
from toolchain.pipeline import Context
from toolchain.recipe import load_recipe

ROOT = Path(__file__).resolve().parents[2]


def test_fresh_rows_drops_rows_of_other_splits_and_repeats(diversity_heldout):
    part = TextData(["a", "b", "a ", "c", "d", "c"], np.array([0, 1, 0, 1, 0, 1]), ["x", "y"], "t")
    keys = list(row_keys(part))
    keep, dropped = diversity_heldout._fresh_rows(keys, {("text", "d")})
    assert keep == [0, 1, 3] and dropped == 3  # "a " repeats "a" after whitespace normalisation
    # a visiting order and a limit: the first two fresh rows in that order, indices sorted
    keep, dropped = diversity_heldout._fresh_rows(keys, set(), order=[5, 4, 3, 2], limit=2)
    assert keep == [4, 5] and dropped == 0
    keep, dropped = diversity_heldout._fresh_rows(keys, set(), order=[5, 3, 4], limit=2)
    assert keep == [4, 5] and dropped == 1  # row 3 repeats row 5
    images = np.zeros((3, 4, 4), np.uint8)
    images[1, 0, 0] = 7
    img = ImageData(images, np.array([0, 1, 0]), ["x", "y"], "i")
    # image 2 repeats image 0 byte for byte
    assert diversity_heldout._fresh_rows(list(row_keys(img)), set()) == ([0, 1], 1)


def test_heldout_rows_are_new_and_the_recipe_splits_unchanged(diversity_heldout):
    ctx = Context(load_recipe(ROOT / "recipes" / "minilm-tweets.yaml", profile="quick"))
    parts, info = diversity_heldout.heldout_splits(ctx, id_rows=500, near_rows=300)
    id_part, ood_part, near = parts["heldout"], parts["ood_heldout"], parts["near_ood_heldout"]
    assert 450 <= len(id_part) <= 500 and info["heldout"]["rows"] == len(id_part)
    used_id = {t for s in ("train", "val", "calib", "test") for t in ctx.data[s].texts}
    used_ood = {t for s in ("ood_val", "ood_test") for t in ctx.data[s].texts}
    assert not used_id & set(id_part.texts) and len(set(id_part.texts)) == len(id_part)
    assert not used_ood & set(ood_part.texts) and len(set(ood_part.texts)) == len(ood_part)
    # every BBC article the quick splits leave over, less the duplicates (the set has some)
    left = info["ood_heldout"]["left_after_splits"]
    assert left == 2225 - 32 - 64 and len(ood_part) == left - info["ood_heldout"]["dropped_duplicates"] > 2000
    # near OOD: Coachella tweets that the recipe's near_ood_test rows did not take, none repeated
    used_near = set(ctx.data["near_ood_test"].texts)
    assert len(near) == info["near_ood_heldout"]["rows"] == 300
    assert not (used_near | used_id) & set(near.texts) and len(set(near.texts)) == 300
    assert all("coachella" in t.lower() for t in near.texts)
    # the same rows on a second call (seeded)
    again, _ = diversity_heldout.heldout_splits(ctx, id_rows=500, near_rows=300)
    assert again["heldout"].texts == id_part.texts and again["near_ood_heldout"].texts == near.texts


def test_heldout_rows_of_the_image_recipe(diversity_heldout):
    ctx = Context(load_recipe(ROOT / "recipes" / "vit-fashion-mnist.yaml", profile="quick"))
    parts, info = diversity_heldout.heldout_splits(ctx, id_rows=400, near_rows=200)
    assert [len(parts[k]) for k in ("heldout", "near_ood_heldout")] == [400, 200]
    near_classes = {ctx.data["near_ood_test"].class_names[i] for i in parts["near_ood_heldout"].labels}
    assert near_classes <= {"Shirt", "Ankle boot"}
    used = {k for s in ctx.data for k in row_keys(ctx.data[s])}
    for part in parts.values():
        keys = list(row_keys(part))
        assert len(set(keys)) == len(keys) and not used & set(keys)
    # every digit the recipe's OOD splits leave (1,797 digits, 32 + 64 in quick splits), less repeats
    assert info["ood_heldout"]["left_after_splits"] == 1797 - 32 - 64
    # near OOD: the rows near_ood_test took are left out before counting duplicates (a handful at most)
    assert info["near_ood_heldout"]["dropped_duplicates"] < 10  # not the ~1/12 of rows near_ood_test took


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
