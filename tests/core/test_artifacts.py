"""Atomic writes, manifests, verification and the artifacts lock."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from toolchain.artifacts import StageDir, atomic_write_text, locked, verify_folder, verify_tree
from toolchain.errors import ArtifactError


def test_atomic_write_leaves_no_temp_file(tmp_path):
    target = atomic_write_text(tmp_path / "a.txt", "hello")
    assert target.read_text() == "hello"
    assert [p.name for p in tmp_path.iterdir()] == ["a.txt"]


def test_stage_publish_verify_and_detect_changes(tmp_path):
    sd = StageDir(tmp_path, "score", key="k1")
    assert not sd.is_complete()
    work = sd.begin()
    (work / "scores.json").write_text("{}")
    (work / "sub").mkdir()
    (work / "sub" / "x.bin").write_bytes(b"\x00\x01")
    sd.publish({"seconds": 1.0})
    assert sd.is_complete()
    assert not StageDir(tmp_path, "score", key="other").is_complete()
    assert verify_tree(tmp_path) == []
    (tmp_path / "score" / "sub" / "x.bin").write_bytes(b"\x00\x02")
    (tmp_path / "score" / "extra.txt").write_text("?")
    problems = verify_folder(tmp_path / "score")
    assert any("x.bin: changed" in p for p in problems)
    assert any("extra.txt: extra" in p for p in problems)
    (tmp_path / "score" / "scores.json").unlink()
    assert any("scores.json: missing" in p for p in verify_folder(tmp_path / "score"))
    assert not sd.is_complete()


def test_aborted_stage_keeps_previous_output(tmp_path):
    first = StageDir(tmp_path, "export", key="a")
    (first.begin() / "model.onnx").write_text("v1")
    first.publish({})
    second = StageDir(tmp_path, "export", key="b")
    (second.begin() / "model.onnx").write_text("half")
    second.abort()
    assert (tmp_path / "export" / "model.onnx").read_text() == "v1"
    assert first.is_complete()
    assert not any(p.name.startswith(".export") for p in tmp_path.iterdir())


def test_lock_refuses_a_live_holder_and_is_free_once_it_is_killed(tmp_path):
    code = "import sys, time\nfrom toolchain.artifacts import locked\nwith locked(sys.argv[1]):\n" \
           "    print('held', flush=True)\n    time.sleep(30)\n"
    holder = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(ArtifactError, match=rf"in use by process {holder.pid} on host"), locked(tmp_path):
            pass
    finally:
        holder.kill()  # SIGKILL: no finally block runs in the holder; the kernel drops its lock
        holder.wait()
    with locked(tmp_path):  # no stale lock to clear
        assert json.loads((tmp_path / ".lock.holder").read_text())["pid"] == os.getpid()
    assert not (tmp_path / ".lock.holder").exists()


def test_a_lock_file_left_with_a_live_pid_is_not_a_lock(tmp_path):
    (tmp_path / ".lock").write_text(str(os.getpid()))  # the old PID-file format, naming a live process
    with locked(tmp_path):
        pass
