"""``hydra-toolchain parity GRAPH... --reference SRC``: any exported graph or engine against its PyTorch source.

The recipe's ``parity`` stage and this command run the same gate, :func:`toolchain.parity.run_parity`
(numeric checks per output with the precision's measured tolerances, UQ-metric checks, Polygraphy
cross-check, ``report.json`` / ``junit.xml`` / ``summary.md``, exit code 0/1/2/3) and the same
rescue, :func:`toolchain.parity.rescue_precision`. Here the reference is a folder (a Hugging Face
checkpoint: ``logits``/``probs``; a Hydra folder: ``probs``/``member_logits``) and the feeds come
from files:

* generated feeds at three shapes (batch 1, 8 and 2; text at three sequence lengths), always;
* ``data``: a labelled CSV (``text,label``), tokenised with the source's tokenizer (a Hydra folder
  written by the ``fuse`` stage carries its tokenizer; else ``tokenizer``), rows sorted by token
  length and cut into batches; its labels give the ID metrics (mapped by name through the
  checkpoint's ``id2label`` when it names its classes);
* ``ood``: a CSV of out-of-distribution texts (OOD metrics);
* ``inputs``: an ``.npz`` file. Written by ``save_inputs`` it holds every feed of a run
  (``generated.0.input_ids``, ``id.0.labels``, ``ood.0.pixel_values`` ...), so a CI job replays
  exactly the same inputs without the data; a plain file of named arrays (one per graph input,
  ``labels`` optional) is cut into batches: with ``labels`` they are ID rows, without they
  replace the generated feeds. Image models take their data this way (``pixel_values``).

A graph's precision is read from the graph (low-precision weights or casts); an engine file's
from ``precision`` or its name (``<graph>.fp16.<suffix>``).

Every file also gets a ``weights`` check (:mod:`toolchain.parity.weights`): each weight of its ONNX
graph (an engine file: the graph its build record names, where it is at hand, :func:`source_graph`)
against the reference folder's parameter at the graph's own rounding; a graph exported from another
checkpoint fails it even where BF16 rounding hides the difference at the outputs.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from toolchain.errors import DataError, GraphError, ToolchainError
from toolchain.verbs.rows import batches, csv_rows, load_source_tokenizer, text_batches

Feed = dict[str, np.ndarray]
_GROUPS = ("generated", "id", "ood")


@dataclass
class ParityOptions:
    """Where the feeds come from, the tolerances and the engine (see the module docstring)."""

    data: Path | None = None
    ood: Path | None = None
    inputs: Path | None = None
    tokenizer: Path | None = None
    max_length: int = 128  #: tokens per text (truncation) and the longest generated sequence
    batch_size: int = 32  #: rows per ID/OOD batch (within the default export profile's batch range)
    max_rows: int | None = None  #: at most this many CSV rows per file (a seeded sample), None: all
    tolerances: Mapping[str, Mapping[str, float]] = field(default_factory=dict)  #: output -> atol/rtol
    uq_tolerances: Mapping[str, float] = field(default_factory=dict)  #: metric -> allowed difference
    #: kinds that run the files, a list or ``"a,b"`` (default: the CPU kind every recipe has)
    engine: str | Sequence[str] | None = None
    #: precisions, a list or ``"fp32,bf16"``: a compiling kind (OpenVINO) builds FP32 graphs at each; a
    #: kind that runs graphs as exported runs those of these precisions; engine files whose sidecar and name
    #: do not say their precision take the one given (default: each file's own)
    precision: str | Sequence[str] | None = None
    save_inputs: Path | None = None
    localize: bool = False  #: name where each failing graph first diverges (:mod:`toolchain.verbs.localize`)
    baseline: Path | None = None  #: with ``localize``: a reference graph to compare node by node


@dataclass
class Feeds:
    """The three feed groups of :func:`toolchain.parity.run_parity`."""

    generated: list[Feed]
    ident: list[tuple[Feed, np.ndarray]]
    ood: list[Feed]


# ------------------------------------------------------------------------------------ options
def parse_tolerance_options(tols: Sequence[str] = (), uq_tols: Sequence[str] = ()) -> tuple[dict, dict]:
    """``OUTPUT:ATOL:RTOL`` and ``METRIC:DELTA`` strings -> the two tolerance maps (``*`` = every output/metric)."""
    from toolchain.parity import DEFAULT_UQ_TOLERANCES

    out: dict[str, dict[str, float]] = {}
    for text in tols:
        parts = str(text).split(":")
        try:
            name, atol, rtol = parts[0].strip(), float(parts[1]), float(parts[2])
            if len(parts) != 3 or not name or atol < 0 or rtol < 0:
                raise ValueError
        except (ValueError, IndexError):
            raise ToolchainError(f"--tol '{text}' is not OUTPUT:ATOL:RTOL (e.g. probs:1e-3:1e-2; '*' for every "
                                 "output; non-negative numbers).") from None
        out["" if name == "*" else name] = {"atol": atol, "rtol": rtol}
    uq: dict[str, float] = {}
    for text in uq_tols:
        parts = str(text).split(":")
        try:
            name, delta = parts[0].strip(), float(parts[1])
            if len(parts) != 2 or not name or delta < 0:
                raise ValueError
        except (ValueError, IndexError):
            raise ToolchainError(f"--uq-tol '{text}' is not METRIC:DELTA (e.g. ece:0.01; '*' for every "
                                 "metric).") from None
        if name != "*" and name not in DEFAULT_UQ_TOLERANCES:
            raise ToolchainError(f"--uq-tol '{text}': unknown metric '{name}'; metrics: "
                                 f"{', '.join(sorted(DEFAULT_UQ_TOLERANCES))}.")
        if name == "*":
            uq = dict.fromkeys(DEFAULT_UQ_TOLERANCES, delta) | uq
        else:
            uq[name] = delta
    return out, uq


# ------------------------------------------------------------------------------------ feeds


def _label_index(data: Any, hf_config: Mapping[str, Any], path: Path) -> np.ndarray:
    """The CSV's labels as the checkpoint's class indices (by name when its ``id2label`` names classes)."""
    id2label = {int(k): str(v) for k, v in (hf_config.get("id2label") or {}).items()}
    names = [id2label[i] for i in sorted(id2label)]
    generic = all(n == f"LABEL_{i}" for i, n in enumerate(names))
    if names and not generic:
        index = {n: i for i, n in enumerate(names)}
        unknown = sorted(set(data.class_names) - set(index))
        if unknown:
            raise DataError(f"--data {path}: labels {unknown} are not classes of the reference model "
                            f"(its id2label: {names}).",
                            hint="Give the CSV the model's class names (or integers 0..N-1 for an unnamed head).")
        return np.asarray([index[data.class_names[y]] for y in data.labels], dtype=np.int64)
    if names and len(data.class_names) > len(names):
        raise DataError(f"--data {path}: {len(data.class_names)} classes ({data.class_names}) but the reference "
                        f"model has {len(names)} outputs.")
    return np.asarray(data.labels, dtype=np.int64)




def save_feeds(path: Path, feeds: Feeds) -> Path:
    """Every feed of a run in one ``.npz`` (see the module docstring), written atomically."""
    from toolchain.artifacts import atomic_write_bytes

    arrays: dict[str, np.ndarray] = {}
    for i, feed in enumerate(feeds.generated):
        arrays |= {f"generated.{i}.{k}": v for k, v in feed.items()}
    for i, (feed, labels) in enumerate(feeds.ident):
        arrays |= {f"id.{i}.{k}": v for k, v in feed.items()} | {f"id.{i}.labels": labels}
    for i, feed in enumerate(feeds.ood):
        arrays |= {f"ood.{i}.{k}": v for k, v in feed.items()}
    buffer = io.BytesIO()
    np.savez_compressed(buffer, **arrays)
    atomic_write_bytes(Path(path), buffer.getvalue())
    return Path(path)


def load_feeds(path: Path, names: Sequence[str], batch_size: int) -> tuple[Feeds, bool]:
    """Feeds from ``--inputs``; the flag says whether they replace the generated feeds."""
    from toolchain.engines.inputs import read_npz

    arrays = read_npz(Path(path), "--inputs")
    if arrays and all(k.split(".", 1)[0] in _GROUPS and k.count(".") >= 2 for k in arrays):  # a saved run
        groups: dict[str, dict[int, Feed]] = {g: {} for g in _GROUPS}
        for key, value in arrays.items():
            group, index, name = key.split(".", 2)
            groups[group].setdefault(int(index), {})[name] = value
        ordered = {g: [groups[g][i] for i in sorted(groups[g])] for g in _GROUPS}
        ident = [({k: v for k, v in f.items() if k != "labels"}, f["labels"]) for f in ordered["id"] if "labels" in f]
        feeds = Feeds(ordered["generated"], ident, ordered["ood"])
        return feeds, True
    missing = [n for n in names if n not in arrays]
    if missing:
        raise DataError(f"--inputs '{path}' has no array {missing} (it holds {sorted(arrays)}); the graph takes "
                        f"{list(names)}.")
    rows = {len(arrays[n]) for n in names} | ({len(arrays["labels"])} if "labels" in arrays else set())
    if len(rows) != 1:
        raise DataError(f"--inputs '{path}': the arrays have different numbers of rows ({sorted(rows)}).")
    feed = {n: arrays[n] for n in names}
    if "labels" in arrays:
        labels = np.asarray(arrays["labels"]).astype(np.int64)
        ident = [(b, labels[i * batch_size:(i + 1) * batch_size]) for i, b in enumerate(batches(feed, batch_size))]
        return Feeds([], ident, []), False
    return Feeds(batches(feed, batch_size), [], []), True



def parity_feeds(source: Any, names: Sequence[str], options: ParityOptions) -> Feeds:
    """Generated feeds plus the ID/OOD rows of ``options`` (see the module docstring)."""
    text = "input_ids" in names
    cap = int(source.hf_config.get("max_position_embeddings") or options.max_length)
    longest = max(2, min(options.max_length, cap - 2))  # room for position tables that start after padding

    def generated(batch: int, sequence: int, seed: int) -> Feed:
        feed = source.make_feed(batch, min(sequence, longest), seed)
        return {n: feed[n].numpy() for n in names}

    feeds = Feeds([generated(b, s, 11 + i) for i, (b, s) in enumerate([(1, 8), (8, 64), (2, 96)])], [], [])
    if options.inputs is not None:
        given, replaces = load_feeds(Path(options.inputs), names, options.batch_size)
        feeds = Feeds(given.generated if replaces else feeds.generated, given.ident, given.ood)
    if options.data is not None or options.ood is not None:
        if not text:
            raise DataError(f"--data/--ood take text CSV files, and this model takes {list(names)}.",
                            hint="Give image rows with --inputs FILE.npz (pixel_values, labels).")
        tokenizer = load_source_tokenizer(source, options.tokenizer)
        if options.data is not None:
            rows = csv_rows(options.data, options.max_rows, 1)
            labels = _label_index(rows, source.hf_config, options.data)
            cut, order = text_batches(rows.texts, tokenizer, longest, options.batch_size, names)
            feeds.ident = [(b, labels[order[i * options.batch_size:(i + 1) * options.batch_size]])
                           for i, b in enumerate(cut)]
        if options.ood is not None:
            rows = csv_rows(options.ood, options.max_rows, 1)
            feeds.ood = text_batches(rows.texts, tokenizer, longest, options.batch_size, names)[0]
    if feeds.ood and not feeds.ident:
        raise DataError("--ood needs ID rows too (--data or --inputs with labels): OOD metrics compare the two.")
    for group in (feeds.generated, [f for f, _ in feeds.ident], feeds.ood):
        for feed in group:
            missing = [n for n in names if n not in feed]
            if missing:
                raise DataError(f"--inputs: a feed lacks {missing}; the graph takes {list(names)}.")
    return feeds


# ------------------------------------------------------------------------------------ the gate
def _reference(source: Any, names: Sequence[str], outputs: Sequence[str]) -> tuple[Any, list[str]]:
    from toolchain.engines import make_runner, reference_kind

    module, module_outputs = source.build(None)
    missing = [o for o in outputs if o not in module_outputs]
    if missing:
        raise GraphError(f"the graphs output {list(outputs)}; the {source.kind} '{source.path}' gives "
                         f"{module_outputs}, not {missing}: check a graph against the folder it was exported from.")
    wanted = [o for o in module_outputs if o in outputs] if outputs else list(module_outputs)
    specs = source.family.input_specs()
    example = source.make_feed(1, 8, 0)
    input_specs = {n: (getattr(np, specs[n].dtype), specs[n].shape(example[n].shape)) for n in names}
    return make_runner(reference_kind(), module=module, input_specs=input_specs, output_names=wanted,
                       name=f"torch ({source.path.name})"), wanted


def check_parity(graphs: Sequence[str | Path], reference: str | Path, options: ParityOptions | None = None, *,
                 out: str | Path | None = None, say: Callable[[str], None] = lambda _line: None) -> Any:
    """``hydra-toolchain parity GRAPH... --reference SRC``: the :class:`~toolchain.parity.Verdict` of every file.

    Writes ``report.json``, ``junit.xml`` and ``summary.md`` under ``out`` (when given) and the
    feeds to ``options.save_inputs`` (when given). ``verdict.exit_code``: 0 pass, 1 a check
    failed, 2 a file could not run, 3 only an optional component was missing. With
    ``options.localize`` each failing file's first divergence goes to ``verdict.localization``
    (:func:`toolchain.verbs.localize.localize_failures`).
    """
    from toolchain.parity import run_parity
    from toolchain.verbs.export import open_source
    from toolchain.verbs.targets import PRECISIONS, file_kinds, parse_list, targets_for

    o = options or ParityOptions()
    found, skipped = targets_for(graphs, parse_list(o.engine, "--engine", file_kinds()),
                                 parse_list(o.precision, "--precision", PRECISIONS))
    for label, reason in skipped.items():
        say(f"skipped {label}: {reason}")
    source = open_source(reference)
    names = next((c.inputs for c in found if c.inputs), None) or list(source.family.input_names)
    unknown = [n for n in names if n not in source.family.input_specs()]
    if unknown:
        raise GraphError(f"'{found[0].path}' takes {unknown}, which a {source.family.family} model does not.")
    outputs = next((c.outputs for c in found if c.outputs), [])
    for c in found:
        if c.inputs and c.inputs != names:
            raise GraphError(f"'{c.path.name}' takes {c.inputs}, '{found[0].path.name}' takes {names}: check graphs "
                             "of one reference and one input signature per call.")
        if c.outputs and c.outputs != outputs:
            raise GraphError(f"'{c.path.name}' outputs {c.outputs}, another graph {outputs}: check graphs of one "
                             "reference per call.")
    runner, wanted = _reference(source, names, outputs)
    feeds = parity_feeds(source, names, o)
    if o.save_inputs is not None:
        save_feeds(Path(o.save_inputs), feeds)
        say(f"inputs saved to {o.save_inputs}")
    say(f"reference {source.kind} '{source.path}' ({source.family.family}); feeds: {len(feeds.generated)} generated, "
        f"{sum(len(y) for _, y in feeds.ident)} ID rows, {sum(len(next(iter(f.values()))) for f in feeds.ood)} "
        f"OOD rows")
    candidates = {c.label: c.runner() for c in found}
    tolerances = {k: dict(v) for k, v in o.tolerances.items()} or None
    verdict = run_parity(runner, candidates, feeds.generated, feeds.ident, feeds.ood, tolerances=tolerances,
                         uq_tolerances=dict(o.uq_tolerances) or None, out_dir=Path(out) if out else None,
                         precisions={c.label: c.precision for c in found},
                         graphs={c.label: source_graph(c.path) for c in found})
    verdict.meta["files"] = {c.label: str(c.path) for c in found}
    verdict.meta["skipped"] = skipped
    verdict.meta["reference_folder"] = str(source.path)
    verdict.meta["outputs"] = wanted
    if o.localize and verdict.failures:
        from toolchain.verbs.localize import localize_failures

        localize_failures(verdict, found, source, feeds, baseline=o.baseline, say=say)
    if out is not None:
        verdict.write(Path(out))
    return verdict


def rescue_graphs(verdict: Any, reference: str | Path, options: ParityOptions | None, out: str | Path,
                  say: Callable[[str], None] = lambda _line: None) -> list[dict[str, Any]]:
    """``parity --rescue``: the smallest FP32 node set per failing FP16/BF16 graph; float layers per INT8 graph.

    For each failing FP16/BF16 ``.onnx`` graph, the smallest FP32 node set that passes; for each failing
    INT8 (Q/DQ) graph, the smallest set of quantized layers to keep in float (the UQ-aware float fallback,
    :func:`toolchain.parity.rescue_int8`: the failing graph's own layers turned back to float).

    The FP32 graph is the failing graph's name without its precision (``hydra-conv.fp16.onnx`` ->
    ``hydra-conv.onnx``, beside it); the passing graph goes to ``out/rescued/``.
    """
    from toolchain.artifacts import atomic_write_json
    from toolchain.engines import engine_kind, split_label
    from toolchain.parity import rescue_int8, rescue_precision
    from toolchain.verbs.export import open_source

    o = options or ParityOptions()
    files = verdict.meta.get("files", {})
    failing = sorted(set(verdict.rescuable_engines()) & set(files))
    rescued = []
    source = open_source(reference)
    for label in failing:
        path = Path(files[label])
        precision = verdict.meta["precisions"][label]
        kind = split_label(label)[0]
        if precision == "int8" and path.suffix == ".onnx" and "int8" in engine_kind(kind).precisions:
            rescued.append(_rescue_int8(path, label, kind, source, o, out, rescue_int8, say))
            continue
        if precision not in ("fp16", "bf16") or path.suffix != ".onnx" or kind not in _rescuable_names():
            say(f"rescue: {path.name} is not an FP16/BF16 ONNX graph of a rescuable kind; skipped")
            continue
        fp32, runner, feeds = _rescue_inputs(path, precision, source, o)
        dst = Path(out) / "rescued" / path.name
        res = rescue_precision(fp32, dst, precision, runner, feeds.generated, feeds.ident, feeds.ood,
                               tolerances=dict(o.tolerances) or None, uq_tolerances=dict(o.uq_tolerances) or None)
        rescued.append({"graph": path.name, "passed": res.passed, "kept_fp32_nodes": list(res.kept_fp32_nodes),
                        "path": str(dst)})
        say(f"rescue {path.name}: {'pass' if res.passed else 'FAIL'} keeping {len(res.kept_fp32_nodes)} node(s) in "
            f"FP32: {', '.join(res.kept_fp32_nodes[:8])}")
    if rescued:
        atomic_write_json(Path(out) / "rescued" / "rescue.json", rescued)
    return rescued


def _rescue_inputs(path: Path, precision: str, source: Any, o: ParityOptions) -> tuple[Path, Any, Feeds]:
    """A failing graph's FP32 graph beside it (its name without the precision), the reference and the feeds."""
    fp32 = path.with_name(path.name.replace(f".{precision}.onnx", ".onnx"))
    if fp32 == path or not fp32.is_file():
        raise GraphError(f"rescue of '{path}': its FP32 graph '{fp32}' is not there; the rescue reads the FP32 graph "
                         "it was made from (put it beside the failing graph).")
    names = _graph_inputs(fp32)
    runner, _wanted = _reference(source, names, _graph_outputs(fp32))
    return fp32, runner, parity_feeds(source, names, o)


def _rescue_int8(path: Path, label: str, kind: str, source: Any, o: ParityOptions, out: str | Path,
                 rescue_int8: Callable[..., Any], say: Callable[[str], None]) -> dict[str, Any]:
    """The float fallback of one failing INT8 graph, searched on the engine kind that failed it."""
    from toolchain.engines import engine_kind, runner_for

    fp32, runner, feeds = _rescue_inputs(path, "int8", source, o)
    def factory(p: Path) -> Any:  # searched on the engine that failed (its INT8 kernels), not a stand-in
        return runner_for(kind, {"path": str(p), "precision": "int8"}, name="rescue-int8")

    # one rescued graph per engine kind that failed it (OpenVINO's INT8 kernels may need other layers in float)
    dst = Path(out) / "rescued" / (path.name if engine_kind(kind).rescuable else f"{kind}/{path.name}")
    res = rescue_int8(fp32, dst, path, runner, feeds.generated, feeds.ident, feeds.ood,
                      tolerances=dict(o.tolerances) or None, uq_tolerances=dict(o.uq_tolerances) or None,
                      runner_factory=factory)
    say(f"rescue {path.name} ({label}): {'pass' if res.passed else 'FAIL'} keeping {len(res.kept_fp32_nodes)} "
        f"quantized layer(s) in float: {', '.join(res.kept_fp32_nodes[:8])}")
    return {"graph": path.name, "engine": label, "passed": res.passed, "kept_float_nodes": list(res.kept_fp32_nodes),
            "path": str(dst)}


def _rescuable_names() -> set[str]:
    """Kinds whose graphs rescue can rewrite, with the substitutes they hand low precisions to."""
    from toolchain.engines import engine_kinds

    names = set()
    for k in engine_kinds():
        if k.rescuable:
            names |= {k.name, *k.substitutes.values()}
    return names


def source_graph(path: Path) -> Path | None:
    """The ONNX graph whose weights a file carries: the file itself, or the graph an engine file was built from.

    An engine file's graph is the one its build record names, where it is at hand
    (:func:`toolchain.engines.source.source_status`); None when it is not (its weights are then not
    checked: ``meta["weights"]`` says so).
    """
    from toolchain.engines import engine_kinds

    path = Path(path)
    if path.suffix.lower() == ".onnx":
        return path
    for spec in engine_kinds():
        if path.suffix.lower() in spec.suffixes and spec.describe is not None:
            try:
                graph = spec.describe(path).get("source", {}).get("graph")
            except ToolchainError:
                return None
            return Path(graph) if graph else None
    return None


def _graph_inputs(path: Path) -> list[str]:
    from toolchain.export.graph import graph_summary

    return [e["name"] for e in graph_summary(path)["inputs"]]


def _graph_outputs(path: Path) -> list[str]:
    from toolchain.export.graph import graph_summary

    return [e["name"] for e in graph_summary(path)["outputs"]]


__all__ = [
    "Feeds",
    "ParityOptions",
    "check_parity",
    "load_feeds",
    "parity_feeds",
    "parse_tolerance_options",
    "rescue_graphs",
    "save_feeds",
    "source_graph",
]
