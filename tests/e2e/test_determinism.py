"""Determinism: two runs of the quick profile with the same seed, into two artifacts folders.

Both runs go up to ``export`` (the fewest stages that produce head scores, masks and ONNX files),
at the same time, each with one torch thread (the same settings for both; CPU kernels with a fixed
thread count reduce in a fixed order).

The exact sense of equality:

* byte-identical: ``score/scores.json``, ``prune/members.json`` (the masks), every ``.onnx`` and
  ``.onnx.data`` file, and every other stage output (models, JSON, PNG, the fused Hydra's
  safetensors and config: its config leaves out the checkpoint path, and its safetensors metadata
  has one key, because safetensors writes several in a random order);
* ``*/manifest.json``: equal once the wall-clock fields ``created`` and ``seconds`` are dropped.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow

VOLATILE = {"created", "seconds"}


def _recipe(folder: Path) -> Path:
    data = yaml.safe_load((ROOT / "recipes" / "minilm-tweets.yaml").read_text())
    data["artifacts_dir"] = str(folder / "artifacts")
    folder.mkdir(parents=True)
    path = folder / "minilm-tweets.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _manifest(path: Path) -> dict:
    return {k: v for k, v in json.loads(path.read_text()).items() if k not in VOLATILE}


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory) -> tuple[Path, Path]:
    tmp = tmp_path_factory.mktemp("determinism")
    env = dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    procs = []
    for run in ("a", "b"):
        cmd = [sys.executable, "-m", "toolchain", "export", str(_recipe(tmp / run)), "--profile", "quick"]
        procs.append(subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                      text=True))
    for proc in procs:
        _out, err = proc.communicate(timeout=1800)
        assert proc.returncode == 0, err[-3000:]
    return tuple(tmp / run / "artifacts" / "minilm-tweets-quick" for run in ("a", "b"))


def test_scores_masks_and_onnx_files_are_byte_identical(two_runs):
    a, b = two_runs
    for rel in ("score/scores.json", "prune/members.json"):
        assert (a / rel).read_bytes() == (b / rel).read_bytes(), rel
    graphs = sorted(p.relative_to(a) for p in (a / "export").iterdir() if p.name.endswith((".onnx", ".onnx.data")))
    assert len([g for g in graphs if g.suffix == ".onnx"]) >= 4, graphs
    assert graphs == sorted(p.relative_to(b) for p in (b / "export").iterdir()
                            if p.name.endswith((".onnx", ".onnx.data")))
    different = [str(g) for g in graphs if (a / g).read_bytes() != (b / g).read_bytes()]
    assert not different, different


def test_every_other_output_is_equal_in_the_documented_sense(two_runs):
    a, b = two_runs
    files = sorted(str(p.relative_to(a)) for p in a.rglob("*") if p.is_file() and p.name != ".lock")
    assert files == sorted(str(p.relative_to(b)) for p in b.rglob("*") if p.is_file() and p.name != ".lock")
    for rel in files:
        fa, fb = a / rel, b / rel
        if fa.name == "manifest.json":
            assert _manifest(fa) == _manifest(fb), rel
        else:
            assert fa.read_bytes() == fb.read_bytes(), rel
