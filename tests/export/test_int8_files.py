"""INT8 (Q/DQ) graphs from files: ``export --precision int8 --data``, ``parity`` on ONNX Runtime and OpenVINO,
the float fallback (``parity --rescue --calib``), ``bench --precision int8``.

A tiny BERT with MiniLM's tokenizer and its Hydra folder (the ``files`` fixture of conftest.py), calibrated
on 128 real tweets; the gate passes the honest graphs, fails a copy whose weight scale is broken (exit 1,
its weight named), and the fallback finds the layers to keep in float when the tolerances ask for more
than INT8 gives.
"""

from __future__ import annotations

import csv
import json

import numpy as np
import onnx
import pytest
from export_models import run_cli

main = run_cli


@pytest.fixture(scope="module")
def int8(files, tmp_path_factory):
    """``single.int8.onnx`` and ``hydra-conv.int8.onnx`` (with their FP32 graphs) calibrated on 128 tweets."""
    from toolchain.data import load_tweets

    tmp = tmp_path_factory.mktemp("int8")
    tweets = load_tweets()
    rows = np.random.default_rng(3).permutation(len(tweets.texts))[200:328]  # not the parity rows (0-110)
    calib = tmp / "calib.csv"
    with calib.open("w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["text", "label"])
        w.writerows((tweets.texts[i], tweets.class_names[int(tweets.labels[i])]) for i in rows)
    outs = {}
    for src in (files["ckpt"], files["hydra"]):
        outs[src.name] = main("export", str(src), "-o", str(tmp / "g"), "--precision", "fp32,int8", "--data",
                              str(calib), "--lowering", "conv")
    return {"g": tmp / "g", "calib": calib, "outs": outs, "tmp": tmp}


def test_export_writes_a_qdq_graph_with_its_decisions(int8):
    from toolchain.export.precision import graph_precision
    from toolchain.export.quantize import head_layers, matrix_layers

    for name, out in int8["outs"].items():
        assert out.returncode == 0, (name, out.stderr[-3000:])
    g = int8["g"]
    graphs = json.loads((g / "graphs.json").read_text())["graphs"]
    assert graphs["hydra-conv.int8"]["precision"] == "int8" and graphs["hydra-conv.int8"]["pytorch_check"]["ok"]
    for base in ("single", "hydra-conv"):
        model = onnx.load(str(g / f"{base}.int8.onnx"))
        assert graph_precision(model) == "int8"
        fp32 = onnx.load(str(g / f"{base}.onnx"), load_external_data=False)
        report = json.loads((g / f"{base}.int8.precision.json").read_text())
        heads = head_layers(fp32)
        assert heads and set(heads) <= set(report["kept_float"])  # the classifier heads stay float
        assert set(report["quantized"]) == set(matrix_layers(fp32)) - set(heads)
        assert report["calibration"]["rows"] == 128 and report["calibration"]["method"] == "minmax"
        # every quantized layer reads an INT8 weight through a DequantizeLinear with a zero zero-point
        inits = {i.name: i for i in model.graph.initializer}
        dq = [n for n in model.graph.node if n.op_type == "DequantizeLinear" and n.input[0] in inits]
        assert len(dq) == report["quantized_count"]
        assert all(inits[n.input[0]].data_type == onnx.TensorProto.INT8 for n in dq)
        assert all(not onnx.numpy_helper.to_array(inits[n.input[2]]).any() for n in dq if len(n.input) > 2)
    # Hydra: every grouped layer's members measured against the one activation scale they share
    ranges = json.loads((g / "hydra-conv.int8.precision.json").read_text())["member_ranges"]
    assert ranges and all(len(v) == 2 and max(v) == 1.0 and min(v) > 0 for v in ranges.values())


def test_int8_without_calibration_rows_exits_2(files, tmp_path):
    out = main("export", str(files["ckpt"]), "-o", str(tmp_path / "g"), "--precision", "int8")
    assert out.returncode == 2 and "--precision int8 needs calibration rows: pass --data FILE" in out.stderr
    assert not (tmp_path / "g" / "single.onnx").exists()  # refused before anything was written


@pytest.mark.parametrize("graph, reference", [("single.int8.onnx", "ckpt"), ("hydra-conv.int8.onnx", "hydra")])
def test_parity_passes_the_int8_graphs_on_onnxruntime_and_openvino(files, int8, graph, reference, tmp_path):
    out = main("parity", str(int8["g"] / graph), "--reference", str(files[reference]), "--data", str(files["data"]),
               "--ood", str(files["ood"]), "--engine", "onnxrt-cpu,openvino-cpu", "--json", str(tmp_path / "v.json"))
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads((tmp_path / "v.json").read_text())
    ov = f"openvino-cpu:{graph}@int8"
    assert set(report["engines"]) == {f"onnxrt-cpu:{graph}", ov}
    assert report["meta"]["precisions"] == {f"onnxrt-cpu:{graph}": "int8", ov: "int8"}
    # OpenVINO read back that its matrix layers ran in INT8 (an engine that fell back to float would say fp32)
    assert report["meta"]["engines"][ov]["ran_precision"] == "int8"
    assert report["meta"]["engines"][ov]["layers"]["FullyConnected" if graph.startswith("single") else
                                                   "Convolution"].get("int8", 0) + report["meta"]["engines"][ov][
        "layers"].get("GroupConvolution", {}).get("int8", 0) > 0
    checks = {c["name"]: c for c in report["engines"][f"onnxrt-cpu:{graph}"]["checks"]}
    assert checks["weights"]["status"] == "pass"  # the INT8 weights dequantize to the reference's, within half a step
    assert report["meta"]["uq_tolerances_by_engine"][ov]["accuracy"]["atol"] == 0.01  # INT8's UQ defaults


@pytest.mark.parametrize("what", ["weight", "activation"])
def test_a_copy_with_a_broken_scale_fails_with_exit_1(files, int8, what, tmp_path):
    model = onnx.load(str(int8["g"] / "single.int8.onnx"))
    inits = {i.name: i for i in model.graph.initializer}
    dq = [n for n in model.graph.node if n.op_type == "DequantizeLinear" and n.input[1] in inits
          and (n.input[0] in inits) == (what == "weight")]
    # a weight in the middle of the encoder; the pooler's input (the last quantized activation: a random tiny
    # encoder's own layers barely move its logits), clipped at a tenth of its range
    scale = inits[dq[len(dq) // 2 if what == "weight" else -1].input[1]]
    factor = np.float32(1.25 if what == "weight" else 0.1)
    scale.CopyFrom(onnx.numpy_helper.from_array(onnx.numpy_helper.to_array(scale) * factor, scale.name))
    broken = tmp_path / "single.int8.onnx"
    onnx.save(model, str(broken))
    out = main("parity", str(broken), "--reference", str(files["ckpt"]), "--data", str(files["data"]),
               "--engine", "openvino-cpu", "--json", str(tmp_path / "v.json"))
    assert out.returncode == 1, out.stderr[-3000:]
    report = json.loads((tmp_path / "v.json").read_text())
    failed = {c["name"] for e in report["engines"].values() for c in e["checks"] if c["status"] == "fail"}
    if what == "weight":
        assert "weights" in failed  # the dequantized weight is 25% off its parameter: named
    else:
        assert any(n.startswith("numeric/") for n in failed)  # activations clipped at a tenth of their range
        # --localize on the Q/DQ graph names the layer whose input scale broke, against PyTorch and the FP32 graph
        (tmp_path / "single.onnx").write_bytes((int8["g"] / "single.onnx").read_bytes())
        out = main("parity", str(broken), "--reference", str(files["ckpt"]), "--data", str(files["data"]),
                   "--localize")
        assert out.returncode == 1
        assert "(int8) vs PyTorch: first diverges at node /module/model/bert/pooler/dense/Gemm" in out.stderr
        assert "(int8) vs the FP32 graph: first diverges at node /module/model/bert/pooler/dense/Gemm" in out.stderr


def test_the_float_fallback_keeps_the_fewest_layers_that_pass(files, int8, tmp_path):
    """Tolerances tighter than INT8 gives (a user's ``--tol``): the fallback turns layers of the failing graph back
    to float until it passes, writes it and names them."""
    graph = int8["g"] / "single.int8.onnx"
    args = ["parity", str(graph), "--reference", str(files["ckpt"]), "--data", str(files["data"]),
            "--tol", "*:0.005:0.005", "-o", str(tmp_path / "p")]
    assert main(*args).returncode == 1
    out = main(*args, "--rescue")
    assert out.returncode == 0, out.stderr[-3000:]
    rescued = json.loads((tmp_path / "p" / "rescued" / "rescue.json").read_text())[0]
    quantized = json.loads((int8["g"] / "single.int8.precision.json").read_text())["quantized"]
    assert rescued["passed"] and 0 < len(rescued["kept_float_nodes"]) < len(quantized)
    written = json.loads((tmp_path / "p" / "rescued" / "single.int8.precision.json").read_text())
    assert set(rescued["kept_float_nodes"]) <= set(written["kept_float"])
    again = main("parity", rescued["path"], "--reference", str(files["ckpt"]), "--data", str(files["data"]),
                 "--tol", "*:0.005:0.005")
    assert again.returncode == 0, again.stderr[-3000:]


def test_the_fallback_works_on_the_failing_graph_itself(files, int8, tmp_path):
    """A broken activation scale is not quantized away: the fallback searches the failing file, and the layer that
    reads the broken scale is the one it keeps in float."""
    model = onnx.load(str(int8["g"] / "single.int8.onnx"))
    inits = {i.name: i for i in model.graph.initializer}
    dq = [n for n in model.graph.node if n.op_type == "DequantizeLinear" and n.input[0] not in inits
          and n.input[1] in inits]
    scale = inits[dq[-1].input[1]]  # the pooler's input, clipped at a tenth of its range
    scale.CopyFrom(onnx.numpy_helper.from_array(onnx.numpy_helper.to_array(scale) * np.float32(0.1), scale.name))
    (tmp_path / "single.onnx").write_bytes((int8["g"] / "single.onnx").read_bytes())
    onnx.save(model, str(tmp_path / "single.int8.onnx"))
    out = main("parity", str(tmp_path / "single.int8.onnx"), "--reference", str(files["ckpt"]), "--data",
               str(files["data"]), "--rescue", "-o", str(tmp_path / "p"))
    assert out.returncode == 0, out.stderr[-3000:]
    rescued = json.loads((tmp_path / "p" / "rescued" / "rescue.json").read_text())[0]
    assert rescued["kept_float_nodes"] == ["/module/model/bert/pooler/dense/Gemm"]


def test_bench_times_int8_graphs_on_both_kinds(int8, tmp_path):
    out = main("bench", str(int8["g"] / "single.onnx"), str(int8["g"] / "single.int8.onnx"), "--engine",
               "onnxrt-cpu,openvino-cpu", "--batch", "1", "--seq", "16", "--rounds", "3", "--warmup", "1",
               "-o", str(tmp_path / "b"))
    assert out.returncode == 0, out.stderr[-3000:]
    table = (tmp_path / "b" / "bench.md").read_text()
    assert "| onnxrt-cpu | 1 | single.int8 |" in table and "| openvino-cpu | 1 | single.int8@int8 |" in table
