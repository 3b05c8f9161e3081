"""A small, generic, seeded fine-tuning loop for any adapter's model (recovery after pruning).

AdamW (no weight decay on biases and LayerNorm weights, i.e. parameters with fewer than two
dimensions), a linear schedule (warm up from 0 over ``warmup_ratio * steps``, then linear decay
to 0 at ``steps``), gradient-norm clipping at 1.0, cross-entropy on ``adapter.logits``.

Data: ``batches_fn(batch_size, seed)`` returns an iterable of ``(batch dict, labels)`` for one
pass over the training data in an order drawn from ``seed``. The loop calls it with
``seed * 1_000_003 + epoch`` for epoch 0, 1, ... until ``steps`` optimizer steps are done. The
torch RNG (dropout) is seeded with ``seed`` inside ``torch.random.fork_rng``, so the caller's
RNG state is untouched and the same seed gives identical weights (same machine and threads).

The model is in train mode during the loop and in eval mode afterwards.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from toolchain.scoring._checks import check_float, check_int

__all__ = ["BatchesFn", "epoch_seed", "finetune"]

log = logging.getLogger(__name__)

BatchesFn = Callable[[int, int], Iterable[tuple[dict[str, torch.Tensor], torch.Tensor]]]


def epoch_seed(seed: int, epoch: int) -> int:
    """The data-order seed of ``epoch`` in a run seeded with ``seed``."""
    return int(seed) * 1_000_003 + int(epoch)


def _param_groups(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    decay, no_decay = [], []
    for p in model.parameters():
        if p.requires_grad:
            (decay if p.dim() >= 2 else no_decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def finetune(
    model: nn.Module,
    adapter: object,
    batches_fn: BatchesFn,
    *,
    steps: int,
    lr: float,
    batch_size: int,
    seed: int,
    weight_decay: float = 0.01,
    warmup_ratio: float = 0.1,
    progress: bool = True,
    grad_clip: float | None = 1.0,
    log_every: int = 0,
) -> dict[str, list[float]]:
    """Fine-tune ``model`` (in place) with cross-entropy on ``adapter.logits``.

    Args:
        model: the module to train (``adapter.model``, or the model the adapter wraps).
        adapter: its :class:`toolchain.models.ModelAdapter`.
        batches_fn: ``(batch_size, seed) -> iterable of (batch, labels)`` (see module docstring).
        steps: optimizer steps, >= 1.
        lr: peak learning rate, > 0.
        batch_size: passed to ``batches_fn``.
        seed: seeds the data order and dropout.
        weight_decay: AdamW decay of matrices, >= 0.
        warmup_ratio: fraction of steps of linear warm-up, in ``[0, 1)``.
        progress: show a tqdm progress bar.
        grad_clip: max gradient norm (None: no clipping).
        log_every: log the mean loss every this many steps at INFO (0: only at the end).

    Returns:
        ``{"losses": [per-step training loss], "lrs": [per-step learning rate]}``.
    """
    steps = check_int("steps", steps, lo=1)
    lr = check_float("lr", lr, lo=0.0, lo_open=True)
    batch_size = check_int("batch_size", batch_size, lo=1)
    seed = check_int("seed", seed, lo=0)
    weight_decay = check_float("weight_decay", weight_decay, lo=0.0)
    warmup_ratio = check_float("warmup_ratio", warmup_ratio, lo=0.0, hi=1.0, hi_open=True)
    log_every = check_int("log_every", log_every, lo=0)
    if grad_clip is not None:
        grad_clip = check_float("grad_clip", grad_clip, lo=0.0, lo_open=True)
    if adapter.model is not model:
        raise ValueError("adapter must wrap model (adapter.model is not the model given)")
    from tqdm.auto import tqdm

    warmup = int(warmup_ratio * steps)

    def schedule(step: int) -> float:
        if step < warmup:
            return (step + 1) / (warmup + 1)
        return max(0.0, (steps - step) / max(1, steps - warmup))

    opt = torch.optim.AdamW(_param_groups(model, weight_decay), lr=lr)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, schedule)
    losses: list[float] = []
    lrs: list[float] = []
    bar = tqdm(total=steps, desc="finetune", disable=not progress, leave=False)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model.train()
        try:
            epoch = 0
            while len(losses) < steps:
                got = 0
                for batch, labels in batches_fn(batch_size, epoch_seed(seed, epoch)):
                    got += 1
                    lrs.append(float(opt.param_groups[0]["lr"]))
                    logits = adapter.logits(batch)
                    loss = F.cross_entropy(logits.float(), torch.as_tensor(labels, dtype=torch.long))
                    opt.zero_grad(set_to_none=True)
                    loss.backward()
                    if grad_clip is not None:
                        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
                    opt.step()
                    sched.step()
                    losses.append(float(loss.detach()))
                    bar.update(1)
                    bar.set_postfix(loss=f"{losses[-1]:.4f}")
                    if log_every and len(losses) % log_every == 0:
                        recent = losses[-log_every:]
                        log.info(
                            "finetune: step %d/%d, mean loss %.4f",
                            len(losses),
                            steps,
                            sum(recent) / len(recent),
                        )
                    if len(losses) >= steps:
                        break
                if got == 0:
                    raise ValueError(f"batches_fn(batch_size={batch_size}, seed=...) yielded no batch")
                epoch += 1
        finally:
            model.eval()
            bar.close()
    log.info("finetune: %d steps, loss %.4f -> %.4f", steps, losses[0], losses[-1])
    return {"losses": losses, "lrs": lrs}
