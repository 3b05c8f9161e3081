"""Bench test fixtures: the fake runners' module on the path, and one tiny exported folder."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # --import-mode=importlib: make bench_fakes importable
