"""``hydra-toolchain infer GRAPH --inputs IN.npz --out OUT.npz``: one graph or engine file on named arrays.

Everything is checked before inference runs: the kind (``--engine`` or the file's suffix) and
whether it runs this file, the inputs file, that ``--out`` can be written, the feed against what
is known before loading (an engine's sidecar: inputs and profile) and against the graph's value
limits (empty inputs, token ids beyond the vocabulary, a sequence beyond the position table).
Nothing is written unless inference succeeds; outputs are written atomically.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import numpy as np

from toolchain.errors import FeedError, GraphError, ToolchainError


def describe_specs(specs: Any) -> str:
    """``'x' float32 [batch, 6], 'mask' int64 [batch, 6]`` for messages."""

    def dims(shape: Any) -> str:
        return "[" + ", ".join("?" if d is None else str(d) for d in shape) + "]"

    return ", ".join(f"'{n}' {s.dtype if s.dtype is not None else '?'} {dims(s.shape)}" for n, s in specs.items())


def infer_kind(graph: Path, engine: str | None) -> tuple[Any, Any]:
    """The engine kind that runs ``graph`` (``--engine`` or the first kind for its suffix), and the suffix's kind."""
    from toolchain.engines import engine_kind, engine_kinds, kinds_for_suffix, known_suffixes

    runnable = [s.name for s in engine_kinds(selectable=True) if s.runs_files]
    suffix = graph.suffix.lower()
    owners = kinds_for_suffix(suffix)
    owner = engine_kind(owners[0]) if owners else None
    kind = engine or (owner.name if owner is not None else None)
    if kind is None:
        raise ToolchainError(f"cannot tell what '{graph}' is from its suffix '{suffix}'; pass --engine "
                             f"({' | '.join(runnable)}) or use {' / '.join(known_suffixes())}.")
    if kind not in runnable:
        raise ToolchainError(f"--engine {kind!r} is not supported here; choose one of {', '.join(runnable)}.")
    return engine_kind(kind), owner


def infer_file(graph: Path, inputs: Path, out: Path, engine: str | None = None) -> tuple[str, dict[str, np.ndarray]]:
    """Run ``graph`` on the arrays of ``inputs``; write the outputs to ``out``; return ``(kind, outputs)``."""
    from toolchain.artifacts import atomic_write_bytes
    from toolchain.engines import kinds_for_suffix, runner_for
    from toolchain.engines.inputs import check_output_path, check_values, read_npz

    graph, inputs, out = Path(graph), Path(inputs), Path(out)
    suffix = graph.suffix.lower()
    spec, owner = infer_kind(graph, engine)
    kind = spec.name
    if not graph.is_file():
        raise GraphError(f"{spec.file_label} '{graph}' does not exist" + (" (a folder was given)" if graph.is_dir()
                                                                        else "")
                         + "; check the path (hydra-toolchain export / build write them under the artifacts folder).")
    if owner is not None and suffix not in spec.suffixes:  # a file another kind runs
        if spec.needs_build:
            raise ToolchainError(f"--engine {kind} runs a built {spec.file_label}, and '{graph}' is an "
                                 f"{owner.file_label}; build an {spec.file_label} with hydra-toolchain build, or run "
                                 f"the {owner.file_label} with --engine {owner.name}.")
        raise ToolchainError(f"'{graph}' is a {owner.runtime} {owner.file_label}; {spec.runtime} runs "
                             f"{' / '.join(spec.suffixes)} files. Use --engine {owner.name}.")
    if out.resolve() in (graph.resolve(), inputs.resolve()):
        raise ToolchainError(f"--out '{out}' would overwrite an input; choose another output file.")
    check_output_path(out)  # before inference runs, not after
    feed = read_npz(inputs)
    only = kinds_for_suffix(suffix) == [kind]  # a suffix several kinds run (.onnx): the kind is named in messages
    runner = runner_for(kind, {"path": str(graph), "engine": str(graph)}, name=graph.name if only
                        else f"{graph.name} ({kind})")
    # input specs known before loading (an engine's sidecar; a clear error when it is missing or malformed) and
    # value limits (vocabulary and sequence length from the graph's embedding tables)
    specs, limits = spec.inspect_file(graph) if spec.inspect_file is not None else ({}, {})
    try:
        runner.precheck(feed)  # engine files: the sidecar's inputs and profile, before the runtime is needed
        check_values(feed, limits, runner=runner.name)  # empty inputs, token ids, sequence length
        with runner:
            specs = runner.input_specs()
            outputs = runner.infer(feed)
    except FeedError as exc:
        expected = f" {graph.name} expects {describe_specs(specs)}." if specs else ""
        raise FeedError(exc.message.rstrip(".") + f" (inputs file '{inputs}')." + expected, hint=exc.hint) from None
    buffer = io.BytesIO()
    np.savez(buffer, **outputs)
    atomic_write_bytes(out, buffer.getvalue())
    return kind, outputs
