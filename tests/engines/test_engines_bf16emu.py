"""onnxrt-cpu-bf16emu: a BF16 graph on ONNX Runtime's CPU provider, FP32 kernels with exact BF16 rounding."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from toolchain.engines import make_runner, runner_kinds
from toolchain.engines.onnxrt.bf16emu import emulate_bf16
from toolchain.errors import GraphError
from toolchain.parity import ReferenceEvaluatorRunner

BF16 = ml_dtypes.bfloat16


def _bf16_graph(path):
    """x [B, 8] -> Cast(bf16) -> MatMul(w) -> Mul(s) -> Add(b) -> Div(d) -> Cast(fp32); small integers in
    x and w keep the MatMul sums exact, so any difference is rounding, not summation order."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(v.astype(BF16), n) for n, v in (
        ("w", rng.integers(-8, 9, (8, 5)).astype(np.float32)), ("s", rng.uniform(0.5, 2.0, 5).astype(np.float32)),
        ("b", rng.uniform(-1, 1, 5).astype(np.float32)), ("d", rng.uniform(1.0, 3.0, 5).astype(np.float32)))]
    nodes = [helper.make_node("Cast", ["x"], ["xb"], to=TensorProto.BFLOAT16),
             helper.make_node("MatMul", ["xb", "w"], ["m"]), helper.make_node("Mul", ["m", "s"], ["ms"]),
             helper.make_node("Add", ["ms", "b"], ["a"]), helper.make_node("Div", ["a", "d"], ["q"]),
             helper.make_node("Cast", ["q"], ["y"], to=TensorProto.FLOAT)]
    graph = helper.make_graph(nodes, "bf16", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 5])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, str(path))
    return model


def test_registered():
    assert "onnxrt-cpu-bf16emu" in runner_kinds()


def test_emulation_is_bit_identical_to_true_bf16_arithmetic(tmp_path):
    path = tmp_path / "g.onnx"
    model = _bf16_graph(path)
    x = np.random.default_rng(1).integers(-20, 21, (64, 8)).astype(np.float32) * 1.37
    with pytest.raises(GraphError):  # the reason for the emulation: no BF16 MatMul kernel on ORT's CPU provider
        with make_runner("onnxrt-cpu", path=path) as plain:
            plain.infer({"x": x})
    with make_runner("onnxrt-cpu-bf16emu", path=path) as emu:
        got = emu.infer({"x": x})["y"]
        assert emu.emulation == {"initializers": 4, "constants": 0, "rounded_outputs": 4, "casts_to_bf16": 1,
                                 "io": []}
    with ReferenceEvaluatorRunner(path) as ref:
        want = ref.infer({"x": x})["y"]
    assert got.dtype == np.float32 and np.array_equal(got, want)
    # rounding really happens: every value is a BF16 value, and FP32 arithmetic gives other numbers
    assert np.array_equal(got, got.astype(BF16).astype(np.float32))
    weights = {i.name: numpy_helper.to_array(i).astype(np.float32) for i in model.graph.initializer}
    fp32 = ((x.astype(BF16).astype(np.float32) @ weights["w"]) * weights["s"] + weights["b"]) / weights["d"]
    assert not np.array_equal(got, fp32) and np.abs(got - fp32).max() < 0.05 * np.abs(fp32).max()


def test_cast_rounds_to_nearest_even_like_ml_dtypes(tmp_path):
    path = tmp_path / "g.onnx"
    _bf16_graph(path)
    rewritten = emulate_bf16(onnx.load(str(path))).model
    cast = next(n for n in rewritten.graph.node if n.op_type == "Cast" and n.attribute[0].i == TensorProto.BFLOAT16)
    graph = helper.make_graph([helper.make_node("Cast", ["x"], ["b"], to=TensorProto.BFLOAT16),
                               helper.make_node("Cast", ["b"], ["y"], to=TensorProto.FLOAT)], "c",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(tmp_path / "c.onnx"))
    ties = np.array([1 + 2**-8, 1 + 3 * 2**-8, -(1 + 2**-8), 3.0e38, 1e-40, np.inf], np.float32)
    x = np.concatenate([np.random.default_rng(2).standard_normal(50_000).astype(np.float32), ties])
    with make_runner("onnxrt-cpu", path=tmp_path / "c.onnx") as runner:
        y = runner.infer({"x": x})["y"]
    assert cast.input and np.array_equal(y, x.astype(BF16).astype(np.float32))


def test_graph_without_bf16_is_unchanged(tmp_path):
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "f",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    done = emulate_bf16(model)
    assert done.model == model and done.report()["rounded_outputs"] == 0
