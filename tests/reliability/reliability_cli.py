"""Helpers shared by the reliability tests: run the public CLI, check its error contract, snapshot folders."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def cli(*args: str, env: dict | None = None, cwd: Path | None = None,
        timeout: int = 600) -> subprocess.CompletedProcess:
    """``hydra-toolchain ARGS`` in a fresh interpreter (offline)."""
    full = dict(os.environ, HF_HUB_OFFLINE="1", **(env or {}))
    return subprocess.run([sys.executable, "-m", "toolchain", *args], capture_output=True, text=True,
                          cwd=cwd or ROOT, env=full, timeout=timeout)


def check_error(out: subprocess.CompletedProcess, code: int, *needles: str) -> str:
    """The documented error contract: exit ``code``, no traceback, one ``error:`` paragraph naming ``needles``."""
    assert out.returncode == code, (out.returncode, out.stderr[-2000:])
    assert "Traceback" not in out.stderr, out.stderr[-2000:]
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("error: "), out.stderr[-2000:]
    for needle in needles:
        assert needle in last, (needle, last)
    return last


def snapshot(folder: Path) -> dict[str, str]:
    """sha256 of every file under ``folder`` (relative paths)."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(Path(folder).rglob("*")) if p.is_file()}
