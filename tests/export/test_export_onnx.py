import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from export_models import (
    BERT_AXES,
    BERT_EXPORT_SHAPE,
    CONV_AXES,
    CONV_EXPORT_SHAPE,
    TinyGroupedConv,
    bert_inputs,
    conv_inputs,
)
from torch import nn

from toolchain.engines.onnxrt.dynamic import check_dynamic
from toolchain.errors import CheckFailed, GraphError
from toolchain.export.graph import graph_summary, load_checked
from toolchain.export.onnx_export import export_onnx


class TestExport:
    def test_writes_checked_graph_and_summary(self, bert_onnx):
        path = bert_onnx.path
        onnx.checker.check_model(str(path), full_check=True)
        summary = json.loads(bert_onnx.summary_path.read_text())
        assert bert_onnx.summary_path == path.with_name("bert.summary.json")
        assert summary == graph_summary(path)
        assert summary["inputs"] == [
            {"name": "input_ids", "dtype": "int64", "dims": ["batch", "seq"]},
            {"name": "attention_mask", "dtype": "int64", "dims": ["batch", "seq"]},
        ]
        assert [o["name"] for o in summary["outputs"]] == ["logits", "probs"]
        assert summary["outputs"][0]["dims"] == ["batch", 3]
        assert summary["opset"] == {"ai.onnx": 17}
        assert summary["operators"]["MatMul"] >= 12
        assert summary["parameters"] > 30_000 and summary["initializer_bytes"] >= 4 * 30_000
        assert summary["file_bytes"] == path.stat().st_size
        assert summary["export_input_shapes"] == {"input_ids": [2, 8], "attention_mask": [2, 8]}
        assert bert_onnx.external_data is None and summary["external_data_files"] == []
        assert sorted(p.name for p in path.parent.iterdir()) == ["bert.onnx", "bert.summary.json"]  # no temp left

    def test_grouped_conv_is_kept_and_counted(self, conv_onnx):
        summary = conv_onnx.summary
        assert summary["grouped_conv"] == 2
        assert sorted(summary["conv_groups"].values()) == [3, 3]
        assert summary["inputs"] == [{"name": "x", "dtype": "float", "dims": ["batch", 24, "time"]}]

    def test_opset17_lowers_layernorm_to_one_node_and_gelu_to_erf(self, bert_onnx, conv_onnx):
        for result in (bert_onnx, conv_onnx):
            ops = result.summary["operators"]
            assert ops.get("LayerNormalization", 0) >= 1
            assert "Erf" in ops and "Pow" not in ops and "Sqrt" not in ops

    def test_opset16_decomposes_layernorm(self, tmp_path, conv_module):
        result = export_onnx(conv_module, conv_inputs(CONV_EXPORT_SHAPE), ["logits", "probs"], tmp_path / "c16.onnx",
                             dynamic_axes=CONV_AXES, opset=16)
        ops = result.summary["operators"]
        assert "LayerNormalization" not in ops
        assert {"ReduceMean", "Sub", "Pow", "Sqrt", "Div"} <= set(ops)

    def test_external_data_travels_with_the_graph(self, tmp_path, bert_module, bert_onnx):
        path = tmp_path / "ext" / "bert.onnx"
        result = export_onnx(bert_module, bert_inputs(BERT_EXPORT_SHAPE), ["logits", "probs"], path,
                             dynamic_axes=BERT_AXES, external_data=True)
        assert result.external_data == path.with_name("bert.onnx.data")
        assert result.summary["external_data_files"] == ["bert.onnx.data"]
        assert result.summary["external_data_bytes"] > 100_000
        assert result.summary["file_bytes"] < bert_onnx.summary["file_bytes"] - 100_000
        load_checked(path)
        feed = {k: v.numpy() for k, v in bert_inputs((3, 6)).items()}
        got = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(["logits"], feed)[0]
        with torch.inference_mode():
            ref = bert_module(**bert_inputs((3, 6)))["logits"].numpy()
        np.testing.assert_allclose(got, ref, atol=1e-4)

    def test_reexport_without_external_data_removes_stale_weights_file(self, tmp_path, conv_module):
        path = tmp_path / "m.onnx"
        args = (conv_module, conv_inputs(CONV_EXPORT_SHAPE), ["logits", "probs"], path)
        export_onnx(*args, dynamic_axes=CONV_AXES, external_data=True)
        assert path.with_name("m.onnx.data").exists()
        export_onnx(*args, dynamic_axes=CONV_AXES, external_data=False)
        assert not path.with_name("m.onnx.data").exists()
        load_checked(path)

    def test_dynamo_exporter_keeps_conv_groups_at_opset18(self, tmp_path, conv_module):
        result = export_onnx(conv_module, conv_inputs((2, 24, 7)), ["logits", "probs"], tmp_path / "d.onnx",
                             dynamic_axes={"x": {0: "batch", 2: "time"}}, opset=18, exporter="dynamo")
        assert result.summary["grouped_conv"] == 2
        assert result.summary["opset"]["ai.onnx"] == 18
        check_dynamic(result.path, conv_module, conv_inputs, [(1, 24, 3), (4, 24, 11)])


class TestExportArguments:
    def test_unknown_dynamic_axis_name(self, tmp_path, conv_module):
        with pytest.raises(GraphError, match="'y'"):
            export_onnx(conv_module, conv_inputs(CONV_EXPORT_SHAPE), ["logits", "probs"], tmp_path / "m.onnx",
                        dynamic_axes={"y": {0: "batch"}})

    def test_dynamo_below_opset18_is_refused(self, tmp_path, conv_module):
        with pytest.raises(GraphError, match="opset 17"):
            export_onnx(conv_module, conv_inputs(CONV_EXPORT_SHAPE), ["logits"], tmp_path / "m.onnx",
                        dynamic_axes={}, exporter="dynamo")

    def test_output_name_the_module_does_not_return(self, tmp_path, conv_module):
        with pytest.raises(GraphError, match="scores"):
            export_onnx(conv_module, conv_inputs(CONV_EXPORT_SHAPE), ["logits", "scores"], tmp_path / "m.onnx",
                        dynamic_axes={})
        assert not any(p.name.startswith(".m.onnx.tmp") for p in tmp_path.iterdir())


class TestCheckDynamic:
    def test_bert_ort_matches_torch_at_new_shapes(self, bert_onnx, bert_module):
        shapes = [(1, 5), (3, 13)]
        assert BERT_EXPORT_SHAPE not in shapes
        report = check_dynamic(bert_onnx.path, bert_module, bert_inputs, shapes,
                               atol={"logits": 1e-4, "probs": 1e-5})
        assert report.ok and len(report.comparisons) == 4
        assert max(c.max_abs_diff for c in report.comparisons if c.output == "logits") <= 1e-4
        assert max(c.max_abs_diff for c in report.comparisons if c.output == "probs") <= 1e-5

    def test_grouped_conv_ort_matches_torch_at_new_shapes(self, conv_onnx, conv_module):
        report = check_dynamic(conv_onnx.path, conv_module, conv_inputs, [(1, 24, 3), (5, 24, 11)],
                               atol={"logits": 1e-4, "probs": 1e-5})
        assert report.ok

    def test_catches_a_specialised_dim(self, tmp_path):
        class Specialised(nn.Module):
            def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
                steps = int(x.shape[1])  # a Python int: the trace freezes T
                return {"y": x + torch.arange(steps, dtype=x.dtype)}

        module = Specialised()
        path = tmp_path / "spec.onnx"
        export_onnx(module, {"x": torch.randn(2, 4)}, ["y"], path, dynamic_axes={"x": {0: "b", 1: "t"}})
        report = check_dynamic(path, module, lambda s: {"x": torch.randn(*s)}, [(3, 4), (2, 6)],
                               raise_on_failure=False)
        assert not report.ok and len(report.failures) == 1 and "(2, 6)" in report.failures[0]
        with pytest.raises(CheckFailed, match="specialised"):
            check_dynamic(path, module, lambda s: {"x": torch.randn(*s)}, [(2, 6)])

    def test_values_over_tolerance_fail_with_the_statistic(self, conv_onnx):
        other = TinyGroupedConv(seed=1)  # different weights: values must disagree
        report = check_dynamic(conv_onnx.path, other, conv_inputs, [(2, 24, 5)], raise_on_failure=False)
        assert not report.ok
        assert all("max abs diff" in f for f in report.failures)


def test_summary_of_a_missing_file_is_a_graph_error(tmp_path):
    with pytest.raises(GraphError, match="not found"):
        graph_summary(Path(tmp_path / "none.onnx"))
