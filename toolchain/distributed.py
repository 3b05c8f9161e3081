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
  store every 0.2 s and interrupts the main thread (a rank busy computing stops within a fraction
  of a second); it then raises :class:`RemoteRankError` carrying the failing rank's message and
  exit code. A rank that dies without posting (killed) is reported as lost contact; a rank that
  hangs is bounded by the process-group timeout. :func:`barrier` waits on the store (no time
  limit, so a long rank-0-only stage is fine) while watching for posted errors and for the store
  host going away.

Collectives must be called by every rank of the group in the same order (the usual rule); the
library functions that use them (:func:`toolchain.scoring.score_heads`, the circuit search,
data-parallel :func:`toolchain.pruning.finetune.finetune`) do so by construction.
"""

from __future__ import annotations

import _thread
import atexit
import contextlib
import datetime
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
import torch

from toolchain import interrupts
from toolchain.errors import ToolchainError

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

log = logging.getLogger(__name__)


@contextlib.contextmanager
def _tolerated(why: str) -> Iterator[None]:
    """Run a best-effort step of failure handling or teardown; log (debug, with ``why``) instead of raise.

    Its own failure must not hide the error being handled.
    """
    try:
        yield
    except Exception as exc:
        log.debug("%s failed: %s: %s", why, type(exc).__name__, exc)

T = TypeVar("T")

TIMEOUT_ENV = "HYDRA_DIST_TIMEOUT_S"
GRACE_ENV = "HYDRA_DIST_GRACE_S"
BACKEND_ENV = "HYDRA_DIST_BACKEND"
DEFAULT_TIMEOUT_S = 1800.0
DEFAULT_GRACE_S = 10.0
WATCH_INTERVAL_S = 0.2
_ERROR_KEY = "error"
_ACK_KEY = "error-ack"


class RemoteRankError(ToolchainError):
    """Another rank failed (or could not be reached): this rank stops too.

    ``exit_code`` is the failing rank's (2 for a toolchain error, 4 for an internal error, 130 for
    an interruption); ``remote_rank`` is the failing rank (None when unknown).
    """

    def __init__(self, message: str, *, remote_rank: int | None = None, exit_code: int = 2) -> None:
        super().__init__(message)
        self.remote_rank = remote_rank
        self.exit_code = exit_code


@dataclass
class _State:
    local_depth: int = 0
    guard_depth: int = 0
    aborted: bool = False
    handled: bool = False
    acked: bool = False
    world: int = 1
    rank: int = 0
    backend: str = ""
    barrier_seq: int = 0
    waiting: int = 0
    store: Any = None
    remote: dict | None = None
    watcher: threading.Thread | None = None
    watch_stop: threading.Event | None = None
    watch_lock: threading.Lock | None = None
    initialised_here: bool = False


_state = _State()


def _dist() -> Any:
    import torch.distributed as dist

    return dist


# ---------------------------------------------------------------------------- process group
def _env_float(name: str, default: float) -> float:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ToolchainError(f"environment variable {name}={raw!r} must be a number of seconds.") from None
    if value <= 0:
        raise ToolchainError(f"environment variable {name}={raw!r} must be > 0.")
    return value


def init_from_env(*, backend: str | None = None, timeout_s: float | None = None) -> bool:
    """Initialise the default process group from the launcher's environment variables.

    Does nothing (returns False) when ``WORLD_SIZE`` is absent or 1, or torch has no
    distributed support. Returns True when a process group of more than one rank is (now or
    already) initialised.

    Args:
        backend: ``"gloo"``, ``"nccl"``, ... (default: ``HYDRA_DIST_BACKEND``, else
            ``"cpu:gloo,cuda:nccl"`` when CUDA is available, else ``"gloo"``).
        timeout_s: collective timeout (default ``HYDRA_DIST_TIMEOUT_S``, else 1800 s).

    Raises:
        ToolchainError: ``WORLD_SIZE`` > 1 but ``RANK`` / ``MASTER_ADDR`` / ``MASTER_PORT`` missing.
    """
    if not torch.distributed.is_available():
        return False
    dist = _dist()
    if dist.is_initialized():
        _cache_world()
        return _state.world > 1
    try:
        world = int(os.environ.get("WORLD_SIZE", "1") or 1)
    except ValueError:
        raise ToolchainError(f"WORLD_SIZE={os.environ['WORLD_SIZE']!r} is not an integer.") from None
    if world <= 1:
        return False
    missing = [k for k in ("RANK", "MASTER_ADDR", "MASTER_PORT") if not os.environ.get(k)]
    if missing:
        raise ToolchainError(
            f"WORLD_SIZE={world} but {', '.join(missing)} is not set: launch with torchrun or accelerate launch, "
            "or set RANK, MASTER_ADDR and MASTER_PORT yourself."
        )
    cuda = torch.cuda.is_available()
    backend = backend or os.environ.get(BACKEND_ENV) or ("cpu:gloo,cuda:nccl" if cuda else "gloo")
    if cuda and "nccl" in backend:
        torch.cuda.set_device(local_rank() % torch.cuda.device_count())
    timeout = timeout_s if timeout_s is not None else _env_float(TIMEOUT_ENV, DEFAULT_TIMEOUT_S)
    dist.init_process_group(backend, init_method="env://", timeout=datetime.timedelta(seconds=timeout))
    _state.initialised_here = True
    _state.backend = backend
    _cache_world()
    atexit.register(_shutdown_at_exit)
    log.info("distributed: rank %d of %d (backend %s, timeout %.0f s)", _state.rank, _state.world, backend, timeout)
    return _state.world > 1


def _cache_world() -> None:
    dist = _dist()
    _state.world = dist.get_world_size()
    _state.rank = dist.get_rank()
    if not _state.backend:
        _state.backend = str(dist.get_backend())


def shutdown() -> None:
    """Destroy the process group (if this module created it and it is alive)."""
    dist = _dist()
    if _state.initialised_here and not _state.aborted and dist.is_initialized():
        with _tolerated("destroying the process group at shutdown (the job is ending anyway)"):
            dist.destroy_process_group()
    _state.initialised_here = False


def _shutdown_at_exit() -> None:
    with _tolerated("shutting torch.distributed down at interpreter exit"):
        shutdown()


def is_initialized() -> bool:
    """True when a default process group exists (also after this module aborted it)."""
    if not torch.distributed.is_available():
        return False
    return _state.aborted or _dist().is_initialized()


def enabled() -> bool:
    """True when collectives are in use: a process group of > 1 ranks, outside :func:`local_only`."""
    if _state.local_depth or not is_initialized():
        return False
    if not _state.aborted:
        _cache_world()
    return _state.world > 1


def local_rank() -> int:
    """``LOCAL_RANK`` (the rank on this machine; 0 when unset)."""
    return int(os.environ.get("LOCAL_RANK", "0") or 0)


def world_size(group: Any = None) -> int:
    """Number of ranks (of ``group``, default all); 1 in a single process or in :func:`local_only`."""
    if not enabled():
        return 1
    if group is None:
        return _state.world
    return _dist().get_world_size(group)


def rank(group: Any = None) -> int:
    """The rank of this process (in ``group``, default all); 0 in a single process or in :func:`local_only`."""
    if not enabled():
        return 0
    if group is None:
        return _state.rank
    return _dist().get_rank(group)


def is_main() -> bool:
    """True on rank 0 (and in a single process): the rank that writes artifacts."""
    return rank() == 0


@contextlib.contextmanager
def local_only() -> Iterator[None]:
    """Inside the block this process acts alone: world 1, rank 0, collectives are no-ops.

    For work that only one rank does (the pipeline's rank-0-only stages) and that calls library
    functions which would otherwise distribute themselves.
    """
    _state.local_depth += 1
    try:
        yield
    finally:
        _state.local_depth -= 1


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


# ---------------------------------------------------------------------------- collectives
def _collective(what: str, fn: Callable[[], T]) -> T:
    """Run one collective; a failure (a peer died, a timeout) becomes :class:`RemoteRankError`."""
    if _state.aborted:
        raise _remote_error(what, None)
    with _waiting():
        try:
            return fn()
        except RemoteRankError:
            raise
        except RuntimeError as exc:  # gloo / NCCL / store failures (a peer died, a timeout)
            raise _remote_error(what, exc) from exc


@contextlib.contextmanager
def _waiting() -> Iterator[None]:
    """Mark the main thread as waiting on the other ranks (the watcher must not interrupt it).

    A failure elsewhere ends such a wait by itself: the collective fails, the barrier sees the
    posted error.
    """
    _state.waiting += 1
    try:
        yield
    finally:
        _state.waiting -= 1


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


# ---------------------------------------------------------------------------- store side channel
def _store() -> Any:
    """A prefixed view of the rendezvous store (None when unavailable)."""
    if _state.store is not None:
        return _state.store
    try:
        from torch.distributed import distributed_c10d as c10d

        base = c10d._get_default_store()
        while isinstance(base, _dist().PrefixStore):
            base = base.underlying_store
    except Exception as exc:
        log.debug("no rendezvous store (failures cannot be posted to the other ranks): %s: %s",
                  type(exc).__name__, exc)
        return None
    _state.store = _prefixed(base)
    return _state.store


def _prefixed(base: Any) -> Any:
    run_id = os.environ.get("TORCHELASTIC_RUN_ID", "none")
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return _dist().PrefixStore(f"hydra-toolchain/{run_id}/{restart}", base)


def _watch_store() -> Any:
    """A second store connection for the watcher thread (the main thread may block on its own)."""
    store = _store()
    if store is None:
        return None
    try:
        base = store.underlying_store
        clone = base.clone() if hasattr(base, "clone") else base
        return _prefixed(clone)
    except Exception as exc:
        log.debug("cannot clone the store for the watcher, sharing the main one: %s: %s", type(exc).__name__, exc)
        return store


def _read_error(store: Any) -> dict | None:
    if store is None or not store.check([_ERROR_KEY]):
        return None
    try:
        return json.loads(store.get(_ERROR_KEY).decode())
    except (ValueError, UnicodeDecodeError):
        return {"rank": None, "type": "Error", "message": "unreadable error record", "exit_code": 2}


def _ack(store: Any) -> None:
    if _state.acked or store is None:
        return
    with _tolerated("acknowledging another rank's error (it stops waiting after its timeout)"):
        store.add(_ACK_KEY, 1)
        _state.acked = True


def _remote_from(info: dict, where: str) -> RemoteRankError:
    who = info.get("rank")
    text = f"{info.get('type', 'Error')}: {info.get('message', '')}".strip()
    return RemoteRankError(
        f"rank {who} failed: {text} (rank {_state.rank} stopped {where}; the job ends on every rank)",
        remote_rank=who,
        exit_code=int(info.get("exit_code", 2) or 2),
    )


def _remote_error(what: str, exc: BaseException | None, *, wait_s: float = 3.0) -> RemoteRankError:
    """The error to raise when a collective failed: the posted message if any rank posted one."""
    if _state.remote is not None:
        return _remote_from(_state.remote, f"in {what}")
    store = _store()
    deadline = time.monotonic() + wait_s
    info = None
    while store is not None:
        try:
            info = _read_error(store)
        except Exception as exc:
            log.debug("stopped waiting for a posted error: the store is gone (%s: %s)", type(exc).__name__, exc)
            break
        if info is not None or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    if info is not None and info.get("rank") != _state.rank:
        _state.remote = info
        _ack(store)
        return _remote_from(info, f"in {what}")
    detail = f": {type(exc).__name__}: {str(exc).splitlines()[0][:300]}" if exc is not None else ""
    return RemoteRankError(
        f"rank {_state.rank} lost contact with the other ranks during {what}{detail} (another rank crashed, was "
        "killed or timed out; see its log)",
        exit_code=2,
    )


def _exit_code_of(exc: BaseException) -> int:
    if isinstance(exc, KeyboardInterrupt):
        return 130
    if isinstance(exc, ToolchainError):
        return int(exc.exit_code)
    return 4


def _abort() -> None:
    """Abort every process group of this process (peers blocked in a collective fail at once)."""
    if _state.aborted:
        return
    _state.aborted = True
    dist = _dist()
    if not dist.is_initialized():
        return
    try:
        from torch.distributed import distributed_c10d as c10d

        c10d._abort_process_group()
    except Exception as exc:
        log.debug("aborting the process group failed (%s: %s); destroying it instead", type(exc).__name__, exc)
        with _tolerated("destroying the process group after a failed abort"):
            dist.destroy_process_group()


def _post_and_abort(exc: BaseException) -> None:
    """On a failure of this rank: post its message (first error wins), abort, wait for acknowledgements."""
    store = _store()
    msg = str(exc) or repr(exc)
    record = json.dumps({"rank": _state.rank, "type": type(exc).__name__, "message": msg[:4000],
                         "exit_code": _exit_code_of(exc)})
    first = False
    if store is not None:
        with _tolerated("posting this rank's error to the store (the others see the collective fail instead)"):
            first = store.compare_set(_ERROR_KEY, "", record).decode() == record
            if not first:  # another rank failed first (e.g. everyone got SIGTERM): acknowledge its error
                _ack(store)
    log.error("rank %d failed: %s: %s; stopping every rank", _state.rank, type(exc).__name__, msg)
    _abort()
    if not first:
        return
    deadline = time.monotonic() + _env_float(GRACE_ENV, DEFAULT_GRACE_S)
    while time.monotonic() < deadline:  # keep the store (rank 0 hosts it) up until the others read it
        try:
            if store.add(_ACK_KEY, 0) >= _state.world - 1:
                break
        except Exception as exc:
            log.debug("stopped waiting for acknowledgements: the store is gone (%s: %s)", type(exc).__name__, exc)
            break
        time.sleep(0.05)


def _handle_failure(exc: BaseException, what: str) -> BaseException:
    """What to raise on this rank for ``exc`` inside :func:`guard`."""
    if _state.handled:
        return exc
    _state.handled = True
    if isinstance(exc, RemoteRankError):
        if exc.remote_rank is None:  # lost contact or timed out, nobody posted: tell the others
            _post_and_abort(exc)
            return exc
        _ack(_store())
        _abort()
        return exc
    if isinstance(exc, KeyboardInterrupt):
        info = _state.remote
        if info is None:
            with _tolerated("reading another rank's posted error after an interrupt"):
                info = _read_error(_store())
        if info is not None and info.get("rank") != _state.rank:
            _state.remote = info
            _ack(_store())
            _abort()
            return _remote_from(info, f"in {what}")
    _post_and_abort(exc)
    return exc


def _start_watcher() -> None:
    store = _watch_store()
    if store is None:
        return
    stop, lock = threading.Event(), threading.Lock()
    me = _state.rank
    nccl = "nccl" in _state.backend

    def watch() -> None:
        while not stop.wait(WATCH_INTERVAL_S):
            try:
                info = _read_error(store)
            except Exception as exc:
                log.debug("failure watcher stopped: the store is gone (%s: %s)", type(exc).__name__, exc)
                return
            if info is None or info.get("rank") == me:
                continue
            with lock:
                if stop.is_set() or _state.remote is not None:
                    return  # the main thread already knows
                _state.remote = info
                _ack(store)
                if nccl:  # NCCL does not notice a dead peer by itself: make its collectives fail
                    _abort()
                if not _state.waiting:  # busy computing: stop it now
                    _thread.interrupt_main()
            return

    _state.watch_stop, _state.watch_lock = stop, lock
    _state.watcher = threading.Thread(target=watch, name="hydra-dist-watch", daemon=True)
    _state.watcher.start()


def _stop_watcher() -> None:
    if _state.watcher is None:
        return
    with _state.watch_lock:
        _state.watch_stop.set()
    _state.watcher.join(timeout=2 * WATCH_INTERVAL_S + 1)
    _state.watcher = None


@contextlib.contextmanager
def guard(what: str = "the distributed job") -> Iterator[None]:
    """Make a failure on any rank end the block on every rank with that rank's message.

    On this rank's exception: post it, abort the process group, wait (bounded) for the others
    to read it, re-raise it. Another rank's failure surfaces here as :class:`RemoteRankError`
    (from a failed collective, a :func:`barrier`, or the watcher thread's interrupt). Nesting is
    fine (the outermost guard runs the watcher). A no-op without a process group.
    """
    if not enabled():
        yield
        return
    outer = _state.guard_depth == 0
    _state.guard_depth += 1
    if outer:
        _start_watcher()
    try:
        yield
    except BaseException as exc:
        if outer:
            _stop_watcher()
        err = _handle_failure(exc, what)
        if err is exc:
            raise
        raise err from exc
    finally:
        _state.guard_depth -= 1
        if outer:
            _stop_watcher()


def barrier(group: Any = None, *, what: str = "barrier") -> None:
    """Wait until every rank arrives.

    The world barrier waits on the rendezvous store with no time limit (a long rank-0-only stage
    is fine) and raises :class:`RemoteRankError` as soon as another rank posts a failure or the
    store host disappears. A subgroup barrier is torch's (process-group timeout).
    """
    if not enabled():
        return
    if group is not None:
        _collective(what, lambda: _dist().barrier(group=group))
        return
    store = _store()
    if store is None:
        _collective(what, lambda: _dist().barrier())
        return
    if _state.aborted:
        raise _remote_error(what, None)
    _state.barrier_seq += 1
    key = f"barrier/{_state.barrier_seq}"
    w = _state.world
    with _waiting():
        try:
            store.add(f"{key}/arrive", 1)
        except Exception as exc:
            raise _remote_error(what, exc, wait_s=0.0) from exc
        if _state.rank == 0:
            _poll(store, what, lambda: store.add(f"{key}/arrive", 0) >= w)
            store.set(f"{key}/release", "1")
            # the others read the release from rank 0's store: keep it up until they did
            _poll(store, what, lambda: store.add(f"{key}/left", 0) >= w - 1,
                  limit_s=_env_float(GRACE_ENV, DEFAULT_GRACE_S))
        else:
            _poll(store, what, lambda: store.check([f"{key}/release"]))
            try:
                store.add(f"{key}/left", 1)
            except Exception as exc:
                raise _remote_error(what, exc, wait_s=0.0) from exc


def _poll(store: Any, what: str, ready: Callable[[], bool], limit_s: float | None = None) -> bool:
    """Wait until ``ready()``; raise :class:`RemoteRankError` on a posted failure or a lost store."""
    delay, start = 0.001, time.monotonic()
    while True:
        if _state.remote is not None:
            raise _remote_from(_state.remote, f"in {what}")
        try:
            if ready():
                return True
            info = _read_error(store)
        except Exception as exc:
            raise _remote_error(what, exc, wait_s=0.0) from exc
        if info is not None and info.get("rank") != _state.rank:
            _state.remote = info
            _ack(store)
            raise _remote_from(info, f"in {what}")
        if limit_s is not None and time.monotonic() - start > limit_s:
            return False
        interrupts.check()  # a graceful SIGTERM stops a rank waiting here
        time.sleep(delay)
        delay = min(delay * 2, 0.05)
