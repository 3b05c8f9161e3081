"""``run_bench``: the latency and size report of an export folder (single, deep ensemble, Hydra).

The export stage writes ``graphs.json`` describing ``single.onnx``, ``member1.onnx`` ...
``member{M-1}.onnx``, ``hydra-<lowering>.onnx`` and their precision variants. From it
:func:`run_bench` assembles the deployments to compare, per engine kind:

* ``single``: the single model (``single.onnx``);
* ``deep-ensemble``: ``single`` then every ``member<i>``, one after another on the same feed
  (M separate sessions, each holding its own weights, as a deep ensemble is deployed);
* ``hydra-<lowering>``: each fused graph;
* for precisions other than FP32: ``single.<p>`` and ``hydra-<lowering>.<p>`` (no deep ensemble).

It times them with :func:`~toolchain.bench.measure.measure` (warm-up, interleaved rounds,
every sample kept), adds the per-round ratios, file sizes, memory, the analytic FLOPs and
weight bytes (:mod:`toolchain.hydra.cost`) with roofline ratios, and writes the report.

Feeds are generated from the graphs' inputs: text graphs get ``input_ids`` with real token ids
(1000..20000, limited to the vocabulary), a full ``attention_mask`` and zero
``token_type_ids`` (int64, ``[batch, sequence]``); image graphs get ``pixel_values`` (float32,
standard normal) with the graph's static ``C, H, W``.

An engine kind whose dependencies are missing (``onnxrt-cuda`` without onnxruntime-gpu or a
GPU, ``tensorrt`` without tensorrt or built engines, ``torch`` without modules) is skipped and
its reason recorded; nothing else changes.

The pipeline's bench stage calls it on the export folder and writes into its own folder, where
the report stage finds ``latency.md`` and the PNG::

    b = ctx.recipe.bench
    run_bench(ctx.stage_dir("export"), batch_sizes=b.batch_sizes, sequence_length=b.sequence_length,
              threads=b.threads, warmup=b.warmup, rounds=b.rounds, engines=ctx.recipe.engines, out_dir=work)
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from toolchain.bench.measure import (
    Case,
    CaseResult,
    Variant,
    file_footprint,
    measure,
    measure_passes,
    paired_ratios,
    process_memory,
    summarize,
)
from toolchain.bench.roofline import (
    CostModel,
    Peaks,
    cost_model_from_hydra,
    embedding_copies,
    resolve_peaks,
    roofline_rows,
)
from toolchain.engines import (
    EngineUnavailable,
    Runner,
    default_engines,
    engine_kind,
    entries_for,
    runner_for,
    selectable_kinds,
)
from toolchain.engines import thread_scope as engine_thread_scope
from toolchain.errors import EngineError, GraphError, MissingDependencyError, ModelError

log = logging.getLogger(__name__)

#: every kind a recipe may name (the engine registry's selectable kinds, sorted)
ENGINE_KINDS = tuple(selectable_kinds())
TOKEN_RANGE = (1000, 20000)
_DTYPE_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2}
_MEMBER = re.compile(r"^member(\d+)$")
_FLOAT_DTYPES = ("float", "float32", "float16", "bfloat16")


# ------------------------------------------------------------------------------- graphs.json
def read_graphs(export_dir: Path) -> dict[str, dict[str, Any]]:
    """``graphs.json`` of an export folder, every listed file checked to exist."""
    path = Path(export_dir) / "graphs.json"
    if not path.is_file():
        raise GraphError(f"no graphs.json in {export_dir}; run the export stage first (hydra-toolchain export).")
    graphs = json.loads(path.read_text())
    missing = [f"{name} ({g.get('path')})" for name, g in graphs.items()
               if not (Path(export_dir) / str(g.get("path", ""))).is_file()]
    if missing:
        raise GraphError(f"graphs.json in {export_dir} lists files that are missing: {', '.join(missing)}.")
    return graphs


def plan_variants(
    graphs: Mapping[str, Mapping[str, Any]], precisions: Sequence[str] = ("fp32",)
) -> dict[str, list[str]]:
    """Variant name -> graph names run one after another, in the report's order.

    FP32: ``single``, ``deep-ensemble`` (when members exist), ``hydra-<lowering>`` per lowering;
    another precision ``p``: ``single.p``, ``deep-ensemble.p`` (when the members exist at ``p``:
    a kind that compiles FP32 graphs at a precision builds them) and ``hydra-<lowering>.p``.
    """
    plan: dict[str, list[str]] = {}
    for precision in precisions:
        suffix = "" if precision == "fp32" else f".{precision}"
        chosen = {n: g for n, g in graphs.items() if g.get("precision", "fp32") == precision}
        single = f"single{suffix}"
        if single in chosen:
            plan[single] = [single]
        members = sorted((int(m.group(1)), n) for n in chosen if (m := _MEMBER.match(n.removesuffix(suffix))))
        if single in chosen and members:
            plan[f"deep-ensemble{suffix}"] = [single] + [n for _, n in members]
        for name in sorted(n for n, g in chosen.items() if g.get("kind") == "hydra"):
            plan[name] = [name]
    return plan


def ratio_pairs(variants: Sequence[str]) -> list[tuple[str, str]]:
    """``(numerator, denominator)`` pairs whose per-round ratios are reported.

    Every Hydra variant against the single model and the deep ensemble of its precision; each deep
    ensemble against the single model of its precision.
    """
    present = set(variants)
    pairs = []
    for name in variants:
        if name.startswith("hydra"):
            suffix = name[len(name.split(".")[0]):]
            for den in (f"single{suffix}", f"deep-ensemble{suffix}"):
                if den in present:
                    pairs.append((name, den))
    for name in variants:
        if name.startswith("deep-ensemble"):
            suffix = name[len("deep-ensemble"):]
            if f"single{suffix}" in present:
                pairs.append((name, f"single{suffix}"))
    return pairs


# ------------------------------------------------------------------------------------- feeds
def _input_entries(graphs: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The inputs (name, dtype, dims) from the first graph with a summary."""
    for g in graphs.values():
        entries = (g.get("summary") or {}).get("inputs")
        if entries:
            return [dict(e) for e in entries]
    names = next(iter(graphs.values())).get("inputs") or []
    return [{"name": n, "dtype": "float" if n == "pixel_values" else "int64", "dims": []} for n in names]


def vocabulary_size(onnx_path: Path, input_name: str = "input_ids") -> int | None:
    """Rows of the embedding table gathered by ``input_name`` (None when not found)."""
    import onnx

    model = onnx.load(str(onnx_path), load_external_data=False)
    inits = {i.name: i for i in model.graph.initializer}
    sources = {input_name}
    for node in model.graph.node:  # follow Cast/Identity of the ids to the Gather
        if node.op_type in ("Cast", "Identity") and node.input and node.input[0] in sources:
            sources.update(node.output)
    for node in model.graph.node:
        if node.op_type == "Gather" and len(node.input) > 1 and node.input[1] in sources and node.input[0] in inits:
            dims = list(inits[node.input[0]].dims)
            if dims:
                return int(dims[0])
    return None


def make_feed(
    inputs: Sequence[Mapping[str, Any]],
    batch: int,
    sequence: int,
    *,
    vocab: int | None = None,
    seed: int = 0,
) -> dict[str, np.ndarray]:
    """One feed for graphs with these ``inputs`` (``[{"name", "dtype", "dims"}]``).

    Text: ``input_ids`` uniform in ``TOKEN_RANGE`` (scaled down into a smaller vocabulary),
    ``attention_mask`` all ones, ``token_type_ids`` zeros, int64 ``[batch, sequence]``.
    Images: ``pixel_values`` standard normal float32 ``[batch, C, H, W]`` (static dims).
    """
    rng = np.random.default_rng(seed)
    feed: dict[str, np.ndarray] = {}
    low, high = TOKEN_RANGE
    if vocab is not None and vocab <= high:
        low, high = max(1, vocab // 10), vocab
    for entry in inputs:
        name, dims = entry["name"], list(entry.get("dims") or [])
        if _is_float(entry):
            rest = dims[1:]
            if not rest or not all(isinstance(d, int) for d in rest):
                raise GraphError(f"input '{name}' has dims {dims}: the image benchmark needs static C, H, W.")
            feed[name] = rng.standard_normal((batch, *rest)).astype(np.float32)
        elif name == "input_ids":
            feed[name] = rng.integers(low, high, size=(batch, sequence), dtype=np.int64)
        elif name == "attention_mask":
            feed[name] = np.ones((batch, sequence), dtype=np.int64)
        else:  # token_type_ids and any other id input
            feed[name] = np.zeros((batch, sequence), dtype=np.int64)
    return feed


def _is_float(entry: Mapping[str, Any]) -> bool:
    """A floating-point input (image pixels): static ``C, H, W``, no sequence axis."""
    return entry.get("dtype") in _FLOAT_DTYPES


def _is_text(inputs: Sequence[Mapping[str, Any]]) -> bool:
    return not any(_is_float(e) for e in inputs)


def _cast_for(runner: Runner, feed: Mapping[str, np.ndarray]) -> dict[str, np.ndarray] | None:
    """A copy of ``feed`` in the runner's input dtypes, or None when it already matches."""
    specs = runner.input_specs()
    if all(feed[k].dtype == specs[k].dtype for k in feed if k in specs):
        return None
    return {k: v.astype(specs[k].dtype) if k in specs else v for k, v in feed.items()}


# ------------------------------------------------------------------------------------ runners
def _torch_specs(inputs: Sequence[Mapping[str, Any]]) -> dict[str, tuple]:
    specs = {}
    for e in inputs:
        if _is_float(e):
            specs[e["name"]] = (np.float32, ("batch", *list(e.get("dims") or [None])[1:]))
        else:
            specs[e["name"]] = (np.int64, ("batch", "sequence"))
    return specs


def build_runners(
    kind: str,
    graph_names: Sequence[str],
    graphs: Mapping[str, Mapping[str, Any]],
    export_dir: Path,
    *,
    threads: int,
    engines_dir: Path | None = None,
    torch_modules: Mapping[str, Any] | None = None,
    inputs: Sequence[Mapping[str, Any]] = (),
    entries: Mapping[str, Mapping[str, Any]] | None = None,
) -> tuple[dict[str, Runner], dict[str, str]]:
    """Inactive runners of ``kind`` for the graphs it can run, and graph -> reason for the others.

    Each runner is built by the engine registry (:func:`~toolchain.engines.runner_for`) from the
    graph's export entry completed by the kind's own (``entries``; default: what the kind runs,
    ``engines.json`` for a kind the build stage builds first, MissingDependencyError when there is none).
    """
    if kind not in ENGINE_KINDS:
        raise EngineError(f"run_bench: engine kind must be one of {ENGINE_KINDS}; got '{kind}'.")
    runners: dict[str, Runner] = {}
    missing: dict[str, str] = {}
    build_dir = engines_dir or Path(export_dir).parent / "build"
    if entries is None:
        entries = entries_for(kind, graphs, build_dir=build_dir)
    for name in graph_names:
        try:  # a built kind's entry (engines.json) completes the graph's; none: the kind says what is missing
            runners[name] = runner_for(kind, {**graphs.get(name, {}), **entries.get(name, {})},
                                       export_dir=Path(export_dir), build_dir=build_dir, threads=threads, name=name,
                                       module=(torch_modules or {}).get(name), input_specs=_torch_specs(inputs))
        except EngineUnavailable as exc:
            missing[name] = str(exc)
    return runners, missing


def _kind_entries(kind: str, graphs: Mapping[str, Mapping[str, Any]], precisions: Sequence[str],
                  build_dir: Path) -> tuple[dict[str, Mapping[str, Any]], list[str], dict[str, str]]:
    """What ``kind`` benchmarks: its entries, the precisions it runs for real, and why it skips the others.

    A kind that runs graphs as exported benchmarks the export's graphs at the precisions it runs
    natively (a substitute such as the BF16 emulator measures no deployment's latency); a kind the
    build stage builds, its built engines (``engines.json``), and records what could not be built.
    """
    spec = engine_kind(kind)
    if spec.needs_build:
        built = entries_for(kind, graphs, build_dir=build_dir)
        kept = {n: {**graphs.get(str(e.get("graph", n)), {}), **graphs.get(n, {}), **e} for n, e in built.items()}
        have = {str(e.get("precision", "fp32")) for e in kept.values()}
        skipped = {f"{p} engines": "none built here" + (f" ({r})" if (r := spec.unavailable(p)) else "")
                   for p in precisions if p not in have}
        return kept, [p for p in precisions if p in have], skipped
    runs = [p for p in precisions if p in spec.precisions]
    skipped = {f"{p} graphs": spec.unsupported.get(p, f"{kind} runs no {p} kernels of its own (its substitute "
                                                       f"{spec.substitutes[p]} is for parity, not latency)"
                                               if p in spec.substitutes else f"{kind} does not run {p} graphs")
               for p in precisions if p not in runs}
    return dict(graphs), runs, skipped


def _activate(runners: Mapping[str, Runner]) -> dict[str, int]:
    """Activate every runner; return each one's resident-set growth (bytes) while loading."""
    grown = {}
    try:
        for name, runner in runners.items():
            before = process_memory()["rss_bytes"]
            runner.activate()
            grown[name] = max(0, process_memory()["rss_bytes"] - before)
    except BaseException:
        _deactivate(runners)
        raise
    return grown


def _deactivate(runners: Mapping[str, Runner]) -> None:
    for runner in runners.values():
        runner.deactivate()


# ------------------------------------------------------------------------------- cost model
def _auto_cost_model(hydra_dir: Path, inputs: Sequence[Mapping[str, Any]], sequence: int,
                     vocab: int | None) -> tuple[CostModel, int]:
    """Cost model and token count from a saved Hydra model (``fuse/hydra`` of the pipeline)."""
    import torch

    from toolchain.hydra.fuse import load_hydra

    model = load_hydra(hydra_dir)
    feed = {k: torch.from_numpy(v) for k, v in make_feed(inputs, 1, sequence, vocab=vocab).items()
            if k in model.config.input_names}
    with torch.no_grad():
        hidden = model.embeddings(**feed)[0]
    return cost_model_from_hydra(model, feed), int(hidden.shape[1])


def _analytic(
    cost_model: CostModel | None, tokens: int | None, batch_sizes: Sequence[int], precisions: Sequence[str]
) -> dict[str, Any]:
    if cost_model is None or tokens is None:
        return {}
    return {p: {str(b): cost_model.compare(b, tokens, _DTYPE_BYTES.get(p, 4)) for b in batch_sizes}
            for p in precisions}


def _unstreamed(cost_model: CostModel | None, precisions: Sequence[str]) -> dict[str, dict[str, float]]:
    """Per precision, cost key -> bytes of the input stages (embedding tables are gathered, not streamed)."""
    if cost_model is None:
        return {}
    copies = embedding_copies(cost_model.members)
    return {p: {k: float(n * cost_model.spec.embedding_params * _DTYPE_BYTES.get(p, 4)) for k, n in copies.items()}
            for p in precisions}


# -------------------------------------------------------------------------------- run_bench
def run_bench(
    export_dir: Path,
    *,
    batch_sizes: Sequence[int] = (1, 8),
    sequence_length: int = 128,
    threads: int = 2,
    warmup: int = 3,
    rounds: int | Mapping[int, int] = 15,
    engines: Sequence[str] | None = None,
    out_dir: Path | None = None,
    progress: bool = True,
    precisions: Sequence[str] = ("fp32",),
    torch_modules: Mapping[str, Any] | None = None,
    cost_model: CostModel | None = None,
    tokens: int | None = None,
    hydra_dir: Path | None = None,
    peaks: Peaks | None = None,
    peak_flops: float | None = None,
    bandwidth: float | None = None,
    engines_dir: Path | None = None,
    stem: str = "latency",
    seed: int = 0,
    graphs: Mapping[str, Mapping[str, Any]] | None = None,
    plan: Mapping[str, Sequence[str]] | None = None,
    pairs: Sequence[tuple[str, str]] | None = None,
    entries: Mapping[str, Mapping[str, Mapping[str, Any]]] | None = None,
    plans: Mapping[str, Mapping[str, Sequence[str]]] | None = None,
    cross_pairs: Sequence[tuple[str, str]] | None = None,
    real_feeds: Sequence[Mapping[str, np.ndarray]] | None = None,
    real_rounds: int = 3,
) -> dict[str, Any]:
    """Measure single model, deep ensemble and Hydra graphs of an export folder; write the report.

    Args:
        export_dir: folder with ``graphs.json`` (the pipeline's ``artifacts/<recipe>/export``).
        batch_sizes: batch sizes to time (each a case).
        sequence_length: tokens per text sample (image graphs use their static size).
        threads: intra-op threads of every session (and of torch for the reference).
        warmup: untimed passes per case.
        rounds: timed interleaved rounds per case, or batch size -> rounds (short cases afford
            more rounds; a batch size left out gets the largest count given).
        engines: runner kinds (``onnxrt-cpu``, ``onnxrt-cuda``, ``tensorrt``, ``torch``); a kind
            whose dependencies are missing is skipped with its reason (default: the recipe
            default's kinds that run files, i.e. ``onnxrt-cpu``).
        out_dir: where ``<stem>.json``, ``<stem>.md`` and ``<stem>.png`` go (None: write nothing).
        progress: tqdm bar over rounds.
        precisions: graph precisions to time (``fp32``; ``fp16``/``bf16`` where exported).
        torch_modules: graph name -> dict-output ``nn.Module`` for the ``torch`` kind.
        cost_model: analytic costs (:class:`CostModel`); default: from ``hydra_dir``.
        tokens: tokens per sample for the cost model (default: ``sequence_length`` for text).
        hydra_dir: saved Hydra model (default ``export_dir/../fuse/hydra`` when it exists).
        peaks: machine peaks (:class:`Peaks`); default: from the two arguments below, the rest
            calibrated (:func:`~toolchain.bench.roofline.calibrate`).
        peak_flops: peak FLOP/s override.
        bandwidth: memory bandwidth override, bytes/s.
        engines_dir: folder with the TensorRT ``engines.json`` (default ``export_dir/../build``).
        stem: file name stem of the report files.
        seed: seed of the generated feeds.
        graphs: the graphs to run instead of ``export_dir``'s ``graphs.json`` (name -> entry with
            ``path``, absolute or relative to ``export_dir``, and ``summary``); ``hydra-toolchain
            bench GRAPH...`` passes the files it was given.
        plan: variant name -> graph names, instead of :func:`plan_variants`.
        pairs: ``(numerator, denominator)`` variants whose per-round ratios are reported, instead
            of :func:`ratio_pairs`.
        entries: kind -> name -> the entry its runner is built from, instead of what the kind runs
            (``graphs``, or ``engines.json`` for a kind the build stage builds): ``bench GRAPH...``
            passes graphs a compiling kind (OpenVINO) compiles at a precision.
        plans: kind -> its own plan (variant -> names), instead of ``plan`` / :func:`plan_variants`.
        cross_pairs: ``("<kind>:<variant>", "<kind>:<variant>")`` per-round ratios across kinds
            (default: each variant of every other kind against the first kind's variant of the same
            base name at FP32, e.g. ``openvino-cpu:hydra-conv.bf16 / onnxrt-cpu:hydra-conv``).
        real_feeds: batches of real rows (the test split in token-length order); each variant
            runs the whole list once per round, ``real_rounds`` interleaved rounds: rows per second.
        real_rounds: rounds of ``real_feeds``.

    Every kind's variants are measured in ONE interleaved run per case (``A B C A' B' C' ...``):
    drift hits all engines alike, and ratios across engines are per round too.

    Returns:
        The JSON-able result (also written as ``<stem>.json``): ``settings``, ``machine``,
        ``graphs`` (files and sizes), ``engines`` (status, plan, variants, files, load memory),
        ``cases`` (per engine and batch: every sample, statistics, per-round ratios, analytic costs
        and roofline ratios), ``cross_ratios`` (per batch), ``throughput`` (real rows), ``analytic``,
        ``peaks``, ``memory``.
    """
    from toolchain.bench.report import machine_info, write_report

    export_dir = Path(export_dir)
    if engines is None:
        engines = [k for k in default_engines() if engine_kind(k).runs_files]
    per_batch = _rounds_per_batch(rounds, batch_sizes)
    _check_settings(batch_sizes, sequence_length, threads, warmup, min(per_batch.values()), engines)
    graphs = dict(graphs) if graphs is not None else read_graphs(export_dir)
    given_plan = dict(plan) if plan else None
    if plans:
        plan = {v: list(n) for p in plans.values() for v, n in p.items()}
    else:
        plan = given_plan if given_plan is not None else plan_variants(graphs, precisions)
    if not plan:
        raise GraphError(f"graphs.json in {export_dir} has no single-model or Hydra graph of precision {precisions}.")
    needed = [n for n in dict.fromkeys(n for names in plan.values() for n in names) if n in graphs]
    inputs = _input_entries({n: graphs[n] for n in needed})
    text = _is_text(inputs)
    onnx_files = [export_dir / graphs[n]["path"] for n in needed if str(graphs[n]["path"]).endswith(".onnx")]
    vocab = vocabulary_size(onnx_files[0]) if text and onnx_files else None
    started = time.time()
    memory_start = process_memory()
    machine = machine_info(threads)

    # analytic costs (for the roofline) -------------------------------------------------------
    analytic_note = None
    hydra_dir = Path(hydra_dir) if hydra_dir is not None else export_dir.parent / "fuse" / "hydra"
    if cost_model is None and hydra_dir.is_dir():
        try:
            cost_model, found_tokens = _auto_cost_model(hydra_dir, inputs, sequence_length, vocab)
            tokens = tokens or found_tokens
        except (ModelError, ValueError, OSError, RuntimeError) as exc:  # reported; the bench runs on
            analytic_note = f"cost model not built from {hydra_dir}: {exc}"
            log.warning("%s", analytic_note)
    if cost_model is not None and tokens is None and text:
        tokens = sequence_length
    if cost_model is None and analytic_note is None:
        analytic_note = f"no cost model (pass cost_model= or save the fused model in {hydra_dir})"
    elif cost_model is not None and tokens is None:
        analytic_note = "image graphs need tokens= (patches + class token) for the analytic costs"
    analytic = _analytic(cost_model, tokens, batch_sizes, precisions)
    unstreamed = _unstreamed(cost_model, precisions)
    if analytic and peaks is None:
        peaks = resolve_peaks(threads, peak_flops=peak_flops, bandwidth=bandwidth)

    # cases ---------------------------------------------------------------------------------
    base_feeds = {b: make_feed(inputs, b, sequence_length, vocab=vocab, seed=seed + b) for b in batch_sizes}

    def key(b: int) -> dict[str, int]:
        return {"batch": b, "sequence": sequence_length} if text else {"batch": b}

    graph_info = {n: {k: graphs[n].get(k) for k in ("kind", "lowering", "precision", "path")} |
                  {"footprint": file_footprint(export_dir / graphs[n]["path"])} for n in needed}
    build_dir = engines_dir or export_dir.parent / "build"
    engines_out: dict[str, Any] = {}
    columns: dict[str, dict[str, Any]] = {}  # kind -> runners, plan, files, loaded memory
    try:
        for kind in engines:
            try:
                column = _column(kind, graphs, export_dir, build_dir, precisions, entries, plans, given_plan,
                                 threads, torch_modules, inputs)
                column["loaded"] = _activate(column["runners"])
            except MissingDependencyError as exc:
                engines_out[kind] = {"status": "skipped", "reason": str(exc)}
                log.warning("bench: skipping %s: %s", kind, exc)
                continue
            columns[kind] = column
        infos, results = _bench_all(columns, base_feeds, key, warmup, per_batch, progress, threads)
        engines_out.update(infos)
        throughput = (_throughput(columns, real_feeds, real_rounds, progress, threads)
                      if real_feeds and columns else None)
    finally:
        for column in columns.values():
            _deactivate(column["runners"])
    cases_out: list[dict[str, Any]] = []
    for kind, res in results:
        info = {**graph_info, **columns[kind]["files"]}
        cases_out.append(_case_entry(kind, res, analytic, peaks, info, columns[kind]["plan"], unstreamed,
                                     pairs))
    cross = _cross_ratios(results, columns, cross_pairs)
    engines_out = {k: engines_out[k] for k in engines if k in engines_out}
    result = {
        "schema": "hydra-toolchain.bench/1",
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(started)),
        "duration_s": round(time.time() - started, 2),
        "settings": {"export_dir": str(export_dir), "batch_sizes": list(batch_sizes),
                     "sequence_length": sequence_length if text else None, "modality": "text" if text else "image",
                     "threads": threads, "warmup": warmup, "rounds": {str(b): n for b, n in per_batch.items()},
                     "engines": list(engines),
                     "precisions": list(precisions), "seed": seed, "vocabulary": vocab,
                     "token_range": list(TOKEN_RANGE) if text else None, "tokens": tokens},
        "machine": machine,
        "plan": next((c["plan"] for c in columns.values()), plan),
        "graphs": graph_info,
        "engines": engines_out,
        "cases": cases_out,
        "cross_ratios": cross,
        "throughput": throughput,
        "analytic": {"cost_model": cost_model.as_dict() if cost_model else None, "note": analytic_note,
                     "by_precision": analytic},
        "peaks": peaks.as_dict() if peaks is not None else None,
        "memory": {"start": memory_start, "end": process_memory()},
    }
    result["machine"]["loadavg_end"] = _loadavg()
    if out_dir is not None:
        result["files"] = {k: str(v) for k, v in write_report(result, Path(out_dir), stem=stem).items()}
    return result


def _check_settings(batch_sizes: Sequence[int], sequence_length: int, threads: int, warmup: int, rounds: int,
                    engines: Sequence[str]) -> None:
    problems = []
    if not batch_sizes or any(not isinstance(b, int) or b < 1 for b in batch_sizes):
        problems.append(f"batch_sizes must be positive ints, got {list(batch_sizes)}")
    if not isinstance(sequence_length, int) or sequence_length < 1:
        problems.append(f"sequence_length must be a positive int, got {sequence_length!r}")
    if threads < 1:
        problems.append(f"threads must be >= 1, got {threads}")
    if warmup < 0 or rounds < 1:
        problems.append(f"warmup must be >= 0 and rounds >= 1, got warmup={warmup}, rounds={rounds}")
    unknown = [e for e in engines if e not in ENGINE_KINDS]
    if unknown or not engines:
        problems.append(f"engines must be a non-empty subset of {ENGINE_KINDS}, got {list(engines)}")
    if problems:
        raise ValueError("run_bench: " + "; ".join(problems))


def _rounds_per_batch(rounds: int | Mapping[int, int], batch_sizes: Sequence[int]) -> dict[int, int]:
    if isinstance(rounds, Mapping):
        if not rounds:
            raise ValueError("run_bench: rounds is an empty mapping; give batch size -> rounds")
        fallback = max(int(v) for v in rounds.values())
        return {b: int(rounds.get(b, fallback)) for b in batch_sizes}
    return {b: int(rounds) for b in batch_sizes}


def _loadavg() -> list[float] | None:
    try:
        import os

        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def _column(kind: str, graphs: Mapping[str, Mapping[str, Any]], export_dir: Path, build_dir: Path,
            precisions: Sequence[str], entries: Mapping[str, Mapping[str, Mapping[str, Any]]] | None,
            plans: Mapping[str, Mapping[str, Sequence[str]]] | None, plan: Mapping[str, Sequence[str]] | None,
            threads: int, torch_modules: Mapping[str, Any] | None,
            inputs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One kind's inactive runners, its plan (variants it can run), its files and what it skips and why."""
    if entries is not None and kind in entries:
        kind_entries, runs, skipped = dict(entries[kind]), list(precisions), {}
    else:
        kind_entries, runs, skipped = _kind_entries(kind, graphs, precisions, build_dir)
    kplan = dict((plans or {}).get(kind) or plan or plan_variants(kind_entries, runs))
    names = list(dict.fromkeys(n for gnames in kplan.values() for n in gnames))
    runners, missing = build_runners(kind, names, graphs, export_dir, threads=threads, engines_dir=build_dir,
                                     torch_modules=torch_modules, inputs=inputs, entries=kind_entries)
    if not runners:
        why = "; ".join(sorted(set(missing.values()))) or f"no graphs of precision {', '.join(runs) or '-'}"
        raise MissingDependencyError(f"{kind}: nothing to run ({why})")
    files = {}
    for name in runners:
        e = {**graphs.get(name, {}), **kind_entries.get(name, {})}
        path = Path(build_dir) / e["engine"] if "engine" in e else Path(export_dir) / e["path"]
        if path.is_file():
            files[name] = {"kind": e.get("kind"), "lowering": e.get("lowering"), "precision": e.get("precision"),
                           "path": str(path), "footprint": file_footprint(path)}
    plan_ok, plan_skipped = {}, dict(skipped)
    for vname, gnames in kplan.items():
        absent = [g for g in gnames if g not in runners]
        if absent:
            plan_skipped[vname] = f"{', '.join(absent)}: {missing.get(absent[0], 'not available')}"
        else:
            plan_ok[vname] = list(gnames)
    if not plan_ok:
        raise MissingDependencyError(f"{kind}: no variant runs ({plan_skipped})")
    return {"runners": runners, "plan": plan_ok, "skipped": plan_skipped, "files": files}


def _bench_all(
    columns: Mapping[str, Mapping[str, Any]],
    base_feeds: Mapping[int, dict[str, np.ndarray]],
    key: Any,
    warmup: int,
    rounds: Mapping[int, int],
    progress: bool,
    threads: int,
) -> tuple[dict[str, Any], list[tuple[str, CaseResult]]]:
    """Every kind's variants in one interleaved run per case: per-kind info, and ``(kind, CaseResult)`` per case."""
    import contextlib

    variants, out = [], {}
    for kind, c in columns.items():
        for vname, gnames in c["plan"].items():
            variants.append(Variant(f"{kind}:{vname}", [c["runners"][g] for g in gnames], kind, {"graphs": gnames}))
    if not variants:
        return {}, []
    cases = []
    for b, feed in base_feeds.items():
        own = {}
        for v in variants:
            cast = _cast_for(v.runners[0], feed)
            if cast is not None:
                own[v.name] = cast
        cases.append(Case(key(b), feed, own, rounds[b]))
    with contextlib.ExitStack() as stack:
        for kind in columns:  # torch: its global intra-op pool
            stack.enter_context(engine_thread_scope(kind, threads))
        combined = measure(variants, cases, warmup=warmup, rounds=max(rounds.values()), progress=progress,
                           description=", ".join(columns))
    results = []
    for kind, c in columns.items():
        mine = [f"{kind}:{v}" for v in c["plan"]]
        for res in combined:
            results.append((kind, CaseResult(res.case, {n.split(":", 1)[1]: res.samples[n] for n in mine},
                                             {n.split(":", 1)[1]: res.clocks[n] for n in mine},
                                             [n.split(":", 1)[1] for n in res.order if n in mine])))
        first = next(r for k, r in results if k == kind)
        out[kind] = {
            "status": "ok", "plan": c["plan"],
            "variants": {v: {"graphs": g, "runners": len(g), "clock": first.clocks[v],
                             "load_rss_bytes": sum(c["loaded"].get(x, 0) for x in dict.fromkeys(g))}
                         for v, g in c["plan"].items()},
            "skipped_variants": c["skipped"], "files": c["files"],
            "peak_rss_bytes": process_memory()["peak_rss_bytes"],
        }
    return out, results


def _default_cross_pairs(columns: Mapping[str, Mapping[str, Any]]) -> list[tuple[str, str]]:
    """Each variant of every other kind against the first kind's variant of the same base name at FP32."""
    kinds = list(columns)
    if len(kinds) < 2:
        return []
    first = kinds[0]
    base = set(columns[first]["plan"])
    pairs = []
    for kind in kinds[1:]:
        for vname in columns[kind]["plan"]:
            den = vname.split(".")[0]
            if den in base:
                pairs.append((f"{kind}:{vname}", f"{first}:{den}"))
    return pairs


def _cross_ratios(results: Sequence[tuple[str, CaseResult]], columns: Mapping[str, Mapping[str, Any]],
                  cross_pairs: Sequence[tuple[str, str]] | None) -> list[dict[str, Any]]:
    """Per case: per-round ratios of variants of different kinds (measured in the same rounds)."""
    pairs = list(cross_pairs) if cross_pairs is not None else _default_cross_pairs(columns)
    if not pairs:
        return []
    by_case: dict[str, dict[str, Any]] = {}
    samples: dict[str, dict[str, list[float]]] = {}
    for kind, res in results:
        label = res.case.label()
        by_case.setdefault(label, {**res.case.key, "ratios": {}})
        for v, s in res.samples.items():
            samples.setdefault(label, {})[f"{kind}:{v}"] = s
    for label, entry in by_case.items():
        have = samples[label]
        for num, den in pairs:
            if num in have and den in have:
                entry["ratios"][f"{num}/{den}"] = paired_ratios(have[num], have[den])
    return list(by_case.values())


def _throughput(columns: Mapping[str, Mapping[str, Any]], feeds: Sequence[Mapping[str, np.ndarray]], rounds: int,
                progress: bool, threads: int) -> dict[str, Any]:
    """Rows per second of every variant over ``feeds`` (whole passes, interleaved rounds), and per-round ratios."""
    import contextlib

    rows = int(sum(len(next(iter(f.values()))) for f in feeds))
    variants = [Variant(f"{kind}:{v}", [c["runners"][g] for g in gnames], kind, {"graphs": gnames})
                for kind, c in columns.items() for v, gnames in c["plan"].items()]
    with contextlib.ExitStack() as stack:
        for kind in columns:
            stack.enter_context(engine_thread_scope(kind, threads))
        samples = measure_passes(variants, [dict(f) for f in feeds], rounds=rounds, progress=progress)
    out: dict[str, Any] = {"rows": rows, "batches": len(feeds), "rounds": rounds,
                           "batch_size": max(len(next(iter(f.values()))) for f in feeds), "engines": {}, "ratios": {}}
    for kind, c in columns.items():
        mine = {v: samples[f"{kind}:{v}"] for v in c["plan"]}
        out["engines"][kind] = {v: {"samples_s": s, **summarize(s), "rows_per_s": rows / float(np.median(s))}
                                for v, s in mine.items()}
        out["ratios"][kind] = {f"{a}/{b}": paired_ratios(mine[a], mine[b]) for a, b in ratio_pairs(list(mine))}
    return out


def _case_entry(
    kind: str,
    res: CaseResult,
    analytic: Mapping[str, Any],
    peaks: Peaks | None,
    graph_info: Mapping[str, Mapping[str, Any]],
    plan: Mapping[str, Sequence[str]],
    unstreamed: Mapping[str, Mapping[str, float]],
    pairs: Sequence[tuple[str, str]] | None = None,
) -> dict[str, Any]:
    stats = res.stats()
    entry: dict[str, Any] = {"engine": kind, **res.case.key, "order": res.order,
                             "variants": {}, "ratios": {}, "roofline": {}}
    for name, samples in res.samples.items():
        graphs = plan[name]
        entry["variants"][name] = {
            "samples_s": samples, "clock": res.clocks[name], **stats[name],
            "file_bytes": sum(graph_info[g]["footprint"]["total_bytes"] for g in dict.fromkeys(graphs)),
            "initializer_bytes": sum(graph_info[g]["footprint"].get("initializer_bytes", 0)
                                     for g in dict.fromkeys(graphs)),
        }
    for num, den in (pairs if pairs is not None else ratio_pairs(list(res.samples))):
        if num in res.samples and den in res.samples:
            entry["ratios"][f"{num}/{den}"] = res.ratio(num, den)
    batch = str(res.case.batch)
    if analytic and peaks is not None:
        for precision, by_batch in analytic.items():
            costs = by_batch.get(batch)
            if costs is None:
                continue
            names = [n for n in res.samples if (graph_info[plan[n][0]].get("precision") or "fp32") == precision]
            medians = {n: stats[n]["median"] for n in names}
            entry["roofline"].update(roofline_rows(medians, costs, peaks, unstreamed_bytes=unstreamed.get(precision)))
        fp32 = analytic.get("fp32", {}).get(batch)
        if fp32 is not None:
            entry["analytic_ratios"] = {
                k: v for k, v in fp32["ratios_vs_single"].items() if k in ("hydra", "deep_ensemble", "members")}
            entry["analytic_ratios"]["hydra_vs_deep_ensemble"] = {
                "flops": fp32["hydra"]["flops"] / fp32["deep_ensemble"]["flops"],
                "weight_bytes": fp32["hydra"]["weight_bytes"] / fp32["deep_ensemble"]["weight_bytes"]}
    return entry
