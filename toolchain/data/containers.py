"""Labelled data containers: :class:`TextData` and :class:`ImageData`.

Both hold a list/array of examples, an ``int64`` label array, the class names (label ``i`` is
``class_names[i]``) and a human-readable ``name``. They share ``len()``, :meth:`subset`,
:meth:`class_counts` and :meth:`fingerprint` (a SHA-256 of the contents, stable across runs and
machines, used to hash calibration data).

Arrays handed out by the loaders may be read-only views of an in-process cache; :meth:`subset`
always returns fresh, writeable copies.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Self

import numpy as np

from toolchain.errors import DataError

__all__ = ["ImageData", "LabelledData", "TextData"]

IndexLike = Sequence[int] | np.ndarray


def _as_labels(labels: object, n: int, class_names: Sequence[str], name: str) -> np.ndarray:
    """Validate labels (1-D integers in ``[0, len(class_names))``, one per example) as int64."""
    arr = np.asarray(labels)
    if arr.ndim != 1 or len(arr) != n:
        raise DataError(f"data set '{name}': expected {n} labels (1-D), got shape {arr.shape}")
    if n and not np.issubdtype(arr.dtype, np.integer):
        raise DataError(f"data set '{name}': labels must be integers, got dtype {arr.dtype}")
    arr = arr.astype(np.int64, copy=False)
    if n and (arr.min() < 0 or arr.max() >= len(class_names)):
        raise DataError(
            f"data set '{name}': labels must lie in [0, {len(class_names)}), got [{arr.min()}, {arr.max()}]"
        )
    return arr


def _as_index(indices: IndexLike, n: int) -> np.ndarray:
    """Turn integer indices or a boolean mask into an int64 index array."""
    idx = np.asarray(indices)
    if idx.size == 0:
        return np.zeros(0, dtype=np.int64)
    if idx.dtype == np.bool_:
        if idx.shape != (n,):
            raise DataError(f"boolean mask has shape {idx.shape}, expected ({n},)")
        return np.flatnonzero(idx)
    if idx.ndim != 1 or not np.issubdtype(idx.dtype, np.integer):
        raise DataError(f"indices must be a 1-D integer array, got {idx.dtype} with shape {idx.shape}")
    if idx.min() < -n or idx.max() >= n:
        raise DataError(f"indices out of range for {n} examples: [{idx.min()}, {idx.max()}]")
    return idx.astype(np.int64, copy=False)


class LabelledData:
    """Behaviour shared by :class:`TextData` and :class:`ImageData` (not used directly)."""

    labels: np.ndarray
    class_names: list[str]
    name: str

    def _validate(self, n: int) -> None:
        if not self.class_names or len(set(self.class_names)) != len(self.class_names):
            raise DataError(f"data set '{self.name}': class names must be unique and non-empty")
        object.__setattr__(self, "class_names", list(self.class_names))
        object.__setattr__(self, "labels", _as_labels(self.labels, n, self.class_names, self.name))

    def __len__(self) -> int:
        return len(self.labels)

    def class_counts(self) -> dict[str, int]:
        """Examples per class, in class order (classes with no example count 0)."""
        counts = np.bincount(self.labels, minlength=len(self.class_names))
        return {c: int(k) for c, k in zip(self.class_names, counts)}

    def _take(self, idx: np.ndarray, name: str) -> Self:
        raise NotImplementedError

    def subset(self, indices: IndexLike, name: str | None = None) -> Self:
        """Examples at ``indices`` (ints or a boolean mask), in that order, as fresh copies."""
        return self._take(_as_index(indices, len(self)), self.name if name is None else name)

    def _content_chunks(self) -> Iterator[bytes]:
        raise NotImplementedError

    def fingerprint(self) -> str:
        """SHA-256 (hex) of kind, class names, labels and examples; the ``name`` is not hashed."""
        h = hashlib.sha256()
        h.update(type(self).__name__.encode())
        h.update(json.dumps(self.class_names).encode())
        h.update(self.labels.astype("<i8").tobytes())
        for chunk in self._content_chunks():
            h.update(chunk)
        return h.hexdigest()


@dataclass(frozen=True, eq=False, repr=False)
class TextData(LabelledData):
    """Texts with integer labels (``labels[i]`` indexes ``class_names``)."""

    texts: list[str]
    labels: np.ndarray
    class_names: list[str]
    name: str

    def __post_init__(self) -> None:
        object.__setattr__(self, "texts", list(self.texts))
        if not all(isinstance(t, str) for t in self.texts):
            raise DataError(f"data set '{self.name}': every text must be a str")
        self._validate(len(self.texts))

    def _take(self, idx: np.ndarray, name: str) -> TextData:
        return TextData([self.texts[i] for i in idx], self.labels[idx], self.class_names, name)

    def _content_chunks(self) -> Iterator[bytes]:
        for text in self.texts:
            b = text.encode("utf-8", "surrogatepass")
            yield len(b).to_bytes(8, "little")
            yield b

    def __repr__(self) -> str:
        return f"TextData(name={self.name!r}, n={len(self)}, classes={self.class_names})"


@dataclass(frozen=True, eq=False, repr=False)
class ImageData(LabelledData):
    """Grayscale ``uint8`` images ``[N, H, W]`` with integer labels."""

    images: np.ndarray
    labels: np.ndarray
    class_names: list[str]
    name: str

    def __post_init__(self) -> None:
        images = self.images
        if not isinstance(images, np.ndarray) or images.dtype != np.uint8 or images.ndim != 3:
            got = f"{images.dtype} {images.shape}" if isinstance(images, np.ndarray) else type(images)
            raise DataError(f"data set '{self.name}': images must be a uint8 array [N, H, W], got {got}")
        self._validate(len(images))

    def _take(self, idx: np.ndarray, name: str) -> ImageData:
        return ImageData(self.images[idx], self.labels[idx], self.class_names, name)

    def _content_chunks(self) -> Iterator[bytes]:
        yield json.dumps(list(self.images.shape)).encode()
        yield np.ascontiguousarray(self.images).tobytes()

    def __repr__(self) -> str:
        n, height, width = self.images.shape
        return f"ImageData(name={self.name!r}, n={n}, size={height}x{width}, classes={self.class_names})"
