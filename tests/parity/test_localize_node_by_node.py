"""``parity --localize`` on graphs without module-scoped names: node by node against a reference graph.

Issue 47 item 5. The candidate's every node is renamed ``n0, n1, ...`` and every intermediate value
``v0, v1, ...`` (no scope left for the PyTorch path), then one weight is corrupted: (a) the first
layer's, (b) the classifier head's, (c) an initializer several nodes read (the TorchScript exporter
shares identical initializers through ``Identity`` nodes), on a tiny BERT and a tiny ViT; (d) a
Linear that the model's forward calls twice. :func:`localize_against_graph` against the honest
graph (``--baseline``) must name the first node, in graph order, that reads the corrupted weight.
The low-precision path with no FP32 graph beside it compares the graph with itself cast up to FP32.
All on real ONNX Runtime sessions.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from cli_runner import run_cli as _cli
from onnx import numpy_helper

from toolchain.export.precision import graph_precision
from toolchain.parity.localize import localize_against_torch
from toolchain.parity.localize_graph import cast_up, localize_against_graph, match_values
from toolchain.parity.scopes import Graph

pytestmark = pytest.mark.filterwarnings("ignore:You are using the legacy TorchScript-based ONNX export")



def rename(src: Path, dst: Path) -> dict[str, str]:
    """Copy ``src`` with every node named ``n<i>`` and every intermediate value ``v<i>``; old node name -> new."""
    model = onnx.load(str(src))
    g = model.graph
    keep = {i.name for i in g.input} | {o.name for o in g.output} | {i.name for i in g.initializer}
    values: dict[str, str] = {}
    nodes: dict[str, str] = {}
    for i, node in enumerate(g.node):
        nodes[node.name] = f"n{i}"
        node.name = f"n{i}"
        for k, out in enumerate(node.output):
            if out and out not in keep:
                values[out] = f"v{len(values)}"
                node.output[k] = values[out]
    for node in g.node:
        for k, name in enumerate(node.input):
            node.input[k] = values.get(name, name)
    for info in g.value_info:
        info.name = values.get(info.name, info.name)
    onnx.save(model, str(dst))
    return nodes


def readers(model: onnx.ModelProto, weight: str) -> list[str]:
    """Nodes (graph order) reading ``weight`` directly or through ``Identity``."""
    names, found = {weight}, []
    for node in model.graph.node:
        if any(i in names for i in node.input):
            if node.op_type == "Identity":
                names.update(node.output)
            else:
                found.append(node.name)
    return found


def pick(model: onnx.ModelProto, case: str) -> str:
    """The initializer a case corrupts."""
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer if i.data_type == onnx.TensorProto.FLOAT}
    read = {name: readers(model, name) for name in inits}
    order = {n.name: i for i, n in enumerate(model.graph.node)}
    if case == "first":  # the first node (graph order) reading a matrix
        return min((n for n in inits if inits[n].ndim >= 2 and read[n]), key=lambda n: order[read[n][0]])
    if case == "head":  # the last MatMul/Gemm reading a matrix: the classifier
        ops = {n.name: n.op_type for n in model.graph.node}
        return max((n for n in inits if inits[n].ndim == 2 and read[n] and ops[read[n][-1]] in ("MatMul", "Gemm")),
                   key=lambda n: order[read[n][-1]])
    shared = [n for n in inits if len(read[n]) >= 3 and inits[n].ndim == 1]  # case "shared"
    return min(shared, key=lambda n: order[read[n][0]])


def corrupt(src: Path, dst: Path, weight: str, scale: float = 0.5) -> None:
    model = onnx.load(str(src))
    init = next(i for i in model.graph.initializer if i.name == weight)
    w = numpy_helper.to_array(init).astype(np.float32)
    noise = np.random.default_rng(0).standard_normal(w.shape).astype(np.float32)
    init.CopyFrom(numpy_helper.from_array(w + scale * max(float(w.std()), 0.1) * noise, weight))
    onnx.save(model, str(dst))


def _family(tmp_path_factory, name: str) -> dict:
    from toolchain.models import save_model
    from toolchain.models.tiny import tiny_bert, tiny_vit
    from toolchain.verbs import ExportOptions, export_graphs
    from toolchain.verbs.export import open_source

    tmp = tmp_path_factory.mktemp(f"node-by-node-{name}")
    ckpt = save_model({"bert": tiny_bert, "vit": tiny_vit}[name](layers=3).model, tmp / "ckpt")
    export_graphs(ckpt, tmp / "g", ExportOptions(precisions=("fp32", "fp16")))
    source = open_source(ckpt)
    feeds = [{k: v.numpy() for k, v in source.make_feed(b, 12, 30 + b).items()} for b in (2, 5)]
    return {"g": tmp / "g", "ckpt": ckpt, "module": source.build(None)[0], "feeds": feeds}


@pytest.fixture(scope="module")
def families(tmp_path_factory) -> dict:
    return {name: _family(tmp_path_factory, name) for name in ("bert", "vit")}


@pytest.mark.parametrize("family", ["bert", "vit"])
@pytest.mark.parametrize("case", ["first", "head", "shared"])
def test_renamed_graph_with_a_corrupted_weight_is_localized_against_the_baseline(families, family, case, tmp_path):
    f = families[family]
    honest = f["g"] / "single.onnx"
    weight = pick(onnx.load(str(honest)), case)
    corrupt(honest, tmp_path / "broken.onnx", weight)
    names = rename(tmp_path / "broken.onnx", tmp_path / "renamed.onnx")
    expected = names[readers(onnx.load(str(honest)), weight)[0]]

    pairs, how = match_values(Graph(tmp_path / "renamed.onnx"), Graph(honest))
    assert how == "structure" and len(pairs) > 100
    # the PyTorch path needs module-scoped names: it finds none here
    torch_side = localize_against_torch(tmp_path / "renamed.onnx", f["module"], f["feeds"])
    assert torch_side.found is False and "no module output" in " ".join(torch_side.notes)

    loc = localize_against_graph(tmp_path / "renamed.onnx", honest, f["feeds"], precision="fp32")
    assert loc.against == "baseline" and loc.found and loc.fails_unmarked, loc.summary()
    assert loc.node == expected, (loc.node, expected, loc.summary())
    assert loc.weights and loc.weights[0]["initializer"] in (weight, *[n for n in pairs])  # the corrupted weight
    assert loc.weights[0]["reference"].endswith("(single.onnx)")
    assert loc.statistic > 1 or loc.failed in ("max_limit", "feed")
    before = [c for c in loc.checked if c.position < Graph(tmp_path / "renamed.onnx").position[loc.value]]
    assert all(c.status == "pass" for c in before)  # every earlier value checked matches the baseline
    assert "the baseline graph" in loc.summary() and f"node {expected} " in loc.summary(), loc.summary()
    if case == "shared":
        assert any("read by" in note for note in loc.notes)


@pytest.mark.parametrize("case", ["first", "head", "shared"])
def test_renamed_fp16_graph_is_localized_against_the_fp32_graph_by_structure(families, case, tmp_path):
    """The precision pass's casts, ``__fp16`` weights and FP16 constants do not break the structural match."""
    f = families["bert"]
    weight = pick(onnx.load(str(f["g"] / "single.onnx")), case)
    fp16 = onnx.load(str(f["g"] / "single.fp16.onnx"))
    low = next(i.name for i in fp16.graph.initializer if i.name in (weight, f"{weight}__fp16"))
    init = next(i for i in fp16.graph.initializer if i.name == low)
    w = numpy_helper.to_array(init)
    noise = np.random.default_rng(0).standard_normal(w.shape)
    init.CopyFrom(numpy_helper.from_array((w + 0.5 * max(float(w.std()), 0.1) * noise).astype(w.dtype), low))
    onnx.save(fp16, str(tmp_path / "broken.fp16.onnx"))
    names = rename(tmp_path / "broken.fp16.onnx", tmp_path / "renamed.fp16.onnx")
    expected = names[readers(fp16, low)[0]]
    loc = localize_against_graph(tmp_path / "renamed.fp16.onnx", f["g"] / "single.onnx", f["feeds"], precision="fp16")
    assert loc.found and loc.node == expected, (expected, loc.summary())
    assert loc.weights and loc.weights[0]["initializer"] == low


class _Twice(torch.nn.Module):
    """A tiny classifier whose forward calls one Linear twice (its weight read by two nodes)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = torch.nn.Linear(6, 16)
        self.block = torch.nn.Linear(16, 16)
        self.head = torch.nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        h = torch.tanh(self.block(torch.tanh(self.embed(x))))
        return {"logits": self.head(torch.tanh(self.block(h)))}


def test_a_module_called_twice_is_named_at_its_first_call(tmp_path):
    model = _Twice().eval()
    torch.onnx.export(model, (torch.zeros(2, 6),), str(tmp_path / "twice.onnx"), input_names=["x"],
                      output_names=["logits"], dynamic_axes={"x": {0: "b"}, "logits": {0: "b"}}, dynamo=False)
    graph = onnx.load(str(tmp_path / "twice.onnx"))
    shared = next(i.name for i in graph.graph.initializer if len(readers(graph, i.name)) == 2
                  and numpy_helper.to_array(i).shape == (16, 16))
    first, second = readers(graph, shared)
    corrupt(tmp_path / "twice.onnx", tmp_path / "broken.onnx", shared)
    feeds = [{"x": np.random.default_rng(s).standard_normal((4, 6)).astype(np.float32)} for s in (1, 2)]
    loc = localize_against_graph(tmp_path / "broken.onnx", tmp_path / "twice.onnx", feeds, precision="fp32")
    assert loc.found and loc.node == first != second, loc.summary()
    assert loc.weights[0]["initializer"] == shared and any("read by 2 nodes" in n for n in loc.notes)


def test_cli_baseline_localizes_a_renamed_graph(families, tmp_path):
    f = families["bert"]
    honest = f["g"] / "single.onnx"
    weight = pick(onnx.load(str(honest)), "head")
    corrupt(honest, tmp_path / "broken.onnx", weight)
    names = rename(tmp_path / "broken.onnx", tmp_path / "renamed.onnx")
    expected = names[readers(onnx.load(str(honest)), weight)[0]]
    out = _cli("parity", str(tmp_path / "renamed.onnx"), "--reference", str(f["ckpt"]), "--localize", "--baseline",
               str(honest), "--json", str(tmp_path / "v.json"))
    assert out.returncode == 1, out.stderr[-3000:]
    torch_side, graph_side = json.loads((tmp_path / "v.json").read_text())["engines"][
        "onnxrt-cpu:renamed.onnx"]["localization"]
    assert torch_side["found"] is False and graph_side["against"] == "baseline"
    assert graph_side["found"] is True and graph_side["node"] == expected, graph_side["summary"]
    assert expected in out.stdout + out.stderr
    # without --baseline the FP32 graph cannot be placed node by node, and the report says what to give
    out = _cli("parity", str(tmp_path / "renamed.onnx"), "--reference", str(f["ckpt"]), "--localize", "--json",
               str(tmp_path / "w.json"))
    items = json.loads((tmp_path / "w.json").read_text())["engines"]["onnxrt-cpu:renamed.onnx"]["localization"]
    assert out.returncode == 1 and "--baseline GRAPH" in items[-1]["summary"]


def test_cli_baseline_needs_localize_and_an_onnx_file(families, tmp_path):
    honest = families["bert"]["g"] / "single.onnx"
    out = _cli("parity", str(honest), "--reference", str(families["bert"]["ckpt"]), "--baseline", str(honest))
    assert out.returncode == 2 and "add --localize" in out.stderr
    out = _cli("parity", str(honest), "--reference", str(families["bert"]["ckpt"]), "--localize", "--baseline",
               str(tmp_path / "missing.onnx"))
    assert out.returncode == 2 and "--baseline" in out.stderr and "missing.onnx" in out.stderr


def test_fp16_graph_alone_is_compared_with_itself_cast_up(families, tmp_path):
    """No FP32 graph beside it: the FP16 graph cast up to FP32 is the reference; it runs the same weights in FP32."""
    f = families["bert"]
    fp16 = tmp_path / "alone.fp16.onnx"
    shutil.copy(f["g"] / "single.fp16.onnx", fp16)
    up = cast_up(onnx.load(str(fp16)))
    assert graph_precision(onnx.load(str(fp16))) == "fp16" and graph_precision(up) == "fp32"
    assert {v.name for v in up.graph.value_info} == {v.name for v in onnx.load(str(fp16)).graph.value_info}
    honest = localize_against_graph(fp16, up, f["feeds"], precision="fp16", against="fp32-cast")
    assert honest.found is False and honest.fails_unmarked is False  # true FP16 arithmetic passes the rule
    # where 16 bits lose digits and 32 do not: x + 1024 stored in FP16 (spacing 1 there), then - 1024. Explicit
    # casts: ONNX Runtime's CPU provider runs FP16 Add/Sub in FP32 and drops the cast pairs it inserts
    model = onnx.load(str(fp16))
    head = [n for n in model.graph.node if n.op_type in ("MatMul", "Gemm")][-1]  # the classifier
    node = next(n for n in model.graph.node if head.input[0] in n.output)  # what it reads: the pooler's Tanh
    out = node.output[0]
    node.output[0] = out + "_exact"
    model.graph.initializer.append(numpy_helper.from_array(np.array(1024.0, np.float32), "big"))
    make = onnx.helper.make_node
    lossy = [make("Cast", [out + "_exact"], ["l1"], to=1, name="lossy/Up"),
             make("Add", ["l1", "big"], ["l2"], name="lossy/Add"),
             make("Cast", ["l2"], ["l3"], to=10, name="lossy/Round"),
             make("Cast", ["l3"], ["l4"], to=1, name="lossy/Back"),
             make("Sub", ["l4", "big"], ["l5"], name="lossy/Sub"),
             make("Cast", ["l5"], [out], to=10, name="lossy/Down")]
    index = list(model.graph.node).index(node)
    for k, extra in enumerate(lossy):
        model.graph.node.insert(index + 1 + k, extra)
    onnx.save(model, str(fp16))
    loc = localize_against_graph(fp16, cast_up(model), f["feeds"], precision="fp16", against="fp32-cast")
    assert loc.found and loc.node == "lossy/Sub", loc.summary()
    assert not loc.weights and "itself run in FP32" in loc.summary()


def test_a_pooling_gather_is_not_blamed_for_errors_it_only_selects(tmp_path):
    """One element off by 3x the tolerance: the quantile passes it in the [B, T, D] input, fails it once gathered."""
    from onnx import TensorProto, helper

    def graph(path: Path, scale: np.ndarray) -> None:
        nodes = [helper.make_node("Mul", ["x", "s"], ["scaled"], name="scale/Mul"),
                 helper.make_node("Gather", ["scaled", "last"], ["y"], axis=1, name="pool/Gather")]
        g = helper.make_graph(nodes, "pool", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 64, 32])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", 32])],
                              [numpy_helper.from_array(scale, "s"), numpy_helper.from_array(np.array(63), "last")])
        onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(path))

    ones = np.ones((64, 32), np.float32)
    off = ones.copy()
    off[63, 5] = 1.05
    graph(tmp_path / "ref.onnx", ones)
    graph(tmp_path / "cand.onnx", off)
    x = np.random.default_rng(0).standard_normal((2, 64, 32)).astype(np.float32)
    x[:, 63, 5] = 1.5
    from toolchain.parity.localize import onnx_runner

    loc = localize_against_graph(tmp_path / "cand.onnx", tmp_path / "ref.onnx", [{"x": x}], precision="fp16",
                                 run_marked=onnx_runner(None, "fp32"))
    assert loc.found and loc.node == "scale/Mul", loc.summary()
    scaled = next(c for c in loc.checked if c.value == "scaled")
    assert scaled.status == "pass" and scaled.max_error > 1  # the rule passes it; its worst element does not
    assert any("only moves values" in note for note in loc.notes)
