"""Benchmark scripts (``benchmarks/<name>/<file>.py``, not package modules) loaded from their paths for the tests."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]


def load_script(relpath: str, name: str) -> ModuleType:
    """The script at ``ROOT / relpath`` as a module called ``name`` (not registered in ``sys.modules``)."""
    spec = importlib.util.spec_from_file_location(name, ROOT / relpath)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
