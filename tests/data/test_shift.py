"""The corruption suites: seeded, nested across severities (so severity-monotone), label-preserving."""

from __future__ import annotations

import difflib
import itertools

import numpy as np
import pytest

from toolchain.data import ImageData, TextData
from toolchain.data.shift import (
    IMAGE_CORRUPTIONS,
    SEVERITIES,
    TEXT_CORRUPTIONS,
    corrupt,
    corrupt_images,
    corrupt_texts,
    corruptions_for,
)
from toolchain.errors import DataError

TEXTS = ["I can't believe how good this morning's coffee was, honestly the best in town!",
         "worst customer service ever, waited two hours and nobody called back",
         "ok", "Flight delayed again... guess I'll be sleeping at the airport tonight."] * 10


def _text_distance(a: list[str], b: list[str]) -> float:
    """Mean character-level dissimilarity (1 - difflib ratio)."""
    return float(np.mean([1.0 - difflib.SequenceMatcher(None, x, y).ratio() for x, y in zip(a, b, strict=True)]))


@pytest.fixture(scope="module")
def images() -> np.ndarray:
    from scipy import ndimage
    from sklearn.datasets import load_digits

    digits = load_digits().images[:40]  # 8x8 in 0..16, smoothly scaled up to 28x28 uint8 (Fashion-MNIST's size)
    return np.clip(np.rint(ndimage.zoom(digits * 15.9, (1, 3.5, 3.5), order=1)), 0, 255).astype(np.uint8)


@pytest.mark.parametrize("kind", list(TEXT_CORRUPTIONS))
def test_text_corruptions_are_seeded_and_grow_with_severity(kind):
    runs = [corrupt_texts(TEXTS, kind, s, seed=3) for s in SEVERITIES]
    assert corrupt_texts(TEXTS, kind, 2, seed=3) == runs[1]  # the same seed, the same texts
    assert corrupt_texts(TEXTS, kind, 5, seed=4) != runs[4]  # another seed, other draws
    distances = [_text_distance(TEXTS, r) for r in runs]
    assert 0 < distances[0] and all(a <= b for a, b in itertools.pairwise(distances)), distances
    assert distances[-1] > 2 * distances[0]
    assert all(r.strip() for run in runs for r in run)  # no text becomes empty


def test_text_positions_changed_at_one_severity_are_changed_at_the_next():
    # word dropout: the words dropped at severity s are dropped at s + 1 too
    for s in SEVERITIES[:-1]:
        lighter, heavier = corrupt_texts(TEXTS, "word_dropout", s), corrupt_texts(TEXTS, "word_dropout", s + 1)
        for text, a, b in zip(TEXTS, lighter, heavier, strict=True):
            assert len(b.split()) <= len(a.split()) <= len(text.split())


@pytest.mark.parametrize("kind", list(IMAGE_CORRUPTIONS))
def test_image_corruptions_are_seeded_and_grow_with_severity(kind, images):
    runs = [corrupt_images(images, kind, s, seed=3) for s in SEVERITIES]
    assert all(r.dtype == np.uint8 and r.shape == images.shape for r in runs)
    assert np.array_equal(corrupt_images(images, kind, 3, seed=3), runs[2])
    distances = [float(np.abs(r.astype(np.float32) - images).mean()) for r in runs]
    assert 0 < distances[0] and all(a < b for a, b in itertools.pairwise(distances)), distances
    assert not np.array_equal(images, runs[0])


def test_containers_keep_rows_order_and_labels(images):
    labels = np.arange(len(TEXTS)) % 3
    text = TextData(list(TEXTS), labels, ["a", "b", "c"], "t")
    out = corrupt(text, "typos", 4, seed=1)
    assert isinstance(out, TextData) and out.name == "t+typos@4" and len(out) == len(text)
    assert np.array_equal(out.labels, labels) and out.class_names == text.class_names
    assert out.texts != text.texts and text.texts == list(TEXTS)  # the input is untouched
    image = ImageData(images, np.arange(len(images)) % 10, [str(i) for i in range(10)], "d")
    out = corrupt(image, "rotate", 5)
    assert isinstance(out, ImageData) and np.array_equal(out.labels, image.labels) and out.images.shape == images.shape
    assert corruptions_for(text) == tuple(TEXT_CORRUPTIONS) and corruptions_for(image) == tuple(IMAGE_CORRUPTIONS)


def test_bad_kind_or_severity_names_them():
    with pytest.raises(DataError, match="unknown text corruption 'typo'"):
        corrupt_texts(TEXTS, "typo", 1)
    with pytest.raises(DataError, match="severity must be one of"):
        corrupt_texts(TEXTS, "typos", 6)
    with pytest.raises(DataError, match="unknown image corruption"):
        corrupt_images(np.zeros((1, 4, 4), np.uint8), "fog", 1)
