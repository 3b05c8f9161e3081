"""The runner contract, run against every CPU backend (torch reference, ONNX Runtime, OpenVINO)."""

import subprocess
import sys
from typing import ClassVar

import numpy as np
import pytest
from engine_models import FEATURES, INPUT_SPECS, TinyScorer, feed

from toolchain.engines import Runner, check_feed, make_runner, runner_kinds
from toolchain.engines.base import ShapeLimits, TensorSpec
from toolchain.errors import EngineError


class TestContract:
    def test_outputs_by_name(self, make):
        with make() as runner:
            out = runner.infer(feed(3))
        assert list(out) == ["scores", "probs"]
        assert out["scores"].shape == (3, 4) and out["scores"].dtype == np.float32
        np.testing.assert_allclose(out["probs"].sum(-1), 1.0, atol=1e-6)

    def test_input_specs(self, make):
        with make() as runner:
            specs = runner.input_specs()
        assert set(specs) == {"x", "mask"}
        assert specs["x"].dtype == np.float32 and specs["mask"].dtype == np.int64
        assert specs["x"].shape[1] == FEATURES and not isinstance(specs["x"].shape[0], int)

    def test_context_manager_activates_and_deactivates(self, make):
        runner = make()
        assert not runner.is_active
        with runner as active:
            assert active is runner and runner.is_active
        assert not runner.is_active
        with pytest.raises(EngineError, match="activate"):
            runner.infer(feed())

    def test_activate_twice_and_deactivate_twice_are_harmless(self, make):
        runner = make()
        runner.activate()
        runner.activate()
        runner.deactivate()
        runner.deactivate()
        assert not runner.is_active

    def test_unknown_and_missing_names(self, make):
        bad = feed()
        bad["X"] = bad.pop("x")
        with make() as runner, pytest.raises(EngineError) as info:
            runner.infer(bad)
        assert "unknown input(s) ['X']" in info.value.message and "missing input(s) ['x']" in info.value.message

    def test_wrong_dtype_names_the_tensor(self, make):
        bad = feed()
        bad["mask"] = bad["mask"].astype(np.int32)
        with make() as runner, pytest.raises(EngineError, match=r"'mask' has dtype int32, expected int64"):
            runner.infer(bad)

    def test_wrong_rank_and_static_dim(self, make):
        with make() as runner:
            with pytest.raises(EngineError, match=r"'x' has shape \(3, 6, 1\) \(rank 3\)"):
                runner.infer({**feed(), "x": feed()["x"][..., None]})
            with pytest.raises(EngineError, match=r"'x' axis 1 is 5, expected 6"):
                runner.infer({"x": feed()["x"][:, :5], "mask": feed()["mask"]})

    def test_named_dim_must_agree_across_inputs(self, make):
        with make() as runner, pytest.raises(EngineError, match="dim 'batch'"):
            runner.infer({"x": feed(3)["x"], "mask": feed(2)["mask"]})

    def test_batch_over_max(self, make):
        with make(max_batch=2) as runner:
            runner.infer(feed(2))
            with pytest.raises(EngineError, match=r"'mask' batch 3 is over the maximum 2.*'x' batch 3"):
                runner.infer(feed(3))

    def test_not_an_array(self, make):
        with make() as runner, pytest.raises(EngineError, match="'x' is a list"):
            runner.infer({"x": feed()["x"].tolist(), "mask": feed()["mask"]})


def test_backends_agree(scorer, scorer_onnx):
    with make_runner("torch", module=scorer, input_specs=INPUT_SPECS) as ref, \
            make_runner("onnxrt-cpu", path=scorer_onnx) as ort_runner:
        for batch in (1, 5):
            a, b = ref.infer(feed(batch, seed=batch)), ort_runner.infer(feed(batch, seed=batch))
            assert list(a) == list(b)
            for name in a:
                np.testing.assert_allclose(b[name], a[name], atol=1e-5, rtol=1e-5)


def test_torch_autocast_preview_is_close_to_fp32(scorer):
    with make_runner("torch", module=scorer, input_specs=INPUT_SPECS) as fp32, \
            make_runner("torch", module=scorer, input_specs=INPUT_SPECS, autocast="bf16") as bf16:
        a, b = fp32.infer(feed(4)), bf16.infer(feed(4))
    assert b["scores"].dtype == np.float32
    np.testing.assert_allclose(b["scores"], a["scores"], atol=4e-2, rtol=2e-2)  # bf16: ~2 decimal digits


def test_torch_runner_restores_training_flags():
    module = TinyScorer()
    module.train()
    module.proj.eval()
    with make_runner("torch", module=module, input_specs=INPUT_SPECS):
        assert not module.training
    assert module.training and not module.proj.training


def test_registry():
    assert runner_kinds() == ["onnxrt-cpu", "onnxrt-cpu-bf16emu", "onnxrt-cuda", "openvino-cpu", "tensorrt", "torch"]
    with pytest.raises(EngineError, match="unknown runner kind 'trt'"):
        make_runner("trt")


def test_importing_engines_needs_no_gpu_packages():
    code = ("import sys, toolchain.engines, toolchain.engines.tensorrt, toolchain.engines.onnxrt, "
            "toolchain.engines.openvino; print('tensorrt' in sys.modules, 'onnxruntime' in sys.modules, "
            "'openvino' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False", "False", "False"]


class TestCheckFeed:
    SPECS: ClassVar[dict[str, TensorSpec]] = {
        "a": TensorSpec(np.dtype(np.float32), ("b", 3)),
        "c": TensorSpec(np.dtype(np.int64), ("b",)),
    }

    def test_collects_every_problem_in_one_message(self):
        with pytest.raises(EngineError) as info:
            check_feed({"a": np.zeros((2, 4), np.float64), "z": np.zeros(1)}, self.SPECS, runner="r")
        message = info.value.message
        assert message.startswith("r: bad feed:")
        for part in ("unknown input(s) ['z']", "missing input(s) ['c']", "dtype float64", "axis 1 is 4"):
            assert part in message

    def test_profile_limits(self):
        limits = {"a": ShapeLimits((1, 3), (4, 3))}
        check_feed({"a": np.zeros((4, 3), np.float32), "c": np.zeros(4, np.int64)}, self.SPECS, limits=limits)
        with pytest.raises(EngineError, match=r"'a' batch 5 is outside the profile range 1\.\.4"):
            check_feed({"a": np.zeros((5, 3), np.float32), "c": np.zeros(5, np.int64)}, self.SPECS, limits=limits)


def test_runner_is_abstract():
    with pytest.raises(TypeError):
        Runner()  # type: ignore[abstract]
