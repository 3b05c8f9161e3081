"""The artifacts folder under an adversarial user, through the CLI (issue #20 items 1-6).

A tiny BERT checkpoint folder (MiniLM's tokenizer, hidden 32) and a generated CSV: stale results
after the checkpoint changes, ``verify`` on deleted stages and manifests, the lock between
processes, environment errors (a read-only and a full file system: real tmpfs mounts where this
user may mount, as root in CI), a class-count mismatch, and kill -9 leftovers.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest
import yaml
from reliability_cli import ROOT, check_error, cli, snapshot

from toolchain.artifacts import RUN_INDEX

NAME = "artrel"


def _rows(n: int, classes: tuple[str, ...]) -> str:
    lines = ["text,label"]
    lines += [f"example {i} about {classes[i % len(classes)]} things number {i * 7 % 13},{classes[i % len(classes)]}"
              for i in range(n)]
    return "\n".join(lines) + "\n"


def make_checkpoint(folder: Path, seed: int = 0, num_labels: int | None = None,
                    id2label: dict[int, str] | None = None) -> Path:
    """A tiny BERT (MiniLM's vocabulary) saved with the packaged tokenizer; a classifier when ``num_labels``."""
    import torch
    import transformers

    from toolchain.models import load_tokenizer, resolve_source, save_model

    torch.manual_seed(seed)
    cfg = transformers.BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                  intermediate_size=64, max_position_embeddings=64)
    if num_labels is None:
        model = transformers.BertModel(cfg)
    else:
        cfg.num_labels = num_labels
        if id2label:
            cfg.id2label, cfg.label2id = id2label, {v: k for k, v in id2label.items()}
        model = transformers.BertForSequenceClassification(cfg)
    tok = load_tokenizer(resolve_source("packaged:all-MiniLM-L6-v2"))
    return save_model(model, folder, tokenizer=tok)


def write_recipe(folder: Path, model: Path, art: Path, data: str = "data.csv", steps: int = 2) -> Path:
    body = {"name": NAME, "artifacts_dir": str(art),
            "model": {"source": str(model), "max_length": 16},
            "data": {"id": f"csv:{data}", "splits": {"train": 16, "val": 8, "calib": 8, "test": 8}},
            "finetune": {"steps": steps, "batch_size": 4},
            "engines": ["torch"]}
    path = folder / f"recipe-{uuid.uuid4().hex[:6]}.yaml"
    path.write_text(yaml.safe_dump(body))
    return path


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    """A checkpoint folder, a two-class CSV, and an artifacts folder with a finished ``finetune``."""
    tmp = tmp_path_factory.mktemp("artrel")
    make_checkpoint(tmp / "ckpt")
    (tmp / "data.csv").write_text(_rows(48, ("neg", "pos")))
    out = cli("finetune", str(write_recipe(tmp, tmp / "ckpt", tmp / "art")))
    assert out.returncode == 0, out.stderr[-3000:]
    return tmp


def _copy(base: Path, tmp: Path) -> Path:
    """A private copy of the base folder (checkpoint, CSV, artifacts)."""
    dst = tmp / "copy"
    shutil.copytree(base, dst, symlinks=True)
    return dst


def _stage_status(stderr: str, stage: str) -> str:
    for line in stderr.splitlines():
        if line.startswith(f"- {stage}: up to date"):
            return "skipped"
        if line.startswith(f"> {stage}:"):
            return "ran"
    raise AssertionError(f"no status line for {stage}: {stderr[-2000:]}")


# ---------------------------------------------------------------- 1: the checkpoint's content is in the keys
def test_a_changed_checkpoint_reruns_every_stage_that_reads_it(base, tmp_path):
    work = _copy(base, tmp_path)
    recipe = write_recipe(work, work / "ckpt", work / "art")
    assert cli("finetune", str(recipe)).returncode == 0  # the copy's paths differ: its own keys
    out = cli("finetune", str(recipe))
    assert out.returncode == 0, out.stderr[-2000:]
    assert _stage_status(out.stderr, "finetune") == "skipped"  # nothing changed: the cache holds
    before = json.loads((work / "art" / NAME / "finetune" / "manifest.json").read_text())["key"]
    make_checkpoint(work / "ckpt", seed=1)  # the user re-initialises (retrains) the weights in place
    out = cli("finetune", str(recipe))
    assert out.returncode == 0, out.stderr[-2000:]
    assert _stage_status(out.stderr, "load") == "ran" and _stage_status(out.stderr, "finetune") == "ran"
    after = json.loads((work / "art" / NAME / "finetune" / "manifest.json").read_text())["key"]
    assert after != before
    # a tokenizer file alone changes the keys too
    tok = work / "ckpt" / "tokenizer_config.json"
    cfg = json.loads(tok.read_text())
    tok.write_text(json.dumps({**cfg, "model_max_length": 77}))
    out = cli("finetune", str(recipe))
    assert _stage_status(out.stderr, "finetune") == "ran", out.stderr[-2000:]


def test_the_digest_is_read_once_then_reused_by_size_and_mtime(tmp_path):
    from toolchain.artifacts import folder_digest

    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "w.bin").write_bytes(b"a" * 1000)
    cache: dict = {}
    first = folder_digest(tmp_path / "m", cache)
    entry = cache[str((tmp_path / "m" / "w.bin").resolve())]
    assert entry[0] == 1000 and len(entry[2]) == 64
    # a cached digest is used while size and mtime match (proof: a planted digest comes back)
    entry[2] = "0" * 64
    assert folder_digest(tmp_path / "m", cache) != first
    # a new mtime (or size) rehashes the file
    os.utime(tmp_path / "m" / "w.bin", ns=(time.time_ns(), time.time_ns() + 10**9))
    assert folder_digest(tmp_path / "m", cache) == first
    (tmp_path / "m" / "w.bin").write_bytes(b"b" * 1000)
    assert folder_digest(tmp_path / "m", cache) != first


def test_the_digest_cache_is_kept_with_the_artifacts(base):
    from toolchain.artifacts import read_digest_cache

    cache = read_digest_cache(base / "art" / NAME)
    weights = str((base / "ckpt" / "model.safetensors").resolve())
    assert weights in cache and cache[weights][0] == (base / "ckpt" / "model.safetensors").stat().st_size


# ---------------------------------------------------------------- 2: verify misses nothing
def test_verify_notices_a_deleted_manifest_a_deleted_stage_and_a_deleted_index(base, tmp_path):
    work = _copy(base, tmp_path)
    art = work / "art"
    ok = cli("verify", str(art))
    assert ok.returncode == 0, ok.stderr[-2000:]
    index = json.loads((art / NAME / RUN_INDEX).read_text())
    assert {"load", "finetune"} <= set(index["stages"])

    (art / NAME / "finetune" / "manifest.json").unlink()
    out = cli("verify", str(art))
    assert out.returncode == 1 and "finetune/manifest.json: missing" in out.stderr, out.stderr[-2000:]

    shutil.rmtree(art / NAME / "finetune")
    out = cli("verify", str(art))
    assert out.returncode == 1 and "stage 'finetune' is missing" in out.stderr, out.stderr[-2000:]

    (art / NAME / RUN_INDEX).unlink()
    out = cli("verify", str(art))
    assert out.returncode == 1 and f"no {RUN_INDEX}" in out.stderr, out.stderr[-2000:]


# ---------------------------------------------------------------- 3: a lock that is a mutex
HOLDER = textwrap.dedent("""
    import sys, time
    from toolchain.artifacts import locked
    with locked(sys.argv[1]):
        print("held", flush=True)
        time.sleep(float(sys.argv[2]))
""")

CONTENDER = textwrap.dedent("""
    import os, sys, time
    from pathlib import Path
    from toolchain.artifacts import locked
    from toolchain.errors import ArtifactError
    root, until = Path(sys.argv[1]), float(sys.argv[2])
    marker = root / "inside"
    entered = overlaps = 0
    while time.time() < until:
        try:
            with locked(root):
                entered += 1
                if marker.exists():
                    overlaps += 1
                marker.write_text(str(os.getpid()))
                time.sleep(0.002)
                marker.unlink(missing_ok=True)
        except ArtifactError:
            pass
    print(entered, overlaps)
""")


def _python(code: str, *args: str, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", code, *args], cwd=ROOT, stdout=subprocess.PIPE, text=True, **kw)


def test_two_processes_are_never_inside_the_lock_together(tmp_path):
    until = time.time() + 4.0
    procs = [_python(CONTENDER, str(tmp_path), str(until)) for _ in range(2)]
    results = [tuple(map(int, p.communicate(timeout=60)[0].split())) for p in procs]
    assert all(entered > 5 for entered, _ in results), results
    assert all(overlaps == 0 for _, overlaps in results), results


def test_a_held_lock_refuses_with_its_holder_and_kill_9_frees_it(base, tmp_path):
    work = _copy(base, tmp_path)
    root = work / "art" / NAME
    holder = _python(HOLDER, str(root), "60")
    try:
        assert holder.stdout.readline().strip() == "held"
        out = cli("load", str(write_recipe(work, work / "ckpt", work / "art")))
        check_error(out, 2, f"in use by process {holder.pid}", "on host", "Wait for that run")
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    out = cli("load", str(write_recipe(work, work / "ckpt", work / "art")))  # the kernel released it
    assert out.returncode == 0, out.stderr[-2000:]


def test_an_old_lock_file_naming_a_live_process_does_not_block(base, tmp_path):
    work = _copy(base, tmp_path)
    (work / "art" / NAME / ".lock").write_text("1")  # PID 1 is alive: a container's init after docker kill
    out = cli("load", str(write_recipe(work, work / "ckpt", work / "art")))
    assert out.returncode == 0, out.stderr[-2000:]


# ---------------------------------------------------------------- 4: environment errors are the user's
@contextlib.contextmanager
def mounted(target: Path, options: str):
    """A real tmpfs at ``target`` (root only); skips where this user may not mount."""
    target.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("needs root to mount a tmpfs (CI runs as root)")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(target)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield target
    finally:
        subprocess.run(["umount", "-l", str(target)], capture_output=True)


def test_a_failed_first_run_leaves_no_folder(base, tmp_path):
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "config.json").write_text("{ not json")
    shutil.copy(base / "data.csv", tmp_path / "data.csv")
    out = cli("load", str(write_recipe(tmp_path, tmp_path / "broken", tmp_path / "new" / "art")))
    check_error(out, 2, "config.json")
    assert not (tmp_path / "new").exists()


def test_a_read_only_artifacts_location_exits_2_naming_the_path(base, tmp_path):
    with mounted(tmp_path / "ro", "ro,size=1m") as ro:
        out = cli("load", str(write_recipe(base, base / "ckpt", ro / "art")))
        check_error(out, 2, str(ro / "art"), "read-only")


def test_a_full_disk_during_a_weights_write_exits_2_and_publishes_nothing(base, tmp_path):
    work = _copy(base, tmp_path)
    with mounted(tmp_path / "small", "size=400k") as small:
        art = small / "art"
        recipe = write_recipe(work, work / "ckpt", art)
        assert cli("load", str(recipe)).returncode == 0  # small files fit
        before = snapshot(art)
        out = cli("finetune", str(recipe))  # the 4 MB safetensors file does not
        check_error(out, 2, "no space left", str(art))
        assert snapshot(art) == before  # nothing half-written, nothing lost
        assert cli("verify", str(art)).returncode == 0


# ---------------------------------------------------------------- 5: class-count mismatch
def test_a_checkpoint_head_with_other_labels_names_both_label_sets(tmp_path):
    make_checkpoint(tmp_path / "two", num_labels=2, id2label={0: "NEGATIVE", 1: "POSITIVE"})
    (tmp_path / "three.csv").write_text(_rows(48, ("neg", "neu", "pos")))
    out = cli("finetune", str(write_recipe(tmp_path, tmp_path / "two", tmp_path / "art", data="three.csv")))
    check_error(out, 2, "2 labels", "NEGATIVE, POSITIVE", "3 classes", "neg, neu, pos", str(tmp_path / "two"))


# ---------------------------------------------------------------- 6: kill -9 leftovers
def test_kill_9_mid_stage_then_rerun_leaves_nothing_behind(base, tmp_path):
    work = _copy(base, tmp_path)
    root = work / "art" / NAME
    recipe = write_recipe(work, work / "ckpt", work / "art", steps=100000)  # a fine-tune that runs until killed
    proc = subprocess.Popen([sys.executable, "-m", "toolchain", "finetune", str(recipe)], cwd=ROOT,
                            env=dict(os.environ, HF_HUB_OFFLINE="1"), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 300
        while not any(p.name.startswith(".finetune.tmp-") for p in root.iterdir()):
            assert proc.poll() is None and time.time() < deadline, "the fine-tune never started"
            time.sleep(0.2)
        (next(p for p in root.iterdir() if p.name.startswith(".finetune.tmp-")) / "partial.bin").write_bytes(b"x")
    finally:
        proc.kill()
        proc.wait()
    out = cli("verify", str(work / "art"))
    assert out.returncode == 1 and "left over from an interrupted run" in out.stderr, out.stderr[-2000:]
    rerun = cli("finetune", str(write_recipe(work, work / "ckpt", work / "art")))
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    assert "removed 1 temporary folder(s) left by an interrupted run" in rerun.stderr
    assert not [p for p in root.iterdir() if ".tmp-" in p.name or ".old-" in p.name]
    ok = cli("verify", str(work / "art"))
    assert ok.returncode == 0, ok.stderr[-2000:]


def test_relative_paths_resolve_against_the_recipe_folder_from_any_directory(base, tmp_path):
    project = tmp_path / "project"
    project.mkdir()
    shutil.copytree(base / "ckpt", project / "ckpt")
    shutil.copy(base / "data.csv", project / "data.csv")
    body = {"name": NAME, "artifacts_dir": "out", "model": {"source": "ckpt", "max_length": 16},
            "data": {"id": "csv:data.csv", "splits": {"train": 16, "val": 8, "calib": 8, "test": 8}},
            "engines": ["torch"]}
    (project / "r.yaml").write_text(yaml.safe_dump(body))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    out = cli("load", "../project/r.yaml", cwd=elsewhere)
    assert out.returncode == 0, out.stderr[-2000:]
    assert (project / "out" / NAME / "load" / "manifest.json").is_file()
    assert list(elsewhere.iterdir()) == []  # nothing written where the command ran
    from toolchain.recipe import load_recipe

    recipe = load_recipe(project / "r.yaml")
    assert recipe.model.source == str(project / "ckpt") and recipe.data.id == f"csv:{project / 'data.csv'}"
    assert recipe.artifacts() == project / "out" / NAME
    # a wrong relative source names the resolved folder and leaves no artifacts folder behind
    (project / "bad.yaml").write_text(yaml.safe_dump({**body, "artifacts_dir": "bad-out",
                                                      "model": {"source": "nope", "max_length": 16}}))
    bad = cli("load", "../project/bad.yaml", cwd=elsewhere)
    check_error(bad, 2, str(project / "nope"))
    assert not (project / "bad-out").exists() and list(elsewhere.iterdir()) == []


def test_a_checkpoint_already_fine_tuned_for_the_data_is_not_fine_tuned_again(tmp_path):
    make_checkpoint(tmp_path / "tuned", num_labels=2, id2label={0: "neg", 1: "pos"})
    (tmp_path / "data.csv").write_text(_rows(48, ("neg", "pos")))
    out = cli("finetune", str(write_recipe(tmp_path, tmp_path / "tuned", tmp_path / "art")))
    assert out.returncode == 0, out.stderr[-2000:]
    assert "not fine-tuned: the checkpoint already classifies into the data's labels (neg, pos)" in out.stderr
    metrics = json.loads((tmp_path / "art" / NAME / "finetune" / "metrics.json").read_text())
    assert metrics["steps"] == 0 and "loss_first" not in metrics
    import safetensors.torch

    saved = safetensors.torch.load_file(str(tmp_path / "art" / NAME / "finetune" / "model" / "model.safetensors"))
    original = safetensors.torch.load_file(str(tmp_path / "tuned" / "model.safetensors"))
    import torch

    assert all(torch.equal(saved[k], original[k]) for k in original)  # the checkpoint's own weights, unchanged


def test_named_labels_other_than_the_datas_name_both_sets(tmp_path):
    make_checkpoint(tmp_path / "tuned", num_labels=2, id2label={0: "POSITIVE", 1: "NEGATIVE"})
    (tmp_path / "data.csv").write_text(_rows(48, ("neg", "pos")))
    out = cli("finetune", str(write_recipe(tmp_path, tmp_path / "tuned", tmp_path / "art")))
    check_error(out, 2, "(POSITIVE, NEGATIVE)", "(neg, pos)", "id2label")
