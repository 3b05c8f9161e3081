"""Bench test fixtures: the fake runners' and the script loader's modules on the path, and the benchmark scripts."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # --import-mode=importlib: make bench_fakes importable

from bench_scripts import load_script


@pytest.fixture(scope="session")
def diversity_run():
    """``benchmarks/diversity/run.py``."""
    return load_script("benchmarks/diversity/run.py", "diversity_run")


@pytest.fixture(scope="session")
def diversity_heldout():
    """``benchmarks/diversity/heldout.py``."""
    return load_script("benchmarks/diversity/heldout.py", "diversity_heldout")


@pytest.fixture(scope="session")
def parity_eval_size():
    """``benchmarks/parity_tolerances/eval_size.py``."""
    return load_script("benchmarks/parity_tolerances/eval_size.py", "parity_eval_size")
