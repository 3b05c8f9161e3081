"""Session fixtures: the tiny models of ``export_models`` and their FP32 ONNX exports."""

from __future__ import annotations

import csv
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

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
    tiny_with_tokenizer,
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


@pytest.fixture(scope="session")
def files(tmp_path_factory) -> dict[str, Path]:
    """A tiny BERT with MiniLM's tokenizer, its Hydra folder, their graphs, and CSVs of real tweets."""
    from toolchain.data import load_tweets
    from toolchain.hydra import fuse, save_hydra
    from toolchain.models import load_model, load_tokenizer, resolve_source, save_model
    from toolchain.verbs import ExportOptions, Range, export_graphs

    tmp = tmp_path_factory.mktemp("parity-verb")
    tweets = load_tweets()
    rows = np.random.default_rng(3).permutation(len(tweets.texts))
    for name, part in (("data.csv", rows[:70]), ("ood.csv", rows[70:110])):
        with (tmp / name).open("w", newline="", encoding="utf-8") as f:
            w = csv.writer(f)
            w.writerow(["text", "label"])
            w.writerows((tweets.texts[i], tweets.class_names[int(tweets.labels[i])]) for i in part)
    tok = load_tokenizer(resolve_source("packaged:all-MiniLM-L6-v2"))
    ckpt = save_model(tiny_with_tokenizer(list(tweets.class_names)), tmp / "ckpt", tokenizer=tok)
    adapter = load_model(ckpt, tokenizer=False).adapter
    keep = torch.ones(2, 2, 4, dtype=torch.bool)
    keep[0, :, :2] = False
    keep[1, :, 2:] = False
    hydra = save_hydra(fuse(adapter, keep, mlp="average"), tmp / "hydra", tokenizer=tok)
    shapes = {"batch": Range(1, 8, 32), "sequence": Range(8, 64, 128)}
    export_graphs(ckpt, tmp / "g", ExportOptions(precisions=("fp32", "fp16"), **shapes))
    export_graphs(hydra, tmp / "g", ExportOptions(lowerings=("conv",), precisions=("fp32", "fp16", "bf16"), **shapes))
    return {"tmp": tmp, "ckpt": ckpt, "hydra": hydra, "data": tmp / "data.csv", "ood": tmp / "ood.csv",
            "g": tmp / "g"}
