"""Input corruptions at five severities, seeded and label-preserving: the covariate-shift suites.

Text (:data:`TEXT_CORRUPTIONS`): character typos, word dropout, adjacent word swaps, casing and
punctuation noise. Images (:data:`IMAGE_CORRUPTIONS`, uint8 ``[N, H, W]``): Gaussian noise,
Gaussian blur, contrast reduction, pixelation, rotation. :func:`corrupt` applies one kind at one
severity (1-5) to a :class:`~toolchain.data.TextData` / :class:`~toolchain.data.ImageData` and
returns a new container with the same rows, in the same order, with the same labels.

**Seeded and nested.** Every random draw comes from ``(seed, kind, row)``, and is the same at every
severity: a text position is changed at severity ``s`` when its uniform draw is below the
severity's rate, so the positions changed at ``s`` are a subset of those changed at ``s + 1``;
an image gets the same noise field and rotation direction at every severity, only scaled up
(blur, contrast and pixelation draw nothing). So a larger severity is a stronger version of the
same corruption of the same row, and the distance from the clean input grows with it (tested:
``tests/data/test_shift.py``).

The rates are chosen so that severity 1 is a light perturbation a reader shrugs off and severity 5
is heavy but leaves most texts readable and most images recognisable (the style of
Hendrycks & Dietterich's ImageNet-C five-level suites).
"""

from __future__ import annotations

import hashlib
import string
from collections.abc import Sequence
from typing import Any

import numpy as np

from toolchain.data.containers import ImageData, TextData
from toolchain.errors import DataError

__all__ = ["IMAGE_CORRUPTIONS", "SEVERITIES", "TEXT_CORRUPTIONS", "corrupt", "corrupt_images", "corrupt_texts",
           "corruptions_for"]

SEVERITIES: tuple[int, ...] = (1, 2, 3, 4, 5)

#: per-character (typos) or per-word probability of a change, by severity 1..5
TEXT_CORRUPTIONS: dict[str, tuple[float, ...]] = {
    "typos": (0.02, 0.04, 0.07, 0.10, 0.15),
    "word_dropout": (0.05, 0.10, 0.18, 0.27, 0.38),
    "word_swap": (0.05, 0.10, 0.18, 0.27, 0.38),
    "case_punct": (0.10, 0.20, 0.35, 0.50, 0.70),
}
#: the severity's parameter: noise std (of 255), blur sigma (pixels), contrast factor, block size (pixels), degrees
IMAGE_CORRUPTIONS: dict[str, tuple[float, ...]] = {
    "gaussian_noise": (0.04, 0.08, 0.12, 0.18, 0.26),
    "blur": (0.5, 0.75, 1.0, 1.4, 1.9),
    "contrast": (0.75, 0.6, 0.45, 0.32, 0.2),
    "pixelate": (2, 3, 4, 5, 6),
    "rotate": (6.0, 12.0, 18.0, 25.0, 33.0),
}

_KEYBOARD = ["qwertyuiop", "asdfghjkl", "zxcvbnm"]
_NEIGHBOURS = {c: "".join(row[j] for j in (i - 1, i + 1) if 0 <= j < len(row)) for row in _KEYBOARD
               for i, c in enumerate(row)}
_PUNCT = ".,!?;:"


def _rng(seed: int, kind: str, row: int) -> np.random.Generator:
    """The generator of one row: the same draws at every severity."""
    digest = hashlib.sha256(f"{seed}:{kind}:{row}".encode()).digest()
    return np.random.default_rng(int.from_bytes(digest[:8], "little"))


def _check(kind: str, severity: int, table: dict[str, tuple[float, ...]], what: str) -> float:
    if kind not in table:
        raise DataError(f"unknown {what} corruption '{kind}'; choose one of {', '.join(table)}.")
    if isinstance(severity, bool) or severity not in SEVERITIES:
        raise DataError(f"corruption severity must be one of {SEVERITIES}; got {severity!r}.")
    return table[kind][severity - 1]


# ------------------------------------------------------------------------------------ text
def _typos(text: str, rate: float, rng: np.random.Generator) -> str:
    u = rng.random(len(text))
    op = rng.integers(0, 4, len(text))  # 0 neighbour key, 1 delete, 2 repeat, 3 swap with the next
    pick = rng.random(len(text))
    out: list[str] = []
    i = 0
    while i < len(text):
        c = text[i]
        if u[i] >= rate or not c.isalpha():
            out.append(c)
            i += 1
            continue
        if op[i] == 0:
            near = _NEIGHBOURS.get(c.lower(), "") or string.ascii_lowercase
            new = near[int(pick[i] * len(near))]
            out.append(new.upper() if c.isupper() else new)
        elif op[i] == 2:
            out.append(c + c)
        elif op[i] == 3 and i + 1 < len(text):
            out.append(text[i + 1] + c)
            i += 1
        elif op[i] != 1:
            out.append(c)
        i += 1
    return "".join(out) or text


def _words(text: str, rate: float, rng: np.random.Generator, kind: str) -> str:
    words = text.split()
    if len(words) < 2 and kind != "case_punct":
        return text
    u = rng.random(len(words))
    pick = rng.random(len(words))
    if kind == "word_dropout":
        kept = [w for w, x in zip(words, u, strict=True) if x >= rate]
        return " ".join(kept or [words[int(np.argmax(u))]])  # never empty: the least likely word to drop stays
    if kind == "word_swap":
        i = 0
        while i + 1 < len(words):
            if u[i] < rate:
                words[i], words[i + 1] = words[i + 1], words[i]
                i += 2
            else:
                i += 1
        return " ".join(words)
    out = []
    for w, x, p in zip(words, u, pick, strict=True):  # case_punct
        if x < rate:
            if p < 0.25:
                w = w.upper()
            elif p < 0.5:
                w = w.lower().capitalize() if w[:1].islower() else w.lower()
            elif p < 0.75:
                w = w + _PUNCT[int(p * 97) % len(_PUNCT)]
            else:
                w = w.strip(_PUNCT + "'\"") or w
        out.append(w)
    return " ".join(out)


def corrupt_texts(texts: Sequence[str], kind: str, severity: int, seed: int = 0) -> list[str]:
    """``texts`` with ``kind`` applied at ``severity`` (see the module docstring)."""
    rate = _check(kind, severity, TEXT_CORRUPTIONS, "text")
    if kind == "typos":
        return [_typos(t, rate, _rng(seed, kind, i)) for i, t in enumerate(texts)]
    return [_words(t, rate, _rng(seed, kind, i), kind) for i, t in enumerate(texts)]


# ------------------------------------------------------------------------------------ images
def _image(img: np.ndarray, kind: str, value: float, rng: np.random.Generator) -> np.ndarray:
    from scipy import ndimage

    x = img.astype(np.float32)
    if kind == "gaussian_noise":
        x = x + rng.standard_normal(x.shape).astype(np.float32) * value * 255.0
    elif kind == "blur":
        x = ndimage.gaussian_filter(x, sigma=value, mode="nearest")
    elif kind == "contrast":
        x = (x - x.mean()) * value + x.mean()
    elif kind == "pixelate":  # every k x k block (the last ones may be smaller) takes its mean
        k, (h, w) = int(value), x.shape
        rows, cols = np.arange(h) // k, np.arange(w) // k
        sums = np.zeros((rows[-1] + 1, cols[-1] + 1), np.float32)
        np.add.at(sums, (rows[:, None], cols[None, :]), x)
        counts = np.bincount(rows)[:, None] * np.bincount(cols)[None, :]
        x = (sums / counts)[rows[:, None], cols[None, :]]
    elif kind == "rotate":
        sign = 1.0 if rng.random() < 0.5 else -1.0
        x = ndimage.rotate(x, sign * value, reshape=False, order=1, mode="constant", cval=0.0)
    return np.clip(np.rint(x), 0, 255).astype(np.uint8)


def corrupt_images(images: np.ndarray, kind: str, severity: int, seed: int = 0) -> np.ndarray:
    """uint8 ``[N, H, W]`` images with ``kind`` applied at ``severity``; a new array."""
    value = _check(kind, severity, IMAGE_CORRUPTIONS, "image")
    if not isinstance(images, np.ndarray) or images.dtype != np.uint8 or images.ndim != 3:
        raise DataError(f"corrupt_images expects uint8 images [N, H, W]; got {getattr(images, 'dtype', type(images))}")
    return np.stack([_image(img, kind, value, _rng(seed, kind, i)) for i, img in enumerate(images)]) \
        if len(images) else images.copy()


# ------------------------------------------------------------------------------------ containers
def corruptions_for(data: Any) -> tuple[str, ...]:
    """The corruption kinds of ``data``'s modality."""
    return tuple(TEXT_CORRUPTIONS if isinstance(data, TextData) else IMAGE_CORRUPTIONS)


def corrupt(data: TextData | ImageData, kind: str, severity: int, seed: int = 0) -> TextData | ImageData:
    """A copy of ``data`` with ``kind`` at ``severity``: same rows, order, labels and classes."""
    name = f"{data.name}+{kind}@{severity}"
    if isinstance(data, TextData):
        return TextData(corrupt_texts(data.texts, kind, severity, seed), data.labels.copy(), list(data.class_names),
                        name)
    if isinstance(data, ImageData):
        return ImageData(corrupt_images(data.images, kind, severity, seed), data.labels.copy(),
                         list(data.class_names), name)
    raise DataError(f"corrupt() takes TextData or ImageData, got {type(data).__name__}")
