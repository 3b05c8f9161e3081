"""Session fixtures: the tiny models of ``export_models`` and their FP32 ONNX exports."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # --import-mode=importlib: make export_models importable

from export_models import (
    BERT_AXES,
    BERT_EXPORT_SHAPE,
    CONV_AXES,
    CONV_EXPORT_SHAPE,
    TinyBertClassifier,
    TinyGroupedConv,
    bert_inputs,
    conv_inputs,
)

from toolchain.export.onnx_export import ExportResult, export_onnx


@pytest.fixture(scope="session")
def bert_module() -> TinyBertClassifier:
    return TinyBertClassifier()


@pytest.fixture(scope="session")
def conv_module() -> TinyGroupedConv:
    return TinyGroupedConv()


@pytest.fixture(scope="session")
def bert_onnx(tmp_path_factory: pytest.TempPathFactory, bert_module: TinyBertClassifier) -> ExportResult:
    path = tmp_path_factory.mktemp("bert") / "bert.onnx"
    return export_onnx(bert_module, bert_inputs(BERT_EXPORT_SHAPE), ["logits", "probs"], path, dynamic_axes=BERT_AXES)


@pytest.fixture(scope="session")
def conv_onnx(tmp_path_factory: pytest.TempPathFactory, conv_module: TinyGroupedConv) -> ExportResult:
    path = tmp_path_factory.mktemp("conv") / "conv.onnx"
    return export_onnx(conv_module, conv_inputs(CONV_EXPORT_SHAPE), ["logits", "probs"], path, dynamic_axes=CONV_AXES)
