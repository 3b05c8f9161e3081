"""The file commands on compiled OpenVINO files: short CSV rows are padded, stale files exit 2.

A tiny BERT with MiniLM's tokenizer, exported to FP32 and compiled by OpenVINO with the default
sequence profile 8..128. CSV rows that tokenize to fewer than 8 tokens used to be refused
(FeedError, exit 2); they are padded up to the profile's minimum with ``attention_mask`` 0 and the
gate passes. A compiled file whose source graph changed beside it exits 2 from parity, infer and
(as a line) inspect, with both digests and the rebuild command.
"""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
from export_models import run_cli as main
from export_models import tiny_with_tokenizer
from onnx import numpy_helper

from toolchain.artifacts import sha256_file

pytestmark = pytest.mark.filterwarnings("ignore:You are using the legacy TorchScript-based ONNX export")
SHORT = ["good", "bad day", "so happy", "not ok", "love it", "meh", "great game today", "awful", "fine thanks",
         "why", "yes!", "no way"]


@pytest.fixture(scope="module")
def bert(tmp_path_factory) -> dict[str, Path]:
    """The checkpoint, its FP32 graph, its compiled FP32 file (profile 8..128) and a CSV of short rows."""
    from toolchain.data import load_tweets
    from toolchain.models import load_tokenizer, resolve_source, save_model
    from toolchain.verbs import ExportOptions, Range, export_graphs

    tmp = tmp_path_factory.mktemp("stale")
    classes = list(load_tweets().class_names)
    tok = load_tokenizer(resolve_source("packaged:all-MiniLM-L6-v2"))
    ckpt = save_model(tiny_with_tokenizer(classes), tmp / "ckpt", tokenizer=tok)
    export_graphs(ckpt, tmp / "g", ExportOptions(precisions=("fp32",), batch=Range(1, 8, 32),
                                                  sequence=Range(8, 64, 128)))
    lengths = [len(ids) for ids in tok(SHORT)["input_ids"]]
    assert max(lengths) < 8, lengths  # every row is shorter than the profile's minimum
    with (tmp / "short.csv").open("w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["text", "label"])
        w.writerows((text, classes[i % len(classes)]) for i, text in enumerate(SHORT))
    out = main("build", str(tmp / "g" / "single.onnx"), "--engine", "openvino-cpu", "--precision", "fp32",
               "-o", str(tmp / "e"), "--batch", "1:8:32", "--seq", "8:64:128")
    assert out.returncode == 0, out.stderr[-3000:]
    return {"tmp": tmp, "ckpt": ckpt, "graph": tmp / "g" / "single.onnx", "blob": tmp / "e" / "single.blob",
            "short": tmp / "short.csv"}


def test_rows_shorter_than_the_profile_minimum_are_padded_and_pass(bert, tmp_path):
    out = main("parity", str(bert["blob"]), "--reference", str(bert["ckpt"]), "--data", str(bert["short"]),
               "--json", str(tmp_path / "v.json"))
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads((tmp_path / "v.json").read_text())
    assert report["engines"]["openvino-cpu:single.blob"]["status"] == "pass"
    assert report["meta"]["data"]["id_samples"] == len(SHORT)  # every short row gated
    assert report["summary"]["failed"] == 0 and report["summary"]["errors"] == 0


def test_padded_outputs_equal_the_graph_on_the_short_rows(bert):
    from toolchain.data import tokenize
    from toolchain.engines import make_runner
    from toolchain.engines.openvino import OvRunner
    from toolchain.models import load_tokenizer

    enc = tokenize(SHORT, load_tokenizer(bert["ckpt"]), 128, padding="longest")
    feed = {k: v.numpy() for k, v in enc.items()}
    assert feed["input_ids"].shape[1] < 8
    with make_runner("onnxrt-cpu", path=bert["graph"]) as ort, OvRunner(bert["blob"], threads=1) as ov:
        want, got = ort.infer(feed), ov.infer(feed)  # ONNX Runtime takes them as they are; OpenVINO pads
    for name in ("logits", "probs"):
        assert got[name].shape == want[name].shape
        np.testing.assert_allclose(got[name], want[name], rtol=1e-4, atol=1e-5)


def test_infer_pads_short_rows_too(bert, tmp_path):
    feed = {"input_ids": np.array([[101, 2204, 102]], np.int64), "attention_mask": np.ones((1, 3), np.int64),
            "token_type_ids": np.zeros((1, 3), np.int64)}
    np.savez(tmp_path / "in.npz", **feed)
    out = main("infer", str(bert["blob"]), "--inputs", str(tmp_path / "in.npz"), "--out", str(tmp_path / "o.npz"))
    assert out.returncode == 0, out.stderr[-2000:]
    assert np.load(tmp_path / "o.npz")["probs"].shape[0] == 1


def test_short_rows_without_an_attention_mask_are_refused_with_the_reason(bert, tmp_path):
    np.savez(tmp_path / "in.npz", input_ids=np.array([[101, 2204, 102]], np.int64),
             token_type_ids=np.zeros((1, 3), np.int64))
    out = main("infer", str(bert["blob"]), "--inputs", str(tmp_path / "in.npz"), "--out", str(tmp_path / "o.npz"))
    assert out.returncode == 2
    assert "outside the profile range 8..128" in out.stderr, out.stderr[-2000:]
    assert "not padded up to the profile minimum: the feed has no 'attention_mask' input" in out.stderr


def _stale_copy(bert, tmp_path: Path) -> tuple[Path, Path, str, str]:
    """A compiled file beside a copy of its graph, then the graph changed: ``(graph, blob, old, new)``."""
    work = tmp_path / "w"
    work.mkdir()
    graph = Path(shutil.copy(bert["graph"], work / "single.onnx"))
    out = main("build", str(graph), "--engine", "openvino-cpu", "--precision", "fp32", "-o", str(work))
    assert out.returncode == 0, out.stderr[-2000:]
    old = sha256_file(graph)
    model = onnx.load(str(graph))
    weight = next(i for i in model.graph.initializer if i.name.endswith("classifier.weight"))
    weight.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(weight) * 1.5, weight.name))
    onnx.save(model, str(graph))
    return graph, work / "single.blob", old, sha256_file(graph)


def test_a_stale_compiled_file_exits_2_from_parity_infer_and_shows_in_inspect(bert, tmp_path):
    graph, blob, old, new = _stale_copy(bert, tmp_path)
    rebuild = (f"hydra-toolchain build {graph} -o {blob.parent} --engine openvino-cpu --precision fp32 "
               "--batch 1:8:32 --seq 8:64:128")
    gate = main("parity", str(blob), "--reference", str(bert["ckpt"]), "--json", str(tmp_path / "v.json"))
    assert gate.returncode == 2, gate.stderr[-3000:]
    problems = " ".join(json.loads((tmp_path / "v.json").read_text())["problems"])
    assert "StaleEngine" in problems and old in problems and new in problems and rebuild in problems
    np.savez(tmp_path / "in.npz", input_ids=np.full((1, 9), 1000, np.int64), attention_mask=np.ones((1, 9), np.int64),
             token_type_ids=np.zeros((1, 9), np.int64))
    ran = main("infer", str(blob), "--inputs", str(tmp_path / "in.npz"), "--out", str(tmp_path / "o.npz"))
    assert ran.returncode == 2 and old in ran.stderr and new in ran.stderr, ran.stderr[-2000:]
    shown = main("inspect", str(blob))
    assert shown.returncode == 0 and "STALE" in shown.stdout and new in shown.stdout, shown.stdout


def test_a_sidecar_whose_precision_disagrees_with_the_read_back_exits_2(bert, tmp_path):
    work = tmp_path / "p"
    shutil.copytree(bert["blob"].parent, work)
    sidecar = work / "single.blob.json"
    sidecar.write_text(json.dumps({**json.loads(sidecar.read_text()), "ran_precision": "bf16"}))
    gate = main("parity", str(work / "single.blob"), "--reference", str(bert["ckpt"]), "--json",
                str(tmp_path / "v.json"))
    assert gate.returncode == 2, gate.stderr[-3000:]
    problems = " ".join(json.loads((tmp_path / "v.json").read_text())["problems"])
    assert "run fp32 after loading" in problems and "sidecar records bf16" in problems


def test_a_graph_not_exported_here_is_not_padded_and_says_why(bert, tmp_path):
    """A graph from elsewhere may pool at the last non-pad token id: padding could change its result."""
    from toolchain.engines.openvino import read_sidecar

    assert read_sidecar(bert["blob"]).pad_neutral  # exported by this toolchain: padded (tests above)
    foreign = onnx.load(str(bert["graph"]))
    del foreign.metadata_props[:]  # the export stamp gone: as another exporter writes it
    onnx.save(foreign, str(tmp_path / "single.onnx"))
    out = main("build", str(tmp_path / "single.onnx"), "--engine", "openvino-cpu", "--precision", "fp32",
               "-o", str(tmp_path / "e"), "--batch", "1:8:32", "--seq", "8:64:128")
    assert out.returncode == 0, out.stderr[-3000:]
    blob = tmp_path / "e" / "single.blob"
    assert not read_sidecar(blob).pad_neutral
    np.savez(tmp_path / "in.npz", input_ids=np.array([[101, 2204, 102]], np.int64),
             attention_mask=np.ones((1, 3), np.int64), token_type_ids=np.zeros((1, 3), np.int64))
    out = main("infer", str(blob), "--inputs", str(tmp_path / "in.npz"), "--out", str(tmp_path / "o.npz"))
    assert out.returncode == 2
    assert "not exported by hydra-toolchain" in out.stderr, out.stderr[-2000:]
