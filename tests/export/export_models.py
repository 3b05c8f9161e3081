"""Tiny models for the export tests (imported by conftest.py and the test modules).

* ``TinyBertClassifier``: a random-initialised BertForSequenceClassification (hidden 32, 2 layers,
  4 heads, vocab 100, 3 labels) returning {"logits", "probs"}; inputs input_ids/attention_mask
  int64 [B, S], dynamic batch and sequence. Its classifier is scaled so logits are O(1) and
  precision errors are not hidden by tiny outputs.
* ``TinyGroupedConv``: M=3 members of C=8 channels in a channels-first [B, M*C, T] layout,
  grouped Conv1d(groups=3) up and down (the Hydra grouped fully-connected lowering), exact GELU,
  a per-member LayerNorm, a mean over T, a Linear head and a Softmax.
"""

from __future__ import annotations

from pathlib import Path

import torch
from cli_runner import run_cli  # noqa: F401 - re-exported: the export tests import it from here
from torch import nn

BERT_EXPORT_SHAPE = (2, 8)
CONV_EXPORT_SHAPE = (2, 24, 7)


class TinyBertClassifier(nn.Module):
    """BERT sequence classifier returning ``{"logits": [B, 3], "probs": [B, 3]}``."""

    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        from transformers import BertConfig, BertForSequenceClassification

        torch.manual_seed(seed)
        config = BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                            vocab_size=100, num_labels=3)
        self.bert = BertForSequenceClassification(config).eval()
        with torch.no_grad():
            self.bert.classifier.weight.mul_(60.0)
        self.eval()

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> dict[str, torch.Tensor]:
        logits = self.bert(input_ids=input_ids, attention_mask=attention_mask).logits
        return {"logits": logits, "probs": torch.softmax(logits, dim=-1)}


class TinyGroupedConv(nn.Module):
    """Grouped Conv1d ensemble: x [B, M*C, T] -> logits/probs [B, M, K]."""

    def __init__(self, members: int = 3, channels: int = 8, hidden: int = 16, labels: int = 5, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.members, self.channels = members, channels
        self.up = nn.Conv1d(members * channels, members * hidden, kernel_size=1, groups=members)
        self.down = nn.Conv1d(members * hidden, members * channels, kernel_size=1, groups=members)
        self.norm = nn.LayerNorm(channels)
        self.head = nn.Linear(channels, labels)
        with torch.no_grad():
            self.head.weight.mul_(5.0)
        self.eval()

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        h = self.down(nn.functional.gelu(self.up(x))) + x  # [B, M*C, T]
        h = h.unflatten(1, (self.members, self.channels)).transpose(2, 3)  # [B, M, T, C]
        pooled = self.norm(h).mean(dim=2)  # [B, M, C]
        logits = self.head(pooled)  # [B, M, K]
        return {"logits": logits, "probs": torch.softmax(logits, dim=-1)}


def bert_inputs(shape: tuple[int, int], seed: int = 0) -> dict[str, torch.Tensor]:
    """input_ids/attention_mask [B, S]; row 0 is padded after half its length."""
    batch, seq = shape
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, 100, (batch, seq), generator=g)
    mask = torch.ones(batch, seq, dtype=torch.int64)
    mask[0, max(1, seq // 2):] = 0
    return {"input_ids": ids, "attention_mask": mask}


def conv_inputs(shape: tuple[int, int, int], seed: int = 0) -> dict[str, torch.Tensor]:
    """x [B, M*C, T] standard normal."""
    return {"x": torch.randn(*shape, generator=torch.Generator().manual_seed(seed))}


BERT_AXES = {"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "seq"},
             "logits": {0: "batch"}, "probs": {0: "batch"}}
CONV_AXES = {"x": {0: "batch", 2: "time"}, "logits": {0: "batch"}, "probs": {0: "batch"}}


def copy_model(src: Path, dst_dir: Path) -> Path:
    """Copy an .onnx file (and its .data file if any) into ``dst_dir``."""
    dst_dir.mkdir(parents=True, exist_ok=True)
    for f in src.parent.glob(src.name + "*"):
        (dst_dir / f.name).write_bytes(f.read_bytes())
    return dst_dir / src.name


def tiny_with_tokenizer(classes: list[str], seed: int = 0, scale: float = 300.0) -> torch.nn.Module:
    """Hidden 32, 2 layers x 4 heads, MiniLM's vocabulary; the classifier scaled so probabilities spread."""
    import transformers

    torch.manual_seed(seed)
    cfg = transformers.BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                  intermediate_size=64, max_position_embeddings=128, num_labels=len(classes),
                                  id2label=dict(enumerate(classes)), label2id={n: i for i, n in enumerate(classes)})
    model = transformers.BertForSequenceClassification(cfg).eval()
    with torch.no_grad():
        model.classifier.weight.mul_(scale)
    return model
