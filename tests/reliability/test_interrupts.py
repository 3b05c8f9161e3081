"""SIGTERM in the middle of fine-tuning: exit 130 with a clear line, nothing half-written is
published, the folder verifies, and the next run of the same recipe completes the stage.

(The same for the export stage is in tests/e2e/test_pipeline_quick.py.)
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml
from reliability_cli import ROOT, cli

from toolchain.artifacts import locked

pytestmark = pytest.mark.slow

STEPS = 12


def quick_recipe(tmp_path: Path, **quick: dict) -> Path:
    """The default recipe with its quick profile changed by ``quick`` (section -> fields)."""
    data = yaml.safe_load((ROOT / "recipes" / "minilm-tweets.yaml").read_text())
    data["artifacts_dir"] = str(tmp_path / "artifacts")
    for section, values in quick.items():
        data["profiles"]["quick"].setdefault(section, {}).update(values)
    path = tmp_path / "minilm-tweets.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


class StderrTail:
    """Collects a child's stderr in a thread so the test can wait for a line without blocking."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.chunks: list[bytes] = []
        self.thread = threading.Thread(target=self._read, args=(proc.stderr.fileno(),), daemon=True)
        self.thread.start()

    def _read(self, fd: int) -> None:
        while chunk := os.read(fd, 4096):
            self.chunks.append(chunk)

    @property
    def text(self) -> str:
        return b"".join(self.chunks).decode("utf-8", "replace")


def test_sigterm_during_finetuning_keeps_nothing_partial_and_the_rerun_completes(tmp_path):
    recipe = quick_recipe(tmp_path, finetune={"steps": STEPS, "batch_size": 4})
    art = tmp_path / "artifacts" / "minilm-tweets-quick"
    proc = subprocess.Popen([sys.executable, "-m", "toolchain", "finetune", str(recipe), "--profile", "quick"],
                            cwd=ROOT, env=dict(os.environ, HF_HUB_OFFLINE="1"), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    tail = StderrTail(proc)
    # at least one optimiser step done: a progress line in this log ("base classifier: 3/12 steps"; a tqdm bar on a TTY)
    progress = re.compile(rf"(?:\| *|: )([1-9]\d*)/{STEPS} ")
    deadline = time.time() + 240
    while time.time() < deadline and proc.poll() is None:
        if f"base classifier: {STEPS} steps" in tail.text and progress.search(tail.text):
            break
        time.sleep(0.05)
    assert proc.poll() is None, tail.text[-3000:]
    assert list(art.glob(".finetune.tmp-*")), "the fine-tuning stage is not running"
    done = max(int(m) for m in progress.findall(tail.text))
    assert done < STEPS, "fine-tuning finished before the signal: raise STEPS"

    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=120)
    tail.thread.join(timeout=10)
    err = tail.text
    assert proc.returncode == 130, err[-3000:]
    assert "Traceback" not in err
    assert err.strip().splitlines()[-1] == "interrupted: completed stages are kept; the next run resumes"
    assert not (art / "finetune").exists(), "a half-trained model must not be published"
    assert not list(art.glob(".*.tmp-*")) and not list(art.glob(".*.old-*")), "no temporary folder may stay"
    assert not (art / ".lock.holder").exists()  # the holder's record goes with the lock
    with locked(art):  # and the lock is free (an OS lock: its file may stay, nobody holds it)
        pass
    assert (art / "load" / "manifest.json").is_file()  # the completed stage before it is kept
    verified = cli("verify", str(art))
    assert verified.returncode == 0, verified.stderr

    rerun = cli("finetune", str(recipe), "--profile", "quick")
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert "- load: up to date, skipped" in rerun.stderr and "> finetune" in rerun.stderr
    manifest = yaml.safe_load((art / "finetune" / "manifest.json").read_text())
    assert manifest["metrics"]["steps"] == STEPS
    assert cli("verify", str(art)).returncode == 0
