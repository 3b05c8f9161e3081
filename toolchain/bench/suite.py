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

import logging
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from toolchain.bench.columns import (
    ENGINE_KINDS,
    activate,
    bench_columns,
    cross_ratios,
    deactivate,
    make_column,
    rows_per_second,
)
from toolchain.bench.measure import (
    CaseResult,
    file_footprint,
    process_memory,
)
from toolchain.bench.plan import (
    TOKEN_RANGE,
    _input_entries,
    _is_text,
    make_feed,
    plan_variants,
    ratio_pairs,
    read_graphs,
    vocabulary_size,
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
    default_engines,
    engine_kind,
)
from toolchain.errors import GraphError, MissingDependencyError, ModelError

log = logging.getLogger(__name__)

_DTYPE_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2, "int8": 1}


# ------------------------------------------------------------------------------------ runners
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
                column = make_column(kind, graphs, export_dir, build_dir, precisions, entries, plans, given_plan,
                                 threads, torch_modules, inputs)
                column["loaded"] = activate(column["runners"])
            except MissingDependencyError as exc:
                engines_out[kind] = {"status": "skipped", "reason": str(exc)}
                log.warning("bench: skipping %s: %s", kind, exc)
                continue
            columns[kind] = column
        infos, results = bench_columns(columns, base_feeds, key, warmup, per_batch, progress, threads)
        engines_out.update(infos)
        throughput = (rows_per_second(columns, real_feeds, real_rounds, progress, threads)
                      if real_feeds and columns else None)
    finally:
        for column in columns.values():
            deactivate(column["runners"])
    cases_out: list[dict[str, Any]] = []
    for kind, res in results:
        info = {**graph_info, **columns[kind]["files"]}
        cases_out.append(_case_entry(kind, res, analytic, peaks, info, columns[kind]["plan"], unstreamed,
                                     pairs))
    cross = cross_ratios(results, columns, cross_pairs)
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
