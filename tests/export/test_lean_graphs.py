"""Lean Hydra graphs: node counts against the single model, no per-layer shape arithmetic,
one ``LayerNormalization`` per LayerNorm, and the checks every exported graph must still pass
(ONNX Runtime = torch at other shapes, the TensorRT lint, FP32 islands of the FP16 pass).

Tiny BERT and ViT (``toolchain.models.tiny``), M = 3 members keeping 3 of 4 heads per layer
(the recipes' prune ratio 0.25), exported as the export stage does (``export_onnx``, opset 17).
"""

from __future__ import annotations

import onnx
import pytest
import torch

from toolchain.engines.onnxrt.dynamic import check_dynamic
from toolchain.export.lint import lint_tensorrt
from toolchain.export.onnx_export import export_onnx
from toolchain.export.precision import convert_precision
from toolchain.export.stats import SHAPE_OPS, graph_stats, stats_table
from toolchain.hydra import fuse
from toolchain.models.tiny import tiny_bert, tiny_vit
from toolchain.models.wrappers import SingleModel

FAMILIES = {"bert": tiny_bert, "vit": tiny_vit}
MAX_NODE_RATIO = 1.3


def _masks(layers: int = 2, heads: int = 4, members: int = 3) -> torch.Tensor:
    """Member m drops head m in every layer (3 of 4 heads kept, different sets)."""
    masks = torch.ones(members, layers, heads, dtype=torch.bool)
    for m in range(members):
        masks[m, :, m % heads] = False
    return masks


def _axes(family: str, names: list[str]) -> dict[str, dict[int, str]]:
    return {n: ({0: "batch", 1: "sequence"} if family == "bert" else {0: "batch"}) for n in names}


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def exported(request, tmp_path_factory):
    """single, hydra-conv, hydra-matmul (mlp average, layernorm grouped) of one tiny family."""
    family = request.param
    tiny = FAMILIES[family]()
    folder = tmp_path_factory.mktemp(family)
    batch = tiny.make_batch(2, seed=0)
    names = list(tiny.adapter.input_names)
    feed = {n: batch[n] for n in names}
    graphs = {"single": (SingleModel(tiny.adapter), ["logits", "probs"])}
    for low in ("conv", "matmul"):
        graphs[f"hydra-{low}"] = (fuse(tiny.adapter, _masks(), lowering=low), ["probs", "member_logits"])
    paths = {}
    for name, (module, outputs) in graphs.items():
        res = export_onnx(module.eval(), feed, outputs, folder / f"{name}.onnx", dynamic_axes=_axes(family, names))
        paths[name] = res.path
    return family, tiny, graphs, paths


def test_graph_stats_counts_a_hand_built_graph(tmp_path):
    nodes = [
        onnx.helper.make_node("Constant", [], ["s"], value=onnx.numpy_helper.from_array(
            __import__("numpy").array([0, -1], dtype="int64"))),
        onnx.helper.make_node("Shape", ["x"], ["sh"]),
        onnx.helper.make_node("Reshape", ["x", "s"], ["r"]),
        onnx.helper.make_node("Relu", ["r"], ["a"]),
        onnx.helper.make_node("Relu", ["a"], ["y"]),
    ]
    graph = onnx.helper.make_graph(
        nodes, "g", [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["b", 2, 3])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None),
         onnx.helper.make_tensor_value_info("sh", onnx.TensorProto.INT64, None)])
    onnx.save(onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)]), tmp_path / "g.onnx")
    stats = graph_stats(tmp_path / "g.onnx")
    assert stats == {"nodes": 5, "nodes_excluding_constant": 4, "shape_nodes": 1,
                     "ops": {"Relu": 2, "Constant": 1, "Reshape": 1, "Shape": 1}}
    assert "| Relu | 2 |" in stats_table({"g": stats})


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_hydra_graphs_are_at_most_1_3x_the_single_model(exported):
    family, _tiny, _graphs, paths = exported
    stats = {name: graph_stats(path) for name, path in paths.items()}
    single = stats["single"]["nodes_excluding_constant"]
    for name in ("hydra-conv", "hydra-matmul"):
        ratio = stats[name]["nodes_excluding_constant"] / single
        assert ratio <= MAX_NODE_RATIO, f"{family} {name}: {ratio:.2f}x the single model's nodes\n" + stats_table(stats)
        # shape arithmetic is not repeated per layer: no more shape nodes than the single model
        assert stats[name]["shape_nodes"] <= stats["single"]["shape_nodes"], stats_table(stats)


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_each_layernorm_is_one_node(exported):
    """Every LayerNorm of the fused model is one LayerNormalization: no ReduceMean/Sqrt chains."""
    family, _tiny, graphs, paths = exported
    hydra = graphs["hydra-conv"][0]
    layer_norms = 2 * len(hydra.blocks) + sum(
        isinstance(m, torch.nn.LayerNorm) for m in [*hydra.embeddings.modules(), *hydra.heads.modules()])
    for name in ("hydra-conv", "hydra-matmul"):
        ops = graph_stats(paths[name])["ops"]
        assert ops.get("LayerNormalization") == layer_norms, (family, name, ops)
        assert "Sqrt" not in ops and "Pow" not in ops, (family, name, ops)
        assert ops.get("ReduceMean", 0) <= 1, (family, name, ops)  # only the mean over the members' softmax


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_onnxruntime_matches_torch_at_other_shapes(exported):
    family, tiny, graphs, paths = exported
    shapes = [(3, 9), (1, 12)] if family == "bert" else [(3, 0), (1, 0)]

    def make(shape):
        batch = tiny.make_batch(shape[0], seed=5)
        return {k: (v[:, : shape[1]] if family == "bert" else v) for k, v in batch.items()
                if k in tiny.adapter.input_names}

    for name, (module, _outputs) in graphs.items():
        report = check_dynamic(paths[name], module, make, shapes, atol=1e-4, raise_on_failure=False)
        assert report.ok, (name, report.failures)
        assert len(report.comparisons) == 2 * len(shapes)


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_tensorrt_lint_passes(exported):
    family, tiny, _graphs, paths = exported
    if family == "bert":
        profile = {n: ((1, 4), (2, 12), (8, 32)) for n in tiny.adapter.input_names}
    else:
        profile = {"pixel_values": ((1, 1, 16, 16), (2, 1, 16, 16), (8, 1, 16, 16))}
    for name, path in paths.items():
        report = lint_tensorrt(path, trt_version="10", profile=profile)
        assert report.ok, (name, [str(f) for f in report.findings])


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_fp16_keeps_layernorm_softmax_and_reductions_fp32(exported):
    _family, _tiny, _graphs, paths = exported
    for name in ("hydra-conv", "hydra-matmul"):
        model = onnx.load(str(paths[name]))
        result = convert_precision(model, "fp16")
        kinds = {n.name: n.op_type for n in result.model.graph.node}
        kept = {kinds[n] for n in result.kept_fp32 if n in kinds}
        assert {"LayerNormalization", "Softmax", "ReduceMean"} <= kept, (name, kept)
        low = {kinds[n] for n in result.low_nodes if n in kinds}
        assert low & {"Conv", "MatMul"}, (name, low)  # the GEMMs do run in FP16
        assert not low & {"LayerNormalization", "Softmax", "ReduceMean"}


def test_shape_ops_are_named():
    assert {"Shape", "Gather", "Unsqueeze", "Concat"} <= SHAPE_OPS
