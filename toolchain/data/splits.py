"""Seeded, deterministic, disjoint (optionally stratified) splits, class checks and batching.

Sizes are ints (counts) or floats in ``(0, 1]`` (fractions of the whole data set, rounded); the
splits are carved, in the order given, out of one seeded ordering of the data
(``numpy.random.Generator(PCG64(seed))``), so they never overlap and whatever is left over is
unused. With ``stratify=True`` the ordering interleaves the classes evenly (each class is
shuffled, then its members are spread at even positions with a random phase), so any contiguous
chunk - hence every split - keeps the class proportions to within about one example per class.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Mapping
from typing import TypeVar

import numpy as np

from toolchain.data.containers import ImageData, TextData
from toolchain.errors import DataError

__all__ = ["batches", "check_classes", "make_splits", "split_indices"]

D = TypeVar("D", TextData, ImageData)

#: Splits that :func:`make_splits` checks for at least two classes by default.
CLASS_CHECKED_SPLITS = ("train", "calib")


def _resolve_sizes(sizes: Mapping[str, int | float], n: int, what: str) -> dict[str, int]:
    """Turn counts/fractions into counts; every split must be non-empty and all must fit."""
    if not sizes:
        raise DataError(f"no split sizes given for data set '{what}'")
    counts: dict[str, int] = {}
    used = 0
    for split, size in sizes.items():
        if isinstance(size, bool) or not isinstance(size, int | float | np.integer | np.floating):
            raise DataError(f"split '{split}': size must be an int count or a float fraction, got {size!r}")
        if isinstance(size, float | np.floating):
            if not 0.0 < size <= 1.0:
                raise DataError(f"split '{split}': fraction must be in (0, 1], got {size}")
            count = round(float(size) * n)
            if count == 0:
                raise DataError(f"split '{split}': fraction {size} of {n} examples of '{what}' is empty")
        else:
            count = int(size)
            if count <= 0:
                raise DataError(f"split '{split}': size must be > 0, got {count}")
        if used + count > n:
            raise DataError(
                f"split '{split}' asks for {count} examples but data set '{what}' has {n} "
                f"and {n - used} are left after the splits before it ({used} used)"
            )
        counts[split] = count
        used += count
    return counts


def _stratified_order(labels: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Return a permutation in which every contiguous chunk has roughly the overall class mix."""
    n = len(labels)
    keys = np.empty(n, dtype=np.float64)
    for c in np.unique(labels):
        members = rng.permutation(np.flatnonzero(labels == c))
        keys[members] = (np.arange(len(members)) + rng.random()) / len(members)
    return np.lexsort((rng.random(n), keys))


def split_indices(
    labels: np.ndarray,
    sizes: Mapping[str, int | float],
    seed: int,
    *,
    stratify: bool = True,
    what: str = "data",
) -> dict[str, np.ndarray]:
    """Disjoint index arrays, one per split (each shuffled), deterministic for ``seed``.

    Raises:
        DataError: empty data, a size <= 0, or splits that ask for more than there is.
    """
    labels = np.asarray(labels)
    n = len(labels)
    if n == 0:
        raise DataError(f"cannot split data set '{what}': it is empty")
    if isinstance(seed, bool) or not isinstance(seed, int | np.integer):
        raise DataError(f"split seed must be an int, got {seed!r}")
    counts = _resolve_sizes(sizes, n, what)
    rng = np.random.Generator(np.random.PCG64(int(seed)))
    order = _stratified_order(labels, rng) if stratify else rng.permutation(n)
    out: dict[str, np.ndarray] = {}
    start = 0
    for split, count in counts.items():
        out[split] = rng.permutation(order[start : start + count])
        start += count
    taken = np.concatenate(list(out.values()))
    if len(np.unique(taken)) != len(taken):  # cannot happen; kept as a guard, not an `assert`
        raise AssertionError("internal error: splits overlap")
    return out


def check_classes(data: D, split_name: str, min_classes: int = 2) -> D:
    """Return ``data`` if it is non-empty and has at least ``min_classes`` classes present.

    Raises:
        DataError: naming the split, its data set and the classes it has.
    """
    if len(data) == 0:
        raise DataError(f"split '{split_name}' ({data.name}) is empty")
    counts = data.class_counts()
    present = [c for c, k in counts.items() if k > 0]
    if len(present) < min_classes:
        absent = [c for c, k in counts.items() if k == 0]
        lacks = f"; it has no example of {', '.join(repr(c) for c in absent[:5])}" if absent else ""
        raise DataError(
            f"split '{split_name}' ({data.name}, {len(data)} examples) has {len(present)} "
            f"class(es) ({', '.join(present)}) but needs at least {min_classes}{lacks}.",
            hint=f"Make data.splits.{split_name} larger, use stratify=True, or add examples of the rarer classes.",
        )
    return data


def make_splits(
    data: D,
    sizes: Mapping[str, int | float],
    seed: int,
    stratify: bool = True,
    *,
    class_checked: Collection[str] = CLASS_CHECKED_SPLITS,
) -> dict[str, D]:
    """Split ``data`` into named, disjoint subsets, e.g. ``{"train": 2000, "calib": 256}``.

    Subsets are named ``"<data.name>/<split>"``. Splits named in ``class_checked`` (by default
    ``train`` and ``calib``) must hold at least two classes; pass ``class_checked=()`` to skip,
    e.g. for an OOD set split into ``{"ood_val": ..., "ood_test": ...}``.

    Raises:
        DataError: see :func:`split_indices` and :func:`check_classes`.
    """
    parts = split_indices(data.labels, sizes, seed, stratify=stratify, what=data.name)
    out = {split: data.subset(idx, name=f"{data.name}/{split}") for split, idx in parts.items()}
    for split in class_checked:
        if split in out:
            check_classes(out[split], split)
    return out


def batches(n: int, batch_size: int) -> Iterator[slice]:
    """Slices ``[0:b], [b:2b], ...`` covering ``range(n)``; the last one may be shorter."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise DataError(f"batch size must be a positive int, got {batch_size!r}")
    if n < 0:
        raise DataError(f"cannot batch a negative number of examples ({n})")
    return (slice(start, min(start + batch_size, n)) for start in range(0, n, batch_size))
