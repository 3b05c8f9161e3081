"""A local ``csv:`` data set: its content is part of the stage cache keys, an OOD CSV may have one class."""

from __future__ import annotations

from pathlib import Path

import yaml

from toolchain.pipeline import Context
from toolchain.recipe import parse_recipe

ROOT = Path(__file__).resolve().parents[2]


def _ctx(tmp_path: Path) -> Context:
    data = yaml.safe_load((ROOT / "recipes" / "minilm-tweets.yaml").read_text())
    data["data"] = {"id": f"csv:{tmp_path / 'id.csv'}", "ood": f"csv:{tmp_path / 'ood.csv'}",
                    "splits": {"train": 4, "val": 2, "calib": 2, "test": 2},
                    "ood_splits": {"ood_val": 1, "ood_test": 1}}
    data["artifacts_dir"] = str(tmp_path / "artifacts")
    return Context(recipe=parse_recipe(data))


def _write(tmp_path: Path, extra: str = "") -> None:
    rows = "".join(f"text {i},{'pos' if i % 2 else 'neg'}\n" for i in range(10))
    (tmp_path / "id.csv").write_text("text,label\n" + rows + extra)
    (tmp_path / "ood.csv").write_text("text,label\n" + "".join(f"news {i},news\n" for i in range(4)))


def test_editing_the_csv_changes_the_keys_of_the_stages_that_read_data(tmp_path):
    _write(tmp_path)
    before = {s: _ctx(tmp_path).key(s) for s in ("load", "finetune", "export")}
    assert before == {s: _ctx(tmp_path).key(s) for s in before}  # stable while the file is unchanged
    _write(tmp_path, extra="one more,pos\n")
    after = {s: _ctx(tmp_path).key(s) for s in before}
    assert all(before[s] != after[s] for s in before)


def test_an_ood_csv_with_one_class_loads(tmp_path):
    _write(tmp_path)
    data = _ctx(tmp_path).data
    assert len(data["ood_val"]) == 1 and len(data["ood_test"]) == 1
    assert sorted(data["train"].class_names) == ["neg", "pos"]
