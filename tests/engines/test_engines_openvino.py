"""The ``openvino-cpu`` kind: build, sidecar, refusal, the precision read back from the compiled model, the runner.

Real OpenVINO on this CPU. What the CPU can run (BF16, FP16) is read at run time; tests that need a
precision the CPU lacks check the "unavailable" path instead, so the suite means the same on any CPU.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from engine_models import CLASSES, feed

from toolchain.engines import engine_kind, make_runner, runner_for
from toolchain.engines.openvino import (
    CpuIdentity,
    OvRunner,
    PrecisionUnavailable,
    _deps,
    build_ov_engine,
    compatibility_problems,
    current_identity,
    ran_precision,
    read_sidecar,
    sidecar_path,
    unavailable_reason,
)
from toolchain.errors import EngineError

KIND = engine_kind("openvino-cpu")
BF16 = KIND.unavailable("bf16") is None
PROFILE = {"x": ((1, 6), (4, 6), (16, 6)), "mask": ((1, 6), (4, 6), (16, 6))}
NO_LOW = CpuIdentity("2099.1.0", "Test CPU", ("FP32", "INT8"), ())


@pytest.fixture(scope="module")
def blobs(tmp_path_factory, scorer_onnx) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("ov")
    built = {"fp32": build_ov_engine(scorer_onnx, out / "scorer.blob", precision="fp32", profile=PROFILE)}
    if BF16:
        built["bf16"] = build_ov_engine(scorer_onnx, out / "scorer.bf16.blob", precision="bf16", profile=PROFILE)
    return built


def _reference(scorer_onnx: Path, batch: int = 5) -> dict[str, np.ndarray]:
    with make_runner("onnxrt-cpu", path=scorer_onnx) as ort:
        return ort.infer(feed(batch, seed=batch))


class TestReadBack:
    def test_ran_precision_is_the_lowest_precision_of_the_matrix_layers(self):
        layers = {"FullyConnected": {"bf16": 38}, "MatMul": {"bf16": 10, "fp32": 2}, "Softmax": {"fp32": 1}}
        assert ran_precision(layers, "bf16") == ("bf16", 2)  # 2 MatMuls kept in FP32: still a BF16 engine
        assert ran_precision({"FullyConnected": {"fp32": 4}}, "bf16") == ("fp32", 4)  # the hint was ignored
        assert ran_precision({"FullyConnected": {"bf16": 4}}, "fp16") == ("bf16", 0)  # FP16 asked, BF16 ran
        assert ran_precision({"Eltwise": {"fp32": 3}, "Const": {"i32": 1}}, "fp32") == ("fp32", 0)  # no matrix layer
        # an INT8 (Q/DQ) graph: INT8 when its matrix layers ran i8/u8, the float ones counted; all float: fell back
        assert ran_precision({"FullyConnected": {"int8": 6, "fp32": 1}, "MatMul": {"fp32": 2}}, "int8") == ("int8", 3)
        assert ran_precision({"FullyConnected": {"fp32": 7}}, "int8") == ("fp32", 7)
        assert ran_precision({"Input": {"i64": 1}}, "bf16") == ("bf16", 0)  # nothing floating: as asked

    def test_the_sidecar_records_what_each_layer_ran_in(self, blobs, scorer_onnx):
        from toolchain.artifacts import sha256_file

        sidecar = read_sidecar(blobs["fp32"])
        assert sidecar.precision == sidecar.ran_precision == "fp32" and sidecar.kept_fp32 == 0
        assert sidecar.layers["FullyConnected"] == {"fp32": 1}  # the scorer's one Linear
        assert sidecar.onnx_file == "scorer.onnx" and sidecar.onnx_sha256 == sha256_file(scorer_onnx)
        assert sidecar.openvino_version == current_identity().openvino_version
        assert sidecar.profile == {k: [list(s) for s in v] for k, v in PROFILE.items()}
        assert sidecar.inputs["x"] == {"dtype": "float32", "shape": ["batch", 6]}
        assert sidecar.config == {"INFERENCE_PRECISION_HINT": "f32", "EXECUTION_MODE_HINT": "ACCURACY"}
        if BF16:
            low = read_sidecar(blobs["bf16"])
            assert low.precision == "bf16" and low.ran_precision == "bf16"
            assert low.layers["FullyConnected"] == {"bf16": 1}

    @pytest.mark.skipif(not BF16, reason="this CPU has no BF16 in OpenVINO")
    def test_engine_info_reads_the_precision_back_after_import(self, blobs):
        with OvRunner(blobs["bf16"], threads=1) as runner:
            info = runner.engine_info()
        assert info["kind"] == "openvino-cpu" and info["precision"] == "bf16" and info["ran_precision"] == "bf16"
        assert info["layers"]["FullyConnected"] == {"bf16": 1} and info["runtime"].startswith("OpenVINO")


class TestRunner:
    def test_an_fp32_file_is_imported_in_fp32(self, blobs, scorer_onnx):
        # an import without the build's properties runs at the plugin's default precision (BF16 where the CPU has it)
        ref = _reference(scorer_onnx)
        with OvRunner(blobs["fp32"], threads=1) as runner:
            out = runner.infer(feed(5, seed=5))
            assert runner.engine_info()["ran_precision"] == "fp32"
        for name in ref:
            np.testing.assert_allclose(out[name], ref[name], rtol=1e-5, atol=1e-6)

    @pytest.mark.skipif(not BF16, reason="this CPU has no BF16 in OpenVINO")
    def test_a_bf16_file_computes_in_bf16(self, blobs, scorer_onnx):
        ref = _reference(scorer_onnx)
        with OvRunner(blobs["bf16"], threads=1) as runner:
            out = runner.infer(feed(5, seed=5))
        error = np.abs(out["scores"] - ref["scores"]).max() / np.abs(ref["scores"]).max()
        assert 0 < error < 2**-6  # BF16 rounding: not bit-equal to FP32, within a few BF16 ulps

    def test_a_graph_compiled_when_activated_equals_the_built_file(self, blobs, scorer_onnx):
        with OvRunner(onnx_path=scorer_onnx, precision="fp32", profile=PROFILE) as a, OvRunner(blobs["fp32"]) as b:
            np.testing.assert_array_equal(a.infer(feed(3))["scores"], b.infer(feed(3))["scores"])
            assert a.output_names() == ["scores", "probs"]

    def test_the_profile_bounds_the_feed_before_anything_runs(self, blobs):
        runner = OvRunner(blobs["fp32"])
        assert runner.precheck(feed(4))
        with pytest.raises(EngineError, match=r"'x' batch 17 is outside the profile range 1\.\.16"):
            runner.precheck(feed(17))
        with runner, pytest.raises(EngineError, match=r"batch 17 is outside the profile range 1\.\.16"):
            runner.infer(feed(17))

    def test_runner_for_an_entry_with_an_engine_or_a_graph(self, blobs, scorer_onnx):
        built = runner_for("openvino-cpu", {"engine": blobs["fp32"].name, "precision": "fp32"},
                           build_dir=blobs["fp32"].parent, threads=1, name="b")
        graph = runner_for("openvino-cpu", {"path": scorer_onnx.name, "precision": "fp32"},
                           export_dir=scorer_onnx.parent, name="g")
        assert built.engine_path == blobs["fp32"] and graph.onnx_path == scorer_onnx and graph.precision == "fp32"
        with pytest.raises(EngineError, match="exactly one of"):
            OvRunner()


class TestRefusal:
    def test_another_openvino_version_is_refused_with_exit_2(self, blobs, tmp_path):
        path = tmp_path / "old.blob"
        path.write_bytes(blobs["fp32"].read_bytes())
        record = json.loads(sidecar_path(blobs["fp32"]).read_text())
        sidecar_path(path).write_text(json.dumps({**record, "openvino_version": "2024.0.0-1-old"}))
        with pytest.raises(EngineError) as info, OvRunner(path):
            pass
        assert info.value.exit_code == 2
        assert "OpenVINO 2024.0.0-1-old built it" in info.value.message and "Rebuild it here" in info.value.message

    def test_a_precision_this_cpu_lacks_is_refused_by_the_sidecar_check(self, blobs):
        record = read_sidecar(blobs["fp32"])
        assert compatibility_problems(record, NO_LOW) == [
            f"OpenVINO {record.openvino_version} built it, this machine has 2099.1.0"]
        from dataclasses import replace

        same = NO_LOW._replace(openvino_version=record.openvino_version)
        problems = compatibility_problems(replace(record, precision="bf16", ran_precision="bf16"), same)
        assert len(problems) == 1 and "built for bf16" in problems[0] and "no BF16 support" in problems[0]
        assert compatibility_problems(record, same) == []  # FP32 runs on any CPU

    def test_a_file_for_a_precision_this_cpu_lacks_exits_2(self, blobs, tmp_path, monkeypatch):
        path = tmp_path / "x.bf16.blob"
        path.write_bytes(blobs["fp32"].read_bytes())
        record = json.loads(sidecar_path(blobs["fp32"]).read_text())
        sidecar_path(path).write_text(json.dumps({**record, "precision": "bf16"}))
        monkeypatch.setattr(_deps, "current_identity", lambda: NO_LOW._replace(
            openvino_version=record["openvino_version"]))
        with pytest.raises(EngineError, match="no BF16 support") as info, OvRunner(path):
            pass
        assert info.value.exit_code == 2

    def test_missing_and_malformed_sidecars(self, blobs, tmp_path):
        path = tmp_path / "lone.blob"
        path.write_bytes(b"not a model")
        with pytest.raises(EngineError, match=r"sidecar .* is missing"), OvRunner(path):
            pass
        sidecar_path(path).write_text('{"precision": 3}')
        with pytest.raises(EngineError, match="is malformed"):
            read_sidecar(path)


class TestUnavailable:
    def test_reasons_name_the_capability(self):
        assert unavailable_reason("fp32", NO_LOW) is None
        assert "no FP16 support" in unavailable_reason("fp16", NO_LOW)
        assert "AVX512-BF16 or AMX-BF16" in unavailable_reason("bf16", NO_LOW)
        assert unavailable_reason("int8", NO_LOW) is None  # the plugin reports INT8: Q/DQ graphs compile
        assert "no INT8 support" in unavailable_reason("int8", CpuIdentity("2099.1.0", "Test CPU", ("FP32",), ()))
        assert "not 'int4'" in unavailable_reason("int4", NO_LOW)

    def test_the_kind_reads_this_cpu(self):
        caps = current_identity().capabilities
        for precision, cap in (("bf16", "BF16"), ("fp16", "FP16")):
            assert (KIND.unavailable(precision) is None) == (cap in caps)

    def test_building_a_precision_the_cpu_lacks_raises_precision_unavailable(self, scorer_onnx, tmp_path,
                                                                            monkeypatch):
        monkeypatch.setattr(_deps, "current_identity", lambda: NO_LOW)
        with pytest.raises(PrecisionUnavailable, match="no BF16 support") as info:
            build_ov_engine(scorer_onnx, tmp_path / "x.blob", precision="bf16", profile=PROFILE)
        assert info.value.exit_code == 3 and not (tmp_path / "x.blob").exists()


def test_parity_judges_an_engine_at_the_precision_it_ran(scorer, scorer_onnx):
    """A kind that reports another precision than asked (a hint replaced) is judged, and labelled, at what it ran."""
    from engine_models import INPUT_SPECS

    from toolchain.parity import run_parity

    class Replaced(OvRunner):  # asked for fp16, the layers ran bf16 (as OpenVINO does on a CPU with BF16 only)
        def engine_info(self):
            return {**super().engine_info(), "precision": "fp16", "ran_precision": "bf16"}

    reference = make_runner("torch", module=scorer, input_specs=INPUT_SPECS, output_names=["scores", "probs"])
    candidate = Replaced(onnx_path=scorer_onnx, precision="fp32", name="ov")
    labels = np.arange(8) % CLASSES
    verdict = run_parity(reference, {"ov": candidate}, [feed(3)], [(feed(8, seed=1), labels)], [],
                         precisions={"ov": "fp16"}, cross_check=False)
    assert verdict.meta["precisions"]["ov"] == "bf16"
    assert verdict.meta["engines"]["ov"]["precision_asked"] == "fp16"
    assert verdict.meta["tolerances"]["ov"]["probs"] != run_parity(
        reference, {"ov": OvRunner(onnx_path=scorer_onnx, name="ov")}, [feed(3)], [(feed(8, seed=1), labels)], [],
        precisions={"ov": "fp16"}, cross_check=False).meta["tolerances"]["ov"]["probs"]
    assert "| ov | bf16 (fp16 asked) |" in verdict.to_markdown()
