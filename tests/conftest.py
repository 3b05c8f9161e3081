"""Test-wide settings: offline hub, deterministic torch, few threads (CI has 2 cores, shared by the xdist workers)."""

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # --import-mode=importlib: make cli_runner importable
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest
import torch

#: torch threads per test process: CI's 2 cores, shared out among pytest-xdist workers (``-n``);
#: a worker's subprocesses (the CLI) get the same share through OMP_NUM_THREADS
THREADS = max(1, 2 // int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))
if "PYTEST_XDIST_WORKER" in os.environ:
    os.environ["OMP_NUM_THREADS"] = str(THREADS)
torch.set_num_threads(THREADS)


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


def _string_literals(path) -> list[tuple[int, str]]:
    """``(line, value)`` of every string constant in a Python file that is not a docstring/bare string."""
    import ast
    from pathlib import Path

    tree = ast.parse(Path(path).read_text(), filename=str(path))
    bare = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)}
    return [(n.lineno, n.value) for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in bare]


@pytest.fixture(scope="session")
def string_literals():
    """The registry tests' source scan: :func:`_string_literals` (docstrings and comments are allowed)."""
    return _string_literals


def _browser_dom(page) -> str:
    """The DOM of a local HTML file after headless Chromium (Debian's ``chromium``) has loaded and rendered it."""
    import shutil
    import subprocess
    import tempfile
    from pathlib import Path

    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        pytest.skip("Debian's chromium is not installed (scripts/setup.sh installs it when run as root)")
    with tempfile.TemporaryDirectory() as profile:
        out = subprocess.run(
            [exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={profile}", "--dump-dom", Path(page).resolve().as_uri()],
            capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip(), out.stderr[-2000:]
    return out.stdout


@pytest.fixture(scope="session")
def browser_dom():
    """``browser_dom(path) -> str``: the page's DOM as headless Chromium rendered it (skips without Chromium)."""
    return _browser_dom
