"""A user's own CSV data set (``data.id: csv:PATH``): bad files through the CLI, and the loader's rules.

Through ``hydra-toolchain load``: one clear ``error:`` paragraph naming the file and what to do,
exit code 2 (a data error), no traceback, and the artifacts of an earlier good run unchanged.
"""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest
import yaml
from reliability_cli import check_error, cli, snapshot

from toolchain.data import load_dataset, resolve_csv_id, source_digest, split_indices
from toolchain.data.csv_sets import load_csv
from toolchain.errors import DataError

SPLITS = {"train": 8, "calib": 4, "test": 4}


def write_csv(path: Path, rows: list[tuple[str, object]], header: tuple[str, ...] = ("text", "label")) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        writer.writerows(rows)
    return path


def two_class_rows(n: int = 24) -> list[tuple[str, object]]:
    return [(f"example number {i}, with a comma", "pos" if i % 2 else "neg") for i in range(n)]


def recipe(folder: Path, name: str, data_id: str, **extra) -> Path:
    body = {"name": "csvrel", "model": {"source": "packaged:all-MiniLM-L6-v2", "max_length": 16},
            "data": {"id": data_id, "splits": SPLITS}, "artifacts_dir": str(folder / "art"), **extra}
    path = folder / name
    path.write_text(yaml.safe_dump(body))
    return path


@pytest.fixture(scope="module")
def good(tmp_path_factory) -> Path:
    """A folder whose recipe uses a relative ``csv:`` path, loaded once from another working directory."""
    tmp = tmp_path_factory.mktemp("csvdata")
    write_csv(tmp / "data" / "good.csv", two_class_rows())
    out = cli("load", str(recipe(tmp, "good.yaml", "csv:data/good.csv")), cwd=Path("/"))
    assert out.returncode == 0, out.stderr[-3000:]
    summary = yaml.safe_load((tmp / "art" / "csvrel" / "load" / "summary.json").read_text())
    assert summary["classes"] == ["neg", "pos"]
    assert sum(summary["splits"]["train"]["classes"].values()) == 8
    return tmp


def _bad_load(good: Path, name: str, data_id: str, **extra):
    before = snapshot(good / "art")
    out = cli("load", str(recipe(good, name, data_id, **extra)), cwd=Path("/"))
    assert snapshot(good / "art") == before, "a failed load must not touch the artifacts"
    return out


def test_one_class_only(good):
    path = write_csv(good / "data" / "one.csv", [(f"text {i}", "pos") for i in range(10)])
    out = _bad_load(good, "one.yaml", "csv:data/one.csv")
    check_error(out, 2, "needs at least 2 classes: found only 'pos' in", str(path), "Add examples")


def test_missing_file_missing_column_and_empty_file(good):
    check_error(_bad_load(good, "missing.yaml", "csv:data/nowhere.csv"), 2,
                str(good / "data" / "nowhere.csv"), "does not exist", "text,label")
    write_csv(good / "data" / "nocol.csv", [("a", "x")], header=("sentence", "label"))
    check_error(_bad_load(good, "nocol.yaml", "csv:data/nocol.csv"), 2,
                "nocol.csv", "no column 'text'", "['sentence', 'label']", "text,label")
    (good / "data" / "empty.csv").write_text("")
    check_error(_bad_load(good, "empty.yaml", "csv:data/empty.csv"), 2, "empty.csv", "is empty", "text,label")


def _seed_without_rare_class_in_train(path: Path) -> int:
    labels = load_csv(f"csv:{path}").labels
    for seed in range(200):
        if 1 not in labels[split_indices(labels, SPLITS, seed)["train"]]:
            return seed
    raise AssertionError("no seed leaves the rare class out of train")


def test_a_split_with_one_class_names_the_split_and_the_field(good):
    rows = [(f"common text {i}", "a") for i in range(30)] + [("the only rare text", "b")]
    path = write_csv(good / "data" / "rare.csv", rows)
    seed = _seed_without_rare_class_in_train(path)
    out = _bad_load(good, "rare.yaml", "csv:data/rare.csv", seed=seed)
    check_error(out, 2, "split 'train'", "csv:rare.csv", "has 1 class(es) (a)", "no example of 'b'",
                "data.splits.train")


# ------------------------------------------------------------------------------------ loader rules


def test_integer_labels_sort_numerically_and_keep_their_meaning(tmp_path):
    path = write_csv(tmp_path / "ints.csv", [("a", 10), ("b", 2), ("c", 2), ("d", 10), ("e", 0)])
    data = load_dataset(f"csv:{path}")
    assert data.class_names == ["0", "2", "10"]
    assert data.texts == ["a", "b", "c", "d", "e"] and data.labels.tolist() == [2, 1, 1, 2, 0]
    assert data.name == "csv:ints.csv"


def test_one_number_spelled_two_ways_is_not_two_classes(good):
    rows = [(f"row {i}", ("1" if i % 3 == 0 else "1.0") if i % 2 else "0") for i in range(24)]
    write_csv(good / "data" / "spelled.csv", rows)
    out = _bad_load(good, "spelled.yaml", "csv:data/spelled.csv")
    check_error(out, 2, "spelled.csv", "'1' (4 rows)", "'1.0' (8 rows)", "3 in all: 0, 1, 1.0", "one way")


def test_header_case_bom_extra_columns_blank_lines_and_duplicates(tmp_path):
    path = tmp_path / "x.csv"
    path.write_bytes("\ufeffID, Label ,TEXT\n1,pos,\"hello, world\"\n\n2,neg,bye\n3,neg,bye\n4,pos,same\n5,neg,same\n"
                     .encode())
    data = load_csv(f"csv:{path}")
    # "bye" twice with one label: one copy kept; "same" with conflicting labels: every copy dropped
    assert data.texts == ["hello, world", "bye"] and data.class_names == ["neg", "pos"]
    assert data.labels.tolist() == [1, 0]


@pytest.mark.parametrize(("content", "needle"), [
    (b"text,label\nfine,a\n,b\n", "line 3: the text is empty"),
    (b"text,label\nfine,a\nalso fine,\n", "line 3: the label is empty"),
    (b"text,label\nfine,a\nshort\n", "line 3: 1 field(s)"),
    (b"text,label\n", "has a header but no rows"),
    (b"text,label\ncaf\xe9,a\nb,b\n", "not UTF-8 text (line 2"),
    (b"   \n\n", "is empty"),
])
def test_malformed_files_name_the_file_and_line(tmp_path, content, needle):
    path = tmp_path / "bad.csv"
    path.write_bytes(content)
    with pytest.raises(DataError) as info:
        load_csv(f"csv:{path}")
    assert needle in info.value.message and str(path) in info.value.message and "\n" not in str(info.value)
    assert info.value.exit_code == 2


def test_one_class_after_dropping_conflicting_duplicates(tmp_path):
    path = write_csv(tmp_path / "dup.csv", [("x", "a"), ("x", "b"), ("y", "a")])
    with pytest.raises(DataError, match=r"found only 'a' in .* \(1 rows after dropping 2 duplicate row\(s\)\)"):
        load_csv(f"csv:{path}")


def test_an_ood_set_may_hold_one_class(tmp_path):
    path = write_csv(tmp_path / "ood.csv", [("far away", "ood"), ("elsewhere", "ood")])
    assert load_dataset(f"csv:{path}", min_classes=1).class_names == ["ood"]


def test_folder_and_empty_path(tmp_path):
    with pytest.raises(DataError, match="is not a file"):
        load_csv(f"csv:{tmp_path}")
    with pytest.raises(DataError, match="no file after 'csv:'"):
        load_dataset("csv:")


def test_resolve_and_digest(tmp_path):
    assert resolve_csv_id("csv:d/x.csv", tmp_path) == f"csv:{tmp_path / 'd' / 'x.csv'}"
    assert resolve_csv_id("csv:/abs/x.csv", tmp_path) == "csv:/abs/x.csv"
    assert resolve_csv_id("tweets", tmp_path) == "tweets"
    path = write_csv(tmp_path / "d.csv", two_class_rows(4))
    first = source_digest(f"csv:{path}")
    write_csv(path, two_class_rows(6))
    assert source_digest(f"csv:{path}") != first and source_digest("tweets") is None
    assert len(load_csv(f"csv:{path}")) == 6  # the in-process cache notices the edit


def test_csv_ids_are_not_lower_cased(tmp_path):
    path = write_csv(tmp_path / "MixedCase.csv", two_class_rows(4))
    assert len(load_dataset(f"CSV:{path}")) == 4
    assert np.array_equal(load_dataset(f"csv:{path}").labels, [0, 1, 0, 1])


def test_a_10_mb_field_loads(tmp_path):
    """csv's default field limit is 128 KiB ("field larger than field limit"); a long document must load."""
    long_text = "word " * 2_000_000  # 10 MB in one field
    write_csv(tmp_path / "data" / "big.csv", [(long_text, "pos"), *two_class_rows()])
    data = load_csv(f"csv:{tmp_path / 'data' / 'big.csv'}")
    assert len(data) == 25 and len(data.texts[0]) == 10_000_000
    out = cli("load", str(recipe(tmp_path, "big.yaml", "csv:data/big.csv")), cwd=Path("/"))
    assert out.returncode == 0, out.stderr[-3000:]
    summary = yaml.safe_load((tmp_path / "art" / "csvrel" / "load" / "summary.json").read_text())
    assert sum(summary["splits"]["train"]["classes"].values()) == 8
