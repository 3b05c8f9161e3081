"""``--force STAGE`` through the CLI on a tiny real recipe: the stage and everything downstream rerun.

A tiny ViT from config on 64 Fashion-MNIST rows, up to ``export`` (about 30 s, then 20 s): forcing
``fuse`` must rerun ``export`` too (its key is unchanged: keys chain on upstream keys, not outputs),
keep the stages upstream cached, and say why each ran. The export line names the one lowering and
the one precision the recipe exports.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from tiny_recipes import TINY_VIT_MODEL

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow  # real data (Fashion-MNIST) through the CLI

RECIPE = """\
name: tiny-force
seed: 0
artifacts_dir: {art}
""" + TINY_VIT_MODEL + """\
data:
  id: fashion-mnist
  ood: null
  splits: {{train: 64, val: 32, calib: 16, test: 32}}
finetune: {{steps: 2, batch_size: 8}}
scoring: {{criterion: his, calib_samples: 16, batch_size: 8}}
pruning: {{members: 2, strategy: partition, ratio: 0.25}}
export: {{lowerings: [conv], precisions: [fp32]}}
engines: [onnxrt-cpu]
"""


def _export(recipe: Path, *extra: str) -> str:
    out = subprocess.run([sys.executable, "-m", "toolchain", "export", str(recipe), *extra], cwd=ROOT,
                         capture_output=True, text=True, env=dict(os.environ, HF_HUB_OFFLINE="1"), timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stderr


def _ran(log: str) -> list[str]:
    return [line[2:].split(":")[0] for line in log.splitlines() if line.startswith("> ")]


def test_force_fuse_reruns_export_and_says_why(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text(RECIPE.format(art=tmp_path / "art"))
    first = _export(recipe)
    assert _ran(first) == ["load", "finetune", "ensemble", "score", "prune", "fuse", "export"]
    assert "> export: export ONNX graphs: Hydra (conv lowering), single model, deep-ensemble members; FP32 only" \
        in first
    assert "aten::index" not in first
    root = tmp_path / "art" / "tiny-force"
    before = json.loads((root / "export" / "manifest.json").read_text())
    stamps = {s: (root / s / "manifest.json").stat().st_mtime_ns for s in ("prune", "fuse", "export")}

    log = _export(recipe, "--force", "fuse")
    assert _ran(log) == ["fuse", "export"]
    assert all(f"- {s}: up to date, skipped" in log for s in ("load", "finetune", "ensemble", "score", "prune"))
    assert "> fuse: forced: " in log and "> export: rerun (downstream of forced fuse): " in log
    assert "forced: fuse; rerun: export (downstream of forced fuse)" in log
    after = json.loads((root / "export" / "manifest.json").read_text())
    assert after["key"] == before["key"]  # the same key, rebuilt all the same
    assert (root / "prune" / "manifest.json").stat().st_mtime_ns == stamps["prune"]
    assert all((root / s / "manifest.json").stat().st_mtime_ns > stamps[s] for s in ("fuse", "export"))
    assert after["rerun_reason"] == "downstream of forced fuse" and "rerun_reason" not in before
    assert json.loads((root / "fuse" / "manifest.json").read_text())["rerun_reason"] == "forced"
