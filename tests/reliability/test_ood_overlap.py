"""An OOD data set that repeats the in-distribution rows: refused (mostly shared) or trimmed (a few), via the CLI.

An OOD set identical to the ID set gave AUROC 0.50, reported as a result. Texts match after
whitespace normalisation, images when their pixels are byte-identical (toolchain/data/overlap.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml
from reliability_cli import check_error, cli

from toolchain.data import ImageData, TextData, make_splits
from toolchain.data.overlap import drop_id_rows
from toolchain.errors import DataError

ID_ROWS = [(f"in-distribution example number {i}, with a comma", "pos" if i % 2 else "neg") for i in range(24)]
OOD_ROWS = [(f"an unrelated far-away sentence {i}", "ood") for i in range(20)]


def _csv(path: Path, rows) -> Path:
    import csv

    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(("text", "label"))
        writer.writerows(rows)
    return path


def _recipe(folder: Path, ood_rows, ood_splits=None) -> Path:
    _csv(folder / "id.csv", ID_ROWS)
    _csv(folder / "ood.csv", ood_rows)
    body = {"name": "overlap", "model": {"source": "packaged:all-MiniLM-L6-v2", "max_length": 16},
            "data": {"id": "csv:id.csv", "ood": "csv:ood.csv", "splits": {"train": 8, "calib": 4, "test": 4},
                     "ood_splits": ood_splits or {"ood_val": 8, "ood_test": 12}},
            "artifacts_dir": str(folder / "art")}
    path = folder / "r.yaml"
    path.write_text(yaml.safe_dump(body))
    return path


def test_an_ood_set_identical_to_the_id_set_is_refused(tmp_path):
    out = cli("load", str(_recipe(tmp_path, ID_ROWS)), cwd=Path("/"))
    check_error(out, 2, "OOD data set 'csv:", "ood.csv' (data.ood) is identical to the in-distribution data set",
                "id.csv' (data.id)", "20 of its 20 OOD rows (", "ood_val: 8 of 8", "ood_test: 12 of 12",
                "AUROC about 0.5", "Choose an OOD data set that differs from data.id")
    assert not (tmp_path / "art" / "overlap" / "load").exists(), "a refused load publishes nothing"


def test_a_mostly_copied_ood_set_is_refused(tmp_path):
    # 14 ID texts (re-spaced: whitespace does not hide them) + 6 real OOD rows: 70 % shared
    copied = [("  " + t.replace(" ", "\t  ") + "\n", "ood") for t, _ in ID_ROWS[:14]]
    out = cli("load", str(_recipe(tmp_path, copied + OOD_ROWS[:6])), cwd=Path("/"))
    check_error(out, 2, "is mostly a copy of the in-distribution data set", "14 of its 20 OOD rows",
                "same text after whitespace normalisation")


def test_a_few_shared_rows_are_dropped_with_a_warning(tmp_path):
    shared = [(ID_ROWS[i][0].replace(", ", ",   ") + "  ", "ood") for i in (0, 5, 7)]  # re-spaced ID texts
    out = cli("load", str(_recipe(tmp_path, shared + OOD_ROWS[:17])), cwd=Path("/"))
    assert out.returncode == 0, out.stderr[-3000:]
    warning = [line for line in out.stderr.splitlines() if line.startswith("warning: ")]
    assert len(warning) == 1 and "dropped 3 of 20 OOD rows" in warning[0], out.stderr[-3000:]
    assert "in-distribution data set 'csv:" in warning[0] and "id.csv'" in warning[0]
    summary = json.loads((tmp_path / "art" / "overlap" / "load" / "summary.json").read_text())
    assert summary["splits"]["ood_val"]["size"] + summary["splits"]["ood_test"]["size"] == 17


def _images(seed: int, n: int, name: str) -> ImageData:
    rng = np.random.default_rng(seed)
    return ImageData(rng.integers(0, 256, (n, 8, 8), dtype=np.uint8), np.arange(n) % 2, ["a", "b"], name)


def test_images_match_when_byte_identical():
    ident = _images(0, 40, "id")
    ood = _images(1, 20, "ood")
    images = ood.images.copy()
    images[:2] = ident.images[[3, 9]]  # two byte-identical copies
    images[2] = ident.images[4]
    images[2, 0, 0] ^= 1  # one pixel differs: not a copy
    ood = ImageData(images, ood.labels, ood.class_names, "ood")
    splits = make_splits(ood, {"ood_val": 10, "ood_test": 10}, seed=1, class_checked=())
    warned: list[str] = []
    kept = drop_id_rows(ident, splits, id_name="id", ood_name="ood", warn=warned.append)
    assert sum(len(p) for p in kept.values()) == 18
    assert len(warned) == 1 and "dropped 2 of 20 OOD rows" in warned[0] and "byte-identical images" in warned[0]
    with pytest.raises(DataError, match=r"identical to the in-distribution data set 'id' .*40 of its 40 OOD rows"):
        drop_id_rows(ident, make_splits(ident, {"ood_val": 10, "ood_test": 30}, seed=1, class_checked=()),
                     id_name="id", ood_name="ood")


def test_no_overlap_returns_the_same_splits_and_text_never_matches_images():
    text = TextData([t for t, _ in ID_ROWS], np.arange(24) % 2, ["neg", "pos"], "id")
    ood = TextData([t for t, _ in OOD_ROWS], np.zeros(20, np.int64), ["ood"], "ood")
    splits = make_splits(ood, {"ood_val": 8, "ood_test": 12}, seed=1, class_checked=())
    kept = drop_id_rows(text, splits, id_name="id", ood_name="ood", warn=pytest.fail)
    assert all(kept[k] is splits[k] for k in splits)
    images = make_splits(_images(0, 20, "img"), {"ood_test": 20}, seed=1, class_checked=())
    assert drop_id_rows(text, images, id_name="id", ood_name="img", warn=pytest.fail)["ood_test"] is images["ood_test"]


def test_a_split_left_empty_is_refused():
    text = TextData([t for t, _ in ID_ROWS], np.arange(24) % 2, ["neg", "pos"], "id")
    ood = TextData([ID_ROWS[0][0]] + [t for t, _ in OOD_ROWS], np.zeros(21, np.int64), ["ood"], "ood")
    parts = {"ood_val": ood.subset([0]), "ood_test": ood.subset(np.arange(1, 21))}
    with pytest.raises(DataError, match=r"1 of its 21 OOD rows .* split\(s\) ood_val would be left empty"):
        drop_id_rows(text, parts, id_name="id", ood_name="ood")
