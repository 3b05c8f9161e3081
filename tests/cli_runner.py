"""``hydra-toolchain ARGS`` through the CLI's entry point in the test process (no interpreter start-up).

Importable from every test folder (tests/conftest.py puts this folder on ``sys.path``).
"""

from __future__ import annotations

import contextlib
import io
from types import SimpleNamespace


def run_cli(*args: str) -> SimpleNamespace:
    """Run the CLI with ``args``; ``returncode``, ``stdout`` and ``stderr`` as a subprocess would give them."""
    from toolchain.cli import main as entry

    out, err = io.StringIO(), io.StringIO()
    code = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            entry(list(args))
        except SystemExit as exc:
            code = int(exc.code or 0)
    return SimpleNamespace(returncode=code, stdout=out.getvalue(), stderr=err.getvalue())
