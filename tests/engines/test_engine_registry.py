"""The engine-kind registry: what each kind declares, and that nothing outside toolchain/engines names a kind."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from toolchain.engines import (
    EngineUnavailable,
    build_plan,
    candidate_label,
    clock_of,
    default_engines,
    engine_kind,
    engine_kinds,
    entries_for,
    kinds_for_suffix,
    read_unavailable,
    reference_kind,
    resolve_kind,
    runner_for,
    selectable_kinds,
    split_label,
)
from toolchain.errors import EngineError, MissingDependencyError

ROOT = Path(__file__).resolve().parents[2]
TOOLCHAIN = ROOT / "toolchain"
#: literals equal to a kind name that are not engine kinds: Python distribution names
PACKAGE_NAMES = {("toolchain/artifacts.py", "torch"), ("toolchain/bench/report.py", "torch"),
                 ("toolchain/bench/report.py", "tensorrt")}
#: (file, literal) pairs still to move behind the registry: the recipe's ``engines`` field cannot import
#: toolchain.engines (the layers contract puts toolchain.recipe below it)
KNOWN: set[tuple[str, str]] = set()  # the recipe reads the registry
#: modules that still import onnxruntime outside toolchain/engines (toolchain.export sits below toolchain.engines)
ORT_KNOWN: set[str] = set()  # check_dynamic moved to toolchain/engines/onnxrt/dynamic.py


def _modules() -> list[Path]:
    return sorted(p for p in TOOLCHAIN.rglob("*.py") if "engines" not in p.relative_to(TOOLCHAIN).parts[:1])


def test_no_engine_kind_literal_outside_the_engines_package(string_literals):
    kinds = {s.name for s in engine_kinds()}
    found = []
    for path in _modules():
        rel = path.relative_to(ROOT).as_posix()
        for line, value in string_literals(path):
            hits = {k for k in kinds if value == k or value.startswith(k + ":")}
            found += [f"{rel}:{line}: {k!r}" for k in hits if (rel, k) not in PACKAGE_NAMES | KNOWN]
    assert not found, "engine kind names outside toolchain/engines (ask the registry instead):\n" + "\n".join(found)


def test_onnxruntime_is_imported_only_in_the_engines_package():
    found = []
    for path in _modules():
        rel = path.relative_to(ROOT).as_posix()
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            if any(n == "onnxruntime" or n.startswith("onnxruntime.") for n in names) and rel not in ORT_KNOWN:
                found.append(f"{rel}:{node.lineno}")
    assert not found, ("onnxruntime imported outside toolchain/engines (use toolchain.engines.onnxrt):\n"
                       + "\n".join(found))


def test_kinds_declare_what_callers_need():
    assert selectable_kinds() == ["onnxrt-cpu", "onnxrt-cuda", "openvino-cpu", "tensorrt", "torch"]
    assert default_engines() == ["torch", "onnxrt-cpu"]
    assert reference_kind() == "torch"
    assert kinds_for_suffix(".onnx") == ["onnxrt-cpu", "onnxrt-cuda"] and kinds_for_suffix(".plan") == ["tensorrt"]
    assert resolve_kind("onnxrt-cpu", "bf16") == "onnxrt-cpu-bf16emu" and resolve_kind("onnxrt-cpu", "fp16") == \
        "onnxrt-cpu"
    assert resolve_kind("onnxrt-cuda", "bf16") is None and "BF16" in engine_kind("onnxrt-cuda").unsupported["bf16"]
    assert [s.name for s in engine_kinds() if s.needs_build] == ["tensorrt", "openvino-cpu"]
    assert [s.name for s in engine_kinds() if s.compiles] == ["openvino-cpu"]
    assert kinds_for_suffix(".blob") == ["openvino-cpu"] and engine_kind("openvino-cpu").suffix == ".blob"
    assert [s.name for s in engine_kinds() if s.gpu] == ["onnxrt-cuda", "tensorrt"]
    assert clock_of("tensorrt") == clock_of("onnxrt-cuda") == "cuda-event" and clock_of("onnxrt-cpu") == "wall"
    assert clock_of("not-a-kind") is None
    assert engine_kind("tensorrt").suffix == ".engine" and engine_kind("torch").suffix is None
    assert split_label(candidate_label("onnxrt-cpu", "hydra-conv.fp16")) == ("onnxrt-cpu", "hydra-conv.fp16")
    with pytest.raises(EngineError, match="unknown runner kind 'nope'"):
        engine_kind("nope")


def _tiny_onnx(path: Path) -> Path:
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def test_runner_for_builds_each_kind_from_its_entry(tmp_path):
    _tiny_onnx(tmp_path / "g.onnx")
    entry = {"path": "g.onnx", "precision": "fp32", "kind": "hydra", "inputs": ["x"]}
    with runner_for("onnxrt-cpu", entry, export_dir=tmp_path, threads=1, name="g") as runner:
        out = runner.infer({"x": np.array([[-1.0, 0.5, 2.0]], np.float32)})
    np.testing.assert_array_equal(out["y"], [[0.0, 0.5, 2.0]])
    assert runner.name == "g" and runner.kind == "onnxrt-cpu"
    with pytest.raises(EngineUnavailable, match="no torch module"):
        runner_for("torch", entry, export_dir=tmp_path)
    with pytest.raises(EngineUnavailable, match="no TensorRT engine built"):
        runner_for("tensorrt", entry, export_dir=tmp_path)
    trt = runner_for("tensorrt", {"engine": "g.engine", "precision": "fp16"}, build_dir=tmp_path, name="t")
    assert trt.kind == "tensorrt" and trt.engine_path == tmp_path / "g.engine"


def test_entries_of_a_built_kind_come_from_engines_json(tmp_path):
    graphs = {"hydra-conv": {"path": "hydra-conv.onnx", "precision": "fp32"}}
    assert entries_for("onnxrt-cpu", graphs, build_dir=tmp_path) == graphs
    with pytest.raises(MissingDependencyError, match=r"no engines\.json"):
        entries_for("tensorrt", graphs, build_dir=tmp_path)
    (tmp_path / "engines.json").write_text(json.dumps({"tensorrt": {"skipped": "no GPU"}}))
    with pytest.raises(MissingDependencyError, match="skipped the engines: no GPU"):
        entries_for("tensorrt", graphs, build_dir=tmp_path)
    with pytest.raises(MissingDependencyError, match="built nothing for it"):
        entries_for("openvino-cpu", graphs, build_dir=tmp_path)
    built = {"hydra-conv": {"engine": "hydra-conv.engine", "precision": "fp32", "onnx": "hydra-conv.onnx"}}
    records = {"tensorrt": {"engines": built, "unavailable": {}},
               "openvino-cpu": {"engines": {}, "unavailable": {"x.fp16": "no"}}}
    (tmp_path / "engines.json").write_text(json.dumps(records))
    assert entries_for("tensorrt", graphs, build_dir=tmp_path) == built
    assert read_unavailable(tmp_path, "openvino-cpu") == {"x.fp16": "no"} and read_unavailable(tmp_path, "x") == {}


def test_build_plan_builds_graph_precisions_or_compiles_fp32_graphs_per_precision():
    graphs = {"single": {"precision": "fp32"}, "single.fp16": {"precision": "fp16"},
              "hydra-conv": {"precision": "fp32", "kind": "hydra", "lowering": "conv"},
              "hydra-matmul": {"precision": "fp32", "kind": "hydra", "lowering": "matmul"}}
    assert build_plan("tensorrt", graphs, ["fp32", "bf16"]) == [("hydra-conv", "hydra-conv", "fp32")]
    assert build_plan("openvino-cpu", graphs, ["fp32", "bf16"]) == [
        ("single", "single", "fp32"), ("single.bf16", "single", "bf16"), ("hydra-conv", "hydra-conv", "fp32"),
        ("hydra-conv.bf16", "hydra-conv", "bf16"), ("hydra-matmul", "hydra-matmul", "fp32"),
        ("hydra-matmul.bf16", "hydra-matmul", "bf16")]


def test_the_recipe_engines_field_reads_the_registry():
    from toolchain.errors import RecipeError
    from toolchain.recipe import parse_recipe

    base = {"name": "r", "model": {"source": "x"}, "data": {"id": "tweets"}}
    assert parse_recipe(base).engines == default_engines() == ["torch", "onnxrt-cpu"]
    assert parse_recipe({**base, "engines": selectable_kinds()}).engines == selectable_kinds()
    with pytest.raises(RecipeError, match=r"engines.*'trt'.*input should be 'onnxrt-cpu'"):
        parse_recipe({**base, "engines": ["torch", "trt"]})
