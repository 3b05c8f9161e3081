"""The file commands: ``export`` from a checkpoint folder and from a Hydra folder, ``inspect`` of each kind."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from export_models import run_cli

from toolchain.hydra import fuse, save_hydra
from toolchain.models import save_model
from toolchain.models.tiny import TINY_MODELS
from toolchain.verbs import ExportOptions, Range, export_graphs, inspect_path
from toolchain.verbs.export import validate_precision

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.filterwarnings("ignore:You are using the legacy TorchScript-based ONNX export")


def cli(*args: str) -> subprocess.CompletedProcess:
    """``hydra-toolchain ARGS`` in a fresh interpreter (the real entry point, as CI calls it)."""
    return subprocess.run([sys.executable, "-m", "toolchain", *args], capture_output=True, text=True, cwd=ROOT,
                          env=dict(os.environ, HF_HUB_OFFLINE="1"), timeout=600)


main = run_cli  # the entry point in this process (tests/export/export_models.py)


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("verbs")
    tiny = TINY_MODELS["bert"]()
    keep = torch.ones(2, 2, 4, dtype=torch.bool)
    keep[0, :, :2] = False
    keep[1, :, 2:] = False
    return {"checkpoint": save_model(tiny.model, tmp / "ckpt"),
            "hydra": save_hydra(fuse(tiny.adapter, keep, mlp="average"), tmp / "hydra")}


def test_export_of_a_checkpoint_folder_through_the_cli(folders, tmp_path):
    out = cli("export", str(folders["checkpoint"]), "-o", str(tmp_path / "g"), "--precision", "fp32,fp16",
              "--seq", "4:12:16", "--batch", "1:4:8")
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads((tmp_path / "g" / "graphs.json").read_text())
    assert result["ok"] and result["source_kind"] == "checkpoint" and result["family"] == "bert"
    assert set(result["graphs"]) == {"single", "single.fp16"}
    single = result["graphs"]["single"]
    assert single["dynamic_check"]["ok"] and single["lint_ok"] and single["stats"]["nodes"] > 0
    assert result["graphs"]["single.fp16"]["pytorch_check"]["ok"]
    graph = onnx.load(str(tmp_path / "g" / "single.onnx"), load_external_data=False)
    dims = [d.dim_param or d.dim_value for d in graph.graph.input[0].type.tensor_type.shape.dim]
    assert dims == ["batch", "sequence"]  # the family's dynamic axes
    assert "single.onnx (fp32): PyTorch check ok, TensorRT lint ok" in out.stderr


def test_export_of_a_hydra_folder_in_both_lowerings_and_bf16(folders, tmp_path):
    result = export_graphs(folders["hydra"], tmp_path / "g",
                           ExportOptions(lowerings=("conv", "matmul"), precisions=("fp32", "bf16"),
                                         batch=Range(1, 2, 4), sequence=Range(4, 8, 12)))
    assert result["ok"] and result["source_kind"] == "hydra"
    assert set(result["graphs"]) == {"hydra-conv", "hydra-matmul", "hydra-conv.bf16", "hydra-matmul.bf16"}
    assert result["graphs"]["hydra-conv.bf16"]["pytorch_check"]["engine"] == "onnxrt-cpu-bf16emu"
    ops = result["graphs"]["hydra-conv"]["stats"]["ops"]
    assert ops.get("Conv", 0) > 0 and result["graphs"]["hydra-matmul"]["stats"]["ops"].get("Conv", 0) == 0


def test_a_broken_low_precision_graph_fails_its_pytorch_check(folders, tmp_path):
    from toolchain.export.precision import write_precision_variant
    from toolchain.models import load_model
    from toolchain.models.wrappers import SingleModel
    from toolchain.verbs.export import open_source

    export_graphs(folders["checkpoint"], tmp_path / "g", ExportOptions(precisions=("fp32",)))
    write_precision_variant(tmp_path / "g" / "single.onnx", tmp_path / "fp16.onnx", "fp16")
    model = onnx.load(str(tmp_path / "fp16.onnx"))
    target = max(model.graph.initializer, key=lambda t: int(np.prod(t.dims)))  # the biggest weight, zeroed
    zero = onnx.numpy_helper.to_array(target) * 0
    target.CopyFrom(onnx.numpy_helper.from_array(zero, target.name))
    onnx.save(model, str(tmp_path / "broken.onnx"))
    module = SingleModel(load_model(folders["checkpoint"], tokenizer=False).adapter)
    feed = {k: v for k, v in open_source(folders["checkpoint"]).make_feed(4, 12, 7).items()
            if k in module.input_names}
    assert validate_precision(tmp_path / "fp16.onnx", module, feed, "fp16")["ok"]
    assert not validate_precision(tmp_path / "broken.onnx", module, feed, "fp16")["ok"]


def test_bad_export_arguments_exit_2_naming_the_option(folders, tmp_path):
    out = main("export", str(folders["checkpoint"]), "-o", str(tmp_path / "g"), "--batch", "8:1:32")
    assert out.returncode == 2 and "--batch '8:1:32'" in out.stderr
    out = main("export", str(folders["checkpoint"]), "-o", str(tmp_path / "g"), "--precision", "int4")
    assert out.returncode == 2 and "--precision 'int4'" in out.stderr
    out = main("export", str(tmp_path), "-o", str(tmp_path / "g"))
    assert out.returncode == 2 and "neither a Hugging Face checkpoint folder" in out.stderr
    out = main("export", str(tmp_path / "missing.yaml"))  # the recipe form: a YAML file
    assert out.returncode == 2 and "recipe file" in out.stderr


def test_inspect_each_kind(folders, tmp_path):
    export_graphs(folders["hydra"], tmp_path / "g", ExportOptions(lowerings=("conv",), precisions=("fp32", "fp16"),
                                                                  batch=Range(1, 2, 4), sequence=Range(4, 8, 12)))
    fp32 = inspect_path(tmp_path / "g" / "hydra-conv.onnx")
    assert fp32["kind"] == "onnx" and fp32["grouped_conv"] > 0 and "fp32_islands" not in fp32
    assert [d for d in fp32["inputs"][0]["dims"]] == ["batch", "sequence"]
    fp16 = inspect_path(tmp_path / "g" / "hydra-conv.fp16.onnx")
    assert fp16["compute_dtypes"].get("float16", 0) > 0 and fp16["fp32_islands"]["nodes"] > 0
    hydra = inspect_path(folders["hydra"])
    assert hydra["members"] == 2 and hydra["kept_heads"] == [[2, 2], [2, 2]] and hydra["lowering"] == "conv"
    from toolchain.engines import known_suffixes

    suffix = next(s for s in known_suffixes() if s != ".onnx")
    engine = tmp_path / f"m{suffix}"
    engine.write_bytes(b"\0" * 64)  # no sidecar: size and kind, and why the inputs are unknown
    described = inspect_path(engine)
    assert described["kind"] == "engine" and described["file_bytes"] == 64 and "inputs unknown" in described["note"]
    out = cli("inspect", str(tmp_path / "g" / "hydra-conv.fp16.onnx"))
    assert out.returncode == 0 and "FP32 islands:" in out.stdout and "input  input_ids" in out.stdout
    out = main("inspect", str(folders["hydra"]), "--json")
    assert out.returncode == 0 and json.loads(out.stdout)["members"] == 2
    assert main("inspect", str(tmp_path / "nothing.onnx")).returncode == 2


def test_bench_of_two_graphs_through_the_cli(folders, tmp_path):
    export_graphs(folders["hydra"], tmp_path / "g", ExportOptions(lowerings=("conv", "matmul"), precisions=("fp32",),
                                                                  batch=Range(1, 2, 4), sequence=Range(4, 8, 12)))
    out = cli("bench", str(tmp_path / "g" / "hydra-conv.onnx"), str(tmp_path / "g" / "hydra-matmul.onnx"),
              "--batch", "1,2", "--seq", "12", "--rounds", "3", "--warmup", "1", "-o", str(tmp_path / "b"))
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads((tmp_path / "b" / "bench.json").read_text())
    assert [c["batch"] for c in result["cases"]] == [1, 2]
    for case in result["cases"]:
        assert set(case["variants"]) == {"hydra-conv", "hydra-matmul"}
        assert len(case["variants"]["hydra-conv"]["samples_s"]) == 3  # every round kept
        assert set(case["ratios"]) == {"hydra-matmul/hydra-conv"}
    md = (tmp_path / "b" / "bench.md").read_text()
    assert "| onnxrt-cpu | 2 | hydra-matmul |" in md and "/ hydra-conv (p10, p90)" in md
    assert (tmp_path / "b" / "bench.png").read_bytes()[:4] == b"\x89PNG"
    assert "| onnxrt-cpu | 1 | hydra-conv |" in out.stdout
    single = export_graphs(folders["checkpoint"], tmp_path / "s", ExportOptions(precisions=("fp32",)))
    assert single["ok"]
    out = main("bench", str(tmp_path / "s" / "single.onnx"), "--engine", "tensorrt-x")
    assert out.returncode == 2 and "--engine 'tensorrt-x'" in out.stderr
