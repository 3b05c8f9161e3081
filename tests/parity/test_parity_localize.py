"""``parity --localize``: graphs with one weight corrupted in the middle of the encoder, localised.

A tiny BERT (3 layers, MiniLM's vocabulary so the tweets tokenise) exported with ``hydra-toolchain
export``, and a tiny ViT (3 layers) exported the same way. Each case corrupts one MatMul weight of the
middle layer (``layer.1`` / ``layers.1``) and asserts that the report names that node or its layer:
the FP32 graph against PyTorch (layer by layer), and an FP16 or BF16 variant against the FP32 graph
(node by node), all on real ONNX Runtime sessions.
"""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from cli_runner import run_cli as _cli
from onnx import TensorProto, numpy_helper

from toolchain.engines import make_runner
from toolchain.errors import ToolchainError
from toolchain.export.precision import float32_to_bfloat16_bits, write_precision_variant
from toolchain.parity.localize import (
    localize_against_torch,
    module_outputs,
    onnx_runner,
    pick_feeds,
)
from toolchain.parity.localize_graph import localize_against_fp32

pytestmark = pytest.mark.filterwarnings("ignore:You are using the legacy TorchScript-based ONNX export")

BERT_LAYER = "model.bert.encoder.layer.1"
VIT_LAYER = "model.vit.layers.1"



def corrupt(src: Path, dst: Path, node_suffix: str, scale: float) -> tuple[str, str]:
    """Copy ``src`` with the weight of the node named ``...<node_suffix>`` given ``scale * std`` of noise."""
    model = onnx.load(str(src))
    node = next(n for n in model.graph.node if n.name.endswith(node_suffix))
    name = node.input[1]
    init = next(i for i in model.graph.initializer if i.name == name)
    w = numpy_helper.to_array(init).astype(np.float32)
    noisy = (w + scale * w.std() * np.random.default_rng(0).standard_normal(w.shape)).astype(np.float32)
    if init.data_type == TensorProto.BFLOAT16:
        init.CopyFrom(onnx.helper.make_tensor(name, TensorProto.BFLOAT16, w.shape,
                                              float32_to_bfloat16_bits(noisy).tobytes(), raw=True))
    else:
        init.CopyFrom(numpy_helper.from_array(noisy.astype(numpy_helper.to_array(init).dtype), name))
    dst.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(dst))
    return node.name, name


@pytest.fixture(scope="module")
def bert(tmp_path_factory) -> dict:
    import transformers

    from toolchain.data import load_tweets
    from toolchain.models import load_tokenizer, resolve_source, save_model

    tmp = tmp_path_factory.mktemp("localize-bert")
    tweets = load_tweets()
    rows = np.random.default_rng(3).permutation(len(tweets.texts))[:40]
    with (tmp / "data.csv").open("w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["text", "label"])
        w.writerows((tweets.texts[i], tweets.class_names[int(tweets.labels[i])]) for i in rows)
    classes = list(tweets.class_names)
    torch.manual_seed(0)
    cfg = transformers.BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=3, num_attention_heads=4,
                                  intermediate_size=64, max_position_embeddings=128, num_labels=len(classes),
                                  id2label=dict(enumerate(classes)), label2id={n: i for i, n in enumerate(classes)})
    model = transformers.BertForSequenceClassification(cfg).eval()
    with torch.no_grad():
        model.classifier.weight.mul_(300.0)
    ckpt = save_model(model, tmp / "ckpt", tokenizer=load_tokenizer(resolve_source("packaged:all-MiniLM-L6-v2")))
    out = _cli("export", str(ckpt), "-o", str(tmp / "g"), "--precision", "fp32,fp16", "--batch", "1:8:32",
               "--seq", "8:32:64")
    assert out.returncode == 0, out.stderr[-3000:]
    return {"tmp": tmp, "ckpt": ckpt, "g": tmp / "g", "data": tmp / "data.csv"}


def test_cli_localize_names_the_shifted_mid_encoder_matmul(bert, tmp_path):
    """The done-when: FP32 graph, one mid-encoder MatMul weight shifted, exit 1, the JSON names the node."""
    node, weight = corrupt(bert["g"] / "single.onnx", tmp_path / "broken.onnx", "layer.1/intermediate/dense/MatMul",
                           0.5)
    out = _cli("parity", str(bert["g"] / "single.onnx"), str(tmp_path / "broken.onnx"), "--reference",
               str(bert["ckpt"]), "--data", str(bert["data"]), "--max-length", "32", "--localize", "--json",
               str(tmp_path / "v.json"), "-o", str(tmp_path / "p"))
    assert out.returncode == 1, out.stderr[-3000:]
    report = json.loads((tmp_path / "v.json").read_text())
    assert report == json.loads((tmp_path / "p" / "report.json").read_text())
    assert "localization" not in report["engines"]["onnxrt-cpu:single.onnx"]  # the honest graph passed
    (loc,) = report["engines"]["onnxrt-cpu:broken.onnx"]["localization"]  # FP32: PyTorch only
    assert loc["against"] == "pytorch" and loc["found"] is True
    assert loc["node"] == node == "/module/model/bert/encoder/layer.1/intermediate/dense/MatMul"
    assert loc["op_type"] == "MatMul" and loc["layer"] == f"{BERT_LAYER}.intermediate.dense"
    assert loc["block"] == BERT_LAYER
    assert loc["weights"][0]["initializer"] == weight
    assert loc["weights"][0]["reference"] == f"{BERT_LAYER}.intermediate.dense.weight"
    assert loc["statistic"] > 1 and loc["rule"].startswith("max of |c-r|/(0.0001 + 0.0001*|r|)")
    assert loc["fails_unmarked"] is True and loc["survived_marking"] is True
    assert all(run["survived"] for run in loc["runs"]) and len(loc["runs"]) >= 2
    checked = loc["checked"]
    assert any(c["status"] == "pass" and c["layer"].startswith("model.bert.encoder.layer.0") for c in checked)
    assert all(c["status"] == "pass" for c in checked if c["layer"].startswith("model.bert.encoder.layer.0"))
    assert any(c["status"] == "fail" and c["layer"] == loc["layer"] for c in checked)
    assert 0 < loc["rows"] <= 64 and loc["feeds"]
    summary = (tmp_path / "p" / "summary.md").read_text()
    assert "### Where it diverges (--localize)" in summary and node in summary
    assert "onnxrt-cpu:broken.onnx" in out.stderr + out.stdout and "first diverges at node" in out.stderr + out.stdout


@pytest.mark.skipif(__import__("toolchain.engines", fromlist=["engine_kind"]).engine_kind("openvino-cpu")
                    .unavailable("bf16") is not None, reason="this CPU has no BF16 in OpenVINO")
def test_cli_localize_on_openvino_bf16_names_the_shifted_matmul(bert, tmp_path):
    """An engine compiled at BF16 from a wrong FP32 graph: marked copies are compiled the same way, both paths."""
    node, _weight = corrupt(bert["g"] / "single.onnx", tmp_path / "broken.onnx", "layer.1/intermediate/dense/MatMul",
                            3.0)
    out = _cli("parity", str(tmp_path / "broken.onnx"), "--reference", str(bert["ckpt"]), "--data",
               str(bert["data"]), "--max-length", "32", "--engine", "openvino-cpu", "--precision", "bf16",
               "--localize", "--json", str(tmp_path / "v.json"))
    assert out.returncode == 1, out.stderr[-3000:]
    found = json.loads((tmp_path / "v.json").read_text())["engines"]["openvino-cpu:broken.onnx@bf16"]["localization"]
    torch_path, fp32_path = found
    assert (torch_path["against"], fp32_path["against"]) == ("pytorch", "fp32-graph")
    assert torch_path["found"] is True and torch_path["node"] == node, torch_path["summary"]
    assert torch_path["layer"] == f"{BERT_LAYER}.intermediate.dense"
    # the engine computes its (wrong) FP32 graph faithfully: nothing diverges from that graph
    assert fp32_path["found"] is False and "the FP32 graph's own" in " ".join(fp32_path["notes"])


def test_fp16_graph_localized_against_pytorch_and_the_fp32_graph(bert, tmp_path):
    from toolchain.verbs import ParityOptions, check_parity

    shutil.copy(bert["g"] / "single.onnx", tmp_path / "single.onnx")  # the FP32 graph beside the FP16 one
    node, weight = corrupt(bert["g"] / "single.fp16.onnx", tmp_path / "single.fp16.onnx",
                           "layer.1/output/dense/MatMul", 2.0)
    lines: list[str] = []
    verdict = check_parity([tmp_path / "single.fp16.onnx"], bert["ckpt"], ParityOptions(localize=True),
                           out=tmp_path / "p", say=lines.append)
    assert verdict.exit_code == 1
    torch_side, fp32_side = verdict.localization["onnxrt-cpu:single.fp16.onnx"]
    assert torch_side["against"] == "pytorch" and torch_side["layer"] == f"{BERT_LAYER}.output.dense"
    assert torch_side["node"] == node and torch_side["weights"][0]["initializer"] == weight == f"{weight}"
    assert fp32_side["against"] == "fp32-graph" and fp32_side["found"] is True
    assert fp32_side["node"] == node and fp32_side["op_type"] == "MatMul"
    assert fp32_side["value"] == f"{node}_output_0"  # node by node: the MatMul itself, not its module's output
    assert fp32_side["layer"] == f"{BERT_LAYER}.output.dense"
    assert fp32_side["weights"][0]["reference"] == f"{weight.removesuffix('__fp16')} (FP32 graph)"
    assert fp32_side["rule"].startswith("q0.999 of |c-r|/(0.01 + 0.01*|r|) <= 1, max <= 4")
    assert fp32_side["statistic"] > 1 or fp32_side["failed"] in ("max_limit", "feed")
    assert fp32_side["survived_marking"] is True
    before = [c for c in fp32_side["checked"] if c["layer"].startswith("model.bert.encoder.layer.0")]
    assert before and all(c["status"] == "pass" for c in before)  # correct FP16 rounding passes the rule
    report = json.loads((tmp_path / "p" / "report.json").read_text())
    assert len(report["engines"]["onnxrt-cpu:single.fp16.onnx"]["localization"]) == 2
    assert any(line.startswith("localize onnxrt-cpu:single.fp16.onnx: on ") for line in lines)


@pytest.fixture(scope="module")
def vit(tmp_path_factory) -> dict:
    from toolchain.models import save_model
    from toolchain.models.tiny import tiny_vit
    from toolchain.verbs import ExportOptions, export_graphs
    from toolchain.verbs.export import open_source

    tmp = tmp_path_factory.mktemp("localize-vit")
    ckpt = save_model(tiny_vit(layers=3).model, tmp / "ckpt")
    export_graphs(ckpt, tmp / "g", ExportOptions(precisions=("fp32",)))
    write_precision_variant(tmp / "g" / "single.onnx", tmp / "g" / "single.bf16.onnx", "bf16")
    source = open_source(ckpt)
    module = source.build(None)[0]
    feeds = [{k: v.numpy() for k, v in source.make_feed(b, 8, 20 + b).items()} for b in (1, 8)]
    return {"g": tmp / "g", "module": module, "feeds": feeds}


def test_vit_fp32_graph_localized_against_pytorch(vit, tmp_path):
    node, weight = corrupt(vit["g"] / "single.onnx", tmp_path / "broken.onnx", "layers.1/attention/v_proj/MatMul", 0.5)
    loc = localize_against_torch(tmp_path / "broken.onnx", vit["module"], vit["feeds"], labels=["a", "b"])
    assert loc.found and loc.node == node and loc.op_type == "MatMul"
    assert loc.layer == f"{VIT_LAYER}.attention.v_proj" and loc.block == VIT_LAYER
    assert loc.weights[0]["initializer"] == weight and loc.feeds == ["a", "b"] and loc.rows == 9
    assert loc.survived_marking is True
    d = loc.to_dict()
    assert d["summary"] == loc.summary() and node in d["summary"] and "survived every marking" in d["summary"]
    assert json.dumps(d, allow_nan=False)  # JSON-ready
    assert [c.position for c in loc.checked] == sorted(c.position for c in loc.checked)  # graph order
    with pytest.raises(ToolchainError, match="per_round must be a positive integer"):
        localize_against_torch(tmp_path / "broken.onnx", vit["module"], vit["feeds"], per_round=0)


def test_vit_bf16_variant_localized_against_fp32(vit, tmp_path):
    fp32 = vit["g"] / "single.onnx"
    node, weight = corrupt(vit["g"] / "single.bf16.onnx", tmp_path / "single.bf16.onnx", "layers.1/mlp/fc1/MatMul",
                           3.0)
    honest = localize_against_fp32(vit["g"] / "single.bf16.onnx", fp32, vit["feeds"], precision="bf16")
    assert honest.found is False and honest.fails_unmarked is False and "pass the rule" in honest.notes[0]
    reference = module_outputs(vit["module"], vit["feeds"])
    loc = localize_against_fp32(tmp_path / "single.bf16.onnx", fp32, vit["feeds"], precision="bf16",
                                run_marked=onnx_runner("onnxrt-cpu", "bf16"), reference_outputs=reference,
                                module_paths=[p for p, _ in vit["module"].named_modules()])
    assert loc.found and loc.fails_unmarked and loc.node == node and loc.op_type == "MatMul"
    assert loc.layer == f"{VIT_LAYER}.mlp.fc1" and loc.block == VIT_LAYER
    assert loc.weights and loc.weights[0]["initializer"] == weight
    assert loc.rule.startswith("q0.999 of |c-r|/(0.1 + 0.02*|r|)")
    assert loc.survived_marking is True and not loc.notes
    against_torch = localize_against_torch(tmp_path / "single.bf16.onnx", vit["module"], vit["feeds"], precision="bf16")
    assert against_torch.layer == f"{VIT_LAYER}.mlp.fc1" and against_torch.node == node  # through the BF16 weight
    assert against_torch.weights[0]["reference"] == f"{VIT_LAYER}.mlp.fc1.weight"


def test_a_failure_the_marking_hides_is_reported_as_such(vit, tmp_path):
    """A compiler whose fusion changes when values are exposed: the marked runs pass, and the report says so."""
    corrupt(vit["g"] / "single.onnx", tmp_path / "broken.onnx", "layers.1/mlp/fc2/MatMul", 0.5)
    honest = onnx.load(str(vit["g"] / "single.onnx"))

    def run_marked(path: Path):
        marked = onnx.load(str(path))
        extra = [o for o in marked.graph.output if o.name not in {"logits", "probs"}]
        if not extra:  # the unmarked engine: the broken one
            return make_runner("onnxrt-cpu", path=path)
        fused = onnx.ModelProto()
        fused.CopyFrom(honest)
        fused.graph.output.extend(extra)
        target = path.with_name(f"fused-{path.name}")
        onnx.save(fused, str(target))
        return make_runner("onnxrt-cpu", path=target)

    loc = localize_against_torch(tmp_path / "broken.onnx", vit["module"], vit["feeds"], run_marked=run_marked)
    assert loc.fails_unmarked is True and loc.survived_marking is False
    hidden = [run["run"] for run in loc.runs if not run["survived"]]
    assert hidden and all(run["survived"] == (not run["marked"] or set(run["marked"]) <= {"logits", "probs"})
                          for run in loc.runs)  # a run that exposes no extra value is the broken engine
    assert any(f"did not survive the marking in run(s) {hidden}" in note for note in loc.notes)
    assert "did NOT survive" in loc.summary()


def test_pick_feeds_takes_the_worst_feeds_first_up_to_the_rows():
    feeds = [(f"f{i}", {"x": np.zeros((n, 2), np.float32)}) for i, n in enumerate((1, 8, 8, 4))]
    data = [{"per_feed": [{"feed": "f0", "max_abs_err": 0.1}, {"feed": "f1", "max_abs_err": 0.0},
                          {"feed": "f2", "max_abs_err": 2.0}, {"feed": "f3", "max_abs_err": 0.5}]}]
    assert [label for label, _ in pick_feeds(feeds, data, max_rows=10)] == ["f2", "f3"]  # gate order kept
    assert [label for label, _ in pick_feeds(feeds, data, max_rows=1)] == ["f2"]
    nan = [{"per_feed": [{"feed": "f1", "max_abs_err": "NaN"}, {"feed": "f2", "max_abs_err": 2.0}]}]
    assert [label for label, _ in pick_feeds(feeds, nan, max_rows=1)] == ["f1"]  # NaN/Inf first
    assert [label for label, _ in pick_feeds(feeds, [], max_rows=9)] == ["f0", "f1"]  # no data: gate order


def test_localize_with_a_recipe_is_refused(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("name: x\n")
    out = _cli("parity", str(recipe), "--localize")
    assert out.returncode == 2 and "--localize works on files" in out.stderr


def test_only_uq_failures_are_reported_without_marking_anything():
    from toolchain.parity import Check, Verdict
    from toolchain.verbs.localize import localize_failures
    from toolchain.verbs.parity import Feeds
    from toolchain.verbs.targets import Target

    bad = Target("onnxrt-cpu:g.bf16.onnx", "onnxrt-cpu", "bf16", Path("g.bf16.onnx"), {})
    good = Target("onnxrt-cpu:g.onnx", "onnxrt-cpu", "fp32", Path("g.onnx"), {})
    checks = [Check(bad.label, "numeric/logits", "pass", "ok"), Check(bad.label, "uq/accuracy", "fail", "moved"),
              Check(good.label, "numeric/logits", "pass", "ok")]
    verdict = Verdict("torch", [bad.label, good.label], checks, meta={})
    feeds = Feeds([{"x": np.zeros((1, 2), np.float32)}, {"x": np.zeros((2, 2), np.float32)}], [], [])
    localize_failures(verdict, [bad, good], source=None, feeds=feeds)  # the files do not exist: nothing is run
    (item,) = verdict.localization[bad.label]
    assert item["found"] is False and "only uq/accuracy failed" in item["summary"]
    assert good.label not in verdict.localization
    assert verdict.to_dict()["engines"][bad.label]["localization"] == [item]
    assert "### Where it diverges (--localize)" in verdict.to_markdown()
