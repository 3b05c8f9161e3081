"""Launch a small job of N ranks (subprocesses with torchrun's environment variables, gloo on CPU)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).with_name("_worker.py")


_GIVEN: set[int] = set()
_GIVEN_LOCK = threading.Lock()


def free_port() -> int:
    """A free port never handed out before in this process.

    Scenarios run side by side (threads): a port is only bound when a job's rank 0 starts its store,
    so the OS may offer the same free port to two jobs in that window, and their ranks then meet in
    one store (seen in the full suite: the second job of a pair waited 120 s for a failure posted
    elsewhere).
    """
    with _GIVEN_LOCK:
        while True:
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            if port not in _GIVEN:
                _GIVEN.add(port)
                return port


def rank_env(rank: int, world: int, port: int, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update({
        "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_WORLD_SIZE": str(world),
        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
        "HYDRA_DIST_TIMEOUT_S": "60", "HYDRA_DIST_GRACE_S": "5", "PYTHONPATH": str(ROOT),
        "TOKENIZERS_PARALLELISM": "false",
    })
    env.update(extra)
    return env


@dataclass
class Result:
    returncode: int
    stdout: str
    stderr: str
    seconds: float


def launch(args: list[str], *, world: int = 2, timeout: float = 120, cwd: Path = ROOT, **extra: str) -> list[Result]:
    """Run ``python ARGS`` as ranks 0..world-1; kill everything after ``timeout`` (a hang fails the test)."""
    port = free_port()
    t0 = time.monotonic()
    procs = [
        subprocess.Popen([sys.executable, *args], cwd=cwd, env=rank_env(r, world, port, **extra),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for r in range(world)
    ]
    out = []
    for p in procs:
        try:
            stdout, stderr = p.communicate(timeout=max(1.0, timeout - (time.monotonic() - t0)))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            pytest.fail(f"distributed job {args} did not finish within {timeout} s (a rank hangs)")
        out.append(Result(p.returncode, stdout, stderr, time.monotonic() - t0))
    return out


def worker(scenario: str, out_dir: Path, **kw) -> list[Result]:
    return launch([str(WORKER), scenario, str(out_dir)], **kw)


@pytest.fixture(scope="session")
def jobs():
    """``jobs.launch(args, ...)`` and ``jobs.worker(scenario, out_dir, ...)``."""
    import types

    return types.SimpleNamespace(launch=launch, worker=worker, free_port=free_port, rank_env=rank_env)
