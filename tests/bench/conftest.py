"""Bench test fixtures: the fake runners' module on the path, and the diversity benchmark scripts."""

import importlib.util
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # --import-mode=importlib: make bench_fakes importable

ROOT = Path(__file__).resolve().parents[2]


def _script(relpath: str, name: str):
    """A benchmark script (not a package module) loaded from its path."""
    spec = importlib.util.spec_from_file_location(name, ROOT / relpath)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="session")
def diversity_run():
    """``benchmarks/diversity/run.py``."""
    return _script("benchmarks/diversity/run.py", "diversity_run")


@pytest.fixture(scope="session")
def diversity_heldout():
    """``benchmarks/diversity/heldout.py``."""
    return _script("benchmarks/diversity/heldout.py", "diversity_heldout")


@pytest.fixture(scope="session")
def parity_eval_size():
    """``benchmarks/parity_tolerances/eval_size.py``."""
    return _script("benchmarks/parity_tolerances/eval_size.py", "parity_eval_size")
