"""Fixtures: the tiny scorer, its ONNX export, and runner factories for the contract tests."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # --import-mode=importlib: make engine_models importable

from engine_models import INPUT_SPECS, TinyScorer, feed

from toolchain.engines import make_runner
from toolchain.export.onnx_export import export_onnx


@pytest.fixture(scope="session")
def scorer() -> TinyScorer:
    return TinyScorer()


@pytest.fixture(scope="session")
def scorer_onnx(tmp_path_factory: pytest.TempPathFactory, scorer: TinyScorer) -> Path:
    path = tmp_path_factory.mktemp("scorer") / "scorer.onnx"
    example = {k: torch.from_numpy(v) for k, v in feed(2).items()}
    export_onnx(scorer, example, ["scores", "probs"], path,
                dynamic_axes={"x": {0: "batch"}, "mask": {0: "batch"}, "scores": {0: "batch"}, "probs": {0: "batch"}})
    return path


@pytest.fixture(params=["torch", "onnxrt-cpu", "openvino-cpu"])
def make(request: pytest.FixtureRequest, scorer: TinyScorer, scorer_onnx: Path):
    """Factory ``make(**extra) -> Runner`` for each CPU runner kind."""

    def build(**extra):
        if request.param == "torch":
            return make_runner("torch", module=scorer, input_specs=INPUT_SPECS, output_names=["scores", "probs"],
                               **extra)
        if request.param == "openvino-cpu":  # the FP32 graph compiled when activated (a .blob: test_engines_openvino)
            return make_runner("openvino-cpu", onnx_path=scorer_onnx, precision="fp32", threads=1, **extra)
        return make_runner("onnxrt-cpu", path=scorer_onnx, intra_op_threads=1, **extra)

    build.kind = request.param
    return build
