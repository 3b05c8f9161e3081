import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from toolchain.errors import CheckFailed, GraphError
from toolchain.export import trt_ops
from toolchain.export.lint import lint_tensorrt
from toolchain.export.precision import write_precision_variant

BERT_PROFILE = {"input_ids": ((1, 1), (4, 32), (16, 128)), "attention_mask": ((1, 1), (4, 32), (16, 128))}
CONV_PROFILE = {"x": ((1, 24, 1), (4, 24, 32), (16, 24, 256))}


def _save(tmp_path, nodes, inputs, outputs, inits=(), opset=17, name="bad.onnx"):
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    path = tmp_path / name
    onnx.save(model, str(path))
    return path


def _vi(name, dtype, dims):
    return helper.make_tensor_value_info(name, dtype, dims)


def _grouped_conv(tmp_path, weight_is_init=True, channels=6):
    w = numpy_helper.from_array(np.zeros((6, 2, 1), np.float32), "w")
    nodes = [helper.make_node("Conv", ["x", "w"], ["y"], name="conv", group=3)]
    inputs = [_vi("x", TensorProto.FLOAT, ["b", channels, "t"])]
    if not weight_is_init:
        inputs.append(_vi("w", TensorProto.FLOAT, [6, 2, 1]))
    return _save(tmp_path, nodes, inputs, [_vi("y", TensorProto.FLOAT, None)], [w] if weight_is_init else [])


class TestGoodGraphs:
    @pytest.mark.parametrize("version", ["10", "11", "10.15"])
    def test_exported_models_pass(self, bert_onnx, conv_onnx, version):
        for path, profile in [(bert_onnx.path, BERT_PROFILE), (conv_onnx.path, CONV_PROFILE)]:
            report = lint_tensorrt(path, version, profile)
            assert report.ok, [str(f) for f in report.errors]
            assert not report.warnings, [str(f) for f in report.warnings]

    @pytest.mark.parametrize("target", ["fp16", "bf16"])
    def test_low_precision_variants_pass(self, tmp_path, bert_onnx, target):
        dst = tmp_path / f"bert_{target}.onnx"
        write_precision_variant(bert_onnx.path, dst, target)
        assert lint_tensorrt(dst, "11", BERT_PROFILE).ok

    def test_grouped_conv_with_static_channels_and_initializer_weights(self, tmp_path):
        assert lint_tensorrt(_grouped_conv(tmp_path), "10", {"x": ((1, 6, 1), (2, 6, 8), (4, 6, 16))}).ok


class TestBadGraphs:
    def test_unsupported_op(self, tmp_path):
        path = _save(tmp_path, [helper.make_node("Unique", ["x"], ["y"], name="uniq")],
                     [_vi("x", TensorProto.FLOAT, [4])], [_vi("y", TensorProto.FLOAT, None)])
        report = lint_tensorrt(path)
        assert not report.ok
        finding = report.errors[0]
        assert (finding.code, finding.node, finding.op) == ("unsupported-op", "uniq", "Unique")
        assert "operators.md" in finding.message

    def test_custom_domain_op_needs_a_plugin(self, tmp_path):
        node = helper.make_node("FusedThing", ["x"], ["y"], name="fused", domain="com.example")
        graph = helper.make_graph([node], "g", [_vi("x", TensorProto.FLOAT, [4])], [_vi("y", TensorProto.FLOAT, [4])])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                        helper.make_opsetid("com.example", 1)])
        onnx.save(model, str(tmp_path / "c.onnx"))
        assert lint_tensorrt(tmp_path / "c.onnx").codes() == {"custom-op"}

    def test_grouped_conv_weight_not_an_initializer_is_only_a_warning(self, tmp_path):
        # no TensorRT source restricts grouped Conv with run-time weights: imported as a tensor input
        report = lint_tensorrt(_grouped_conv(tmp_path, weight_is_init=False), "10",
                               {"x": ((1, 6, 1), (2, 6, 8), (4, 6, 16)), "w": ((6, 2, 1),) * 3})
        assert report.ok, [str(f) for f in report.errors]
        assert any(f.code == "conv-weights" and f.node == "conv" for f in report.warnings)

    def test_grouped_conv_dynamic_channel_dim_passes(self, tmp_path):
        report = lint_tensorrt(_grouped_conv(tmp_path, channels="c"), "10", {"x": ((1, 6, 1), (2, 6, 8), (4, 6, 16))})
        assert report.ok, [str(f) for f in report.errors]

    def test_grouped_conv_channel_mismatch(self, tmp_path):
        report = lint_tensorrt(_grouped_conv(tmp_path, channels=9), "10")
        assert any(f.code == "conv-shape" and "9 != group 3 x weight in-channels 2" in f.message
                   for f in report.errors)

    def test_float64_tensor_is_a_warning(self, tmp_path):
        # the parser casts DOUBLE down to float32 (operators.md data-type note): accepted, with a warning
        path = _save(tmp_path, [helper.make_node("Relu", ["x"], ["y"], name="relu")],
                     [_vi("x", TensorProto.DOUBLE, [4])], [_vi("y", TensorProto.DOUBLE, [4])])
        report = lint_tensorrt(path)
        assert report.ok, [str(f) for f in report.errors]
        assert "dtype" in report.codes("warning")
        assert any("'x'" in f.message and "float64" in f.message and "cast" in f.message for f in report.warnings)

    def test_cast_to_float64_is_a_warning(self, tmp_path):
        path = _save(tmp_path, [helper.make_node("Cast", ["x"], ["y"], name="to64", to=TensorProto.DOUBLE)],
                     [_vi("x", TensorProto.FLOAT, [4])], [_vi("y", TensorProto.DOUBLE, [4])])
        report = lint_tensorrt(path)
        assert report.ok and any(f.node == "to64" for f in report.warnings)

    def test_int16_tensor(self, tmp_path):
        path = _save(tmp_path, [helper.make_node("Identity", ["x"], ["y"], name="id")],
                     [_vi("x", TensorProto.INT16, [4])], [_vi("y", TensorProto.INT16, [4])])
        assert any(f.code == "dtype" and "int16" in f.message for f in lint_tensorrt(path).errors)

    def test_dynamic_dim_not_covered_by_profile(self, bert_onnx):
        report = lint_tensorrt(bert_onnx.path, "10", {"input_ids": BERT_PROFILE["input_ids"]})
        assert not report.ok
        assert any("'attention_mask'" in f.message and f.code == "profile" for f in report.errors)

    def test_profile_for_unknown_input_and_wrong_static_dim(self, conv_onnx):
        profile = {"x": ((1, 12, 1), (2, 12, 8), (4, 12, 16)), "y": ((1,), (1,), (1,))}
        messages = [f.message for f in lint_tensorrt(conv_onnx.path, "10", profile).errors]
        assert any("'y'" in m and "not a graph input" in m for m in messages)
        assert any("axis 1 is static (24)" in m for m in messages)

    def test_profile_rank_and_order(self, conv_onnx):
        bad_rank = lint_tensorrt(conv_onnx.path, "10", {"x": ((1, 24), (2, 24), (4, 24))})
        assert any("rank 3" in f.message for f in bad_rank.errors)
        bad_order = lint_tensorrt(conv_onnx.path, "10", {"x": ((4, 24, 1), (2, 24, 8), (1, 24, 16))})
        assert any("min <= opt <= max" in f.message for f in bad_order.errors)

    def test_reduce_axes_must_be_constant(self, tmp_path):
        node = helper.make_node("ReduceSum", ["x", "axes"], ["y"], name="sum")
        path = _save(tmp_path, [node], [_vi("x", TensorProto.FLOAT, [2, 3]), _vi("axes", TensorProto.INT64, [1])],
                     [_vi("y", TensorProto.FLOAT, None)])
        assert any(f.code == "constant-input" and f.node == "sum" for f in lint_tensorrt(path).errors)

    def test_op_on_a_type_the_parser_lacks(self, tmp_path):
        path = _save(tmp_path, [helper.make_node("MatMul", ["a", "b"], ["y"], name="mm")],
                     [_vi("a", TensorProto.INT64, [2, 2]), _vi("b", TensorProto.INT64, [2, 2])],
                     [_vi("y", TensorProto.INT64, [2, 2])])
        assert any(f.code == "op-dtype" and f.node == "mm" for f in lint_tensorrt(path).errors)

    def test_opset_out_of_range(self, tmp_path):
        path = _save(tmp_path, [helper.make_node("Relu", ["x"], ["y"])], [_vi("x", TensorProto.FLOAT, [2])],
                     [_vi("y", TensorProto.FLOAT, [2])], opset=8)
        assert "opset" in lint_tensorrt(path, "10").codes()


class TestReport:
    def test_raise_if_failed_lists_every_error(self, tmp_path):
        path = _save(tmp_path, [helper.make_node("Unique", ["x"], ["y"], name="u")],
                     [_vi("x", TensorProto.INT16, [4])], [_vi("y", TensorProto.INT16, None)])
        report = lint_tensorrt(path)
        with pytest.raises(CheckFailed) as info:
            report.raise_if_failed()
        assert "unsupported-op" in str(info.value) and "dtype" in str(info.value)
        assert info.value.exit_code == 1

    def test_bad_version(self, conv_onnx):
        with pytest.raises(GraphError, match=r"8\.6"):
            lint_tensorrt(conv_onnx.path, "8.6")

    def test_op_table_is_consistent(self):
        assert not set(trt_ops.SUPPORTED) & trt_ops.UNSUPPORTED
        assert {"MatMul", "Conv", "Gemm", "LayerNormalization", "Softmax", "Erf", "Cast"} <= set(trt_ops.SUPPORTED)
        assert "BF16" in trt_ops.SUPPORTED["Conv"].types
        assert set(trt_ops.OP_SINCE) <= set(trt_ops.SUPPORTED)
        assert all(rule.source for rule in [*trt_ops.OP_SINCE.values(), *trt_ops.FEATURE_SINCE.values()])
        assert "DFT" in trt_ops.SUPPORTED and "DFT" not in trt_ops.UNSUPPORTED
