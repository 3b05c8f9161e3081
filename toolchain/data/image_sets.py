"""Real, offline image data sets: Fashion-MNIST (Debian idx files) and scikit-learn digits (OOD).

Fashion-MNIST comes from the Debian package ``dataset-fashion-mnist`` (gzipped idx files in
``/usr/share/datasets/fashion-mnist``); the folder can be overridden with ``root=`` or the
``HYDRA_FASHION_MNIST_DIR`` environment variable. The idx parser checks magic numbers and sizes
so that a truncated or corrupt file raises :class:`DataError` naming it.

The scikit-learn digits (8x8, values 0..16) are resized to the Fashion-MNIST size and rescaled
to ``uint8`` 0..255; both sets have dark backgrounds, which makes digits a natural
out-of-distribution set for Fashion-MNIST.
"""

from __future__ import annotations

import functools
import gzip
import os
import zlib
from pathlib import Path

import numpy as np
import torch

from toolchain.data.containers import ImageData
from toolchain.errors import DataError, MissingDependencyError

__all__ = [
    "DEFAULT_FASHION_MNIST_DIR",
    "FASHION_MNIST_CLASSES",
    "FASHION_MNIST_ENV",
    "load_digits",
    "load_fashion_mnist",
    "read_idx",
    "resize_images",
]

DEFAULT_FASHION_MNIST_DIR = Path("/usr/share/datasets/fashion-mnist")
FASHION_MNIST_ENV = "HYDRA_FASHION_MNIST_DIR"
FASHION_MNIST_CLASSES = [
    "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
    "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot",
]  # fmt: skip
_FASHION_PREFIX = {"train": "train", "test": "t10k"}
_IDX_UBYTE = 0x08


def read_idx(path: str | Path, ndim: int) -> np.ndarray:
    """Parse an idx file (optionally gzipped) of unsigned bytes with ``ndim`` dimensions.

    The result is cached in-process (keyed on path, size and mtime) and read-only.

    Raises:
        DataError: naming the file when it is truncated, corrupt or of the wrong kind.
    """
    path = Path(path)
    try:
        st = path.stat()
    except OSError as exc:
        raise DataError(f"cannot read idx file {path}: {exc.strerror or exc}") from exc
    return _read_idx_cached(str(path.resolve()), st.st_size, st.st_mtime_ns, ndim)


@functools.lru_cache(maxsize=8)
def _read_idx_cached(path: str, _size: int, _mtime_ns: int, ndim: int) -> np.ndarray:
    try:
        with open(path, "rb") as fh:
            raw = fh.read()
        data = gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw
    except (OSError, EOFError, zlib.error) as exc:
        raise DataError(f"idx file {path} is truncated or corrupt ({exc})") from exc
    magic = data[:4]
    if len(magic) < 4 or magic[:2] != b"\x00\x00" or magic[2] != _IDX_UBYTE or magic[3] != ndim:
        raise DataError(
            f"idx file {path} has magic {magic.hex()}, expected 000008{ndim:02x} "
            f"(unsigned bytes, {ndim} dimensions)"
        )
    header = 4 + 4 * ndim
    if len(data) < header:
        raise DataError(f"idx file {path} is truncated: {len(data)} bytes, shorter than its header")
    dims = tuple(int(d) for d in np.frombuffer(data, dtype=">u4", count=ndim, offset=4))
    expected = int(np.prod(dims, dtype=np.int64))
    if len(data) - header != expected:
        raise DataError(
            f"idx file {path} is truncated or corrupt: header says {dims} "
            f"({expected} bytes) but it holds {len(data) - header} bytes of data"
        )
    arr = np.frombuffer(data, dtype=np.uint8, offset=header).reshape(dims)
    arr.flags.writeable = False
    return arr


def _fashion_root(root: str | Path | None) -> Path:
    """``root`` argument, else ``$HYDRA_FASHION_MNIST_DIR``, else the Debian folder."""
    if root is not None:
        return Path(root)
    env = os.environ.get(FASHION_MNIST_ENV, "").strip()
    return Path(env) if env else DEFAULT_FASHION_MNIST_DIR


def _find_idx(folder: Path, stem: str) -> Path:
    for candidate in (folder / f"{stem}.gz", folder / stem):
        if candidate.is_file():
            return candidate
    raise MissingDependencyError(
        f"data set 'fashion-mnist' needs {stem}.gz in {folder}, which is missing "
        f"(apt-get install dataset-fashion-mnist, or set {FASHION_MNIST_ENV} or root= "
        "to a folder with the idx files)"
    )


def load_fashion_mnist(split: str = "train", root: str | Path | None = None) -> ImageData:
    """Fashion-MNIST ``train`` (60,000) or ``test`` (10,000) 28x28 ``uint8`` images, 10 classes.

    Raises:
        MissingDependencyError: the idx files are not there.
        DataError: unknown ``split``, or a truncated/corrupt/inconsistent file.
    """
    if split not in _FASHION_PREFIX:
        raise DataError(f"fashion-mnist split must be one of {sorted(_FASHION_PREFIX)}, got {split!r}")
    folder = _fashion_root(root)
    prefix = _FASHION_PREFIX[split]
    image_path = _find_idx(folder, f"{prefix}-images-idx3-ubyte")
    label_path = _find_idx(folder, f"{prefix}-labels-idx1-ubyte")
    images = read_idx(image_path, 3)
    labels = read_idx(label_path, 1)
    if len(images) != len(labels):
        raise DataError(
            f"fashion-mnist {split}: {image_path.name} has {len(images)} images "
            f"but {label_path.name} has {len(labels)} labels"
        )
    if len(labels) and labels.max() >= len(FASHION_MNIST_CLASSES):
        raise DataError(f"fashion-mnist {split}: {label_path} holds label {labels.max()} (expected 0..9)")
    return ImageData(images, labels, list(FASHION_MNIST_CLASSES), f"fashion-mnist/{split}")


def resize_images(images: torch.Tensor, size: int) -> torch.Tensor:
    """Bilinear resize of float ``[N, C, H, W]`` to ``[N, C, size, size]`` (antialiased down)."""
    if images.shape[-2:] == (size, size):
        return images
    down = size < max(images.shape[-2:])
    return torch.nn.functional.interpolate(
        images, size=(size, size), mode="bilinear", align_corners=False, antialias=down
    )


@functools.lru_cache(maxsize=1)
def _sklearn_digits() -> tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits as sk_load_digits

    bunch = sk_load_digits()
    labels = np.asarray(bunch.target, dtype=np.int64)
    labels.flags.writeable = False
    return np.asarray(bunch.images, dtype=np.float32), labels


@functools.lru_cache(maxsize=4)
def _digits_at(size: int) -> tuple[np.ndarray, np.ndarray]:
    images, labels = _sklearn_digits()
    x = torch.from_numpy(images * (255.0 / 16.0)).unsqueeze(1)
    x = resize_images(x, size).squeeze(1)
    out = x.round().clamp(0, 255).to(torch.uint8).numpy()
    out.flags.writeable = False
    return out, labels


def load_digits(size: int = 28) -> ImageData:
    """scikit-learn's 1,797 handwritten digits as ``uint8`` ``[N, size, size]`` in 0..255.

    Meant as an out-of-distribution set for Fashion-MNIST; classes are ``"0"`` .. ``"9"``.
    """
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise DataError(f"digits size must be a positive int, got {size!r}")
    images, labels = _digits_at(size)
    return ImageData(images, labels, [str(d) for d in range(10)], "digits")
