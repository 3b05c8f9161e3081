"""``score`` under torchrun with 2 ranks: rank 0 alone writes; a failure on rank 1 publishes nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow  # real data (Fashion-MNIST) and three CLI jobs

RECIPE = """\
name: tiny
seed: 0
artifacts_dir: {art}
model:
  family: vit
  from_config: {{image_size: 28, patch_size: 7, num_channels: 1, hidden_size: 32, num_hidden_layers: 2,
                num_attention_heads: 4, intermediate_size: 64, hidden_dropout_prob: 0.0,
                attention_probs_dropout_prob: 0.0}}
  image_size: 28
  num_channels: 1
data:
  id: fashion-mnist
  ood: null
  splits: {{train: 64, val: 32, calib: 24, test: 32}}
finetune: {{steps: 0}}
scoring: {{criterion: hies, calib_samples: 24, batch_size: 5}}
pruning: {{members: 2, strategy: bootstrap, ratio: 0.25}}
engines: [torch]
"""

# the CLI, with score_heads failing on rank 1 when HYDRA_TEST_FAIL_RANK says so
ENTRY = textwrap.dedent("""\
    import os, sys
    import toolchain.scoring.registry as registry
    original = registry.score_heads
    def score_heads(*args, **kwargs):
        if os.environ.get("RANK") == os.environ.get("HYDRA_TEST_FAIL_RANK"):
            raise ValueError("injected failure in score_heads")
        return original(*args, **kwargs)
    registry.score_heads = score_heads
    from toolchain.cli import main
    main(sys.argv[1:])
""")


def _env(tmp: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR",
                                                             "MASTER_PORT")}
    env.update({"OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT), "TMPDIR": str(tmp),
                "HYDRA_DIST_TIMEOUT_S": "60", "HYDRA_DIST_GRACE_S": "5", **extra})
    return env


def _torchrun(jobs, entry: Path | tuple[str, ...], recipe: Path, tmp: Path, command: str = "score",
              **extra: str) -> subprocess.Popen:
    """2 ranks of ``entry`` (a script, or e.g. ``("-m", "toolchain")``) running ``command RECIPE``."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
           "--master-port", str(jobs.free_port()), *((str(entry),) if isinstance(entry, Path) else entry),
           command, str(recipe)]
    return subprocess.Popen(cmd, cwd=ROOT, env=_env(tmp, **extra), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)


def _finish(p: subprocess.Popen, timeout: float = 180) -> tuple[int, str]:
    try:
        out, _ = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        pytest.fail("the job hangs")
    return p.returncode, out


def test_two_ranks_score_stage_writes_once_and_equals_single_process(jobs, tmp_path):
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    entry = tmp_path / "entry.py"
    entry.write_text(ENTRY)
    single, multi = tmp_path / "single.yaml", tmp_path / "multi.yaml"
    single.write_text(RECIPE.format(art=tmp_path / "art-single"))
    multi.write_text(RECIPE.format(art=tmp_path / "art-multi"))

    # 1. rank 1 fails inside the score stage (next to it, the single-process reference run)
    ref = subprocess.Popen([sys.executable, "-m", "toolchain", "score", str(single)], cwd=ROOT, env=_env(scratch),
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    failing = _torchrun(jobs, entry, multi, scratch, HYDRA_TEST_FAIL_RANK="1")
    code, out = _finish(failing)
    ref_code, ref_out = _finish(ref)
    assert ref_code == 0, ref_out[-3000:]
    assert code != 0, out[-3000:]
    assert "rank 1 failed: ValueError: injected failure in score_heads" in out, out[-3000:]
    root = tmp_path / "art-multi" / "tiny"
    # no score, no .tmp, nobody holding the lock (an OS lock: its file may stay)
    assert sorted(p.name for p in root.iterdir() if p.name not in (".lock", ".source-digests.json", "pipeline.json")) \
        == ["ensemble", "finetune", "load"]
    assert not (root / ".lock.holder").exists()
    assert not list(scratch.glob("hydra-*"))  # the non-main rank's private work folders are gone

    # 2. rerun: stages up to date are skipped by both ranks, score runs and is published once by rank 0
    code, out = _finish(_torchrun(jobs, entry, multi, scratch))
    assert code == 0, out[-3000:]
    assert out.count("> score:") == 1 and out.count("up to date, skipped") == 3, out[-3000:]  # rank 0 reports
    assert sorted(p.name for p in root.iterdir() if p.name not in (".lock", ".source-digests.json", "pipeline.json")) \
        == ["ensemble", "finetune", "load", "score"]
    assert sorted(json.loads((root / "pipeline.json").read_text())["stages"]) == ["ensemble", "finetune", "load",
                                                                                  "score"]
    assert sorted(p.name for p in (root / "score").iterdir()) == ["heatmap-hies.png", "manifest.json", "scores.json"]
    assert not list(scratch.glob("hydra-*"))
    got = json.loads((root / "score" / "scores.json").read_text())
    want = json.loads((tmp_path / "art-single" / "tiny" / "score" / "scores.json").read_text())
    assert got["data_hash"] == want["data_hash"] and got["params"] == want["params"]
    for row_g, row_w in zip(got["scores"], want["scores"]):
        assert row_g == pytest.approx(row_w, rel=1e-6, abs=0)
    verify = subprocess.run([sys.executable, "-m", "toolchain", "verify", str(tmp_path / "art-multi")], cwd=ROOT,
                            env=_env(scratch), capture_output=True, text=True)
    assert verify.returncode == 0, verify.stderr


def _weights(folder: Path) -> dict:
    from safetensors.torch import load_file

    files = sorted(folder.glob("*.safetensors"))
    assert files, f"no weights in {folder}"
    out = {}
    for f in files:
        out.update(load_file(str(f)))
    return out


def test_two_ranks_train_the_ensemble_and_recover_members_like_one_process(jobs, tmp_path):
    """Deep-ensemble members (2 jobs) and recovery fine-tunes (3 jobs) spread over 2 ranks: rank 0 saves them,
    each identical to the single-process run (each member is trained alone on one rank, one thread each)."""
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    recipe = RECIPE.replace("finetune: {{steps: 0}}", "finetune: {{steps: 3, batch_size: 8}}").replace(
        "pruning: {{members: 2, strategy: bootstrap, ratio: 0.25}}",
        "pruning: {{members: 3, strategy: partition, core: 1, ratio: 0.25, recovery: {{steps: 2, batch_size: 8}}}}")
    single, multi = tmp_path / "single.yaml", tmp_path / "multi.yaml"
    single.write_text(recipe.format(art=tmp_path / "art-single"))
    multi.write_text(recipe.format(art=tmp_path / "art-multi"))
    ref = subprocess.Popen([sys.executable, "-m", "toolchain", "prune", str(single)], cwd=ROOT, env=_env(scratch),
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    code, out = _finish(_torchrun(jobs, ("-m", "toolchain"), multi, scratch, command="prune"), timeout=600)
    ref_code, ref_out = _finish(ref, timeout=600)
    assert ref_code == 0, ref_out[-3000:]
    assert code == 0, out[-3000:]
    a, b = tmp_path / "art-single" / "tiny", tmp_path / "art-multi" / "tiny"
    folders = [f"ensemble/member{i}" for i in range(3)] + [f"prune/member{i}" for i in range(3)]
    for rel in folders:
        wa, wb = _weights(a / rel), _weights(b / rel)
        assert wa.keys() == wb.keys(), rel
        assert all(bool((wa[k] == wb[k]).all()) for k in wa), rel
    assert json.loads((a / "ensemble" / "metrics.json").read_text()) == json.loads(
        (b / "ensemble" / "metrics.json").read_text())
    assert (a / "prune" / "members.json").read_text() == (b / "prune" / "members.json").read_text()
    assert not list(scratch.glob("hydra-*"))
    verify = subprocess.run([sys.executable, "-m", "toolchain", "verify", str(b)], cwd=ROOT, env=_env(scratch),
                            capture_output=True, text=True)
    assert verify.returncode == 0, verify.stderr


def test_accelerate_launch_runs_the_score_stage_on_two_ranks(jobs, tmp_path):
    pytest.importorskip("accelerate", reason="accelerate is not installed (pip install accelerate)")
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    entry = tmp_path / "entry.py"  # the CLI, announcing each rank first
    marks = tmp_path / "marks"
    marks.mkdir()
    entry.write_text("import os, sys, pathlib\n"  # each rank leaves a mark: rank<R>-of-<WORLD_SIZE>
                     f"pathlib.Path({str(marks)!r}, f\"rank{{os.environ['RANK']}}-of-{{os.environ['WORLD_SIZE']}}\")"
                     ".touch()\nfrom toolchain.cli import main\nmain(sys.argv[1:])\n")
    single, multi = tmp_path / "single.yaml", tmp_path / "multi.yaml"
    single.write_text(RECIPE.format(art=tmp_path / "art-single"))
    multi.write_text(RECIPE.format(art=tmp_path / "art-multi"))
    ref = subprocess.Popen([sys.executable, "-m", "toolchain", "score", str(single)], cwd=ROOT, env=_env(scratch),
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    # --multi_gpu selects accelerate's torchrun launcher (on a machine without GPUs the ranks use gloo);
    # --cpu would select its single-process launcher
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2", "--num_machines",
           "1", "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", str(jobs.free_port()),
           str(entry), "score", str(multi)]
    code, out = _finish(subprocess.Popen(cmd, cwd=ROOT, env=_env(scratch), stdout=subprocess.PIPE,
                                         stderr=subprocess.STDOUT, text=True), timeout=300)
    ref_code, ref_out = _finish(ref)
    assert ref_code == 0, ref_out[-3000:]
    assert code == 0, out[-3000:]
    assert sorted(p.name for p in marks.iterdir()) == ["rank0-of-2", "rank1-of-2"], out[-3000:]
    got = json.loads((tmp_path / "art-multi" / "tiny" / "score" / "scores.json").read_text())
    want = json.loads((tmp_path / "art-single" / "tiny" / "score" / "scores.json").read_text())
    for row_g, row_w in zip(got["scores"], want["scores"], strict=True):
        assert row_g == pytest.approx(row_w, rel=1e-6, abs=0)
