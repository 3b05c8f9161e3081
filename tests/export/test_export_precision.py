"""FP16/BF16 variants: structure (what computes in which type, and why) and closeness to FP32.

Tolerances (pass if |low - fp32| <= atol + rtol * |fp32| elementwise; statistic: max abs diff):

* FP16 has an 11-bit significand (unit roundoff 2^-11 ~ 4.9e-4, ~3 decimal digits). Logits O(1):
  atol = rtol = 3e-3; probabilities: atol 1e-3. Measured on the tiny models (3 seeds x 3 shapes,
  ORT CPU FP16 vs ORT CPU FP32): BERT logits 7.0e-4 / probs 2.0e-4; grouped Conv 7.7e-4 / 1.8e-4.
* BF16 has an 8-bit significand (2^-8 ~ 3.9e-3, ~2 decimal digits): atol 4e-2, rtol 2e-2 on logits,
  atol 1e-2 on probabilities. Measured (onnx.reference, BF16 vs ORT FP32): BERT 1.0e-2 / 1.6e-3;
  grouped Conv 1.5e-2 / 3.6e-3.

ORT's CPU provider runs the FP16 graphs; it has no BF16 kernels for MatMul/Conv/Add..., so BF16
graphs run in ``onnx.reference`` (tiny graphs only).
"""

import ml_dtypes
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from export_models import bert_inputs, conv_inputs
from onnx import TensorProto, helper, numpy_helper

from toolchain.errors import GraphError
from toolchain.export.onnx_export import export_onnx
from toolchain.export.precision import (
    FP16_MAX,
    compute_dtypes,
    convert_precision,
    float32_to_bfloat16_bits,
    write_precision_variant,
)
from toolchain.export.reference import reference_run

TOL = {
    "fp16": {"logits": (3e-3, 3e-3), "probs": (1e-3, 0.0)},
    "bf16": {"logits": (4e-2, 2e-2), "probs": (1e-2, 0.0)},
}
LOW = {"fp16": "float16", "bf16": "bfloat16"}


def _ops(model, op_type):
    return [n.name for n in model.graph.node if n.op_type == op_type]


def _assert_close(got, ref, target):
    for name, (atol, rtol) in TOL[target].items():
        diff = np.abs(got[name].astype(np.float64) - ref[name])
        assert not np.isnan(got[name]).any(), name
        assert (diff <= atol + rtol * np.abs(ref[name])).all(), f"{target} {name}: max abs diff {diff.max():.3g}"


def _fp32(path, feed):
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in session.get_outputs()], session.run(None, feed)))


def _run_low(model, target, feed):
    if target == "fp16":
        session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        return dict(zip([o.name for o in session.get_outputs()], session.run(None, feed)))
    return reference_run(model, feed)


class TestBfloat16Rounding:
    def test_matches_ml_dtypes_round_to_nearest_even(self):
        rng = np.random.default_rng(0)
        values = np.concatenate([
            rng.standard_normal(2000).astype(np.float32) * 10.0 ** rng.integers(-30, 30, 2000),
            np.array([1.0 + 2**-8, 1.0 + 3 * 2**-8, -(1.0 + 2**-8), 0.0, -0.0, np.inf, -np.inf, 3.4e38],
                     dtype=np.float32),  # ties go to even; 3.4e38 rounds past the largest bf16 to inf
        ])
        expected = values.astype(ml_dtypes.bfloat16).view(np.uint16)
        np.testing.assert_array_equal(float32_to_bfloat16_bits(values), expected)

    def test_nan_stays_nan(self):
        bits = float32_to_bfloat16_bits(np.array([np.nan, -np.nan, np.float32(np.nan) * 0], dtype=np.float32))
        assert np.isnan(bits.view(ml_dtypes.bfloat16).astype(np.float32)).all()

    def test_ties_to_even_by_hand(self):
        # 1 + 2^-8 lies halfway between bf16 1.0 (even) and 1 + 2^-7: it rounds down to 0x3F80.
        assert float32_to_bfloat16_bits(np.array([1.0 + 2**-8], dtype=np.float32))[0] == 0x3F80
        # 1 + 3*2^-8 lies halfway between 1 + 2^-7 (odd) and 1 + 2^-6 (even): it rounds up to 0x3F82.
        assert float32_to_bfloat16_bits(np.array([1.0 + 3 * 2**-8], dtype=np.float32))[0] == 0x3F82


@pytest.mark.parametrize("target", ["fp16", "bf16"])
class TestBertVariant:
    def test_structure(self, bert_onnx, target):
        result = convert_precision(bert_onnx.path, target)
        model = result.model
        onnx.checker.check_model(model, full_check=True)
        types = compute_dtypes(model)
        for name in _ops(model, "LayerNormalization") + _ops(model, "Softmax") + _ops(model, "Erf"):
            assert types[name] == "float", name
            assert "keep_fp32_ops" in result.kept_fp32[name]
        assert "normalisation" in result.kept_fp32[_ops(model, "LayerNormalization")[0]]
        assert "softmax" in result.kept_fp32[_ops(model, "Softmax")[0]]
        matmuls = _ops(model, "MatMul") + _ops(model, "Gemm")
        assert len(matmuls) >= 14 and all(types[m] == LOW[target] for m in matmuls)
        assert all(v.type.tensor_type.elem_type == TensorProto.FLOAT for v in model.graph.output)
        assert [v.type.tensor_type.elem_type for v in model.graph.input] == [TensorProto.INT64] * 2
        low_inits = [i for i in model.graph.initializer if i.data_type != TensorProto.FLOAT and i.dims]
        assert low_inits and all(i.data_type == getattr(TensorProto, LOW[target].upper()) for i in low_inits
                                 if i.data_type in (TensorProto.FLOAT16, TensorProto.BFLOAT16))
        # LayerNorm gamma/beta are read in FP32 directly, not rounded through 16 bits
        for ln in model.graph.node:
            if ln.op_type == "LayerNormalization":
                assert not any("__to_float" in t for t in ln.input[1:]), ln.input

    def test_close_to_fp32(self, bert_onnx, target):
        model = convert_precision(bert_onnx.path, target).model
        for shape in [(3, 9), (1, 16)]:
            feed = {k: v.numpy() for k, v in bert_inputs(shape, seed=1).items()}
            _assert_close(_run_low(model, target, feed), _fp32(bert_onnx.path, feed), target)


class TestGroupedConvVariant:
    def test_fp16_conv_runs_in_fp16_and_is_close(self, conv_onnx):
        result = convert_precision(conv_onnx.path, "fp16")
        types = compute_dtypes(result.model)
        assert all(types[c] == "float16" for c in _ops(result.model, "Conv"))
        assert {types[n] for n in _ops(result.model, "ReduceMean")} == {"float"}
        assert "reduction" in result.kept_fp32[_ops(result.model, "ReduceMean")[0]]
        feed = {k: v.numpy() for k, v in conv_inputs((3, 24, 9), seed=2).items()}
        _assert_close(_run_low(result.model, "fp16", feed), _fp32(conv_onnx.path, feed), "fp16")

    def test_bf16_at_opset17_keeps_conv_fp32_and_says_why(self, conv_onnx):
        result = convert_precision(conv_onnx.path, "bf16")
        for conv in _ops(result.model, "Conv"):
            assert compute_dtypes(result.model)[conv] == "float"
            assert "opset 17" in result.kept_fp32[conv] and "opset=22" in result.kept_fp32[conv]

    def test_bf16_at_opset22_runs_conv_in_bf16_and_is_close(self, conv_onnx):
        result = convert_precision(conv_onnx.path, "bf16", opset=22)
        assert result.model.opset_import[0].version == 22
        types = compute_dtypes(result.model)
        assert all(types[c] == "bfloat16" for c in _ops(result.model, "Conv"))
        assert not any("Conv" in reason for reason in result.kept_fp32.values())
        feed = {k: v.numpy() for k, v in conv_inputs((2, 24, 11), seed=3).items()}
        _assert_close(_run_low(result.model, "bf16", feed), _fp32(conv_onnx.path, feed), "bf16")


class TestConfiguration:
    def test_keep_fp32_nodes(self, conv_onnx):
        head = next(n for n in _ops(convert_precision(conv_onnx.path, "fp16").model, "MatMul"))
        result = convert_precision(conv_onnx.path, "fp16", keep_fp32_nodes=[head])
        assert result.kept_fp32[head] == "listed in keep_fp32_nodes"
        assert compute_dtypes(result.model)[head] == "float"

    def test_unknown_node_name_is_an_error(self, conv_onnx):
        with pytest.raises(GraphError, match="no_such_node"):
            convert_precision(conv_onnx.path, "fp16", keep_fp32_nodes=["no_such_node"])

    def test_keep_fp32_ops_replaces_the_defaults(self, conv_onnx):
        result = convert_precision(conv_onnx.path, "fp16", keep_fp32_ops=["Softmax", "Conv"])
        types = compute_dtypes(result.model)
        assert all(types[c] == "float" for c in _ops(result.model, "Conv"))
        assert all(types[n] == "float16" for n in _ops(result.model, "LayerNormalization"))
        assert result.kept_fp32[_ops(result.model, "Conv")[0]].startswith("Conv in keep_fp32_ops")

    def test_bad_target(self, conv_onnx):
        with pytest.raises(GraphError, match="fp8"):
            convert_precision(conv_onnx.path, "fp8")

    def test_decomposed_layernorm_from_opset16_stays_fp32(self, tmp_path, conv_module):
        from export_models import CONV_AXES, CONV_EXPORT_SHAPE

        path = tmp_path / "c16.onnx"
        export_onnx(conv_module, conv_inputs(CONV_EXPORT_SHAPE), ["logits", "probs"], path, dynamic_axes=CONV_AXES,
                    opset=16)
        result = convert_precision(path, "fp16")
        types = compute_dtypes(result.model)
        pattern = [n for n, why in result.kept_fp32.items() if "decomposed LayerNorm" in why]
        ops = {n.name: n.op_type for n in result.model.graph.node}
        assert sorted(ops[n] for n in pattern) == ["Add", "Div", "Pow", "ReduceMean", "ReduceMean", "Sqrt", "Sub"]
        assert all(types[n] == "float" for n in pattern)
        feed = {k: v.numpy() for k, v in conv_inputs((2, 24, 5), seed=4).items()}
        _assert_close(_run_low(result.model, "fp16", feed), _fp32(path, feed), "fp16")


def test_fp16_clamps_out_of_range_constants_but_keeps_infinities():
    weight = numpy_helper.from_array(np.array([1e6, -1e6, 0.5, -np.inf], dtype=np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "w"], ["y"], name="add")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])], [weight])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    result = convert_precision(model, "fp16")
    assert result.clamped_values == 2
    converted = next(i for i in result.model.graph.initializer if i.data_type == TensorProto.FLOAT16)
    np.testing.assert_array_equal(numpy_helper.to_array(converted), [FP16_MAX, -FP16_MAX, 0.5, -np.inf])
    out = _run_low(result.model, "fp16", {"x": np.zeros(4, np.float32)})["y"]
    np.testing.assert_array_equal(out, [FP16_MAX, -FP16_MAX, 0.5, -np.inf])


def test_bf16_clamps_float32_extremes_so_a_mask_fill_stays_finite():
    # BERT's extended attention mask: (1 - mask) * finfo(float32).min; in BF16 the constant must not
    # round to -inf (0 * -inf = NaN on every kept token)
    fill = numpy_helper.from_array(np.array([np.finfo(np.float32).min, 1e38, -np.inf], dtype=np.float32), "fill")
    graph = helper.make_graph(
        [helper.make_node("Mul", ["x", "fill"], ["y"], name="mul")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])], [fill])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    result = convert_precision(model, "bf16")
    assert result.clamped_values == 1
    converted = next(i for i in result.model.graph.initializer if i.data_type == TensorProto.BFLOAT16)
    values = numpy_helper.to_array(converted).astype(np.float32)
    assert values[0] == -float(ml_dtypes.finfo(ml_dtypes.bfloat16).max) and values[2] == -np.inf
    out = reference_run(result.model, {"x": np.zeros(3, np.float32)})["y"]
    assert np.isfinite(out[:2]).all() and np.isnan(out[2])  # a real infinity keeps its meaning


def test_write_precision_variant_files(tmp_path, bert_onnx):
    dst = tmp_path / "bert_fp16.onnx"
    result = write_precision_variant(bert_onnx.path, dst, "fp16")
    onnx.checker.check_model(str(dst), full_check=True)
    assert dst.with_name("bert_fp16.summary.json").exists()
    report = dst.with_name("bert_fp16.precision.json").read_text()
    assert "LayerNormalization" in report and result.casts_inserted > 0


def test_constant_nodes_are_converted_like_initializers():
    nodes = [
        helper.make_node("Constant", [], ["half"], name="c_half", value_float=0.5),
        helper.make_node("Constant", [], ["big"], name="c_big",
                         value=numpy_helper.from_array(np.array([1e5], np.float32))),
        helper.make_node("Mul", ["x", "half"], ["h"], name="mul"),
        helper.make_node("Add", ["h", "big"], ["y"], name="add"),
    ]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    for target in ("fp16", "bf16"):
        result = convert_precision(model, target)
        assert result.converted_constants == 2 and not _ops(result.model, "Constant")
        assert compute_dtypes(result.model)["mul"] == LOW[target]
        out = _run_low(result.model, target, {"x": np.array([2.0, 4.0], np.float32)})["y"]
        big = FP16_MAX if target == "fp16" else float(np.float32(1e5).astype(ml_dtypes.bfloat16))  # 99840
        np.testing.assert_allclose(out, [big, big], rtol=1e-3)  # + 1 or + 2 is below half an ulp there


def test_rsqrt_form_decomposed_layernorm_stays_fp32(tmp_path):
    """The rsqrt form ``d * rsqrt(mean(d * d) + eps)`` (hand-written LayerNorms, and Hydra graphs
    exported before their LayerNorms became ``LayerNormalization`` nodes) is matched as a whole."""
    import torch

    class RsqrtNorm(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj = torch.nn.Conv1d(8, 8, 1)

        def forward(self, x):
            y = self.proj(x).reshape(-1, 2, 4, x.shape[-1])  # two members of 4 channels
            d = y - y.mean(dim=2, keepdim=True)
            out = d * torch.rsqrt((d * d).mean(dim=2, keepdim=True) + 1e-5)
            return {"y": torch.addcmul(torch.zeros(2, 4, 1), out, torch.ones(2, 4, 1)).reshape(x.shape)}

    res = export_onnx(RsqrtNorm().eval(), {"x": torch.randn(2, 8, 5)}, ["y"], tmp_path / "n.onnx",
                      dynamic_axes={"x": {0: "b", 2: "t"}})
    model = onnx.load(res.path)
    ops = {n.name: n.op_type for n in model.graph.node}
    out = convert_precision(model, "fp16")
    kept = sorted(ops[n] for n, why in out.kept_fp32.items() if "decomposed LayerNorm" in why and n in ops)
    # the squared deviation, the variance, eps add, sqrt and the normalising divide/multiply
    assert {"Mul", "ReduceMean", "Add", "Sqrt", "Sub"} <= set(kept), kept
    assert kept.count("Mul") >= 2  # Mul(d, d) and Mul(d, rsqrt)
