"""A small, generic, seeded fine-tuning loop for any adapter's model (recovery after pruning).

AdamW (no weight decay on biases and LayerNorm weights, i.e. parameters with fewer than two
dimensions), a linear schedule (warm up from 0 over ``warmup_ratio * steps``, then linear decay
to 0 at ``steps``), gradient-norm clipping at 1.0, cross-entropy on ``adapter.logits``.

Distillation (``teacher`` and ``distill`` > 0): each row's loss is ``(1 - distill) * CE(student,
label) + distill * T^2 * KL(softmax(teacher / T) || softmax(student / T))`` with ``T =
temperature`` (Hinton et al. 2015; the ``T^2`` keeps the soft term's gradient scale independent
of ``T``). The teacher's logits are computed without gradients; it stays in eval mode.

Data: ``batches_fn(batch_size, seed)`` returns an iterable of ``(batch dict, labels)`` for one
pass over the training data in an order drawn from ``seed``. The loop calls it with
``seed * 1_000_003 + epoch`` for epoch 0, 1, ... until ``steps`` optimizer steps are done. The
torch RNG (dropout) is seeded with ``seed`` inside ``torch.random.fork_rng``, so the caller's
RNG state is untouched and the same seed gives identical weights (same machine and threads).

The model is in train mode during the loop and in eval mode afterwards.

Data parallel (``process_group`` of G > 1 ranks, e.g. :attr:`toolchain.distributed.Assignment.group`):
every rank of the group draws the same full batch from ``batches_fn`` and keeps a contiguous
block of its rows (``torch.tensor_split``); the loss on those rows is ``sum of cross-entropies /
full batch size``, so the gradients summed over the group (one all-reduce per step, in the
gradients' dtype) are the gradient of the full batch's mean loss; every rank then clips and
steps identically. The parameters start from the group's first rank (broadcast) and end
identical on every rank. The result equals single-process training on the full batch up to
float rounding, not bit for bit: the batch's gradient is summed in a different order (per rank
inside the backward's matrix products, then across ranks), which moves float32 gradients by
about 1e-7 relative, and AdamW carries such differences forward (measured on the tiny BERT, 2
ranks, 12 steps: parameters within 1.4e-6 of the single-process run, losses within 5e-8
relative; tests/distributed asserts 2e-5 and 1e-5). Dropout draws per rank (rank ``k`` of
the group seeds dropout with ``seed + 7919 * k``), so with dropout on the run is an equally valid
but different random draw; with dropout off the data, order and schedule are those of the
single-process run.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from toolchain import distributed as dist
from toolchain import interrupts
from toolchain.progress import progress as progress_display
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
    process_group: Any = None,
    desc: str = "finetune",
    teacher: Callable[[dict[str, torch.Tensor]], torch.Tensor] | None = None,
    distill: float = 0.0,
    temperature: float = 2.0,
) -> dict[str, list[float]]:
    """Fine-tune ``model`` (in place) with cross-entropy on ``adapter.logits`` (and a teacher term).

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
        progress: show progress (a bar on a terminal, a line per tenth in a log: :mod:`toolchain.progress`).
        grad_clip: max gradient norm (None: no clipping).
        log_every: log the mean loss every this many steps at INFO (0: only at the end).
        process_group: a ``torch.distributed`` group of the ranks that train this model together
            (data parallel, see the module docstring); None or a group of one rank: train alone.
        desc: what the progress display calls this run (e.g. ``deep-ensemble member 2/2``).
        teacher: ``batch -> logits`` of a teacher model (e.g. the unpruned fine-tuned model), for
            distillation; required when ``distill > 0``.
        distill: weight of the teacher term, in ``[0, 1]`` (0: labels only).
        temperature: softening temperature of the teacher term, > 0.

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
    distill = check_float("distill", distill, lo=0.0, hi=1.0)
    temperature = check_float("temperature", temperature, lo=0.0, lo_open=True)
    if distill > 0 and teacher is None:
        raise ValueError("distill > 0 needs a teacher (batch -> logits)")
    loss_fn = _LossFn(teacher if distill > 0 else None, distill, temperature)

    warmup = int(warmup_ratio * steps)

    def schedule(step: int) -> float:
        if step < warmup:
            return (step + 1) / (warmup + 1)
        return max(0.0, (steps - step) / max(1, steps - warmup))

    group_size = dist.world_size(process_group) if process_group is not None else 1
    if group_size > 1:
        with dist.guard("data-parallel fine-tuning"):
            return _finetune_data_parallel(
                model, adapter, batches_fn, steps=steps, lr=lr, batch_size=batch_size, seed=seed,
                weight_decay=weight_decay, schedule=schedule, progress=progress, grad_clip=grad_clip,
                log_every=log_every, group=process_group, desc=desc, loss_fn=loss_fn,
            )
    opt = torch.optim.AdamW(_param_groups(model, weight_decay), lr=lr)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, schedule)
    losses: list[float] = []
    lrs: list[float] = []
    bar = progress_display(steps, desc, enabled=progress)
    def step_loss(batch: Any, labels: Any) -> float:
        opt.zero_grad(set_to_none=True)
        labels = torch.as_tensor(labels, dtype=torch.long)
        loss = loss_fn(adapter.logits(batch), labels, batch).sum() / labels.shape[0]
        loss.backward()
        return float(loss.detach())

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        _train_loop(model, batches_fn, step_loss, opt=opt, sched=sched, bar=bar, steps=steps, batch_size=batch_size,
                    seed=seed, grad_clip=grad_clip, log_every=log_every, losses=losses, lrs=lrs)
    log.info("finetune: %d steps, loss %.4f -> %.4f", steps, losses[0], losses[-1])
    return {"losses": losses, "lrs": lrs}


class _LossFn:
    """Per-row training loss: cross-entropy, or its mix with a teacher term (module docstring)."""

    def __init__(self, teacher: Callable[[dict[str, torch.Tensor]], torch.Tensor] | None, distill: float,
                 temperature: float) -> None:
        self.teacher, self.distill, self.temperature = teacher, distill, temperature

    def __call__(self, logits: torch.Tensor, labels: torch.Tensor, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        logits = logits.float()
        ce = F.cross_entropy(logits, labels.to(logits.device), reduction="none")
        if self.teacher is None:
            return ce
        with torch.no_grad():
            soft = F.log_softmax(self.teacher(batch).float() / self.temperature, dim=-1)
        t = self.temperature
        kl = F.kl_div(F.log_softmax(logits / t, dim=-1), soft, log_target=True, reduction="none").sum(-1)
        return (1.0 - self.distill) * ce + self.distill * t * t * kl


def _train_loop(model: nn.Module, batches_fn: BatchesFn, step_loss: Callable[[Any, Any], float], *, opt: Any,
                sched: Any, bar: Any, steps: int, batch_size: int, seed: int, grad_clip: float | None,
                log_every: int, losses: list[float], lrs: list[float]) -> None:
    """Epochs of ``batches_fn`` until ``steps`` optimizer steps; ``step_loss`` fills the gradients."""
    model.train()
    try:
        epoch = 0
        while len(losses) < steps:
            got = 0
            for batch, labels in batches_fn(batch_size, epoch_seed(seed, epoch)):
                interrupts.check()  # a graceful SIGTERM stops between steps
                got += 1
                lrs.append(float(opt.param_groups[0]["lr"]))
                loss_value = step_loss(batch, labels)
                if grad_clip is not None:
                    torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
                opt.step()
                sched.step()
                losses.append(loss_value)
                _report(bar, losses, steps, log_every)
                if len(losses) >= steps:
                    break
            if got == 0:
                raise ValueError(f"batches_fn(batch_size={batch_size}, seed=...) yielded no batch")
            epoch += 1
    finally:
        model.eval()
        bar.close()


def _report(bar: Any, losses: list[float], steps: int, log_every: int) -> None:
    bar.update(1)
    bar.set_postfix(loss=f"{losses[-1]:.4f}")
    if log_every and len(losses) % log_every == 0:
        recent = losses[-log_every:]
        log.info("finetune: step %d/%d, mean loss %.4f", len(losses), steps, sum(recent) / len(recent))


def _rows(batch: dict[str, torch.Tensor], n: int, rows: torch.Tensor) -> dict[str, torch.Tensor]:
    """Rows ``rows`` of every per-sample tensor (first axis ``n``); other tensors unchanged."""
    return {k: (v.index_select(0, rows.to(v.device)) if v.dim() > 0 and v.shape[0] == n else v)
            for k, v in batch.items()}


def _sync_gradients(params: list[nn.Parameter], loss_part: float, group: Any) -> float:
    """Sum the gradients (and the loss) over ``group``; returns the full batch's loss.

    A parameter that got a gradient on any rank gets the sum (zeros where a rank had none, e.g.
    a rank with no rows); one that got none anywhere keeps ``grad = None`` (AdamW skips it, as
    in a single process).
    """
    meta = torch.tensor([p.grad is not None for p in params] + [loss_part], dtype=torch.float64)
    meta = dist.all_reduce_sum(meta, group=group)
    by_dtype: dict[tuple[torch.dtype, torch.device], list[nn.Parameter]] = {}
    for p, got in zip(params, meta[:-1].tolist()):
        if got > 0:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            by_dtype.setdefault((p.grad.dtype, p.grad.device), []).append(p)
    for ps in by_dtype.values():
        flat = torch.cat([p.grad.reshape(-1) for p in ps])
        dist.all_reduce_(flat, group=group)
        offset = 0
        for p in ps:
            k = p.grad.numel()
            p.grad.copy_(flat[offset : offset + k].view_as(p.grad))
            offset += k
    return float(meta[-1])


def _finetune_data_parallel(
    model: nn.Module,
    adapter: object,
    batches_fn: BatchesFn,
    *,
    steps: int,
    lr: float,
    batch_size: int,
    seed: int,
    weight_decay: float,
    schedule: Callable[[int], float],
    progress: bool,
    grad_clip: float | None,
    log_every: int,
    group: Any,
    desc: str = "finetune",
    loss_fn: _LossFn | None = None,
) -> dict[str, list[float]]:
    """:func:`finetune` with each step's batch split over the ranks of ``group`` (module docstring)."""
    loss_fn = loss_fn or _LossFn(None, 0.0, 1.0)
    import torch.distributed as tdist

    me, size = dist.rank(group), dist.world_size(group)
    first = tdist.get_global_rank(group, 0)
    params = [p for p in model.parameters() if p.requires_grad]
    dist.broadcast_tensors([p.data for p in model.parameters()] + list(model.buffers()), src=first, group=group)
    opt = torch.optim.AdamW(_param_groups(model, weight_decay), lr=lr)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, schedule)
    losses: list[float] = []
    lrs: list[float] = []
    bar = progress_display(steps, f"{desc} (data parallel x{size})", enabled=progress and me == 0)
    def step_loss(batch: Any, labels: Any) -> float:
        labels = torch.as_tensor(labels, dtype=torch.long)
        n = int(labels.shape[0])
        rows = torch.tensor_split(torch.arange(n), size)[me]
        opt.zero_grad(set_to_none=True)
        part = 0.0
        if rows.numel():
            mine = _rows(batch, n, rows)
            loss = loss_fn(adapter.logits(mine), labels.index_select(0, rows), mine).sum() / n
            loss.backward()
            part = float(loss.detach())
        return _sync_gradients(params, part, group)

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed + 7919 * me)
        _train_loop(model, batches_fn, step_loss, opt=opt, sched=sched, bar=bar, steps=steps, batch_size=batch_size,
                    seed=seed, grad_clip=grad_clip, log_every=log_every, losses=losses, lrs=lrs)
    # identical steps keep the ranks identical; make it exact whatever the backend's reduction order
    dist.broadcast_tensors([p.data for p in model.parameters()] + list(model.buffers()), src=first, group=group)
    log.info("finetune (data parallel x%d): %d steps, loss %.4f -> %.4f", size, steps, losses[0], losses[-1])
    return {"losses": losses, "lrs": lrs}
