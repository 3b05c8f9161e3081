"""A graceful stop on SIGTERM: stop at the next safe point, not in the middle of a C++ call.

Raising ``KeyboardInterrupt`` straight from a signal handler lands wherever the main thread is:
inside an import of a pybind11 extension (onnx, onnxruntime), inside torch's ONNX tracer, inside a
C++ callback into Python. Interrupted there, the process can abort (``std::terminate``), crash at
interpreter shutdown, or segfault; the CI saw exit -11 and local runs -6 and -2 when a SIGTERM
landed at the start of the export stage. So the first SIGTERM only records the request, and the
run stops at the next **safe point** (:func:`check`): between fine-tuning steps and batches, between
stages, between exported graphs, between benchmark rounds. If none comes within
:data:`GRACE_S` seconds (``install(grace_s=...)``; a long C++ call), or a second SIGTERM arrives,
the handler raises at once (the old behaviour). Either way the stage's ``except BaseException``
cleanup runs, the half-built stage folder is removed, and the CLI exits 130.

SIGINT (Ctrl-C) keeps Python's default (or the ignore a background job inherits);
``toolchain.distributed`` stops a busy rank with an asynchronous exception in its thread, not
with SIGINT, so it works either way.
"""

from __future__ import annotations

import _thread
import os
import signal
import threading

#: seconds from the first SIGTERM to a forced stop when no safe point comes (orchestrators such as
#: Kubernetes and torchrun send SIGKILL some 30 s after SIGTERM)
GRACE_S = 10.0

_requested: int | None = None
_timer: threading.Timer | None = None
_grace_s = GRACE_S


def install(grace_s: float = GRACE_S) -> None:
    """Handle SIGTERM with a graceful stop (main thread only; the CLI calls it)."""
    global _grace_s
    _grace_s = float(grace_s)
    reset()
    signal.signal(signal.SIGTERM, _on_sigterm)


def reset() -> None:
    """Forget a recorded request and cancel its deadline (tests; a new run in the same process)."""
    global _requested
    _cancel_deadline()
    _requested = None


def requested() -> bool:
    """Whether a stop was requested and not yet acted on."""
    return _requested is not None


def check() -> None:
    """A safe point: raise ``KeyboardInterrupt`` if a stop was requested.

    Cheap (one global read); call it once per step, batch, graph or round of a long loop.
    """
    if _requested is not None:
        _cancel_deadline()
        raise KeyboardInterrupt(f"signal {_requested}")


def _cancel_deadline() -> None:
    global _timer
    if _timer is not None:
        _timer.cancel()
        _timer = None


def _on_sigterm(signum: int, _frame: object) -> None:
    global _requested, _timer
    if _requested is not None:  # a second signal, or the deadline: stop now
        _cancel_deadline()
        raise KeyboardInterrupt(f"signal {signum}")
    _requested = signum
    # os.write, not print: the handler may run in the middle of a buffered write to stderr
    os.write(2, f"\nSIGTERM: stopping at the next safe point (at most {_grace_s:g} s); send it again to stop "
                f"now\n".encode())
    _timer = threading.Timer(_grace_s, _thread.interrupt_main, args=(signal.SIGTERM,))
    _timer.daemon = True
    _timer.start()
