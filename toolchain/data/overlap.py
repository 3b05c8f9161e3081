"""Rows an OOD data set shares with the in-distribution data: found, then dropped or refused.

An OOD row that is also an ID row is not out of distribution: a model scores it like any ID row,
and an OOD set that repeats the ID data measures nothing (AUROC about 0.5, reported as if it
were a result). :func:`drop_id_rows` compares every row of the OOD splits with every row of the
ID data set (all of it: an OOD row the model was trained on is no better):

* texts match when equal after whitespace normalisation (runs of spaces, tabs and newlines are
  one space; leading and trailing space ignored); case and punctuation count;
* images match when their pixel arrays are byte-identical (same shape, same bytes; hashed);
* a text data set never matches an image data set.

More than :data:`MAX_OVERLAP` of the OOD rows shared (an OOD set identical to the ID set, or
mostly copied from it), or a split left empty: :class:`~toolchain.errors.DataError` (exit 2)
naming both data sets and the count. Fewer: the shared rows are dropped from the OOD splits and
``warn`` gets one line saying how many. No overlap: the splits come back unchanged (the same
objects, so their fingerprints and every cache key are unchanged).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Hashable, Iterator, Mapping
from typing import TypeVar

import numpy as np

from toolchain.data.containers import ImageData, TextData
from toolchain.errors import DataError

__all__ = ["MAX_OVERLAP", "drop_id_rows", "row_keys"]

D = TypeVar("D", TextData, ImageData)

#: Largest fraction of the OOD rows that may also be ID rows (those are dropped, with a warning).
MAX_OVERLAP = 0.5


def _normalise(text: str) -> str:
    return " ".join(text.split())


def row_keys(data: TextData | ImageData) -> Iterator[Hashable]:
    """One comparison key per row: the whitespace-normalised text, or a hash of an image's shape and bytes."""
    if isinstance(data, TextData):
        yield from (("text", _normalise(t)) for t in data.texts)
        return
    shape = repr(tuple(data.images.shape[1:])).encode()
    for image in data.images:
        yield ("image", hashlib.blake2b(shape + np.ascontiguousarray(image).tobytes(), digest_size=20).digest())


def drop_id_rows(
    id_data: TextData | ImageData,
    ood_splits: Mapping[str, D],
    *,
    id_name: str,
    ood_name: str,
    warn: Callable[[str], None] | None = None,
    max_overlap: float = MAX_OVERLAP,
) -> dict[str, D]:
    """The OOD splits without the rows that are also rows of ``id_data`` (see the module docstring).

    Args:
        id_data: the whole in-distribution data set.
        ood_splits: split name -> OOD rows, e.g. ``{"ood_val": ..., "ood_test": ...}``.
        id_name: the ID data set as the recipe names it (``data.id``), for messages.
        ood_name: the OOD data set as the recipe names it (``data.ood``), for messages.
        warn: called with one line when rows are dropped.
        max_overlap: largest shared fraction of the OOD rows that is dropped rather than refused.

    Raises:
        DataError: more than ``max_overlap`` of the OOD rows are ID rows, or a split would be left empty.
    """
    if type(id_data) is not ImageData and type(id_data) is not TextData:
        return dict(ood_splits)
    if any(type(part) is not type(id_data) for part in ood_splits.values()):
        return dict(ood_splits)  # text vs images: nothing can match
    if isinstance(id_data, ImageData) and not all(
            part.images.shape[1:] == id_data.images.shape[1:] for part in ood_splits.values()):
        return dict(ood_splits)  # different image sizes: nothing can match
    seen = set(row_keys(id_data))
    shared = {name: np.fromiter((k in seen for k in row_keys(part)), dtype=bool, count=len(part))
              for name, part in ood_splits.items()}
    count = sum(int(m.sum()) for m in shared.values())
    if count == 0:
        return dict(ood_splits)
    total = sum(len(part) for part in ood_splits.values())
    how = ("the same text after whitespace normalisation" if isinstance(id_data, TextData)
           else "byte-identical images")
    per_split = ", ".join(f"{name}: {int(m.sum())} of {len(m)}" for name, m in shared.items())
    emptied = [name for name, m in shared.items() if m.all()]
    too_many = count > max_overlap * total
    if too_many or emptied:
        what = "identical to" if count == total else "mostly a copy of" if too_many else "overlapping"
        left = "" if too_many else f"; split(s) {', '.join(emptied)} would be left empty"
        raise DataError(
            f"OOD data set '{ood_name}' (data.ood) is {what} the in-distribution data set '{id_name}' (data.id): "
            f"{count} of its {total} OOD rows ({per_split}) are also ID rows ({how}){left}, so OOD detection "
            f"would measure nothing (AUROC about 0.5).",
            hint="Choose an OOD data set that differs from data.id, or remove the ID rows from it.",
        )
    if warn is not None:
        warn(f"OOD data set '{ood_name}': dropped {count} of {total} OOD rows ({per_split}) that are also rows of "
             f"the in-distribution data set '{id_name}' ({how}).")
    return {name: part.subset(~shared[name]) if shared[name].any() else part for name, part in ood_splits.items()}
