"""torch.onnx's warning on advanced indexing with negative indices: silent in our exports, and rightly so.

The TorchScript exporter warns on every ``x[rows, cols]`` index that a negative index would give a
wrong graph (it flattens ``x`` and Gathers ``rows * n_cols + cols``). In the exported single models it
comes from three places (located by tracing the tiny models): transformers' padding-mask builder
(``padding_mask[arange(B), arange(T)]``, every text family), CLIP's EOS pooling over its constant
class prompts and Llama's last-real-token pooling (``hidden[arange(B), argmax(...)]``). Each index is
non-negative by construction, so :func:`toolchain.export.onnx_export.export_onnx` drops that warning.
Here: the raw exporter does emit it for these models (the test sees the real case), ``export_onnx``
neither returns, logs nor leaks it, and ONNX Runtime equals PyTorch where the pooled index is at its
extremes (0: a one-token row; ``T - 1``: a full row) at batch sizes other than the export's.
"""

from __future__ import annotations

import logging
import warnings

import numpy as np
import onnxruntime as ort
import pytest
import torch

from toolchain.export.onnx_export import export_onnx
from toolchain.models.tiny import TINY_MODELS
from toolchain.models.wrappers import SingleModel

OUTPUTS = ["logits", "probs"]
WARNING = "Exporting aten::index operator of advanced indexing"


@pytest.fixture(autouse=True)
def _one_thread():
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def _model(family: str):
    tiny = TINY_MODELS[family]()
    model = SingleModel(tiny.adapter).eval()
    example = tiny.make_batch(2, seed=0)
    names = [n for n in getattr(model, "input_names", example) if n in example]
    specs = type(tiny.adapter).input_specs()
    axes = {n: specs[n].dynamic_axes() for n in names} | {o: {0: "batch"} for o in OUTPUTS}
    return tiny, model, {n: example[n] for n in names}, axes


def _extreme_rows(tiny, lengths: list[int]) -> dict[str, torch.Tensor]:
    """A text batch whose rows keep ``lengths`` real tokens (right padding): last-token index 0 .. T - 1."""
    batch = tiny.make_batch(len(lengths), seed=7, pad=False)
    mask = torch.zeros_like(batch["input_ids"])
    for i, n in enumerate(lengths):
        mask[i, :n] = 1
    batch["input_ids"] = torch.where(mask.bool(), batch["input_ids"], torch.zeros_like(batch["input_ids"]))
    batch["attention_mask"] = mask
    return batch


@pytest.mark.parametrize("family", ["llama", "bert", "clip"])
def test_export_emits_no_negative_index_warning_and_matches_pytorch(tmp_path, caplog, family):
    tiny, model, example, axes = _model(family)
    with warnings.catch_warnings(record=True) as raw:  # the exporter alone: the warning this is about
        warnings.simplefilter("always")
        torch.onnx.export(model, tuple(example.values()), str(tmp_path / "raw.onnx"), input_names=list(example),
                          output_names=OUTPUTS, dynamic_axes=axes, opset_version=17, dynamo=False)
    assert any(WARNING in str(w.message) for w in raw), family

    with caplog.at_level(logging.WARNING), warnings.catch_warnings(record=True) as leaked:
        warnings.simplefilter("always")
        res = export_onnx(model, example, OUTPUTS, tmp_path / "single.onnx", dynamic_axes=axes)
    assert not [w for w in res.warnings if "aten::index" in w]
    assert "aten::index" not in caplog.text
    assert not [w for w in leaked if "aten::index" in str(w.message)]

    seq = example["input_ids"].shape[1] if "input_ids" in example else None
    feeds = [tiny.make_batch(3, seed=3)] if seq is None else \
        [_extreme_rows(tiny, [seq, 1, seq // 2]), _extreme_rows(tiny, [1, seq, 2, seq, 1])]
    sess = ort.InferenceSession(str(res.path), providers=["CPUExecutionProvider"])
    for feed in feeds:
        feed = {n: feed[n] for n in example}
        got = dict(zip(OUTPUTS, sess.run(OUTPUTS, {n: v.numpy() for n, v in feed.items()}), strict=True))
        with torch.no_grad():
            want = {k: v.numpy() for k, v in model(**feed).items()}
        assert got["logits"].shape == want["logits"].shape
        assert np.abs(got["probs"] - want["probs"]).max() <= 1e-5, family
        assert np.abs(got["logits"] - want["logits"]).max() <= 1e-4, family
