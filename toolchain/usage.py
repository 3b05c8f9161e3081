"""Usage mistakes on the command line: the click exceptions typer raises, shown with the usage line (exit 2).

typer >= 0.22 carries its own copy of click (``typer._click``), so ``click.ClickException`` of the
separate click package never matches what typer raises (typer 0.29.2: every usage mistake ended as
"internal error", exit 4). The classes are found from ``typer.BadParameter``, a ClickException
subclass in every typer, whichever click it uses.
"""

from __future__ import annotations

import sys

import typer
from rich.console import Console
from rich.markup import escape


def click_errors() -> tuple[type[Exception], ...]:
    """The ``ClickException`` classes to catch: the one typer raises, and the separate click's when installed."""
    found = [c for c in typer.BadParameter.__mro__ if c.__name__ == "ClickException"]
    try:
        import click
    except ImportError:
        pass
    else:
        found.append(click.ClickException)
    return tuple(dict.fromkeys(found))


#: what ``except`` catches for a usage mistake (missing argument or option, unknown command or option, bad value)
CLICK_ERRORS = click_errors()


def show_usage_error(exc: Exception) -> int:
    """Print the command's usage line, where to get help and ``error: <the problem>`` on stderr; return 2.

    No command at all (``NoArgsIsHelpError``): typer has printed the help already.
    """
    if type(exc).__name__ == "NoArgsIsHelpError":
        text = exc.format_message().strip()
        if text:
            print(text, file=sys.stderr)
        return 2
    out = Console(stderr=True, soft_wrap=True, highlight=False)
    ctx = getattr(exc, "ctx", None)
    if ctx is not None:
        out.print(escape(ctx.get_usage()))
        out.print(f"Try '{escape(ctx.command_path)} --help' for help.")
    out.print(f"[red]error[/red]: {escape(exc.format_message())}")
    return 2
