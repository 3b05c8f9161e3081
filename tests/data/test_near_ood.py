"""Near-OOD hold-out: held rows never reach an ID split; class hold-out renumbers the label space."""

from __future__ import annotations

import numpy as np
import pytest

from toolchain.data import ImageData, TextData, load_tweets
from toolchain.data.near_ood import hold_out
from toolchain.errors import DataError

CLASSES = ["cat", "dog", "bird", "fish"]


def _images(n: int = 40) -> ImageData:
    rng = np.random.default_rng(0)
    labels = np.arange(n) % 4
    images = (labels[:, None, None] * 60 + rng.integers(0, 10, (n, 6, 6))).astype(np.uint8)  # label in the pixels
    return ImageData(images, labels, CLASSES, "pets")


def test_class_hold_out_removes_the_classes_and_renumbers_the_rest():
    data = _images()
    kept, held = hold_out(data, classes=["dog", "fish"])
    assert kept.class_names == ["cat", "bird"] and kept.name == "pets" and held.name == "pets/near-ood"
    assert len(kept) + len(held) == len(data) and len(held) == 20
    # every kept image keeps its content and gets its class's new index; held rows are exactly dog and fish
    old = kept.images[:, 0, 0] // 60
    assert np.array_equal(kept.labels, np.where(old == 0, 0, 1)) and set(old) == {0, 2}
    assert set(held.labels) == {1, 3} and set(held.images[:, 0, 0] // 60) == {1, 3}


def test_match_hold_out_keeps_labels_and_takes_every_matching_text():
    texts = ["Coachella lineup is out!", "my flight was late", "#COACHELLA2015 tickets", "great coffee", "ok"]
    data = TextData(texts, [2, 0, 1, 2, 1], ["negative", "neutral", "positive"], "tw")
    kept, held = hold_out(data, match="(?i)coachella")
    assert held.texts == [texts[0], texts[2]] and list(held.labels) == [2, 1]
    assert kept.texts == [texts[1], texts[3], texts[4]] and list(kept.labels) == [0, 2, 1]
    assert kept.class_names == data.class_names


@pytest.mark.parametrize(("kwargs", "pattern"), [
    ({}, "exactly one of 'classes'"),
    ({"classes": ["cat"], "match": "x"}, "exactly one of 'classes'"),
    ({"classes": ["cow"]}, r"data\.near_ood\.classes: \['cow'\] are not classes of 'pets'; its classes: cat, dog"),
    ({"classes": ["cat", "dog", "bird"]}, "leaves 1 class"),
    ({"match": "cat"}, r"data\.near_ood\.match: a text pattern needs text data"),
])
def test_bad_hold_outs_name_the_field(kwargs, pattern):
    with pytest.raises(DataError, match=pattern):
        hold_out(_images(), **kwargs)


def test_a_pattern_that_holds_out_nothing_or_everything_is_refused():
    data = TextData(["a b", "c d"], [0, 1], ["x", "y"], "t")
    with pytest.raises(DataError, match="no row of 't' is held out"):
        hold_out(data, match="zzz")
    with pytest.raises(DataError, match="every row of 't' would be held out"):
        hold_out(data, match=".")


def test_the_default_recipe_never_trains_scores_or_selects_on_a_coachella_tweet():
    from pathlib import Path

    from toolchain.data.batching import near_ood_rows
    from toolchain.pipeline import Context
    from toolchain.recipe import load_recipe

    root = Path(__file__).resolve().parents[2]
    ctx = Context(recipe=load_recipe(root / "recipes" / "minilm-tweets.yaml", profile="quick"))
    near = ctx.data["near_ood_test"]
    assert len(near) == 32 and all("coachella" in t.lower() for t in near.texts)
    id_texts = {t for name, part in ctx.data.items() if name in ("train", "val", "calib", "test") for t in part.texts}
    assert not any("coachella" in t.lower() for t in id_texts)
    assert not id_texts & set(near.texts)
    every = near_ood_rows(ctx.recipe.data)  # 3,758 unique Coachella tweets in the corpus (after de-duplication)
    assert len(every) == sum("coachella" in t.lower() for t in load_tweets().texts) > 3000
