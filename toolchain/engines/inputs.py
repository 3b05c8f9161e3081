"""Checks on the *values* of an inference feed and on the output path, made before anything runs.

:func:`~toolchain.engines.base.check_feed` checks names, dtypes and shapes against a graph's
inputs. What it cannot see, and ONNX Runtime / TensorRT answer with raw C++ text or silently
accept, is checked here:

* an empty input (batch 0, or a sequence of 0 tokens);
* token ids outside the vocabulary: negative (ONNX ``Gather`` wraps them around silently) or
  ``>= rows`` of the embedding table they index;
* a sequence longer than the position embedding table (the model's ``max_position_embeddings``).

The limits are read from the graph itself (:func:`graph_value_limits`), so they hold for any
exported graph: an integer graph input that (through ``Cast`` / ``Reshape`` / ``Unsqueeze``...)
indexes a ``Gather`` over an initializer is a token-id input whose vocabulary is the table's row
count; a ``Gather`` over an initializer whose indices are a ``Slice`` of a constant buffer
(BERT's ``position_ids[:, :seq]``, an initializer or a ``Constant``) or a ``Range`` is a
position lookup, and the sequence can be no longer than the table (and the buffer). Only the
graph is read, never the weights; an FP16/BF16 variant's ``Cast`` of a table is followed.

:func:`check_output_path` makes sure ``--out`` can be written before inference runs.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import onnx

from toolchain.errors import FeedError, ToolchainError

__all__ = ["ValueLimits", "check_output_path", "check_values", "engine_value_limits", "graph_inputs",
           "graph_value_limits", "onnx_value_limits", "read_npz"]

#: Operators that pass their first input's values through (reshaped or re-typed) to their output.
_PASS_THROUGH = {"Cast", "Identity", "Reshape", "Unsqueeze", "Squeeze", "Flatten", "Expand"}
_INT_TYPES = {onnx.TensorProto.INT64, onnx.TensorProto.INT32, onnx.TensorProto.INT16, onnx.TensorProto.INT8,
              onnx.TensorProto.UINT64, onnx.TensorProto.UINT32, onnx.TensorProto.UINT16, onnx.TensorProto.UINT8}


class ValueLimits(NamedTuple):
    """What one integer input of a graph may hold.

    Attributes:
        vocab: ids must lie in ``0..vocab - 1`` (None: not an id input).
        table: the embedding initializer that defines ``vocab``.
        max_length: the largest size of the last axis (the sequence), None when unknown.
        length_table: the position embedding initializer (or buffer) that defines ``max_length``.
    """

    vocab: int | None
    table: str | None
    max_length: int | None = None
    length_table: str | None = None


def _producers(graph: onnx.GraphProto) -> dict[str, onnx.NodeProto]:
    return {out: node for node in graph.node for out in node.output}


def _source(name: str, producers: Mapping[str, onnx.NodeProto]) -> tuple[str, onnx.NodeProto | None]:
    """Follow value-preserving operators back from ``name``: ``(name, producing node or None)``."""
    for _ in range(64):  # a bound, not a limit met in practice
        node = producers.get(name)
        if node is None or node.op_type not in _PASS_THROUGH or not node.input:
            return name, node
        name = node.input[0]
    return name, producers.get(name)


def _axis(node: onnx.NodeProto) -> int:
    return next((int(a.i) for a in node.attribute if a.name == "axis"), 0)


def graph_value_limits(model: onnx.ModelProto) -> dict[str, ValueLimits]:
    """Input name -> :class:`ValueLimits` for every integer input that indexes an embedding table.

    The sequence limit (when the graph has a position lookup) applies to every id input.
    """
    graph = model.graph
    tables = {init.name: list(init.dims) for init in graph.initializer}
    tables |= {node.output[0]: list(attr.t.dims) for node in graph.node if node.op_type == "Constant"
               for attr in node.attribute if attr.name == "value"}  # the exporter's folded buffers
    inputs = {v.name for v in graph.input if v.name not in tables
              and v.type.tensor_type.elem_type in _INT_TYPES}
    producers = _producers(graph)
    vocab: dict[str, tuple[int, str]] = {}
    lengths: list[tuple[int, str]] = []
    for node in graph.node:
        if node.op_type != "Gather" or len(node.input) < 2 or _axis(node) != 0:
            continue
        table = _source(node.input[0], producers)[0]  # through a Cast: an FP16 graph's FP32 island
        dims = tables.get(table)
        if not dims or len(dims) < 2:  # an embedding table is [rows, width]
            continue
        rows = int(dims[0])
        source, made_by = _source(node.input[1], producers)
        if source in inputs:
            if source not in vocab or rows < vocab[source][0]:
                vocab[source] = (rows, table)
        elif made_by is not None and made_by.op_type == "Slice":
            buffer = _source(made_by.input[0], producers)[0]
            length, what = rows, table
            if tables.get(buffer) and int(tables[buffer][-1]) < rows:
                length, what = int(tables[buffer][-1]), buffer
            if tables.get(buffer):
                lengths.append((length, what))
        elif made_by is not None and made_by.op_type == "Range":
            lengths.append((rows, table))
    longest = min(lengths) if lengths else (None, None)
    return {name: ValueLimits(rows, table, *longest) for name, (rows, table) in sorted(vocab.items())}


def onnx_value_limits(path: Path) -> dict[str, ValueLimits]:
    """:func:`graph_value_limits` of an ONNX file (graph only; a broken file raises GraphError)."""
    from toolchain.export.graph import load_checked

    return graph_value_limits(load_checked(Path(path), load_weights=False, check=False))


def engine_value_limits(engine_path: Path, onnx_file: str, onnx_sha256: str,
                        recorded_path: str = "") -> dict[str, ValueLimits]:
    """The limits of the ONNX graph an engine file was built from, when that file is at hand.

    The graph named in the sidecar is looked for where :func:`toolchain.engines.source.source_candidates`
    looks (next to the engine, the artifacts' ``export`` folder, the path it was built from); it is
    used only when its sha256 is the one the sidecar recorded. Not found: no limits (the engine's
    profile still bounds the shapes; a stale file is refused when it is loaded).
    """
    from toolchain.engines.source import file_digest, source_candidates

    for candidate in source_candidates(Path(engine_path), onnx_file, recorded_path):
        if candidate.is_file() and file_digest(candidate) == onnx_sha256:
            return onnx_value_limits(candidate)
    return {}


def graph_inputs(model: onnx.ModelProto) -> dict[str, dict[str, Any]]:
    """Graph inputs (not initializers) as ``{name: {"dtype": numpy name, "shape": dims}}`` for the sidecar.

    Dims are ints when static, else the ``dim_param`` name (or None). BF16 inputs are fed as
    float32 (numpy has no bfloat16), as the TensorRT and OpenVINO runners do.
    """
    from onnx.helper import tensor_dtype_to_np_dtype

    from toolchain.export.graph import dims_of

    weights = {i.name for i in model.graph.initializer}
    out = {}
    for value in model.graph.input:
        if value.name in weights:
            continue
        elem = value.type.tensor_type.elem_type
        try:
            dtype = "float32" if elem == onnx.TensorProto.BFLOAT16 else tensor_dtype_to_np_dtype(elem).name
        except (KeyError, ValueError, TypeError):
            dtype = None
        out[value.name] = {"dtype": dtype, "shape": dims_of(value)}
    return out


def _first(mask: np.ndarray) -> tuple[int, ...]:
    return tuple(int(i) for i in np.unravel_index(int(np.argmax(mask)), mask.shape))


def check_values(feed: Mapping[str, object], limits: Mapping[str, ValueLimits], *, runner: str = "runner") -> None:
    """Raise one :class:`FeedError` listing every empty input, out-of-vocabulary id and over-long sequence.

    Inputs that are not numpy arrays, or ids that are not integers, are left to
    :func:`~toolchain.engines.base.check_feed` (it names the expected dtype).
    """
    problems: list[str] = []
    advice: list[str] = []
    for name in sorted(feed):
        value = feed[name]
        if not isinstance(value, np.ndarray) or value.ndim == 0:
            continue
        if value.size == 0:
            axes = [f"axis {a}" if a else "batch" for a, size in enumerate(value.shape) if size == 0]
            problems.append(f"input '{name}' is empty (shape {tuple(value.shape)}: {' and '.join(axes)} 0)")
            advice.append("pass at least one row of at least one token")
            continue
        limit = limits.get(name)
        if limit is None or value.dtype.kind not in "iu":
            continue
        if limit.max_length is not None and value.ndim >= 2 and value.shape[-1] > limit.max_length:
            problems.append(f"input '{name}' has a sequence of {value.shape[-1]} tokens, over the maximum "
                            f"{limit.max_length} (the position table '{limit.length_table}' has "
                            f"{limit.max_length} rows)")
            advice.append(f"truncate the inputs to {limit.max_length} tokens, e.g. tokenizer(..., truncation=True, "
                          f"max_length={limit.max_length})")
        if limit.vocab is None:
            continue
        low, high = value.min(), value.max()
        if low < 0:
            at = _first(value < 0)
            problems.append(f"input '{name}' holds a negative token id {int(value[at])} at index {at}; ids must "
                            f"lie in 0..{limit.vocab - 1}")
        if high >= limit.vocab:
            at = _first(value >= limit.vocab)
            problems.append(f"input '{name}' holds token id {int(value[at])} at index {at}, outside the vocabulary "
                            f"0..{limit.vocab - 1} (the embedding table '{limit.table}' has {limit.vocab} rows)")
        if low < 0 or high >= limit.vocab:
            advice.append("tokenize with this model's own tokenizer")
    if problems:
        raise FeedError(f"{runner}: bad feed: " + "; ".join(problems)
                        + "".join(f" ({a})" for a in dict.fromkeys(advice)) + ".")


def check_output_path(out: Path, flag: str = "--out") -> None:
    """Raise :class:`ToolchainError` (exit 2) naming ``out`` unless a file can be written there.

    Missing folders are fine (they are created): the nearest existing one must be a writable folder.
    """
    out = Path(out)
    if out.is_dir():
        raise ToolchainError(f"{flag} '{out}' is a folder; give a file path such as '{out / 'outputs.npz'}'.")
    folder = out.parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if not folder.is_dir():
        raise ToolchainError(f"{flag} '{out}' cannot be written: '{folder}' is a file, not a folder; "
                             "choose another output path.")
    try:
        handle, probe = tempfile.mkstemp(prefix=f".{out.name}.probe-", dir=folder)
        os.close(handle)
        os.unlink(probe)
    except OSError as exc:
        raise ToolchainError(f"{flag} '{out}' cannot be written: no file can be created in '{folder}' "
                             f"({exc.strerror or exc}); choose a writable folder.") from None


def read_npz(path: Path, flag: str = "inputs file") -> dict[str, np.ndarray]:
    """The named arrays of an ``.npz`` file (ToolchainError naming the file when it cannot be used)."""
    import zipfile

    how = f"write it with numpy.savez('{path.name}', input_name=array, ...) using the graph's input names"
    if not path.is_file():
        raise ToolchainError(f"{flag} '{path}' does not exist; {how}.")
    try:
        with path.open("rb") as f:
            magic = f.read(6)
    except OSError as exc:
        raise ToolchainError(f"cannot read {flag} '{path}' ({exc.strerror or exc}); {how}.") from None
    if not magic.startswith((b"PK\x03\x04", b"PK\x05\x06", b"\x93NUMPY")):  # zip (.npz) or .npy
        text = magic and all(32 <= b < 127 or b in b"\t\r\n" for b in magic)
        what = ("it is empty" if not magic else "it looks like a text file" if text
                else "it does not start with a zip archive's 'PK' signature")
        raise ToolchainError(f"{flag} '{path}' is not a NumPy .npz archive ({what}); {how}.")
    try:
        loaded = np.load(path, allow_pickle=False)
        if not isinstance(loaded, np.lib.npyio.NpzFile):
            raise ToolchainError(f"{flag} '{path}' holds a single unnamed array (.npy), not named arrays; "
                                 f"{how}.")
        with loaded:
            feed = {k: loaded[k] for k in loaded.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, KeyError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ToolchainError(f"cannot read {flag} '{path}' as .npz ({first}); {how}.") from None
    if not feed:
        raise ToolchainError(f"{flag} '{path}' holds no arrays; {how}.")
    return feed
