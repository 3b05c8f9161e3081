"""Run a model over a data split in token-length order and put the outputs back in split order.

The helpers the evaluate, fine-tuning and parity stages, the benchmarks and the tests share.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from toolchain.data import batching
from toolchain.models import ModelAdapter
from toolchain.pipeline import Context


@torch.no_grad()
def predict(ctx: Context, adapter: ModelAdapter, split: str, tokenizer: Any, batch_size: int = 64) -> torch.Tensor:
    """Logits ``[N, C]`` of ``adapter``'s model on a split."""
    adapter.model.eval()
    m = ctx.recipe.model
    part, back = batching.in_length_order(ctx.data[split], tokenizer, m.max_length)  # short rows together
    logits = torch.cat([adapter.logits(b) for b, _ in batching.batches(part, batch_size, tokenizer, m)])
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
    m = ctx.recipe.model
    rows = ctx.data[split] if isinstance(split, str) else split
    part, back = batching.in_length_order(rows, tok, m.max_length)  # less padding
    for batch, _ in batching.batches(part, batch_size, tok, m):
        res = module(**{k: v for k, v in batch.items() if k in names})
        for k, v in res.items():
            outs.setdefault(k, []).append(v.float().numpy())
    return {k: np.concatenate(v)[slice(None) if back is None else back] for k, v in outs.items()}
