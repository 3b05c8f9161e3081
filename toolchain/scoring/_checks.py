"""Argument checks shared by scoring and pruning: every error names the argument and the value."""

from __future__ import annotations

import math
from collections.abc import Collection
from typing import Any

__all__ = ["check_choice", "check_float", "check_int"]


def check_choice(name: str, value: Any, choices: Collection[str]) -> str:
    """``value`` if it is one of ``choices``, else ValueError listing them."""
    if not isinstance(value, str) or value not in choices:
        raise ValueError(f"{name}={value!r} is not valid; choose one of: {', '.join(sorted(choices))}")
    return value


def check_int(name: str, value: Any, *, lo: int | None = None, hi: int | None = None) -> int:
    """``value`` as int if it is an integer (not bool) in ``[lo, hi]``, else ValueError."""
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    value = int(value)
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        bounds = f"[{lo if lo is not None else '-inf'}, {hi if hi is not None else 'inf'}]"
        raise ValueError(f"{name}={value} is out of range; it must lie in {bounds}")
    return value


def check_float(
    name: str,
    value: Any,
    *,
    lo: float | None = None,
    hi: float | None = None,
    lo_open: bool = False,
    hi_open: bool = False,
) -> float:
    """``value`` as float if finite and within the (half-)open or closed bounds, else ValueError."""
    if isinstance(value, bool) or not hasattr(value, "__float__"):
        raise ValueError(f"{name} must be a number, got {value!r}")
    v = float(value)
    bad = not math.isfinite(v)
    if lo is not None:
        bad = bad or (v <= lo if lo_open else v < lo)
    if hi is not None:
        bad = bad or (v >= hi if hi_open else v > hi)
    if bad:
        left = "(" if lo_open else "["
        right = ")" if hi_open else "]"
        bounds = f"{left}{lo if lo is not None else '-inf'}, {hi if hi is not None else 'inf'}{right}"
        raise ValueError(f"{name}={value!r} is out of range; it must lie in {bounds}")
    return v
