"""Input validation shared by the metric functions (private).

Every public metric validates its inputs at entry and raises :class:`MetricInputError` (a
``ValueError`` and a :class:`~toolchain.errors.ToolchainError`) whose message names the argument
and, for non-finite values, the first offending index. Validated arrays are returned as float64
(or int64 for labels) copies-or-views, so the metrics compute in float64 whatever came in.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from toolchain.errors import ToolchainError

#: Tolerance on ``|sum_c probs[n, c] - 1|``: loose enough for float16/float32 softmax outputs,
#: tight enough to reject logits or unnormalised scores passed as probabilities.
PROB_SUM_ATOL = 1e-3


class MetricInputError(ToolchainError, ValueError):
    """A metric received an invalid array (shape, dtype, NaN/Inf, range, empty)."""


def _to_numpy(name: str, value: Any) -> np.ndarray:
    """Convert array-likes (lists, numpy arrays, CPU torch tensors) to a numpy array."""
    if hasattr(value, "detach") and hasattr(value, "cpu"):  # torch.Tensor, without importing torch
        value = value.detach().cpu().numpy()
    try:
        arr = np.asarray(value)
    except (TypeError, ValueError) as exc:  # ragged lists and similar
        raise MetricInputError(f"{name}: cannot be converted to an array ({exc}).") from exc
    return arr


def _first_index(mask: np.ndarray) -> tuple[int, ...]:
    return tuple(int(i) for i in np.argwhere(mask)[0])


def _fmt_index(idx: tuple[int, ...]) -> str:
    return str(idx[0]) if len(idx) == 1 else str(list(idx))


def as_float_array(name: str, value: Any, ndim: int, dims: str) -> np.ndarray:
    """Return ``value`` as a finite, non-empty float64 array with ``ndim`` dimensions.

    ``dims`` names the axes for messages (e.g. ``"[N, C]"``).
    """
    arr = _to_numpy(name, value)
    real = np.issubdtype(arr.dtype, np.integer) or np.issubdtype(arr.dtype, np.floating)
    if arr.dtype == bool or not real:
        raise MetricInputError(f"{name}: expected a real-valued numeric array, got dtype {arr.dtype}.")
    if arr.ndim != ndim:
        raise MetricInputError(f"{name}: expected shape {dims}, got shape {arr.shape} ({arr.ndim}-D).")
    if arr.size == 0:
        raise MetricInputError(f"{name}: empty array (shape {arr.shape}); every axis of {dims} must be >= 1.")
    arr = arr.astype(np.float64, copy=False)
    bad = ~np.isfinite(arr)
    if bad.any():
        idx = _first_index(bad)
        raise MetricInputError(
            f"{name}: non-finite value {float(arr[idx])!r} at index {_fmt_index(idx)} (NaN/Inf are not allowed)."
        )
    return arr


def as_probs(name: str, value: Any) -> np.ndarray:
    """Validate class probabilities ``[N, C]``: finite, in [0, 1], rows summing to 1."""
    probs = as_float_array(name, value, 2, "[N, C]")
    bad = (probs < 0.0) | (probs > 1.0 + PROB_SUM_ATOL)
    if bad.any():
        idx = _first_index(bad)
        raise MetricInputError(f"{name}: probability {float(probs[idx])!r} outside [0, 1] at index {_fmt_index(idx)}.")
    sums = probs.sum(axis=1)
    off = np.abs(sums - 1.0) > PROB_SUM_ATOL
    if off.any():
        i = int(np.flatnonzero(off)[0])
        raise MetricInputError(
            f"{name}: row {i} sums to {float(sums[i])!r}, not 1 (tolerance {PROB_SUM_ATOL}); "
            "pass probabilities (softmax outputs), not logits."
        )
    return probs


def as_labels(name: str, value: Any, n: int, n_classes: int) -> np.ndarray:
    """Validate integer class labels ``[N]`` in ``[0, n_classes)``; returns int64."""
    arr = _to_numpy(name, value)
    if arr.ndim != 1:
        raise MetricInputError(f"{name}: expected shape [N], got shape {arr.shape}.")
    if arr.size == 0:
        raise MetricInputError(f"{name}: empty array; need at least one label.")
    if arr.dtype == bool or not np.issubdtype(arr.dtype, np.integer):
        raise MetricInputError(f"{name}: expected integer class indices, got dtype {arr.dtype}.")
    if arr.shape[0] != n:
        raise MetricInputError(f"{name}: has {arr.shape[0]} labels but the probabilities have {n} rows.")
    bad = (arr < 0) | (arr >= n_classes)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise MetricInputError(f"{name}: label {int(arr[i])} at index {i} is out of range [0, {n_classes}).")
    return arr.astype(np.int64, copy=False)


def as_scores(name: str, value: Any) -> np.ndarray:
    """Validate a finite, non-empty 1-D score vector ``[N]``; returns float64."""
    return as_float_array(name, value, 1, "[N]")


def as_member_logits(name: str, value: Any) -> np.ndarray:
    """Validate finite, non-empty ensemble logits ``[N, M, C]``; returns float64."""
    return as_float_array(name, value, 3, "[N, M, C]")


def as_n_bins(n_bins: Any) -> int:
    """Validate a bin count (a positive integer, not a bool)."""
    if isinstance(n_bins, bool) or not isinstance(n_bins, int | np.integer) or n_bins < 1:
        raise MetricInputError(f"n_bins: expected a positive integer, got {n_bins!r}.")
    return int(n_bins)
