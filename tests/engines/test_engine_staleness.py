"""Compiled engine files against their source graph, their recorded precision, and the ``describe`` hook.

Real OpenVINO on this CPU (the tiny scorer of ``engine_models``); TensorRT engines are checked from
their sidecar, which needs neither TensorRT nor a GPU (staleness is refused before TensorRT is
imported). Also: an engine that ran a lower precision than asked fails parity, and short text feeds
are padded up to a profile's minimum.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path
from typing import ClassVar

import numpy as np
import onnx
import pytest
from engine_models import INPUT_SPECS, feed
from onnx import numpy_helper

from toolchain.artifacts import sha256_file
from toolchain.engines import engine_kind, make_runner, ran_lower, registry
from toolchain.engines.base import ShapeLimits, pad_to_profile, unpad_outputs
from toolchain.engines.openvino import OvRunner, build_ov_engine, sidecar_path
from toolchain.engines.source import StaleEngine, check_source, rebuild_command
from toolchain.engines.tensorrt import EngineSidecar, TrtRunner
from toolchain.errors import EngineError, FeedError, MissingDependencyError

PROFILE = {"x": ((1, 6), (4, 6), (16, 6)), "mask": ((1, 6), (4, 6), (16, 6))}
OV = "openvino-cpu"


def _changed(src: Path, dst: Path, factor: float = 1.5) -> Path:
    """A copy of the scorer graph with its weight scaled: another version of the same graph."""
    model = onnx.load(str(src))
    weight = next(i for i in model.graph.initializer if i.name.endswith("weight"))
    weight.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(weight) * factor, weight.name))
    onnx.save(model, str(dst))
    return dst


@pytest.fixture
def built(tmp_path, scorer_onnx) -> tuple[Path, Path]:
    """``(graph, blob)``: the scorer graph copied into a folder and its FP32 compiled file beside it."""
    graph = shutil.copy(scorer_onnx, tmp_path / "scorer.onnx")
    return Path(graph), build_ov_engine(graph, tmp_path / "scorer.blob", precision="fp32", profile=PROFILE)


def _edit_sidecar(blob: Path, **fields) -> None:
    path = sidecar_path(blob)
    path.write_text(json.dumps({**json.loads(path.read_text()), **fields}))


class TestStaleOpenVino:
    def test_the_recorded_source_wins_over_another_graph_of_the_same_name(self, tmp_path, scorer_onnx):
        """ONNX files are often all model.onnx: an unrelated export/scorer.onnx must not make a file stale."""
        (tmp_path / "candidate").mkdir()
        (tmp_path / "export").mkdir()
        graph = Path(shutil.copy(scorer_onnx, tmp_path / "candidate" / "scorer.onnx"))
        _changed(graph, tmp_path / "export" / "scorer.onnx")  # same name, another graph
        (tmp_path / "build").mkdir()
        blob = build_ov_engine(graph, tmp_path / "build" / "scorer.blob", precision="fp32", profile=PROFILE)
        with OvRunner(blob, threads=1) as runner:  # the graph it was built from is current: loads
            assert runner.infer(feed(2))
        _changed(scorer_onnx, graph)  # now its own source changes: stale, naming that graph
        with pytest.raises(StaleEngine, match="candidate"):
            OvRunner(blob, threads=1).activate()

    def test_a_current_graph_beside_the_file_loads(self, built):
        graph, blob = built
        with OvRunner(blob, threads=1) as runner:
            out = runner.infer(feed(3))
        assert out["probs"].shape == (3, 4)
        assert json.loads(sidecar_path(blob).read_text())["onnx_path"] == str(graph.resolve())

    def test_a_changed_graph_beside_the_file_exits_2_with_both_digests_and_the_rebuild_command(self, built):
        graph, blob = built
        old = sha256_file(graph)
        _changed(graph, graph)
        new = sha256_file(graph)
        with pytest.raises(StaleEngine) as err:
            OvRunner(blob, threads=1).activate()
        assert err.value.exit_code == 2 and isinstance(err.value, EngineError)
        text = str(err.value)
        assert old in text and new in text and old != new
        assert (f"hydra-toolchain build {graph} -o {blob.parent} --engine openvino-cpu --precision fp32 "
                "--batch 1:4:16") in text

    def test_the_graph_in_the_export_folder_counts(self, tmp_path, scorer_onnx):
        (tmp_path / "export").mkdir()
        graph = Path(shutil.copy(scorer_onnx, tmp_path / "export" / "scorer.onnx"))
        blob = build_ov_engine(graph, tmp_path / "build" / "scorer.blob", precision="fp32", profile=PROFILE)
        _edit_sidecar(blob, onnx_path="")  # only the recipe layout: <root>/build/x.blob, <root>/export/x.onnx
        OvRunner(blob).activate()
        _changed(graph, graph)
        with pytest.raises(StaleEngine, match="is stale"):
            OvRunner(blob).activate()

    def test_the_path_it_was_built_from_counts(self, tmp_path, scorer_onnx):
        graph = Path(shutil.copy(scorer_onnx, tmp_path / "scorer.onnx"))
        blob = build_ov_engine(graph, tmp_path / "out" / "scorer.blob", precision="fp32", profile=PROFILE)
        _changed(graph, graph)
        with pytest.raises(StaleEngine, match=str(graph)):
            OvRunner(blob).activate()

    def test_no_graph_at_hand_loads_as_before(self, built):
        graph, blob = built
        graph.unlink()
        with OvRunner(blob, threads=1) as runner:
            assert runner.engine_info()["ran_precision"] == "fp32"
        _edit_sidecar(blob, onnx_path="/nonexistent/scorer.onnx")
        OvRunner(blob).activate()

    def test_an_older_sidecar_without_the_build_path_still_loads(self, built):
        _graph, blob = built
        record = json.loads(sidecar_path(blob).read_text())
        del record["onnx_path"]
        sidecar_path(blob).write_text(json.dumps(record))
        OvRunner(blob).activate()

    def test_a_graph_given_by_the_caller_is_compared(self, built, tmp_path):
        graph, blob = built
        other = _changed(graph, tmp_path / "given.onnx")
        with pytest.raises(StaleEngine, match=r"given\.onnx"):
            OvRunner(blob, source=other).activate()
        OvRunner(blob, source=graph).activate()  # the same graph: fine

    def test_a_graph_given_with_the_file_on_the_command_line_is_its_source(self, built, tmp_path):
        from toolchain.verbs.targets import targets_for

        graph, blob = built
        (tmp_path / "cli").mkdir()
        given = _changed(graph, tmp_path / "cli" / "scorer.onnx")
        targets, _ = targets_for([blob, given], [OV], ["fp32"])
        engine = next(t for t in targets if t.path == blob)
        assert engine.entry["onnx"] == str(given.resolve())
        with pytest.raises(StaleEngine, match=sha256_file(given)):
            engine.runner().activate()

    def test_the_recipe_entry_names_its_source_in_the_export_folder(self, tmp_path, scorer_onnx):
        from toolchain.engines import runner_for

        (tmp_path / "export").mkdir()
        graph = Path(shutil.copy(scorer_onnx, tmp_path / "export" / "scorer.onnx"))
        build_ov_engine(graph, tmp_path / "elsewhere" / "scorer.blob", precision="fp32", profile=PROFILE)
        entry = {"engine": "scorer.blob", "precision": "fp32", "onnx": "scorer.onnx"}
        _changed(graph, graph)
        runner = runner_for(OV, entry, export_dir=tmp_path / "export", build_dir=tmp_path / "elsewhere")
        assert runner.source == graph
        with pytest.raises(StaleEngine):
            runner.activate()


class TestRecordedPrecision:
    def test_a_read_back_that_disagrees_with_the_sidecar_exits_2(self, built):
        _graph, blob = built
        _edit_sidecar(blob, ran_precision="bf16")
        with pytest.raises(EngineError) as err:
            OvRunner(blob).activate()
        assert err.value.exit_code == 2
        assert "run fp32 after loading" in str(err.value) and "sidecar records bf16" in str(err.value)
        assert "hydra-toolchain build" in str(err.value)

    def test_through_parity_it_is_an_error_check_with_exit_2(self, built, scorer):
        from toolchain.parity import run_parity

        _graph, blob = built
        _edit_sidecar(blob, ran_precision="bf16")
        reference = make_runner("torch", module=scorer, input_specs=INPUT_SPECS, output_names=["scores", "probs"])
        verdict = run_parity(reference, {"ov": OvRunner(blob)}, [feed(3)], [], [])
        assert verdict.exit_code == 2
        assert any("sidecar records bf16" in p for p in verdict.problems())


class TestLowerPrecisionFails:
    @pytest.mark.parametrize(("asked", "ran", "lower"), [
        ("fp32", "bf16", True), ("fp32", "fp16", True), ("fp16", "bf16", True), ("fp32", "fp32", False),
        ("bf16", "fp32", False), ("bf16", "fp16", False), ("bf16", "bf16", False)])
    def test_lower_means_fewer_mantissa_bits(self, asked, ran, lower):
        assert ran_lower(asked, ran) is lower

    @staticmethod
    def _verdict(scorer, scorer_onnx, asked: str, compiled: str):
        """Parity of a real OpenVINO engine compiled at ``compiled``, gated as an engine asked for ``asked``."""
        from toolchain.parity import run_parity

        reference = make_runner("torch", module=scorer, input_specs=INPUT_SPECS, output_names=["scores", "probs"])
        candidate = OvRunner(onnx_path=scorer_onnx, precision=compiled, threads=1, name="ov")
        labels = np.array([0, 1, 2, 3, 0, 1, 2, 3])
        return run_parity(reference, {"ov": candidate}, [feed(3)], [(feed(8, seed=1), labels)], [],
                          precisions={"ov": asked}, cross_check=False)

    @staticmethod
    def _assert_fails_on_precision(verdict, asked: str, ran: str, *, numbers_pass: bool) -> None:
        assert verdict.exit_code == 1
        failed = [c for c in verdict.checks if c.status == "fail"]
        assert "run/precision" in [c.name for c in failed]
        if numbers_pass:
            assert [c.name for c in failed] == ["run/precision"]
        check = next(c for c in failed if c.name == "run/precision")
        assert f"asked for {asked}, the engine ran {ran}" in check.message
        assert verdict.meta["engines"]["ov"]["precision_asked"] == asked
        assert verdict.meta["precisions"]["ov"] == ran  # its numbers judged at what it ran
        assert "run/precision" in verdict.to_junit_xml() and f"asked for {asked}" in verdict.to_markdown()

    def test_fp32_asked_that_really_ran_bf16_fails_with_exit_1(self, scorer, scorer_onnx):
        if engine_kind(OV).unavailable("bf16") is not None:
            pytest.skip("this CPU has no BF16 in OpenVINO")
        verdict = self._verdict(scorer, scorer_onnx, "fp32", "bf16")  # read back from the engine: bf16
        self._assert_fails_on_precision(verdict, "fp32", "bf16", numbers_pass=False)

    def test_fp32_asked_whose_read_back_says_bf16_fails_on_any_cpu(self, monkeypatch, scorer, scorer_onnx):
        import toolchain.engines.openvino.runner as ov_runner

        real = ov_runner.ran_precision  # the engine runs FP32; only its read-back is made to say BF16
        monkeypatch.setattr(ov_runner, "ran_precision", lambda layers, asked: ("bf16", real(layers, asked)[1]))
        verdict = self._verdict(scorer, scorer_onnx, "fp32", "fp32")
        self._assert_fails_on_precision(verdict, "fp32", "bf16", numbers_pass=True)  # BF16 tolerances pass it

    def test_the_precision_asked_that_ran_passes(self, scorer, scorer_onnx):
        assert self._verdict(scorer, scorer_onnx, "fp32", "fp32").exit_code == 0

    def test_a_higher_precision_than_asked_is_no_failure(self, scorer, scorer_onnx):
        verdict = self._verdict(scorer, scorer_onnx, "bf16", "fp32")  # asked bf16, ran fp32
        assert verdict.exit_code == 0 and verdict.meta["precisions"]["ov"] == "fp32"  # judged at what it ran

    def test_a_precision_this_cpu_lacks_is_skipped_not_failed(self, scorer_onnx):
        from toolchain.verbs.targets import targets_for

        reason = engine_kind(OV).unavailable("fp16")
        if reason is None:
            pytest.skip("this CPU has FP16 in OpenVINO")
        targets, skipped = targets_for([scorer_onnx], [OV], ["fp32", "fp16"])
        assert [t.precision for t in targets] == ["fp32"]
        assert skipped == {"openvino-cpu:scorer.onnx@fp16": reason}
        with pytest.raises(MissingDependencyError):  # nothing else to run: exit 3, as documented
            targets_for([scorer_onnx], [OV], ["fp16"])


class TestDescribeHook:
    def test_openvino_describes_its_file_in_neutral_keys(self, built):
        graph, blob = built
        d = engine_kind(OV).describe(blob)
        assert d["kind"] == OV and d["precision"] == d["ran_precision"] == "fp32"
        assert d["runtime"].startswith("OpenVINO ") and d["onnx_file"] == "scorer.onnx"
        assert d["source"] == {"graph": str(graph), "status": "current", "sha256": sha256_file(graph)}
        assert d["sidecar"] == json.loads(sidecar_path(blob).read_text())
        _changed(graph, graph)
        assert engine_kind(OV).describe(blob)["source"]["status"] == "stale"

    def test_a_missing_sidecar_is_an_engine_error(self, built):
        _graph, blob = built
        sidecar_path(blob).unlink()
        with pytest.raises(EngineError, match="missing"):
            engine_kind(OV).describe(blob)

    @pytest.fixture
    def hooked(self, monkeypatch):
        """The openvino-cpu kind with a ``describe`` that marks what it returns (the verbs must show the mark)."""
        spec = engine_kind(OV)
        real = spec.describe

        def marked(path: Path) -> dict:
            return {**real(path), "precision": "bf16", "ran_precision": "bf16", "runtime": "HookRuntime 9"}

        monkeypatch.setitem(registry._REGISTRY, OV, dataclasses.replace(spec, describe=marked))

    def test_targets_read_the_precision_through_the_hook(self, built, hooked):
        from toolchain.verbs.targets import targets_for

        _graph, blob = built
        targets, _ = targets_for([blob])
        assert [t.precision for t in targets] == ["bf16"]

    def test_inspect_reads_the_file_through_the_hook(self, built, hooked):
        from toolchain.verbs.inspect import format_inspection, inspect_path

        _graph, blob = built
        info = inspect_path(blob)
        assert info["build"]["runtime"] == "HookRuntime 9"
        text = format_inspection(info)
        assert "HookRuntime 9" in text and "precision bf16, ran bf16" in text
        assert "source graph" in text and "current" in text

    def test_build_records_what_the_hook_says_it_ran(self, tmp_path, scorer_onnx, hooked):
        from toolchain.verbs.build import build_engines

        graphs = {"scorer": {"path": str(scorer_onnx), "precision": "fp32", "inputs": ["x", "mask"]}}
        records = build_engines([OV], graphs, tmp_path, tmp_path, precisions=["fp32"], profile=lambda _n: PROFILE)
        assert records[OV]["engines"]["scorer"]["ran_precision"] == "bf16"  # the hook's, not the file's fp32

    def test_inspect_shows_a_stale_file_and_its_rebuild_command(self, built):
        from toolchain.verbs.inspect import format_inspection, inspect_path

        graph, blob = built
        _changed(graph, graph)
        text = format_inspection(inspect_path(blob))
        assert "STALE" in text and sha256_file(graph) in text and "hydra-toolchain build" in text

    def test_the_verbs_name_no_sidecar_field_of_a_kind(self):
        root = Path(__file__).resolve().parents[2] / "toolchain" / "verbs"
        for name in ("build.py", "targets.py", "inspect.py"):
            text = (root / name).read_text()
            for field in ("openvino_version", "tensorrt_version", "device_name", "gpu_name", 'name + ".json"'):
                assert field not in text, f"{name} reads the sidecar field {field} by name"


def _fake_trt(tmp_path: Path, graph: Path, sha: str) -> Path:
    """A TensorRT engine file (bytes no runtime reads here) with a sidecar naming ``graph`` and ``sha``."""
    engine = tmp_path / "model.engine"
    engine.write_bytes(b"not a real plan")
    sidecar = EngineSidecar(tensorrt_version="10.15.1", gpu_name="NVIDIA H200", compute_capability="9.0",
                            precision="fp16", strongly_typed=True, profile={k: [list(s) for s in v]
                                                                            for k, v in PROFILE.items()},
                            onnx_file=graph.name, onnx_sha256=sha, workspace_gb=4.0, built_at="2026-01-01T00:00:00")
    (tmp_path / "model.engine.json").write_text(json.dumps(sidecar.to_json()))
    return engine


class TestTensorRt:
    def test_a_stale_engine_is_refused_before_tensorrt_is_needed(self, tmp_path, scorer_onnx):
        graph = Path(shutil.copy(scorer_onnx, tmp_path / "scorer.onnx"))
        engine = _fake_trt(tmp_path, graph, "0" * 64)
        with pytest.raises(StaleEngine) as err:
            TrtRunner(engine).activate()
        assert "0" * 64 in str(err.value) and sha256_file(graph) in str(err.value)
        assert f"hydra-toolchain build {graph} -o {tmp_path} --engine tensorrt --precision fp16" in str(err.value)

    def test_without_tensorrt_a_current_engine_says_what_it_needs(self, tmp_path, scorer_onnx):
        try:
            import tensorrt  # noqa: F401
        except ImportError:
            pass
        else:
            pytest.skip("tensorrt is installed: this checks the machine without it")
        graph = Path(shutil.copy(scorer_onnx, tmp_path / "scorer.onnx"))
        engine = _fake_trt(tmp_path, graph, sha256_file(graph))
        with pytest.raises(MissingDependencyError, match=r"needs TensorRT 10\.15\.1"):
            TrtRunner(engine).activate()

    def test_tensorrt_describes_its_file_through_the_same_hook(self, tmp_path, scorer_onnx):
        graph = Path(shutil.copy(scorer_onnx, tmp_path / "scorer.onnx"))
        d = engine_kind("tensorrt").describe(_fake_trt(tmp_path, graph, sha256_file(graph)))
        assert d["precision"] == "fp16" and d["ran_precision"] is None and d["runtime"] == "TensorRT 10.15.1"
        assert d["source"]["status"] == "current" and "--engine tensorrt --precision fp16" in d["rebuild"]


class TestPadding:
    LIMITS: ClassVar[dict[str, ShapeLimits]] = {
        n: ShapeLimits((1, 8), (32, 128)) for n in ("input_ids", "attention_mask", "token_type_ids")}

    def _text(self, length: int, batch: int = 2) -> dict[str, np.ndarray]:
        return {"input_ids": np.arange(1, batch * length + 1, dtype=np.int64).reshape(batch, length),
                "attention_mask": np.ones((batch, length), np.int64),
                "token_type_ids": np.zeros((batch, length), np.int64)}

    def test_short_rows_are_padded_with_zeros_up_to_the_minimum(self):
        given = self._text(5)
        padded, padding, why = pad_to_profile(given, self.LIMITS)
        assert why is None and padding == {1: (5, 8)}
        for name, value in padded.items():
            assert value.shape == (2, 8)
            np.testing.assert_array_equal(value[:, :5], given[name])
            assert not value[:, 5:].any()  # pad id 0, attention_mask 0

    def test_long_enough_rows_are_left_alone(self):
        given = self._text(8)
        padded, padding, why = pad_to_profile(given, self.LIMITS)
        assert padding == {} and why is None and all(padded[k] is given[k] for k in given)

    def test_without_an_attention_mask_it_says_why_it_does_not_pad(self):
        given = {k: v for k, v in self._text(5).items() if k != "attention_mask"}
        padded, padding, why = pad_to_profile(given, self.LIMITS)
        assert padding == {} and padded["input_ids"].shape == (2, 5)
        assert "no 'attention_mask' input" in why

    def test_float_inputs_are_not_padded(self):
        given = {"x": np.zeros((2, 5), np.float32), "attention_mask": np.ones((2, 5), np.int64)}
        limits = {n: ShapeLimits((1, 8), (4, 16)) for n in given}
        assert "holds float32" in pad_to_profile(given, limits)[2]

    def test_dynamic_output_axes_are_cut_back_and_static_ones_kept(self):
        outputs = {"logits": np.zeros((2, 8)), "hidden": np.zeros((2, 8, 3))}
        cut = unpad_outputs(outputs, {1: (5, 8)}, {"logits": (None, 8), "hidden": (None, None, 3)})
        assert cut["logits"].shape == (2, 8) and cut["hidden"].shape == (2, 5, 3)

    def test_the_runner_message_says_why_a_short_feed_was_refused(self):
        from toolchain.engines.base import TensorSpec, check_feed_why

        given = {"input_ids": np.zeros((1, 3), np.int64)}
        specs = {"input_ids": TensorSpec(np.dtype(np.int64), ("batch", "sequence"))}
        with pytest.raises(FeedError, match="not padded up to the profile minimum: the feed has no 'attention_mask'"):
            check_feed_why(given, specs, pad_to_profile(given, self.LIMITS)[2], limits=self.LIMITS)

    def test_rebuild_command_spells_the_profile(self):
        triple = [[1, 8], [8, 64], [32, 128]]
        cmd = rebuild_command(Path("/g/single.onnx"), Path("/e/single.bf16.blob"), OV, "bf16",
                              {"input_ids": triple, "attention_mask": triple})
        assert cmd == ("hydra-toolchain build /g/single.onnx -o /e --engine openvino-cpu --precision bf16 "
                       "--batch 1:8:32 --seq 8:64:128")

    def test_check_source_without_a_graph_returns_none(self, tmp_path):
        assert check_source(tmp_path / "x.blob", kind=OV, onnx_file="x.onnx", onnx_sha256="0", precision="fp32") is None
