"""Progress output fit for its reader: a bar on a terminal, a line per tenth in a log, nothing when quiet."""

from __future__ import annotations

import io
import subprocess
import sys

import pytest

from toolchain.progress import LineProgress, NoProgress, progress, set_quiet


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture(autouse=True)
def _not_quiet(monkeypatch):
    monkeypatch.delenv("TQDM_DISABLE", raising=False)
    set_quiet(False)
    yield
    set_quiet(False)


def test_a_log_gets_one_line_per_tenth_and_no_redraws():
    log = io.StringIO()
    bar = progress(300, "deep-ensemble member 1/2", stream=log)
    assert isinstance(bar, LineProgress)
    for step in range(300):
        bar.update(1)
        bar.set_postfix(loss=f"{1.0 / (step + 1):.4f}")
    bar.close()
    lines = log.getvalue().splitlines()
    assert len(lines) == 10 and "\r" not in log.getvalue()
    assert lines[0].startswith("  deep-ensemble member 1/2: 30/300 steps (10%")
    assert lines[-1].startswith("  deep-ensemble member 1/2: 300/300 steps (100%")


def test_short_loops_print_each_step_once_at_most():
    log = io.StringIO()
    bar = progress(3, "bench", unit="round", stream=log)
    for _ in range(3):
        bar.update(1)
    assert log.getvalue().splitlines() == ["  bench: 1/3 rounds (33%)", "  bench: 2/3 rounds (66%)",
                                           "  bench: 3/3 rounds (100%)"]


def test_a_terminal_gets_a_bar_unless_tqdm_is_disabled(monkeypatch):
    assert not isinstance(progress(10, "x", stream=_Terminal()), (LineProgress, NoProgress))
    monkeypatch.setenv("TQDM_DISABLE", "1")
    assert isinstance(progress(10, "x", stream=_Terminal()), LineProgress)


def test_quiet_and_disabled_show_nothing():
    log = io.StringIO()
    assert isinstance(progress(10, "x", stream=log, enabled=False), NoProgress)
    set_quiet(True)
    bar = progress(10, "x", stream=log)
    bar.update(10)
    assert log.getvalue() == ""


def test_help_shows_no_value_placeholder_on_flags():
    out = subprocess.run([sys.executable, "-m", "toolchain", "export", "--help"], capture_output=True, text=True,
                         env={"COLUMNS": "120", "PATH": ""}, check=True).stdout
    assert "<bool>" not in out and "<list[str]>" not in out
    assert "--force" in out and "STAGE" in out
    top = subprocess.run([sys.executable, "-m", "toolchain", "--help"], capture_output=True, text=True,
                         env={"COLUMNS": "120", "PATH": ""}, check=True).stdout
    assert "--quiet" in top and "<bool>" not in top
