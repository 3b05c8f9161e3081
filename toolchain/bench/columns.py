"""One column per engine kind: its runners, its plan, and every kind timed in one interleaved run.

:func:`build_runners` makes a kind's runners from its entries (the export's graphs, or the
``engines.json`` of a kind the build stage builds). :func:`bench_columns` times every variant of
every kind in one interleaved :func:`~toolchain.bench.measure.measure` run per case and splits the
samples back per kind; :func:`cross_ratios` pairs variants of different kinds measured in the same
rounds; :func:`throughput` times whole passes over real rows (rows per second).
"""

from __future__ import annotations

import contextlib
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
from toolchain.bench.plan import _cast_for, _torch_specs, plan_variants, ratio_pairs
from toolchain.engines import EngineUnavailable, Runner, engine_kind, entries_for, runner_for, selectable_kinds
from toolchain.engines import thread_scope as engine_thread_scope
from toolchain.errors import EngineError, MissingDependencyError

#: every kind a recipe may name (the engine registry's selectable kinds, sorted)
ENGINE_KINDS = tuple(selectable_kinds())


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


def activate(runners: Mapping[str, Runner]) -> dict[str, int]:
    """Activate every runner; return each one's resident-set growth (bytes) while loading."""
    grown = {}
    try:
        for name, runner in runners.items():
            before = process_memory()["rss_bytes"]
            runner.activate()
            grown[name] = max(0, process_memory()["rss_bytes"] - before)
    except BaseException:
        deactivate(runners)
        raise
    return grown


def deactivate(runners: Mapping[str, Runner]) -> None:
    """Deactivate every runner."""
    for runner in runners.values():
        runner.deactivate()


def make_column(kind: str, graphs: Mapping[str, Mapping[str, Any]], export_dir: Path, build_dir: Path,
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


def bench_columns(
    columns: Mapping[str, Mapping[str, Any]],
    base_feeds: Mapping[int, dict[str, np.ndarray]],
    key: Any,
    warmup: int,
    rounds: Mapping[int, int],
    progress: bool,
    threads: int,
) -> tuple[dict[str, Any], list[tuple[str, CaseResult]]]:
    """Every kind's variants in one interleaved run per case: per-kind info, and ``(kind, CaseResult)`` per case."""
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


def cross_ratios(results: Sequence[tuple[str, CaseResult]], columns: Mapping[str, Mapping[str, Any]],
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


def rows_per_second(columns: Mapping[str, Mapping[str, Any]], feeds: Sequence[Mapping[str, np.ndarray]], rounds: int,
                progress: bool, threads: int) -> dict[str, Any]:
    """Rows per second of every variant over ``feeds`` (whole passes, interleaved rounds), and per-round ratios."""
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
