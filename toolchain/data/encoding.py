"""Turn data into model inputs: token ids for text, normalised pixel values for images.

:func:`encode` dispatches on the container type (:class:`TextData` or :class:`ImageData`), never
on a data set's name; :func:`encode_batches` yields ``(inputs, labels)`` batch by batch.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch

from toolchain.data.containers import ImageData, TextData
from toolchain.data.image_sets import resize_images
from toolchain.data.splits import batches
from toolchain.errors import DataError, ModelError

__all__ = ["encode", "encode_batches", "load_tokenizer", "to_pixel_values", "tokenize"]

Padding = Literal["max_length", "longest"]
_TEXT_KEYS = ("input_ids", "attention_mask", "token_type_ids")


def load_tokenizer(model_dir: str | Path) -> Any:
    """``transformers.AutoTokenizer`` from a local model folder (no network access).

    Raises:
        ModelError: the folder is missing or holds no usable tokenizer.
    """
    from transformers import AutoTokenizer

    path = Path(model_dir)
    if not path.is_dir():
        raise ModelError(f"model folder {path} does not exist; cannot load its tokenizer")
    try:
        return AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    except (OSError, ValueError) as exc:
        raise ModelError(f"model folder {path} has no usable tokenizer: {exc}") from exc


def tokenize(
    texts: Sequence[str], tokenizer: Any, max_length: int, padding: Padding = "max_length"
) -> dict[str, torch.Tensor]:
    """Tokenize with truncation to ``max_length``; pad to ``max_length`` or to the longest text.

    Returns int64 tensors ``[N, L]``: ``input_ids``, ``attention_mask`` and, when the tokenizer
    produces them, ``token_type_ids``.
    """
    if isinstance(texts, str):
        raise DataError("tokenize expects a list of texts, got a single str")
    if len(texts) == 0:
        raise DataError("tokenize got no texts")
    if padding not in ("max_length", "longest"):
        raise DataError(f"padding must be 'max_length' or 'longest', got {padding!r}")
    if isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 2:
        raise DataError(f"max_length must be an int >= 2 (room for the special tokens), got {max_length!r}")
    enc = tokenizer(list(texts), padding=padding, truncation=True, max_length=max_length, return_tensors="pt")
    return {k: enc[k].to(torch.int64) for k in _TEXT_KEYS if k in enc}


def _per_channel(value: float | Sequence[float], channels: int, what: str) -> torch.Tensor:
    t = torch.as_tensor(value, dtype=torch.float32).flatten()
    if t.numel() == 1:
        t = t.expand(channels)
    if t.numel() != channels:
        raise DataError(f"{what} has {t.numel()} values but the model takes {channels} channels")
    if what == "std" and bool((t <= 0).any()):
        raise DataError(f"std must be > 0, got {t.tolist()}")
    return t.view(1, channels, 1, 1)


def to_pixel_values(
    images: np.ndarray,
    image_size: int,
    num_channels: int,
    mean: float | Sequence[float] = 0.5,
    std: float | Sequence[float] = 0.5,
) -> torch.Tensor:
    """``uint8 [N, H, W]`` -> ``float32 [N, C, S, S]``: scale to [0, 1], resize, replicate, normalise.

    With the default ``mean = std = 0.5`` the values lie in ``[-1, 1]``.
    """
    if not isinstance(images, np.ndarray) or images.dtype != np.uint8 or images.ndim != 3:
        got = f"{images.dtype} {images.shape}" if isinstance(images, np.ndarray) else type(images).__name__
        raise DataError(f"to_pixel_values expects uint8 images [N, H, W], got {got}")
    for what, v in (("image_size", image_size), ("num_channels", num_channels)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise DataError(f"{what} must be a positive int, got {v!r}")
    x = torch.from_numpy(np.array(images, dtype=np.float32)).div_(255.0).unsqueeze(1)
    x = resize_images(x, image_size).clamp_(0.0, 1.0)
    x = x.expand(-1, num_channels, -1, -1)
    mean_t = _per_channel(mean, num_channels, "mean")
    std_t = _per_channel(std, num_channels, "std")
    return ((x - mean_t) / std_t).contiguous()


def encode(
    data: TextData | ImageData,
    *,
    tokenizer: Any = None,
    max_length: int = 128,
    padding: Padding = "max_length",
    image_size: int | None = None,
    num_channels: int = 1,
    mean: float | Sequence[float] = 0.5,
    std: float | Sequence[float] = 0.5,
) -> dict[str, torch.Tensor]:
    """Model inputs for all of ``data``: token tensors for text, ``pixel_values`` for images.

    ``image_size=None`` keeps the images' own (square) size.
    """
    if isinstance(data, TextData):
        if tokenizer is None:
            raise DataError(f"data set '{data.name}' is text: encode() needs a tokenizer")
        return tokenize(data.texts, tokenizer, max_length, padding)
    if isinstance(data, ImageData):
        size = image_size if image_size is not None else int(data.images.shape[1])
        return {"pixel_values": to_pixel_values(data.images, size, num_channels, mean, std)}
    raise DataError(f"encode() takes TextData or ImageData, got {type(data).__name__}")


def encode_batches(
    data: TextData | ImageData, batch_size: int, **encode_kwargs: Any
) -> Iterator[tuple[dict[str, torch.Tensor], torch.Tensor]]:
    """Yield ``(inputs, labels)`` for consecutive batches; ``encode_kwargs`` go to :func:`encode`."""
    for sl in batches(len(data), batch_size):
        part = data.subset(np.arange(sl.start, sl.stop))
        yield encode(part, **encode_kwargs), torch.from_numpy(part.labels)
