"""profile.py: per-op-type totals of an ONNX Runtime trace (hand-made and real)."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from toolchain.bench.profile import breakdown_table, drop_runs, op_totals, profile_onnx


def _kernel(name, op, ts, dur):
    return {"cat": "Node", "name": f"{name}_kernel_time", "ts": ts, "dur": dur, "args": {"op_name": op}}


TRACE = [
    {"cat": "Session", "name": "model_run", "ts": 0, "dur": 10},
    _kernel("mm", "MatMul", 2, 5),  # warm-up run
    {"cat": "Session", "name": "model_run", "ts": 20, "dur": 10},
    _kernel("mm", "MatMul", 21, 4),
    _kernel("add", "Add", 26, 2),
    {"cat": "Node", "name": "add_fence_before", "ts": 25, "dur": 1, "args": {"op_name": "Add"}},
    {"cat": "Session", "name": "model_run", "ts": 40, "dur": 14},
    _kernel("mm", "MatMul", 41, 6),
    _kernel("add", "Add", 48, 2),
]


class TestTotals:
    def test_drop_warmup_runs(self):
        kept = drop_runs(TRACE, 1)
        assert all(e["ts"] > 10 for e in kept)
        assert len(kept) == len(TRACE) - 2
        assert drop_runs(TRACE, 0) == TRACE

    def test_op_totals(self):
        t = op_totals(drop_runs(TRACE, 1), runs=2)
        assert t["total_ms"] == pytest.approx((4 + 2 + 6 + 2) / 2 / 1e3)
        assert list(t["ops"]) == ["MatMul", "Add"]  # biggest first; fences are not kernels
        assert t["ops"]["MatMul"] == {"ms": pytest.approx(5e-3), "share": pytest.approx(10 / 14), "calls": 1}
        assert t["ops"]["Add"]["calls"] == 1
        assert t["run_ms"] == pytest.approx(12e-3)  # median of the two kept model_run events

    def test_table(self):
        t = op_totals(drop_runs(TRACE, 1), runs=2)
        md = breakdown_table({"a": t, "b": t})
        assert md.splitlines()[0].startswith("| op type | a ms")
        assert "| MatMul | 0.01 (71%, 1) | 0.01 (71%, 1) |" in md
        assert "**all kernels**" in md


def test_profile_real_graph(tmp_path):
    w = numpy_helper.from_array(np.ones((8, 8), dtype=np.float32), "w")
    b = numpy_helper.from_array(np.ones(8, dtype=np.float32), "b")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Add", ["h", "b"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 8])], [w, b])
    path = tmp_path / "g.onnx"
    onnx.save_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    out = profile_onnx({"g": path}, {"x": np.ones((4, 8), dtype=np.float32)}, threads=1, runs=3, warmup=1,
                       keep_dir=tmp_path / "prof")
    assert out["g"]["total_ms"] >= 0 and out["g"]["ops"]
    assert set(out["g"]["ops"]) <= {"MatMul", "Add", "Gemm", "FusedGemm", "MatMulAdd"}  # ORT may fuse the pair
    assert sum(out["g"]["optimized_ops"].values()) >= 1
    with pytest.raises(ValueError):
        profile_onnx({"g": path}, {}, runs=0)
