"""Splitting work over ranks and the collectives (see the package docstring)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from toolchain.distributed.failures import _collective, barrier, guard
from toolchain.distributed.state import T, _dist, enabled, rank, world_size


# ---------------------------------------------------------------------------- splitting work
def shard_indices(n: int, *, group: Any = None, contiguous: bool = False) -> list[int]:
    """The share of ``range(n)`` of this rank: strided (``i % world == rank``) or contiguous blocks.

    Deterministic; every index belongs to exactly one rank; the shares differ in size by at
    most one. A single process gets all of ``range(n)``.
    """
    n = int(n)
    w, r = world_size(group), rank(group)
    if w == 1:
        return list(range(n))
    if contiguous:
        bounds = np.linspace(0, n, w + 1).round().astype(int)
        return list(range(int(bounds[r]), int(bounds[r + 1])))
    return list(range(r, n, w))


def shard(items: Sequence[T], *, group: Any = None, contiguous: bool = False) -> list[T]:
    """The share of ``items`` of this rank (see :func:`shard_indices`)."""
    return [items[i] for i in shard_indices(len(items), group=group, contiguous=contiguous)]


def map_shards(n: int, fn: Callable[[int], T], *, group: Any = None) -> list[T]:
    """``[fn(0), ..., fn(n - 1)]`` on every rank, each rank computing its strided share.

    Results travel as pickled objects (tensors moved to the CPU first), so they arrive bit for
    bit: combining them in index order afterwards gives the single-process result exactly when
    ``fn(i)`` itself is deterministic. A failure in ``fn`` on any rank ends the job on every rank
    (see :func:`guard`).
    """
    if not enabled():
        return [fn(i) for i in range(n)]
    with guard("map_shards"):
        mine = {i: to_cpu(fn(i)) for i in shard_indices(n, group=group)}
        parts = all_gather_objects(mine, group=group)
    out: dict[int, Any] = {}
    for part in parts:
        out.update(part)
    if sorted(out) != list(range(n)):
        raise RuntimeError(f"map_shards: got results for {sorted(out)}, expected 0..{n - 1}")
    return [out[i] for i in range(n)]


@dataclass(frozen=True)
class Assignment:
    """Which member jobs this rank runs (see :func:`assign`).

    Attributes:
        n_items: number of jobs.
        items: the job indices this rank works on, ascending.
        ranks: for each job, the ranks working on it (the first one holds the result).
        group: the process group of the ranks that share this rank's job (data parallel), or
            None when this rank works alone (pass it to ``finetune(..., process_group=...)``).
    """

    n_items: int
    items: tuple[int, ...]
    ranks: tuple[tuple[int, ...], ...]
    group: Any = None

    def owner(self, item: int) -> int:
        """The rank that holds job ``item``'s result."""
        return self.ranks[item][0]

    def leads(self, item: int) -> bool:
        """True when this rank holds job ``item``'s result (pass it to :func:`gather_results`)."""
        return rank() == self.owner(item)


_ASSIGNMENTS: dict[tuple[int, int], Assignment] = {}


def assign(n_items: int) -> Assignment:
    """Spread ``n_items`` jobs (e.g. ensemble members) over the ranks.

    ``world <= n_items``: round-robin, job ``i`` on rank ``i % world``, one rank per job.
    ``world > n_items``: rank ``r`` works on job ``r % n_items``, so each job gets a group of
    ``world // n_items`` or one more ranks (data parallel within the group; the group's lowest
    rank holds the result). Must be called on every rank (it creates the subgroups, which is a
    collective); the result is cached per ``n_items``. A single process runs every job.
    """
    n = int(n_items)
    if n < 0:
        raise ValueError(f"n_items must be >= 0, got {n_items!r}")
    w, r = world_size(), rank()
    if w == 1:
        return Assignment(n, tuple(range(n)), tuple((0,) for _ in range(n)), None)
    key = (n, w)
    if key in _ASSIGNMENTS:
        return _ASSIGNMENTS[key]
    if n == 0:
        out = Assignment(0, (), (), None)
    elif w <= n:
        ranks = tuple((i % w,) for i in range(n))
        out = Assignment(n, tuple(i for i in range(n) if i % w == r), ranks, None)
    else:
        ranks = tuple(tuple(range(i, w, n)) for i in range(n))
        groups = [new_group(rs) if len(rs) > 1 else None for rs in ranks]  # every rank, same order
        mine = r % n
        out = Assignment(n, (mine,), ranks, groups[mine])
    _ASSIGNMENTS[key] = out
    return out


def new_group(ranks: Sequence[int]) -> Any:
    """A process group of ``ranks`` (a collective: every rank must call it, in the same order)."""
    if not enabled():
        return None
    ranks = sorted(int(r) for r in ranks)
    return _collective("new_group", lambda: _dist().new_group(ranks))


def gather_results(assignment: Assignment, results: dict[int, Any], *, dst: int = 0) -> dict[int, Any] | None:
    """Collect the jobs' results on rank ``dst``: ``{job index: result}`` there, None elsewhere.

    Each rank passes ``{job: result}`` for the jobs it leads (:meth:`Assignment.leads`); other
    entries are ignored. Tensors are moved to the CPU (state dicts travel as pickles). The ranks
    first meet at a :func:`barrier` (no time limit: one rank may train more members than
    another). A single process gets ``results`` back.

    Raises:
        RuntimeError: on ``dst``, a job without a result.
    """
    if not enabled():
        return dict(results)
    mine = {i: to_cpu(v) for i, v in results.items() if assignment.owner(i) == rank()}
    # jobs take unequal times (3 members on 2 ranks): wait without the collective timeout first
    barrier(what="waiting for the other ranks' jobs")
    parts = gather_objects(mine, dst=dst)
    if parts is None:
        return None
    out: dict[int, Any] = {}
    for part in parts:
        out.update(part)
    missing = sorted(set(range(assignment.n_items)) - set(out))
    if missing:
        raise RuntimeError(f"gather_results: no result for job(s) {missing}")
    return {i: out[i] for i in sorted(out)}


def to_cpu(obj: Any) -> Any:
    """``obj`` with every tensor (in dicts, lists, tuples) detached and moved to the CPU."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu()
    if isinstance(obj, dict):
        items = [(k, to_cpu(v)) for k, v in obj.items()]
        try:
            return type(obj)(items)  # keeps an OrderedDict (a state dict) an OrderedDict
        except TypeError:
            return dict(items)
    if isinstance(obj, list):
        return [to_cpu(v) for v in obj]
    if isinstance(obj, tuple) and not hasattr(obj, "_fields"):
        return tuple(to_cpu(v) for v in obj)
    return obj




def _device_for(group: Any) -> torch.device:
    backend = str(_dist().get_backend(group))
    if "nccl" in backend and "gloo" not in backend and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def all_reduce_sum(tensor: torch.Tensor, *, group: Any = None) -> torch.Tensor:
    """The element-wise sum over the ranks, in float64 (a new tensor on ``tensor``'s device).

    A single process gets a float64 copy.
    """
    out = torch.as_tensor(tensor).detach().to(torch.float64).clone()
    if not enabled():
        return out
    dev = out.device
    if dev.type == "cpu":
        out = out.to(_device_for(group))
    _collective("all_reduce", lambda: _dist().all_reduce(out, op=_dist().ReduceOp.SUM, group=group))
    return out.to(dev)


def all_reduce_(tensor: torch.Tensor, *, group: Any = None) -> torch.Tensor:
    """Sum ``tensor`` over the ranks in place, in its own dtype (gradients); returns it."""
    if not enabled():
        return tensor
    buf = tensor
    moved = buf.device.type == "cpu" and _device_for(group).type != "cpu"
    if moved:
        buf = buf.to(_device_for(group))
    _collective("all_reduce", lambda: _dist().all_reduce(buf, op=_dist().ReduceOp.SUM, group=group))
    if moved:
        tensor.copy_(buf.to(tensor.device))
    return tensor


def all_gather_objects(obj: Any, *, group: Any = None) -> list[Any]:
    """Every rank's ``obj`` (picklable), in rank order, on every rank."""
    if not enabled():
        return [obj]
    out: list[Any] = [None] * world_size(group)
    _collective("all_gather_object", lambda: _dist().all_gather_object(out, obj, group=group))
    return out


def gather_objects(obj: Any, *, dst: int = 0, group: Any = None) -> list[Any] | None:
    """Every rank's ``obj`` in rank order on rank ``dst`` (a global rank); None on the others."""
    if not enabled():
        return [obj]
    me = rank()
    out: list[Any] | None = [None] * world_size(group) if me == dst else None
    _collective("gather_object", lambda: _dist().gather_object(obj, out, dst=dst, group=group))
    return out


def broadcast_object(obj: Any, *, src: int = 0, group: Any = None) -> Any:
    """Rank ``src``'s ``obj`` (a global rank) on every rank (the others' ``obj`` is ignored)."""
    if not enabled():
        return obj
    box = [obj]
    _collective("broadcast_object", lambda: _dist().broadcast_object_list(box, src=src, group=group))
    return box[0]


def broadcast_tensors(tensors: Sequence[torch.Tensor], *, src: int = 0, group: Any = None) -> None:
    """Overwrite ``tensors`` (in place, same shapes on every rank) with rank ``src``'s values."""
    if not enabled():
        return
    dist = _dist()
    for t in tensors:
        buf = t.detach()
        moved = buf.device.type == "cpu" and _device_for(group).type != "cpu"
        if moved:
            buf = buf.to(_device_for(group))
        _collective("broadcast", lambda buf=buf: dist.broadcast(buf, src=src, group=group))
        if moved:
            with torch.no_grad():
                t.copy_(buf.to(t.device))


