"""``hydra-toolchain parity GRAPH... --reference SRC``: graphs checked against their PyTorch source on files.

A tiny BERT with the packaged MiniLM tokenizer (so the tweets tokenise into its vocabulary), its
Hydra folder (saved with the tokenizer, as the ``fuse`` stage does), both exported once; then the
gate passes on the honest graphs, fails with exit 1 on a broken one, replays saved inputs
bit-identically, and rescues an FP16 graph that overflows.
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import onnx
import pytest
from export_models import run_cli, tiny_with_tokenizer

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.filterwarnings("ignore:You are using the legacy TorchScript-based ONNX export")


main = run_cli  # the entry point in this process (tests/export/export_models.py)


def test_parity_of_hydra_graphs_on_a_csv_passes_and_writes_reports(files, tmp_path):
    g = files["g"]
    out = main("parity", str(g / "hydra-conv.onnx"), str(g / "hydra-conv.fp16.onnx"), str(g / "hydra-conv.bf16.onnx"),
               "--reference", str(files["hydra"]), "--data", str(files["data"]), "--ood", str(files["ood"]),
               "-o", str(tmp_path / "p"), "--json", str(tmp_path / "v.json"), "--junit", str(tmp_path / "j.xml"))
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads((tmp_path / "v.json").read_text())
    assert report == json.loads((tmp_path / "p" / "report.json").read_text())
    assert report["status"] == "pass"
    assert set(report["engines"]) == {"onnxrt-cpu:hydra-conv.onnx", "onnxrt-cpu:hydra-conv.fp16.onnx",
                                      "onnxrt-cpu-bf16emu:hydra-conv.bf16.onnx"}  # BF16 on its CPU substitute
    assert report["meta"]["precisions"]["onnxrt-cpu:hydra-conv.fp16.onnx"] == "fp16"
    assert report["meta"]["data"]["id_samples"] == 70 and report["meta"]["data"]["ood_samples"] == 40
    checks = {c["name"] for c in report["engines"]["onnxrt-cpu:hydra-conv.onnx"]["checks"]}
    assert {"numeric/probs", "numeric/member_logits"} <= checks and any(c.startswith("uq/auroc") for c in checks)
    suites = ET.parse(tmp_path / "j.xml").getroot()
    assert int(suites.get("tests")) == sum(len(e["checks"]) for e in report["engines"].values())
    assert int(suites.get("failures")) == 0
    assert "parity PASS (exit 0)" in out.stderr and "70 ID rows, 40 OOD rows" in out.stderr


def test_labels_map_by_name_through_the_checkpoint(files, tmp_path):
    from toolchain.verbs import ParityOptions
    from toolchain.verbs.export import open_source
    from toolchain.verbs.parity import parity_feeds

    source = open_source(files["ckpt"])
    names = ["input_ids", "attention_mask", "token_type_ids"]
    feeds = parity_feeds(source, names, ParityOptions(data=files["data"]))
    with files["data"].open(encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    id2label = source.hf_config["id2label"]
    got = sorted(id2label[str(int(y))] if str(int(y)) in id2label else id2label[int(y)]
                 for _, labels in feeds.ident for y in labels)
    assert got == sorted(r["label"] for r in rows)
    assert all(len(labels) <= 32 for _, labels in feeds.ident)  # the default batch fits the default profile
    other = tmp_path / "other.csv"
    other.write_text("text,label\nhello there,happy\nso sad,sad\n")
    out = main("parity", str(files["g"] / "single.onnx"), "--reference", str(files["ckpt"]), "--data", str(other))
    assert out.returncode == 2 and "labels ['happy', 'sad'] are not classes of the reference model" in out.stderr


def test_a_broken_graph_fails_with_exit_1_naming_it(files, tmp_path):
    model = onnx.load(str(files["g"] / "single.fp16.onnx"))
    target = next(t for t in model.graph.initializer if sorted(t.dims) == [3, 32])  # the classifier weight
    arr = onnx.numpy_helper.to_array(target)
    target.CopyFrom(onnx.numpy_helper.from_array((arr * -1).astype(arr.dtype), target.name))
    broken = tmp_path / "single.fp16.onnx"
    onnx.save(model, str(broken))
    out = main("parity", str(files["g"] / "single.onnx"), str(broken), "--reference", str(files["ckpt"]),
               "--data", str(files["data"]), "--junit", str(tmp_path / "j.xml"))
    assert out.returncode == 1, out.stderr[-3000:]
    assert "onnxrt-cpu:single.fp16.onnx numeric/" in out.stderr and "parity FAIL (exit 1)" in out.stderr
    suites = {s.get("name"): s for s in ET.parse(tmp_path / "j.xml").getroot()}
    failing = {name: int(s.get("failures")) for name, s in suites.items()}
    assert failing["parity.onnxrt-cpu_single_onnx"] == 0 and failing["parity.onnxrt-cpu_single_fp16_onnx"] > 0


def test_saved_inputs_replay_the_same_verdict_without_the_data(files, tmp_path):
    g, ref = files["g"] / "single.fp16.onnx", str(files["ckpt"])
    first = main("parity", str(g), "--reference", ref, "--data", str(files["data"]), "--ood", str(files["ood"]),
                 "--save-inputs", str(tmp_path / "in.npz"), "--json", str(tmp_path / "a.json"))
    assert first.returncode == 0, first.stderr[-3000:]
    saved = np.load(tmp_path / "in.npz")
    assert {"generated.0.input_ids", "id.0.labels", "ood.0.attention_mask"} <= set(saved.files)
    again = main("parity", str(g), "--reference", ref, "--inputs", str(tmp_path / "in.npz"),
                 "--json", str(tmp_path / "b.json"))
    assert again.returncode == 0, again.stderr[-3000:]
    a, b = (json.loads((tmp_path / f).read_text()) for f in ("a.json", "b.json"))
    assert a["engines"] == b["engines"] and a["meta"]["data"] == b["meta"]["data"]
    # plain named arrays with labels: ID rows in batches of --batch-size
    plain = tmp_path / "plain.npz"
    feed = {k: saved[f"id.0.{k}"] for k in ("input_ids", "attention_mask", "token_type_ids")}
    np.savez(plain, **feed, labels=saved["id.0.labels"])
    out = main("parity", str(g), "--reference", ref, "--inputs", str(plain), "--batch-size", "8",
               "--json", str(tmp_path / "c.json"))
    assert out.returncode == 0, out.stderr[-3000:]
    data = json.loads((tmp_path / "c.json").read_text())["meta"]["data"]
    assert data["id_samples"] == len(saved["id.0.labels"]) and data["id_batches"] == -(-data["id_samples"] // 8)


@pytest.mark.parametrize("args, message", [
    ([], "--reference"),
    (["--reference", "{hydra}"], "the graphs output ['logits', 'probs']; the hydra"),
    (["--reference", "{ckpt}", "--tol", "probs:1e-3"], "--tol 'probs:1e-3' is not OUTPUT:ATOL:RTOL"),
    (["--reference", "{ckpt}", "--uq-tol", "accuracy:x"], "--uq-tol 'accuracy:x' is not METRIC:DELTA"),
    (["--reference", "{ckpt}", "--uq-tol", "nope:0.1"], "unknown metric 'nope'"),
    (["--reference", "{ckpt}", "--inputs", "{tmp}/missing.npz"], "missing.npz' does not exist"),
    (["--reference", "{ckpt}", "--ood", "{ood}"], "--ood needs ID rows too"),
    (["--reference", "{ckpt}", "--engine", "nope"], "--engine 'nope'"),
    (["--reference", "{tmp}"], "neither a Hugging Face checkpoint folder"),
])
def test_bad_parity_arguments_exit_2_naming_what(files, args, message):
    args = [a.format(**{k: str(v) for k, v in files.items()}) for a in args]
    out = main("parity", str(files["g"] / "single.onnx"), *args)
    assert out.returncode == 2, out.stderr[-2000:]
    assert message in out.stderr


def test_rescue_of_an_fp16_graph_that_overflows(tmp_path):
    """Logits beyond FP16's range: the FP16 graph fails; keeping the classifier in FP32 passes, written to rescued/."""
    from toolchain.models import save_model
    from toolchain.verbs import ExportOptions, Range, export_graphs

    model = tiny_with_tokenizer(["a", "b", "c"], seed=1, scale=3e6)  # pooled output in [-1, 1]: logits ~1e5
    ckpt = save_model(model, tmp_path / "ckpt")
    export_graphs(ckpt, tmp_path / "g", ExportOptions(precisions=("fp32", "fp16"), batch=Range(1, 8, 32),
                                                      sequence=Range(8, 64, 128)))
    args = ["parity", str(tmp_path / "g" / "single.fp16.onnx"), "--reference", str(ckpt), "-o", str(tmp_path / "p")]
    assert main(*args).returncode == 1
    out = main(*args, "--rescue")
    assert out.returncode == 0, out.stderr[-3000:]
    rescued = json.loads((tmp_path / "p" / "rescued" / "rescue.json").read_text())
    assert rescued[0]["passed"] and 0 < len(rescued[0]["kept_fp32_nodes"]) < 10
    again = main("parity", rescued[0]["path"], "--reference", str(ckpt))
    assert again.returncode == 0, again.stderr[-3000:]


def _python_api_example() -> str:
    """The code block marked ``<!-- python-api-example -->``, wherever it is (README.md or docs/*.md)."""
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = page.read_text()
        if "<!-- python-api-example -->" in text:
            begin = text.index("```python", text.index("<!-- python-api-example -->")) + len("```python")
            return text[begin:text.index("```", begin)]
    raise AssertionError("no code block marked <!-- python-api-example --> in README.md or docs/*.md")


def test_the_python_api_example_of_the_readme_runs(files, tmp_path):
    """The docs' Python API block (docs/commands.md), run as written against this test's folders."""
    block = _python_api_example()
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    (tmp_path / "hydra").symlink_to(files["hydra"])
    (tmp_path / "test.csv").symlink_to(files["data"])
    run = subprocess.run([sys.executable, "-c", block], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    assert (tmp_path / "parity" / "junit.xml").is_file() and (tmp_path / "bench" / "bench.json").is_file()
