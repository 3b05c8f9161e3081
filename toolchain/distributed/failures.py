"""Failure propagation between ranks: the store side channel, :func:`guard`, :func:`barrier`."""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from toolchain import interrupts
from toolchain.distributed.state import (
    _ACK_KEY,
    _ERROR_KEY,
    DEFAULT_GRACE_S,
    GRACE_ENV,
    WATCH_BACKOFF_S,
    WATCH_INTERVAL_S,
    WATCH_RETRIES,
    RemoteRankError,
    T,
    _dist,
    _env_float,
    _state,
    _tolerated,
    enabled,
    log,
)
from toolchain.errors import ToolchainError


class RemoteStop(KeyboardInterrupt):
    """Raised in the watched thread by the failure watcher: another rank failed, or the store is gone.

    A ``KeyboardInterrupt`` (code that lets an interruption through lets this through too);
    :func:`guard` turns it into :class:`RemoteRankError` with the failing rank's message.
    """

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
        if isinstance(exc, RemoteStop) and _state.lost is not None:  # the watcher lost the store
            lost = RemoteRankError(f"rank {_state.rank} lost contact with the other ranks in {what}: {_state.lost} "
                                   "(the store host, rank 0, crashed, was killed or exited; see its log)",
                                   exit_code=2)
            log.error("%s; stopping", lost)
            _abort()  # nothing to post: the store is gone
            return lost
    _post_and_abort(exc)
    return exc


def _raise_in(thread_id: int, exc_type: type[BaseException] | None) -> bool:
    """Raise ``exc_type`` in thread ``thread_id`` at its next bytecode (None: cancel a pending one).

    Unlike ``_thread.interrupt_main()`` (a simulated SIGINT), this does not depend on the SIGINT
    disposition: a process started in the background by a non-interactive shell (``cmd &``,
    ``nohup``-style launchers, CI runners) inherits SIGINT *ignored*, and ``interrupt_main`` then
    does nothing, so a busy rank never stopped (tests/distributed [fail-busy, hang]).
    """
    done = ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread_id),
                                                      ctypes.py_object(exc_type) if exc_type is not None else None)
    return done == 1


def _start_watcher() -> None:
    store = _watch_store()
    if store is None:
        return
    stop, lock = threading.Event(), threading.Lock()
    me = _state.rank
    nccl = "nccl" in _state.backend
    watched = threading.get_ident()  # the thread that entered the guard (normally the main thread)

    def stop_watched() -> None:
        """Make the watched thread raise :class:`RemoteStop` (called with ``lock`` held)."""
        if nccl:  # NCCL does not notice a dead peer by itself: make its collectives fail
            _abort()
        if not _state.waiting:  # busy computing: stop it now (a wait ends by itself: its collective fails)
            _state.interrupted = _raise_in(watched, RemoteStop)

    def read() -> dict | None:
        """The posted error, retrying a failed read with a short back-off; raises when the store stays gone."""
        delay = WATCH_BACKOFF_S
        for attempt in range(WATCH_RETRIES + 1):
            try:
                return _read_error(store)
            except Exception as exc:
                if attempt == WATCH_RETRIES or stop.is_set():
                    raise
                log.debug("failure watcher: reading the store failed (%s: %s); retry %d of %d in %.1f s",
                          type(exc).__name__, exc, attempt + 1, WATCH_RETRIES, delay)
                if stop.wait(delay):
                    raise
                delay *= 2
        return None

    def watch() -> None:
        while not stop.wait(WATCH_INTERVAL_S):
            try:
                info = read()
            except Exception as exc:
                with lock:
                    if stop.is_set() or _state.remote is not None:
                        return
                    reason = f"the rendezvous store stopped answering ({type(exc).__name__}: {exc})"
                    log.warning("rank %d: failure watcher gives up after %d retries: %s; stopping this rank",
                                me, WATCH_RETRIES, reason)
                    _state.lost = reason
                    stop_watched()
                return
            if info is None or info.get("rank") == me:
                continue
            with lock:
                if stop.is_set() or _state.remote is not None:
                    return  # the main thread already knows
                _state.remote = info
                _ack(store)
                stop_watched()
            return

    _state.watch_stop, _state.watch_lock, _state.interrupted = stop, lock, False
    _state.watcher = threading.Thread(target=watch, name="hydra-dist-watch", daemon=True)
    _state.watcher.start()


def _stop_watcher() -> None:
    """Stop the watcher thread; a stop it requested and the watched thread has not yet raised is cancelled."""
    if _state.watcher is None:
        return
    with _state.watch_lock:
        _state.watch_stop.set()
        if _state.interrupted:  # not raised yet (or raised already: then this cancels nothing)
            _raise_in(threading.get_ident(), None)
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
        try:
            yield
        finally:
            if outer:
                _stop_watcher()
        if outer and (_state.remote is not None or (_state.lost is not None and _state.interrupted)):
            raise RemoteStop  # another rank failed as this block ended (a stop not yet raised was cancelled)
    except BaseException as exc:
        if outer:
            _stop_watcher()  # again: a stop raised inside the first call cut it short
        err = _handle_failure(exc, what)
        if err is exc:
            raise
        raise err from exc
    finally:
        _state.guard_depth -= 1


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

