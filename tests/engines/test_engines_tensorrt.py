"""TensorRT backend: CPU-side behaviour here; real builds only where tensorrt and CUDA exist."""

import importlib.util
import json

import numpy as np
import pytest
import torch
from engine_models import feed

from toolchain.engines import make_runner
from toolchain.engines.tensorrt import (
    EngineSidecar,
    RuntimeIdentity,
    build_engine,
    compatibility_problems,
    ensure_compatible,
    graph_precision,
    read_sidecar,
    sidecar_path,
)
from toolchain.errors import EngineError, MissingDependencyError
from toolchain.export.graph import load_checked
from toolchain.export.precision import write_precision_variant

HAVE_TRT_GPU = importlib.util.find_spec("tensorrt") is not None and torch.cuda.is_available()
PROFILE = {"x": ((1, 6), (4, 6), (8, 6)), "mask": ((1, 6), (4, 6), (8, 6))}
H200 = RuntimeIdentity("10.15.1", "NVIDIA H200", "9.0")


def _sidecar(**changes) -> EngineSidecar:
    base = dict(tensorrt_version="10.15.1", gpu_name="NVIDIA H200", compute_capability="9.0", precision="fp16",
                strongly_typed=True, profile={"x": [[1, 6], [4, 6], [8, 6]]}, onnx_file="m.onnx", onnx_sha256="0" * 64,
                workspace_gb=4.0, built_at="2026-01-01T00:00:00+00:00")
    return EngineSidecar(**{**base, **changes})


class TestSidecar:
    def test_same_machine_is_compatible(self):
        assert compatibility_problems(H200, H200) == []
        ensure_compatible(_sidecar(), H200, "m.engine")

    def test_other_tensorrt_version_is_refused(self):
        current = RuntimeIdentity("11.0.0", "NVIDIA H200", "9.0")
        with pytest.raises(EngineError, match=r"TensorRT 10\.15\.1 built it, this machine has 11\.0\.0.*Rebuild"):
            ensure_compatible(_sidecar(), current, "m.engine")

    def test_other_gpu_is_refused(self):
        current = RuntimeIdentity("10.15.1", "NVIDIA A100-SXM4-80GB", "8.0")
        problems = compatibility_problems(H200, current)
        assert len(problems) == 2 and "compute capability 9.0" in problems[0] and "A100" in problems[1]

    def test_roundtrip_and_missing_or_malformed(self, tmp_path):
        engine = tmp_path / "m.engine"
        with pytest.raises(EngineError, match=r"sidecar .* is missing"):
            read_sidecar(engine)
        sidecar_path(engine).write_text(json.dumps(_sidecar().to_json()))
        assert read_sidecar(engine) == _sidecar()
        sidecar_path(engine).write_text("{not json")
        with pytest.raises(EngineError, match="malformed"):
            read_sidecar(engine)
        sidecar_path(engine).write_text(json.dumps({"tensorrt_version": "10"}))
        with pytest.raises(EngineError, match="malformed"):
            read_sidecar(engine)


def test_graph_precision(tmp_path, scorer_onnx):
    assert graph_precision(load_checked(scorer_onnx)) == "fp32"
    for target in ("fp16", "bf16"):
        dst = tmp_path / f"{target}.onnx"
        write_precision_variant(scorer_onnx, dst, target)
        assert graph_precision(load_checked(dst)) == target


def test_build_engine_validates_arguments_first(tmp_path, scorer_onnx):
    with pytest.raises(EngineError, match="precision"):
        build_engine(scorer_onnx, tmp_path / "m.engine", precision="int4", profile=PROFILE)  # type: ignore[arg-type]
    # INT8 is explicit quantization only (no INT8 flag in TensorRT 11): an FP32 graph is refused before TensorRT
    with pytest.raises(EngineError, match="INT8 is explicit quantization only"):
        build_engine(scorer_onnx, tmp_path / "m.engine", precision="int8", profile=PROFILE)
    with pytest.raises(EngineError, match=r"min <= opt <= max"):
        build_engine(scorer_onnx, tmp_path / "m.engine", profile={"x": ((4, 6), (2, 6), (8, 6))})


@pytest.mark.skipif(HAVE_TRT_GPU, reason="tensorrt and a CUDA device are present")
def test_build_engine_without_tensorrt_raises_missing_dependency(tmp_path, scorer_onnx):
    with pytest.raises(MissingDependencyError) as info:
        build_engine(scorer_onnx, tmp_path / "m.engine", profile=PROFILE, timing_cache=tmp_path / "cache.bin")
    assert info.value.exit_code == 3
    assert "\n" not in info.value.message
    assert not (tmp_path / "m.engine").exists() and not (tmp_path / "cache.bin").exists()


@pytest.mark.skipif(HAVE_TRT_GPU, reason="tensorrt and a CUDA device are present")
def test_trt_runner_without_tensorrt_raises_missing_dependency(tmp_path):
    runner = make_runner("tensorrt", engine_path=tmp_path / "m.engine")
    with pytest.raises(MissingDependencyError, match=r"TensorRT|CUDA"):
        runner.activate()


# ------------------------------------------------------------------------------ real GPU builds


@pytest.fixture()
def trt_gpu():
    pytest.importorskip("tensorrt", reason="TensorRT engine tests need the tensorrt package (pip install "
                                           "'hydra-toolchain[tensorrt]') on a CUDA machine")
    if not torch.cuda.is_available():
        pytest.skip("TensorRT engine tests need a CUDA device")


@pytest.mark.tensorrt
@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["fp32", "fp16", "bf16"])
def test_engine_matches_onnxruntime(trt_gpu, tmp_path, scorer_onnx, precision):
    source = scorer_onnx
    if precision != "fp32":
        source = tmp_path / f"scorer_{precision}.onnx"
        write_precision_variant(scorer_onnx, source, precision)
    engine = build_engine(source, tmp_path / f"{precision}.engine", precision=precision, profile=PROFILE,
                          timing_cache=tmp_path / "timing.cache", workspace_gb=1.0)
    sidecar = read_sidecar(engine)
    assert sidecar.precision == precision and sidecar.profile["x"] == [[1, 6], [4, 6], [8, 6]]
    assert (tmp_path / "timing.cache").stat().st_size > 0
    atol = {"fp32": 1e-4, "fp16": 3e-3, "bf16": 4e-2}[precision]
    with make_runner("onnxrt-cpu", path=scorer_onnx) as ref, make_runner("tensorrt", engine_path=engine) as trt:
        for batch in (1, 5, 8):
            a, b = ref.infer(feed(batch, seed=batch)), trt.infer(feed(batch, seed=batch))
            for name in a:
                np.testing.assert_allclose(b[name], a[name], atol=atol, rtol=atol)
        with pytest.raises(EngineError, match=r"outside the profile range 1\.\.8"):
            trt.infer(feed(9))


@pytest.mark.tensorrt
@pytest.mark.gpu
def test_engine_from_another_machine_is_refused(trt_gpu, tmp_path, scorer_onnx):
    engine = build_engine(scorer_onnx, tmp_path / "m.engine", profile=PROFILE, workspace_gb=1.0)
    data = json.loads(sidecar_path(engine).read_text())
    data["tensorrt_version"] = "0.0.0"
    sidecar_path(engine).write_text(json.dumps(data))
    with pytest.raises(EngineError, match=r"TensorRT 0\.0\.0 built it"):
        make_runner("tensorrt", engine_path=engine).activate()


def _nonzero_onnx(path):
    """x [batch, 6] float32 -> y = relu(x), idx = NonZero(x) (int64 [2, N]: a data-dependent shape)."""
    import onnx
    from onnx import TensorProto, helper

    nodes = [helper.make_node("Relu", ["x"], ["y"], name="relu"),
             helper.make_node("NonZero", ["x"], ["idx"], name="nz")]
    graph = helper.make_graph(nodes, "nonzero", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 6])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 6]),
                               helper.make_tensor_value_info("idx", TensorProto.INT64, [2, "n"])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


@pytest.mark.tensorrt
@pytest.mark.gpu
def test_engine_with_a_data_dependent_output(trt_gpu, tmp_path):
    source = _nonzero_onnx(tmp_path / "nonzero.onnx")
    engine = build_engine(source, tmp_path / "nz.engine", profile={"x": ((1, 6), (4, 6), (8, 6))}, workspace_gb=1.0)
    rng = np.random.default_rng(0)
    with make_runner("tensorrt", engine_path=engine) as trt:
        for batch in (1, 5, 8):
            x = (rng.standard_normal((batch, 6)) * (rng.random((batch, 6)) > 0.5)).astype(np.float32)
            out = trt.infer({"x": x})
            np.testing.assert_array_equal(out["idx"], np.stack(np.nonzero(x)))
            np.testing.assert_array_equal(out["y"], np.maximum(x, 0))
        empty = trt.infer({"x": np.zeros((2, 6), np.float32)})
        assert empty["idx"].shape == (2, 0)


@pytest.mark.tensorrt
@pytest.mark.gpu
def test_foreign_timing_cache_is_replaced(trt_gpu, tmp_path, scorer_onnx, caplog):
    cache = tmp_path / "timing.cache"
    foreign = b"\x00not a timing cache of this TensorRT\x01" * 16
    cache.write_bytes(foreign)
    with caplog.at_level("WARNING", logger="toolchain.engines.tensorrt.builder"):
        engine = build_engine(scorer_onnx, tmp_path / "m.engine", profile=PROFILE, timing_cache=cache, workspace_gb=1.0)
    assert engine.is_file() and "timing cache" in caplog.text
    data = cache.read_bytes()
    assert data and data != foreign
    build_engine(scorer_onnx, tmp_path / "m2.engine", profile=PROFILE, timing_cache=cache, workspace_gb=1.0)
