"""Progress of long loops, fit for whoever reads it.

On a terminal: a tqdm bar. Anywhere else (a CI log, a file), or with ``TQDM_DISABLE`` set: one
plain line each time another tenth of the loop is done (``  finetune: 30/300 steps (10%)``),
so a log holds at most ten lines per loop instead of hundreds of carriage-return redraws.
``--quiet`` (:func:`set_quiet`) shows nothing. Written here rather than configured in tqdm
because tqdm has no "milestones only" mode for files: its ``mininterval`` still rewrites one
line with carriage returns.
"""

from __future__ import annotations

import os
import sys
from typing import Any, TextIO

_STATE = {"quiet": False}


def set_quiet(quiet: bool) -> None:
    """Show no progress at all (the CLI's ``--quiet``)."""
    _STATE["quiet"] = bool(quiet)


def is_quiet() -> bool:
    """True after ``set_quiet(True)``."""
    return _STATE["quiet"]


def _tqdm_disabled() -> bool:
    return os.environ.get("TQDM_DISABLE", "").strip().lower() not in ("", "0", "false", "no")


class NoProgress:
    """Shows nothing."""

    def update(self, n: int = 1) -> None:
        """Nothing to show."""

    def set_postfix(self, **values: Any) -> None:
        """Nothing to show."""

    def set_postfix_str(self, text: str) -> None:
        """Nothing to show."""

    def close(self) -> None:
        """Nothing to close."""


class LineProgress(NoProgress):
    """One line per tenth of ``total`` (and one at the end), with the latest postfix."""

    def __init__(self, total: int, desc: str, unit: str, stream: TextIO) -> None:
        self.total, self.desc, self.unit, self.stream = max(int(total), 1), desc, unit, stream
        self.done, self.shown_tenths, self.postfix = 0, 0, ""

    def update(self, n: int = 1) -> None:
        """Count ``n`` more; print a line when another tenth is complete."""
        self.done += n
        tenths = min(10, self.done * 10 // self.total)
        if tenths > self.shown_tenths:
            self.shown_tenths = tenths
            extra = f", {self.postfix}" if self.postfix else ""
            print(f"  {self.desc}: {self.done}/{self.total} {self.unit}s ({100 * self.done // self.total}%{extra})",
                  file=self.stream, flush=True)

    def set_postfix(self, **values: Any) -> None:
        """Shown on the next line."""
        self.postfix = ", ".join(f"{k} {v}" for k, v in values.items())

    def set_postfix_str(self, text: str) -> None:
        """Shown on the next line."""
        self.postfix = text


def progress(total: int, desc: str, *, unit: str = "step", enabled: bool = True,
             stream: TextIO | None = None) -> Any:
    """A progress display for a loop of ``total`` units: a tqdm bar, lines, or nothing (see module docstring).

    The result has ``update(n)``, ``set_postfix(**kw)``, ``set_postfix_str(text)`` and ``close()``.
    """
    stream = stream if stream is not None else sys.stderr
    if not enabled or is_quiet():
        return NoProgress()
    if _tqdm_disabled() or not (hasattr(stream, "isatty") and stream.isatty()):
        return LineProgress(total, desc, unit, stream)
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit=unit, leave=False, file=stream)
