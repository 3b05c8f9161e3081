"""The file commands on the ``openvino-cpu`` kind: parity, bench, build, export, inspect and infer.

The tiny BERT with MiniLM's tokenizer of ``conftest.files`` (real tweets as CSV rows): its FP32 graph
compiled by OpenVINO at BF16 must pass parity against the PyTorch checkpoint, and a copy with the
classifier scaled must fail it. Where this CPU has no BF16 (read at run time), the same commands
must say so with exit 3 instead.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from export_models import run_cli as main
from onnx import numpy_helper

from toolchain.engines import engine_kind

pytestmark = pytest.mark.filterwarnings("ignore:You are using the legacy TorchScript-based ONNX export")
BF16 = engine_kind("openvino-cpu").unavailable("bf16") is None
LABEL = "openvino-cpu:single.onnx@bf16"


def _scaled_classifier(src: Path, dst: Path, factor: float) -> Path:
    """A copy of the graph with the classifier's weight scaled (a wrong graph of the same shape)."""
    model = onnx.load(str(src))
    weight = next(i for i in model.graph.initializer if i.name.endswith("classifier.weight"))
    weight.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(weight) * factor, weight.name))
    onnx.save(model, str(dst))
    return dst


def _parity(files, graph: Path, tmp_path: Path, *extra: str):
    return main("parity", str(graph), "--reference", str(files["ckpt"]), "--data", str(files["data"]),
                "--ood", str(files["ood"]), "--json", str(tmp_path / "v.json"), *extra)


def test_parity_of_a_graph_compiled_at_bf16_passes_and_names_kind_and_precision(files, tmp_path):
    out = _parity(files, files["g"] / "single.onnx", tmp_path, "--engine", "openvino-cpu", "--precision", "bf16")
    if not BF16:
        assert out.returncode == 3 and "no BF16 support" in out.stderr, out.stderr[-2000:]
        return
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads((tmp_path / "v.json").read_text())
    assert list(report["engines"]) == [LABEL] and report["engines"][LABEL]["status"] == "pass"
    info = report["meta"]["engines"][LABEL]
    assert info["kind"] == "openvino-cpu" and info["precision_asked"] == "bf16"
    assert report["meta"]["precisions"][LABEL] == info["ran_precision"]  # judged at what it ran (read back)
    assert info["layers"]["FullyConnected"].get("bf16", 0) > 0
    assert report["summary"]["failed"] == 0  # (a tiny random model: flat scores leave rank metrics unresolved)


@pytest.mark.skipif(not BF16, reason="this CPU has no BF16 in OpenVINO")
def test_parity_of_a_wrong_graph_compiled_at_bf16_fails_with_exit_1(files, tmp_path):
    wrong = _scaled_classifier(files["g"] / "single.onnx", tmp_path / "single.onnx", 1.5)
    out = _parity(files, wrong, tmp_path, "--engine", "openvino-cpu", "--precision", "bf16")
    assert out.returncode == 1, out.stderr[-3000:]
    report = json.loads((tmp_path / "v.json").read_text())
    assert report["engines"][LABEL]["status"] == "fail"
    assert any("numeric/logits" in p for p in report["problems"])


def test_bench_puts_every_engine_and_precision_in_one_interleaved_run(files, tmp_path):
    out = main("bench", str(files["g"] / "single.onnx"), "--engine", "onnxrt-cpu,openvino-cpu", "--precision",
               "fp32,bf16", "--batch", "1,2", "--seq", "16", "--rounds", "3", "--warmup", "1", "-o", str(tmp_path))
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads((tmp_path / "bench.json").read_text())
    ran = {(c["engine"], v) for c in result["cases"] for v in c["variants"]}
    expected = {("onnxrt-cpu", "single"), ("openvino-cpu", "single@fp32")} | (
        {("openvino-cpu", "single@bf16")} if BF16 else set())
    assert ran == expected
    assert "onnxrt-cpu:single.onnx@bf16" in result["skipped"]  # ONNX Runtime runs the graph as exported
    if not BF16:
        assert "no BF16 support" in result["skipped"]["openvino-cpu:single.onnx@bf16"]
    assert result["first"] == "onnxrt-cpu:single"
    for case in result["cross_ratios"]:  # one run: the per-round ratios pair samples of the same rounds
        assert set(case["ratios"]) == {f"openvino-cpu:{v}/onnxrt-cpu:single"
                                       for k, v in expected if k == "openvino-cpu"}
        assert all(len(r["per_round"]) == 3 for r in case["ratios"].values())
    assert "openvino-cpu | 1 | single@fp32" in out.stdout

def test_build_inspect_infer_and_parity_of_compiled_files(files, tmp_path):
    out = main("build", str(files["g"] / "single.onnx"), "--engine", "openvino-cpu", "--precision", "fp32,fp16,bf16",
               "-o", str(tmp_path / "e"), "--batch", "1:8:32", "--seq", "8:64:128")
    assert out.returncode == 0, out.stderr[-3000:]
    record = json.loads((tmp_path / "e" / "engines.json").read_text())["openvino-cpu"]
    kind = engine_kind("openvino-cpu")
    for precision, name in (("fp32", "single"), ("fp16", "single.fp16"), ("bf16", "single.bf16")):
        if kind.unavailable(precision) is None:
            assert record["engines"][name]["precision"] == precision
            assert (tmp_path / "e" / f"{name}.blob").is_file() and (tmp_path / "e" / f"{name}.blob.json").is_file()
        else:
            assert record["unavailable"][name] == kind.unavailable(precision) and name not in record["engines"]
    blob = tmp_path / "e" / "single.blob"
    info = main("inspect", str(blob), "--json")
    assert info.returncode == 0, info.stderr
    described = json.loads(info.stdout)
    assert described["engine_kind"] == "openvino-cpu" and described["sidecar"]["ran_precision"] == "fp32"
    assert set(described["inputs"]) == {"input_ids", "attention_mask", "token_type_ids"}
    feed = {"input_ids": np.full((2, 9), 1000, np.int64), "attention_mask": np.ones((2, 9), np.int64),
            "token_type_ids": np.zeros((2, 9), np.int64)}
    np.savez(tmp_path / "in.npz", **feed)
    ran = main("infer", str(blob), "--inputs", str(tmp_path / "in.npz"), "--out", str(tmp_path / "out.npz"))
    assert ran.returncode == 0, ran.stderr[-2000:]
    assert np.load(tmp_path / "out.npz")["probs"].shape == (2, 3)
    gate = _parity(files, blob, tmp_path)
    assert gate.returncode == 0, gate.stderr[-3000:]
    report = json.loads((tmp_path / "v.json").read_text())
    assert list(report["engines"]) == ["openvino-cpu:single.blob"]
    assert report["meta"]["precisions"]["openvino-cpu:single.blob"] == "fp32"


def test_a_compiled_file_from_another_openvino_exits_2(files, tmp_path):
    main("build", str(files["g"] / "single.onnx"), "--precision", "fp32", "-o", str(tmp_path))
    sidecar = tmp_path / "single.blob.json"
    sidecar.write_text(json.dumps({**json.loads(sidecar.read_text()), "openvino_version": "2023.3.0-1-old"}))
    out = _parity(files, tmp_path / "single.blob", tmp_path)
    assert out.returncode == 2 and "OpenVINO 2023.3.0-1-old built it" in out.stderr, out.stderr[-2000:]
    sidecar.unlink()
    np.savez(tmp_path / "x.npz", input_ids=np.ones((1, 8), np.int64))
    out = main("infer", str(tmp_path / "single.blob"), "--inputs", str(tmp_path / "x.npz"), "--out",
               str(tmp_path / "y.npz"))
    assert out.returncode == 2 and "is missing" in out.stderr


def test_export_with_engine_builds_the_compiled_models(files, tmp_path):
    out = main("export", str(files["ckpt"]), "-o", str(tmp_path), "--precision", "fp32,bf16", "--engine",
               "openvino-cpu", "--seq", "8:16:32", "--batch", "1:2:4")
    assert out.returncode == 0, out.stderr[-3000:]
    engines = json.loads((tmp_path / "engines.json").read_text())["openvino-cpu"]
    assert engines["engines"]["single"]["onnx"] == "single.onnx"
    assert ("single.bf16" in engines["engines"]) == BF16 and ("single.bf16" in engines["unavailable"]) != BF16
    sidecar = json.loads((tmp_path / "single.blob.json").read_text())
    assert sidecar["profile"]["input_ids"] == [[1, 8], [2, 16], [4, 32]]


@pytest.mark.parametrize("args, code, message", [
    (["build", "{g}", "-o", "{tmp}", "--engine", "onnxrt-cpu"], 2, "--engine 'onnxrt-cpu'"),
    (["build", "{g}"], 2, "-o/--out"),
    (["parity", "{g}", "--reference", "{ckpt}", "--engine", "tensorrt"], 2, "--engine tensorrt runs engines"),
    (["bench", "{g}", "--engine", "onnxrt-cpu", "--precision", "bf16"], 2, "nothing to run"),
    (["bench", "{g}", "--precision", "int4"], 2, "--precision 'int4'"),
])
def test_engine_and_precision_mistakes_exit_with_the_option_named(files, tmp_path, args, code, message):
    filled = [a.format(g=files["g"] / "single.onnx", tmp=tmp_path, ckpt=files["ckpt"]) for a in args]
    out = main(*filled)
    assert out.returncode == code and message in out.stderr, out.stderr[-2000:]
