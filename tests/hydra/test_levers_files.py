"""The file commands on a forked, MLP-sliced Hydra folder (issue 45): export, parity, bench, inspect.

Tiny BERT, ViT and LLaMA (a gated MLP, RMSNorm, rotary): two members that split after layer 0
(the trunk runs once on one stream) and keep their own, unequal slices of layer 1's MLP neurons.
The graphs pass the parity gate (numeric, UQ and weights checks) on ONNX Runtime and OpenVINO at
FP32 and BF16, and ``inspect`` names the fork and the slices.
"""

from __future__ import annotations

import json

import onnx
import pytest
import torch
from cli_runner import run_cli as cli

pytestmark = pytest.mark.filterwarnings("ignore:You are using the legacy TorchScript-based ONNX export")

FAMILIES = ("bert", "vit", "llama")


def levered(family: str):
    """The tiny model fused with a fork after layer 0 and sliced MLPs in layer 1 (widths I/2 and I/3)."""
    from toolchain.hydra import fuse
    from toolchain.models.tiny import TINY_MODELS

    tiny = TINY_MODELS[family]()
    a = tiny.adapter
    heads = a.heads_per_layer()
    keep = torch.zeros(2, a.num_layers, a.max_heads, dtype=torch.bool)
    keep[:, 0, : heads[0]] = True  # the trunk keeps every head
    keep[0, 1, : heads[1] // 2] = True
    keep[1, 1, heads[1] // 2: heads[1]] = True
    width = a.layers()[1].fc1.out_features
    order = torch.randperm(width, generator=torch.Generator().manual_seed(0)).tolist()
    neurons = [[list(range(a.layers()[0].fc1.out_features)), sorted(order[: width // 2])],
               [list(range(a.layers()[0].fc1.out_features)), sorted(order[width // 2: width // 2 + width // 3])]]
    return tiny, fuse(a, keep, mlp="grouped", fork=1, neurons=neurons)


@pytest.fixture(scope="module", params=FAMILIES)
def folder(request, tmp_path_factory) -> dict:
    from toolchain.hydra import save_hydra

    tmp = tmp_path_factory.mktemp(f"levers-{request.param}")
    tiny, model = levered(request.param)
    return {"family": request.param, "tmp": tmp, "tiny": tiny, "model": model,
            "hydra": save_hydra(model, tmp / "hydra")}


def test_the_folder_round_trips_and_its_config_names_both_levers(folder):
    from toolchain.hydra import load_hydra
    from toolchain.hydra.io import CONFIG_FILE

    cfg = json.loads((folder["hydra"] / CONFIG_FILE).read_text())
    assert cfg["fork"] == 1 and "neurons" not in cfg["layers"][0] and len(cfg["layers"][1]["neurons"]) == 2
    model = load_hydra(folder["hydra"])
    assert model.config.fork == 1 and model.config.sliced
    spec = model.config.layers[1]
    assert len(set(spec.neurons)) == 2 and spec.intermediate_size == max(spec.neurons)
    batch = folder["tiny"].make_batch(3, 1)
    assert torch.equal(model(**batch)["probs"], folder["model"](**batch)["probs"])


def test_export_parity_bench_and_inspect(folder):
    tmp, hydra = folder["tmp"], folder["hydra"]
    shapes = ["--batch", "1:2:4"] + (["--seq", "4:8:12"] if folder["family"] != "vit" else [])
    out = cli("export", str(hydra), "-o", str(tmp / "g"), "--lowering", "conv,matmul", "--precision", "fp32,bf16",
              *shapes)
    assert out.returncode == 0, out.stderr[-3000:]
    g = tmp / "g"
    graph = onnx.load(str(g / "hydra-conv.onnx"), load_external_data=False)
    convs = {n.name: n for n in graph.graph.node if n.op_type == "Conv"}
    groups = {name: next((a.i for a in n.attribute if a.name == "group"), 1) for name, n in convs.items()}
    trunk = [k for k in groups if "/blocks.0/" in k]
    members = [k for k in groups if "/blocks.1/" in k]
    assert trunk and all(groups[k] == 1 for k in trunk)  # the trunk is one stream
    assert members and all(groups[k] == 2 for k in members)  # the members' GFC layers and sliced MLP
    graphs = [str(g / name) for name in ("hydra-conv.onnx", "hydra-matmul.onnx", "hydra-conv.bf16.onnx",
                                         "hydra-matmul.bf16.onnx")]
    out = cli("parity", *graphs, "--reference", str(hydra), "--engine", "onnxrt-cpu", "-o", str(tmp / "p"))
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    out = cli("parity", *graphs[:2], "--reference", str(hydra), "--engine", "openvino-cpu", "--precision", "fp32,bf16",
              "-o", str(tmp / "p-ov"))
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    for run, engines in (("p", 4), ("p-ov", 4)):
        report = json.loads((tmp / run / "report.json").read_text())
        assert len(report["engines"]) == engines, sorted(report["engines"])
        for engine, info in report["engines"].items():
            assert info["status"] == "pass", (engine, info["status"])
            weights = [c for c in info["checks"] if c["name"] == "weights"]
            assert weights and weights[0]["status"] == "pass", engine
    out = cli("bench", str(g / "hydra-conv.onnx"), "--engine", "onnxrt-cpu", "--batch", "1", "--rounds", "1",
              "--warmup", "0", "-o", str(tmp / "b"), *(["--seq", "8"] if folder["family"] != "vit" else []))
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads((tmp / "b" / "bench.json").read_text())
    out = cli("inspect", str(hydra))
    assert out.returncode == 0, out.stderr[-2000:]
    assert "fork: layers 0-0 run once on one stream" in out.stdout
    assert "MLP neurons kept per layer" in out.stdout
