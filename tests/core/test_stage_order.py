"""Run order comes from the stages' ``upstream``; the pipeline core imports no stage."""

from __future__ import annotations

import subprocess
import sys

import pytest

from toolchain.errors import ToolchainError
from toolchain.pipeline import Stage, run_order, stages


def _stage(name: str, *upstream: str) -> Stage:
    return Stage(name, (), tuple(upstream), lambda ctx, work: {}, name)


def test_every_stage_runs_after_its_upstream():
    order = list(stages())
    assert order[0] == "load" and order[-1] == "report"
    for name, st in stages().items():
        assert all(order.index(u) < order.index(name) for u in st.upstream), name
    assert {n for n, st in stages().items() if st.distributed} == {"score", "prune", "ensemble"}


def test_run_order_is_topological_whatever_the_registration_order():
    registry = {s.name: s for s in (_stage("report", "export"), _stage("export", "fuse"), _stage("fuse", "load"),
                                     _stage("load"), _stage("score", "load"))}
    assert run_order(registry) == ["load", "fuse", "export", "report", "score"]
    with pytest.raises(ToolchainError, match="cycle"):
        run_order({"a": _stage("a", "b"), "b": _stage("b", "a")})


def test_the_pipeline_core_imports_no_stage():
    code = "import sys, toolchain.pipeline; print(sorted(m for m in sys.modules if m.startswith('toolchain.stages')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
