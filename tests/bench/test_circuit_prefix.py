"""benchmarks/circuit_prefix: a quick run times both variants and finds the same scores bit for bit."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_quick_run_writes_identical_scores_and_both_timings(tmp_path):
    spec = importlib.util.spec_from_file_location("circuit_prefix_run", ROOT / "benchmarks/circuit_prefix/run.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    res = mod.main(["--repeats", "1", "--samples", "8", "--batch-size", "4", "--max-length", "16",
                    "--out", str(tmp_path)])
    assert res["identical"] is True
    assert len(res["seconds"]["shared"]) == len(res["seconds"]["unshared"]) == 2  # one ABBA pair
    assert json.loads((tmp_path / "results.json").read_text())["identical"] is True
    assert "bit for bit identical: **True**" in (tmp_path / "results.md").read_text()
