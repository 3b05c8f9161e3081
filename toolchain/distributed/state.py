"""Process group and shared state of :mod:`toolchain.distributed` (see the package docstring)."""

from __future__ import annotations

import atexit
import contextlib
import datetime
import logging
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import torch

from toolchain.errors import ToolchainError

log = logging.getLogger("toolchain.distributed")


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
#: the watcher's retries of a failed store read before it gives up (back-off doubling from 0.1 s: ~3 s in all)
WATCH_RETRIES = 5
WATCH_BACKOFF_S = 0.1
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
    #: why the watcher lost the store (it gave up reading it): this rank stops with "lost contact"
    lost: str | None = None
    watcher: threading.Thread | None = None
    watch_stop: threading.Event | None = None
    watch_lock: threading.Lock | None = None
    #: the watcher asked the watched thread to stop (raise :class:`~toolchain.distributed.failures.RemoteStop`)
    interrupted: bool = False
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


