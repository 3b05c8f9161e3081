"""Run a model over a data split in token-length order and put the outputs back in split order.

The helpers the evaluate, fine-tuning and parity stages, the benchmarks and the tests share.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from toolchain.models import ModelAdapter
from toolchain.pipeline import Context


@torch.no_grad()
def predict(ctx: Context, adapter: ModelAdapter, split: str, tokenizer: Any, batch_size: int = 64) -> torch.Tensor:
    """Logits ``[N, C]`` of ``adapter``'s model on a split."""
    adapter.model.eval()
    part, back = ctx.in_length_order(ctx.data[split], tokenizer)  # short rows together: less padding
    logits = torch.cat([adapter.logits(b) for b, _ in ctx.batches(part, batch_size, tokenizer)])
    return logits if back is None else logits[torch.as_tensor(back)]


def evaluate_accuracy(ctx: Context, adapter: ModelAdapter, split: str, tokenizer: Any) -> float:
    """Top-1 accuracy on a split."""
    logits = predict(ctx, adapter, split, tokenizer)
    labels = torch.as_tensor(ctx.data[split].labels)
    return float((logits.argmax(-1) == labels).float().mean())


@torch.no_grad()
def module_outputs(ctx: Context, module: torch.nn.Module, split: str | Any, tok: Any, names: list[str],
             batch_size: int = 64) -> dict[str, np.ndarray]:
    """Run a dict-output module over a split (a name, or a data subset); concatenate each output."""
    module.eval()
    outs: dict[str, list] = {}
    part, back = ctx.in_length_order(ctx.data[split] if isinstance(split, str) else split, tok)  # less padding
    for batch, _ in ctx.batches(part, batch_size, tok):
        res = module(**{k: v for k, v in batch.items() if k in names})
        for k, v in res.items():
            outs.setdefault(k, []).append(v.float().numpy())
    return {k: np.concatenate(v)[slice(None) if back is None else back] for k, v in outs.items()}
