"""Weight parity (:mod:`toolchain.parity.weights`): every graph weight against the reference's parameter.

Real tiny models (BERT, ViT, a Hydra folder of the BERT in both lowerings) exported by the
project's own ``export`` at FP32, FP16 and BF16; the wrong graphs are the ones CI meets: a graph
of another checkpoint of the same architecture (another seed), one weight scaled by 1.05 at BF16,
a key projection multiplied by -2 at FP32, one ULP off at FP32 (invisible at the outputs).
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path
from types import SimpleNamespace

import ml_dtypes
import numpy as np
import onnx
import pytest
import torch
from cli_runner import run_cli as cli
from onnx import TensorProto, numpy_helper

from toolchain.errors import GraphError, ToolchainError
from toolchain.parity.weights import ALLOWED_ULPS, MIN_ELEMENTS, _round_bits, weight_parity

pytestmark = pytest.mark.filterwarnings("ignore:You are using the legacy TorchScript-based ONNX export")

TEXT = {"batch": (1, 8, 32), "sequence": (8, 12, 16)}



@pytest.fixture(scope="module")
def case(tmp_path_factory) -> SimpleNamespace:
    """Checkpoints (BERT and ViT at seeds 0 and 1), a Hydra folder of the BERT, their exported graphs."""
    from toolchain.hydra import fuse, save_hydra
    from toolchain.models import save_model
    from toolchain.models.tiny import tiny_bert, tiny_vit
    from toolchain.verbs import ExportOptions, Range, export_graphs

    tmp = tmp_path_factory.mktemp("weight-parity")
    text = {k: Range(*v) for k, v in TEXT.items()}
    bert = tiny_bert(seed=0)
    folders = {"bert": save_model(bert.model, tmp / "bert"), "bert-other": save_model(tiny_bert(seed=1).model,
                                                                                      tmp / "bert-other"),
               "vit": save_model(tiny_vit(seed=0).model, tmp / "vit"),
               "vit-other": save_model(tiny_vit(seed=1).model, tmp / "vit-other")}
    keep = torch.ones(2, 2, 4, dtype=torch.bool)
    keep[0, :, :2] = False
    keep[1, :, 3:] = False  # unequal head counts: member 0 keeps 2 heads, member 1 keeps 3 (zero-head padding)
    folders["hydra"] = save_hydra(fuse(bert.adapter, keep, mlp="average"), tmp / "hydra")
    all3 = ("fp32", "fp16", "bf16")
    export_graphs(folders["bert"], tmp / "bert-g", ExportOptions(precisions=all3, **text))
    export_graphs(folders["bert-other"], tmp / "bert-other-g", ExportOptions(precisions=("fp32", "bf16"), **text))
    export_graphs(folders["hydra"], tmp / "hydra-g", ExportOptions(lowerings=("conv", "matmul"), precisions=all3,
                                                                   **text))
    export_graphs(folders["vit"], tmp / "vit-g", ExportOptions(precisions=all3, batch=Range(1, 8, 32)))
    export_graphs(folders["vit-other"], tmp / "vit-other-g", ExportOptions(precisions=("fp32", "bf16"),
                                                                           batch=Range(1, 8, 32)))
    return SimpleNamespace(tmp=tmp, folders=folders)


def reference(case: SimpleNamespace, name: str, lowering: str | None = None) -> torch.nn.Module:
    """The module the parity gate runs for a folder (as ``hydra-toolchain parity --reference`` builds it)."""
    from toolchain.verbs.export import open_source

    return open_source(case.folders[name]).build(lowering)[0]


def edited(src: Path, dst: Path, reader_scope: str, change) -> str:
    """Copy ``src`` with the initializer read by the node under ``reader_scope`` changed; return its name."""
    model = onnx.load(str(src))
    node = next(n for n in model.graph.node
                if n.name.startswith(reader_scope + "/") and n.op_type in ("MatMul", "Conv"))
    inits = {i.name: i for i in model.graph.initializer}
    init = inits[next(i for i in node.input if i in inits)]
    array = numpy_helper.to_array(init)
    new = change(array.astype(np.float32)).astype(array.dtype)
    init.CopyFrom(numpy_helper.from_array(new, init.name) if init.data_type != TensorProto.BFLOAT16 else
                  onnx.helper.make_tensor(init.name, TensorProto.BFLOAT16, new.shape,
                                          new.view(np.uint16).tobytes(), raw=True))
    onnx.save(model, str(dst))
    return init.name


# ------------------------------------------------------------------------------------ honest graphs pass
@pytest.mark.parametrize("folder, graph, precision, lowering", [
    ("bert", "bert-g/single.onnx", "fp32", None),
    ("bert", "bert-g/single.fp16.onnx", "fp16", None),
    ("bert", "bert-g/single.bf16.onnx", "bf16", None),
    ("vit", "vit-g/single.onnx", "fp32", None),
    ("vit", "vit-g/single.fp16.onnx", "fp16", None),
    ("vit", "vit-g/single.bf16.onnx", "bf16", None),
    ("hydra", "hydra-g/hydra-conv.onnx", "fp32", "conv"),
    ("hydra", "hydra-g/hydra-conv.bf16.onnx", "bf16", "conv"),
    ("hydra", "hydra-g/hydra-matmul.onnx", "fp32", "matmul"),
    ("hydra", "hydra-g/hydra-matmul.fp16.onnx", "fp16", "matmul"),
    ("hydra", "hydra-g/hydra-matmul.bf16.onnx", "bf16", "matmul"),
])
def test_exported_graphs_pass_with_every_weight_matched(case, folder, graph, precision, lowering):
    module = reference(case, folder, lowering)
    report = weight_parity(case.tmp / graph, module)
    assert report.passed, report.message()
    assert report.precision == precision and report.unmatched == [] and report.reference_unused == []
    assert all(t.how in ("name", "value") for t in report.tensors)
    assert all(t.max_ulps == 0 for t in report.tensors)  # measured: the export copies weights bit for bit
    if precision != "fp32":
        assert any(t.dtype == precision for t in report.tensors)
    matched = {t.reference for t in report.tensors}
    linear = {f"{n}.weight" for n, m in module.named_modules() if isinstance(m, torch.nn.Linear)}
    assert linear <= matched | {"model.vit.pooler.dense.weight"}  # every Linear weight is in the graph
    if folder == "hydra":  # the Q/K/V concatenation of every block, in the lowering's own layout
        assert {f"blocks.{i}.attention.qkv.weight" for i in range(2)} <= matched
    model = onnx.load(str(case.tmp / graph))
    large = [i for i in model.graph.initializer if i.data_type in (TensorProto.FLOAT, TensorProto.FLOAT16,
                                                                     TensorProto.BFLOAT16)
             and int(np.prod(i.dims)) >= MIN_ELEMENTS]
    assert len(report.tensors) == len(large)  # every float initializer of >= 2 elements is judged
    data = report.to_dict()
    assert data["status"] == "pass" and data["failed"] == 0 and data["checked"] == len(large)


# ------------------------------------------------------------------------------------ wrong graphs fail
@pytest.mark.parametrize("family, graph", [("bert", "single.onnx"), ("bert", "single.bf16.onnx"),
                                           ("vit", "single.onnx"), ("vit", "single.bf16.onnx")])
def test_a_graph_of_another_checkpoint_fails_and_names_the_tensors(case, family, graph):
    report = weight_parity(case.tmp / f"{family}-other-g" / graph, reference(case, family))
    assert not report.passed
    assert len(report.failures) * 2 > len(report.tensors)
    assert "another checkpoint" in report.message()
    key = {"bert": "model.bert.encoder.layer.0.attention.self.key.weight",
           "vit": "model.vit.layers.0.attention.k_proj.weight"}[family]
    by_reference = {t.reference: t for t in report.failures}
    assert key in by_reference and by_reference[key].max_abs_diff > 0
    assert by_reference[key].how in ("scope", "name") and by_reference[key].max_ulps > ALLOWED_ULPS["bf16"]


@pytest.mark.parametrize("graph", ["single.onnx", "single.bf16.onnx"])
def test_the_cli_fails_a_stale_graph_with_exit_1_and_reports_every_tensor(case, tmp_path, graph):
    out = cli("parity", str(case.tmp / "bert-other-g" / graph), "--reference", str(case.folders["bert"]),
              "-o", str(tmp_path / "p"))
    assert out.returncode == 1, out.stderr[-3000:]
    report = json.loads((tmp_path / "p" / "report.json").read_text())
    (engine,) = report["engines"]
    weights = next(c for c in report["engines"][engine]["checks"] if c["name"] == "weights")
    assert weights["status"] == "fail" and weights["kind"] == "weights"
    tensors = {t["reference"]: t for t in weights["data"]["tensors"]}
    key = tensors["model.bert.encoder.layer.0.attention.self.key.weight"]
    assert key["status"] == "fail" and key["initializer"].startswith("onnx::MatMul")
    assert "model.bert.encoder.layer.0.attention.self.key.weight" in weights["message"]
    cases = {c.get("name"): c for c in ET.parse(tmp_path / "p" / "junit.xml").getroot().iter("testcase")}
    assert cases["weights"].find("failure") is not None
    assert "differ from the reference" in cases["weights"].find("failure").get("message")
    summary = (tmp_path / "p" / "summary.md").read_text()
    assert "| weights |" in summary and "### Weights" in summary and "onnx::MatMul" in summary


def test_the_cli_passes_the_reference_own_graphs_with_a_weights_check_each(case, tmp_path):
    g = case.tmp / "hydra-g"
    out = cli("parity", str(g / "hydra-conv.onnx"), str(g / "hydra-matmul.bf16.onnx"),
              "--reference", str(case.folders["hydra"]), "-o", str(tmp_path / "p"))
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads((tmp_path / "p" / "report.json").read_text())
    for engine, info in report["engines"].items():
        weights = [c for c in info["checks"] if c["name"] == "weights"]
        assert len(weights) == 1 and weights[0]["status"] == "pass", engine
        assert weights[0]["data"]["checked"] > 10
    assert set(report["meta"]["weights"]) == set(report["engines"])


def test_one_weight_scaled_by_1_05_fails_at_bf16(case, tmp_path):
    src = case.tmp / "bert-g" / "single.bf16.onnx"
    scope = "/module/model/bert/encoder/layer.1/attention/self/key"
    name = edited(src, tmp_path / "scaled.bf16.onnx", scope, lambda w: (w * 1.05).astype(ml_dtypes.bfloat16))
    report = weight_parity(tmp_path / "scaled.bf16.onnx", reference(case, "bert"))
    assert not report.passed
    (bad,) = report.failures
    assert bad.initializer == name and bad.dtype == "bf16" and bad.how == "scope"
    assert bad.reference == "model.bert.encoder.layer.1.attention.self.key.weight"
    assert bad.module == "model.bert.encoder.layer.1.attention.self.key"
    assert bad.max_ulps > ALLOWED_ULPS["bf16"]
    assert bad.reference in report.message() and name in report.message()


def test_a_key_projection_times_minus_two_fails_at_fp32(case, tmp_path):
    src = case.tmp / "bert-g" / "single.onnx"
    scope = "/module/model/bert/encoder/layer.0/attention/self/key"
    name = edited(src, tmp_path / "key.onnx", scope, lambda w: w * -2)
    report = weight_parity(tmp_path / "key.onnx", reference(case, "bert"))
    (bad,) = report.failures
    assert bad.initializer == name and bad.reference == "model.bert.encoder.layer.0.attention.self.key.weight"
    assert bad.transform == "transpose" and bad.dtype == "fp32"


def test_one_ulp_at_fp32_fails_the_weights_check_alone_with_exit_1(case, tmp_path):
    """A weight one FP32 ULP off moves no output beyond the FP32 tolerance; only the weights check sees it."""
    src = case.tmp / "bert-g" / "single.onnx"
    model = onnx.load(str(src))
    init = next(i for i in model.graph.initializer if i.name.endswith("classifier.weight"))
    w = numpy_helper.to_array(init)
    init.CopyFrom(numpy_helper.from_array(np.nextafter(w, np.float32(np.inf)).astype(np.float32), init.name))
    onnx.save(model, str(tmp_path / "single.onnx"))
    out = cli("parity", str(tmp_path / "single.onnx"), "--reference", str(case.folders["bert"]),
              "--json", str(tmp_path / "v.json"))
    assert out.returncode == 1, out.stderr[-3000:]
    report = json.loads((tmp_path / "v.json").read_text())
    failing = [c for e in report["engines"].values() for c in e["checks"] if c["status"] == "fail"]
    assert [c["name"] for c in failing] == ["weights"]
    (bad,) = [t for t in failing[0]["data"]["tensors"] if t["status"] == "fail"]
    assert bad["how"] == "name" and bad["reference"] == "model.classifier.weight" and bad["max_ulps"] == 1


@pytest.mark.parametrize("lowering", ["conv", "matmul"])
def test_a_hydra_graph_with_one_member_key_changed_names_the_key_parameter(case, tmp_path, lowering):
    src = case.tmp / "hydra-g" / f"hydra-{lowering}.onnx"
    module = reference(case, "hydra", lowering)
    att = module.blocks[0].attention
    inner = att.heads * att.head_dim  # member 0's Q, K, V rows: [0, inner), [inner, 2 inner), [2 inner, 3 inner)

    def change(w: np.ndarray) -> np.ndarray:
        w = w.copy()
        if lowering == "conv":  # [M * 3 * inner, D, 1]
            w[inner:2 * inner] *= -2
        else:  # [M, D, 3 * inner]
            w[0, :, inner:2 * inner] *= -2
        return w

    name = edited(src, tmp_path / "h.onnx", "/module/blocks.0/attention", change)
    report = weight_parity(tmp_path / "h.onnx", module)
    (bad,) = report.failures
    assert bad.initializer == name and bad.reference == "blocks.0.attention.qkv.weight"
    assert bad.differs == ("blocks.0.attention.k.weight",)
    assert "blocks.0.attention.k.weight" in report.message()


# ------------------------------------------------------------------------------------ the gate's plumbing
def test_run_parity_reports_weights_per_engine_and_says_when_there_is_no_graph(case, tmp_path):
    from toolchain.engines import make_runner
    from toolchain.parity import run_parity
    from toolchain.verbs.export import open_source

    source = open_source(case.folders["bert"])
    module, _ = source.build(None)
    names = ["input_ids", "attention_mask", "token_type_ids"]
    feeds = [{n: source.make_feed(b, s, i)[n].numpy() for n in names} for i, (b, s) in enumerate([(1, 8), (3, 12)])]
    specs = {n: (np.int64, ("batch", "sequence")) for n in names}
    ref = make_runner("torch", module=module, input_specs=specs, output_names=["logits", "probs"])
    graph = case.tmp / "bert-g" / "single.onnx"
    candidates = {"ort": make_runner("onnxrt-cpu", path=graph), "engine": make_runner("onnxrt-cpu", path=graph)}
    verdict = run_parity(ref, candidates, feeds, [], [], out_dir=tmp_path, graphs={"ort": graph, "engine": None})
    assert verdict.exit_code == 0, verdict.problems()
    assert [c.engine for c in verdict.checks if c.kind == "weights"] == ["ort"]
    assert verdict.meta["weights"] == {"ort": str(graph), "engine": "not checked: no graph"}
    summary = (tmp_path / "summary.md").read_text()
    assert "| weights |" in summary and "**engine**: weights not checked: no graph" in summary
    props = {p.get("name"): p.get("value") for p in ET.parse(tmp_path / "junit.xml").getroot().iter("property")}
    assert props["weights"] in (str(graph), "not checked: no graph")
    # without graphs= there is no weights check (the API's earlier behaviour)
    plain = run_parity(ref, {"ort": make_runner("onnxrt-cpu", path=graph)}, feeds, [], [])
    assert {c.kind for c in plain.checks} == {"run", "numeric"} and "weights" not in plain.meta


def test_bf16_rounding_is_the_precision_pass_rounding():
    from toolchain.export.precision import BF16_MAX, float32_to_bfloat16_bits

    rng = np.random.default_rng(0)
    values = np.concatenate([
        rng.standard_normal(5000).astype(np.float32) * np.float32(10.0) ** rng.integers(-40, 38, 5000),
        np.array([0.0, -0.0, 1.0 + 2**-8, 1.0 + 3 * 2**-8, -(1.0 + 2**-8), 1e-45, BF16_MAX, -BF16_MAX,
                  np.inf, -np.inf], dtype=np.float32)])  # ties to even both ways, subnormal, the largest
    assert np.array_equal(_round_bits(values, "bf16").view(np.uint16), float32_to_bfloat16_bits(values))


def test_bad_arguments_are_named(case, tmp_path):
    with pytest.raises(GraphError, match=r"missing\.onnx"):
        weight_parity(tmp_path / "missing.onnx", reference(case, "bert"))
    with pytest.raises(ToolchainError, match=r"must be a torch nn\.Module, got str"):
        weight_parity(case.tmp / "bert-g" / "single.onnx", "bert")


@pytest.mark.slow
def test_the_packaged_minilm_graph_matches_its_checkpoint_at_fp32_and_bf16(tmp_path):
    from toolchain.export import export_onnx
    from toolchain.export.precision import write_precision_variant
    from toolchain.models import resolve_source
    from toolchain.verbs.export import open_source

    source = open_source(resolve_source("packaged:all-MiniLM-L6-v2"))
    module, outputs = source.build(None)
    feed = {k: v for k, v in source.make_feed(1, 16, 0).items() if k in source.family.input_names}
    export_onnx(module, feed, outputs, tmp_path / "m.onnx", dynamic_axes={n: {0: "b", 1: "s"} for n in feed})
    write_precision_variant(tmp_path / "m.onnx", tmp_path / "m.bf16.onnx", "bf16")
    for graph in ("m.onnx", "m.bf16.onnx"):
        report = weight_parity(tmp_path / graph, module)
        assert report.passed and len(report.tensors) >= 100 and report.unmatched == [], report.message()


def test_an_initializer_with_no_parameter_of_its_size_is_reported_not_failed(case, tmp_path):
    """A tensor derived from several parameters by another tool (a fused attention's packed QKV) has
    nothing of its size to compare with: named and counted as unmatched, while the rest still gate."""
    model = onnx.load(str(case.tmp / "bert-g/single.onnx"))
    packed = np.random.default_rng(0).standard_normal((7, 13)).astype(np.float32)  # no parameter has 91 values
    model.graph.initializer.append(numpy_helper.from_array(packed, "packed_qkv_from_elsewhere"))
    onnx.save(model, str(tmp_path / "extra.onnx"))
    report = weight_parity(tmp_path / "extra.onnx", reference(case, "bert"))
    assert report.passed and report.unmatched == ["packed_qkv_from_elsewhere"]
    assert "1 match no reference parameter of their size" in report.message()
    assert report.to_dict()["unmatched"] == ["packed_qkv_from_elsewhere"]


def test_engines_built_from_one_graph_share_one_weights_check(case, tmp_path, monkeypatch):
    """ONNX Runtime and OpenVINO FP32/BF16 engines of one graph: its weights are compared once, reported per engine."""
    import toolchain.parity.weights as weights_module
    from toolchain.engines import make_runner
    from toolchain.parity import run_parity
    from toolchain.verbs.export import open_source

    calls = []
    real = weights_module.weight_parity
    monkeypatch.setattr(weights_module, "weight_parity", lambda *a, **k: calls.append(a[0]) or real(*a, **k))
    source = open_source(case.folders["bert"])
    module, _ = source.build(None)
    names = ["input_ids", "attention_mask", "token_type_ids"]
    feeds = [{n: source.make_feed(1, 8, 0)[n].numpy() for n in names}]
    ref = make_runner("torch", module=module, input_specs={n: (np.int64, ("batch", "sequence")) for n in names},
                      output_names=["logits", "probs"])
    graph = case.tmp / "bert-g" / "single.onnx"
    candidates = {"a": make_runner("onnxrt-cpu", path=graph), "b": make_runner("onnxrt-cpu", path=graph)}
    verdict = run_parity(ref, candidates, feeds, [], [], graphs={"a": graph, "b": graph})
    assert len(calls) == 1
    checks = [c for c in verdict.checks if c.kind == "weights"]
    assert [c.engine for c in checks] == ["a", "b"] and all(c.status == "pass" for c in checks)
    assert checks[0].data == checks[1].data
