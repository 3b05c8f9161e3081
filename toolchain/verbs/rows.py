"""Rows of data files as graph feeds, shared by ``parity`` (ID/OOD rows) and ``export`` (INT8 calibration).

A labelled text CSV (``text,label``) is tokenised with the source's tokenizer, rows in token-length
order (less padding) cut into batches; an ``.npz`` of named arrays is cut into batches as it is.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from toolchain.errors import DataError, ToolchainError

Feed = dict[str, np.ndarray]

__all__ = ["batches", "csv_rows", "data_feeds", "load_source_tokenizer", "text_batches"]


def batches(arrays: Mapping[str, np.ndarray], size: int) -> list[Feed]:
    """``arrays`` (rows on axis 0) cut into feeds of ``size`` rows."""
    n = len(next(iter(arrays.values())))
    return [{k: v[i:i + size] for k, v in arrays.items()} for i in range(0, n, size)]

def csv_rows(path: Path, max_rows: int | None, min_classes: int) -> Any:
    """A CSV's rows (``load_csv``), at most ``max_rows`` of them (a seeded sample, in file order)."""
    from toolchain.data import load_csv

    data = load_csv(f"csv:{Path(path).resolve()}", min_classes=min_classes)
    if max_rows is not None and len(data) > max_rows:
        data = data.subset(np.sort(np.random.default_rng(0).permutation(len(data))[:max_rows]))
    return data

def text_batches(texts: Sequence[str], tokenizer: Any, max_length: int, size: int,
                  names: Sequence[str]) -> tuple[list[Feed], np.ndarray]:
    """Tokenised batches of ``texts`` in token-length order (less padding); the row order they hold."""
    from toolchain.data import tokenize

    lengths = np.asarray([len(ids) for ids in tokenizer(list(texts), truncation=True,
                                                         max_length=max_length)["input_ids"]])
    order = np.argsort(lengths, kind="stable")
    feeds = []
    for i in range(0, len(order), size):
        enc = tokenize([texts[j] for j in order[i:i + size]], tokenizer, max_length, padding="longest")
        feeds.append({n: enc[n].numpy() for n in names if n in enc})
    return feeds, order

def load_source_tokenizer(source: Any, tokenizer: Path | None = None) -> Any:
    """The tokenizer of ``tokenizer`` (a folder), else of the source folder; DataError naming what to pass."""
    from toolchain.models.loading import load_tokenizer

    folder = Path(tokenizer) if tokenizer is not None else source.path
    try:
        return load_tokenizer(folder)
    except ToolchainError as exc:
        raise DataError(f"--data needs a tokenizer: {exc.message}",
                        hint="Pass --tokenizer DIR (the checkpoint folder the model came from).") from None

def data_feeds(source: Any, names: Sequence[str], data: Path, *, tokenizer: Path | None = None,
               max_length: int = 128, batch_size: int = 16, max_rows: int | None = None) -> list[Feed]:
    """Batches of a data file's rows as graph feeds, the way ``--data``/``--inputs`` read them.

    A labelled text CSV (``text,label``) tokenised with the source's tokenizer (or ``tokenizer``), or an
    ``.npz`` of named arrays (``pixel_values`` ...). At most ``max_rows`` rows (a seeded sample). Used for
    INT8 calibration (``export --precision int8 --data``).
    """
    from toolchain.engines.inputs import read_npz

    data = Path(data)
    if not data.is_file():
        raise DataError(f"--data '{data}' does not exist.")
    if data.suffix.lower() == ".npz":
        arrays = read_npz(data, "--data")
        missing = [n for n in names if n not in arrays]
        if missing:
            raise DataError(f"--data '{data}' has no array {missing} (it holds {sorted(arrays)}); the graph takes "
                            f"{list(names)}.")
        rows = len(arrays[names[0]])
        keep = np.sort(np.random.default_rng(0).permutation(rows)[:max_rows]) if max_rows and rows > max_rows \
            else np.arange(rows)
        return batches({n: np.asarray(arrays[n])[keep] for n in names}, batch_size)
    if "input_ids" not in names:
        raise DataError(f"--data '{data}': a CSV holds texts, and this model takes {list(names)}.",
                        hint="Give image rows as an .npz file (pixel_values).")
    cap = int(source.hf_config.get("max_position_embeddings") or max_length)
    longest = max(2, min(max_length, cap - 2))
    tok = load_source_tokenizer(source, tokenizer)
    rows = csv_rows(data, max_rows, 1)
    return text_batches(rows.texts, tok, longest, batch_size, names)[0]
