"""Scale-out with ``torch.distributed``: a small API that is a no-op in a single process.

Launch any entry point with ``torchrun --nproc-per-node N`` (or ``accelerate launch``, which sets
the same ``RANK`` / ``WORLD_SIZE`` / ``LOCAL_RANK`` / ``MASTER_ADDR`` / ``MASTER_PORT``) and call
:func:`init_from_env` (the pipeline does). Without those variables, or before the process group is
initialised, every function returns the single-process answer (world 1, rank 0, ``shard`` = all
items, ``all_reduce_sum`` = a float64 copy...), so existing code paths are unchanged.

Pieces:

* process group: :func:`init_from_env` (backend ``gloo`` on CPU-only machines, ``cpu:gloo,cuda:nccl``
  when CUDA is available: CPU tensors travel over gloo, CUDA tensors over NCCL; timeout
  ``HYDRA_DIST_TIMEOUT_S``, default 1800 s), :func:`world_size`, :func:`rank`, :func:`is_main`,
  :func:`barrier`, :func:`local_only` (a block in which this process acts alone);
* work splitting: :func:`shard` / :func:`shard_indices` (strided, deterministic),
  :func:`map_shards` (run ``fn(i)`` for this rank's share of ``range(n)``, every rank gets all
  results in order: the scoring criteria and the circuit search use it), :func:`assign` (spread
  M member jobs over ranks; groups of ranks per member when there are more ranks than members),
  :func:`gather_results` (the members' results on rank 0), :func:`new_group`;
* collectives: :func:`all_reduce_sum` (float64), :func:`all_reduce_` (in place, own dtype),
  :func:`all_gather_objects`,
  :func:`gather_objects`, :func:`broadcast_object`, :func:`broadcast_tensors`;
* failures: :func:`guard`. An exception on one rank must end the job on every rank with that
  rank's message, and no rank may wait forever. Inside ``guard()``, a failing rank posts
  ``{rank, type, message, exit_code}`` to the rendezvous store (the first error wins), aborts its
  process group (peers blocked in a collective then fail at once: gloo sees the connection
  close), waits up to ``HYDRA_DIST_GRACE_S`` (default 10 s) for the other ranks to acknowledge,
  and re-raises. Every other rank learns of it either from a collective that fails (the
  collective wrappers here read the posted message) or from a watcher thread that polls the
  store every 0.2 s and raises :class:`~toolchain.distributed.failures.RemoteStop` in the guarded
  thread (an asynchronous exception, not SIGINT: a background job ignores SIGINT; a rank busy
  computing stops within a fraction of a second); it then raises :class:`RemoteRankError` carrying
  the failing rank's message and exit code. A failed store read is retried with a short back-off
  (~3 s in all); when the store stays gone (its host, rank 0, died) the watcher logs a warning and
  stops its rank with "lost contact" instead of letting it compute on. A rank that dies without
  posting (killed) is reported as lost contact; a rank that hangs is bounded by the process-group
  timeout. :func:`barrier` waits on the store (no time
  limit, so a long rank-0-only stage is fine) while watching for posted errors and for the store
  host going away.

Collectives must be called by every rank of the group in the same order (the usual rule); the
library functions that use them (:func:`toolchain.scoring.score_heads`, the circuit search,
data-parallel :func:`toolchain.pruning.finetune.finetune`) do so by construction.
"""


from __future__ import annotations

from toolchain.distributed.failures import barrier, guard
from toolchain.distributed.state import (
    RemoteRankError,
    enabled,
    init_from_env,
    is_initialized,
    is_main,
    local_only,
    local_rank,
    rank,
    shutdown,
    world_size,
)
from toolchain.distributed.work import (
    Assignment,
    all_gather_objects,
    all_reduce_,
    all_reduce_sum,
    assign,
    broadcast_object,
    broadcast_tensors,
    gather_objects,
    gather_results,
    map_shards,
    new_group,
    shard,
    shard_indices,
    to_cpu,
)

__all__ = [
    "Assignment",
    "RemoteRankError",
    "all_gather_objects",
    "all_reduce_",
    "all_reduce_sum",
    "assign",
    "barrier",
    "broadcast_object",
    "broadcast_tensors",
    "enabled",
    "gather_objects",
    "gather_results",
    "guard",
    "init_from_env",
    "is_initialized",
    "is_main",
    "local_only",
    "local_rank",
    "map_shards",
    "new_group",
    "rank",
    "shard",
    "shard_indices",
    "shutdown",
    "to_cpu",
    "world_size",
]
