"""The CLI: exit codes and one-paragraph errors without tracebacks; the load stage end to end."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    return subprocess.run([sys.executable, "-m", "toolchain", *args], capture_output=True, text=True,
                          cwd=cwd or ROOT, env=env, timeout=600)


def test_help_lists_commands():
    out = cli("--help")
    assert out.returncode == 0
    for cmd in ("run", "load", "verify"):
        assert cmd in out.stdout


def test_bad_recipe_exits_2_with_one_clear_line(tmp_path):
    bad = tmp_path / "r.yaml"
    bad.write_text("name: x\nmodel: {source: packaged:all-MiniLM-L6-v2}\ndata: {id: tweets}\npruning: {memebrs: 3}\n")
    out = cli("load", str(bad))
    assert out.returncode == 2
    assert "Traceback" not in out.stderr
    assert "pruning.memebrs" in out.stderr and "Did you mean 'members'" in out.stderr


def test_debug_shows_traceback(tmp_path):
    out = cli("--debug", "load", str(tmp_path / "missing.yaml"))
    assert out.returncode != 0
    assert "Traceback" in out.stderr


def test_missing_model_folder_is_reported(tmp_path):
    r = tmp_path / "r.yaml"
    r.write_text(f"name: x\nartifacts_dir: {tmp_path}/a\nmodel: {{source: {tmp_path}/nope}}\n"
                 "data: {id: tweets, ood: null, splits: {train: 64, test: 32, calib: 16, val: 16}}\n")
    out = cli("load", str(r))
    assert out.returncode == 2, out.stderr
    assert "does not exist" in out.stderr and "Traceback" not in out.stderr


@pytest.mark.slow
def test_load_stage_runs_then_skips_and_verifies(tmp_path):
    r = tmp_path / "r.yaml"
    r.write_text(
        f"name: t\nartifacts_dir: {tmp_path}/art\nmodel: {{source: 'packaged:all-MiniLM-L6-v2'}}\n"
        "data: {id: tweets, ood: bbc, splits: {train: 64, val: 16, calib: 16, test: 32},"
        " ood_splits: {ood_val: 8, ood_test: 16}}\n"
    )
    first = cli("load", str(r))
    assert first.returncode == 0, first.stderr
    assert "6 layers x 12 heads" in first.stderr
    second = cli("load", str(r))
    assert "up to date, skipped" in second.stderr
    assert cli("verify", str(tmp_path / "art")).returncode == 0
    (tmp_path / "art" / "t" / "load" / "summary.json").write_text("{}")
    bad = cli("verify", str(tmp_path / "art"))
    assert bad.returncode == 1 and "summary.json: changed" in bad.stderr
