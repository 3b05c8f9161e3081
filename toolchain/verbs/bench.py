"""``hydra-toolchain bench GRAPH...``: latency of graphs and engine files, interleaved, as ratios to the first.

The recipe's ``bench`` stage and this command run the same :func:`toolchain.bench.run_bench`
(interleaved rounds ``A B C A B C ...``, every sample kept, per-round ratios with p10/p90): here
the variants are the given files on each ``--engine`` at each ``--precision``
(:func:`toolchain.verbs.targets.targets_for`: ``single.onnx`` on ``onnxrt-cpu`` and on
``openvino-cpu`` at FP32 and BF16 are three variants), all in one interleaved run, every variant
compared with the first. Inputs are generated from the first graph's input signature (token ids
inside its embedding table). Writes ``<stem>.json``, ``<stem>.md`` and ``<stem>.png``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from toolchain.errors import GraphError


def _names(paths: Sequence[Path]) -> list[str]:
    """Variant names: file stems, prefixed with their folder where two stems collide."""
    stems = [p.stem for p in paths]
    return [f"{p.parent.name}/{p.stem}" if stems.count(p.stem) > 1 else p.stem for p in paths]


def bench_table(result: dict[str, Any], first: str) -> str:
    """Markdown: median (p50), p90, p99 and the per-round ratio to ``first`` (``<kind>:<variant>``) per case."""
    first_kind, _, first_name = first.partition(":")
    single_kind = {c["engine"] for c in result.get("cases", [])} == {first_kind}
    shown = first_name if single_kind else first
    rows = ["| engine | batch | graph | p50 ms | p90 ms | p99 ms | spread | samples/s | / " + shown + " (p10, p90) |",
            "|---|---:|---|---:|---:|---:|---:|---:|---:|"]
    cross = {c["batch"]: c["ratios"] for c in result.get("cross_ratios") or []}
    for case in result.get("cases", []):
        for name, v in case["variants"].items():
            label = f"{case['engine']}:{name}"
            r = (case["ratios"].get(f"{name}/{first_name}") if case["engine"] == first_kind
                 else cross.get(case["batch"], {}).get(f"{label}/{first}"))
            ratio = "1" if label == first else ("-" if r is None else
                                                f"{r['median']:.3f} [{r['p10']:.3f}, {r['p90']:.3f}]")
            rows.append(f"| {case['engine']} | {case['batch']} | {name} | {1e3 * v['median']:.3f} | "
                        f"{1e3 * v['p90']:.3f} | {1e3 * v['p99']:.3f} | {v['spread']:.2f} | {v['throughput']:.1f} | "
                        f"{ratio} |")
    return "\n".join(rows)


def bench_graphs(paths: Sequence[str | Path], *, engine: str | Sequence[str] | None = None,
                 precision: str | Sequence[str] | None = None, batch_sizes: Sequence[int] = (1, 8),
                 sequence_length: int = 128, threads: int = 2, warmup: int = 3, rounds: int = 15,
                 out: str | Path | None = None, stem: str = "bench", progress: bool = True) -> dict[str, Any]:
    """Time ``paths`` side by side (see the module docstring); return the result, written under ``out``.

    ``engine``: kinds, a list or ``"a,b"`` (default: the CPU kind every recipe has); ``precision``:
    precisions, a list or ``"fp32,bf16"`` (a compiling kind builds each FP32 graph at each; default:
    each file's own). Every (file, kind, precision) that runs here is one variant of ONE interleaved
    run; the first is the denominator of the ratios; combinations that cannot run are listed under
    ``skipped`` with the reason.
    """
    from toolchain.artifacts import atomic_write_json, atomic_write_text
    from toolchain.bench import run_bench
    from toolchain.bench.report import machine_line, plot_report
    from toolchain.export.graph import graph_summary
    from toolchain.verbs.targets import PRECISIONS, file_kinds, parse_list, targets_for

    targets, skipped = targets_for([Path(p).resolve() for p in paths], parse_list(engine, "--engine", file_kinds()),
                                   parse_list(precision, "--precision", PRECISIONS))
    paths_in_order = list(dict.fromkeys(t.path for t in targets))
    stems = dict(zip(paths_in_order, _names(paths_in_order), strict=True))
    graphs: dict[str, dict[str, Any]] = {}
    entries: dict[str, dict[str, Any]] = {}
    plans: dict[str, dict[str, list[str]]] = {}
    order: list[str] = []
    summaries: dict[Path, dict[str, Any]] = {}
    for t in targets:
        name = stems[t.path]
        if "@" in t.label:  # a graph a kind compiles at a precision
            name = f"{name}@{t.precision}"
        summary = summaries.setdefault(t.path, graph_summary(t.path) if t.path.suffix == ".onnx" else {})
        outputs = {o["name"] for o in summary.get("outputs", [])} or set(t.outputs)
        graphs[name] = {"path": str(t.path), "kind": "hydra" if "member_logits" in outputs else "single",
                        "precision": t.precision, "inputs": list(t.inputs), **({"summary": summary} if summary else {})}
        entries.setdefault(t.kind, {})[name] = t.entry
        plans.setdefault(t.kind, {})[name] = [name]
        order.append(f"{t.kind}:{name}")
    signatures = {n: [e["name"] for e in g["summary"]["inputs"]] if "summary" in g else g["inputs"]
                  for n, g in graphs.items()}
    first = next(iter(signatures))
    for name, sig in signatures.items():
        if sorted(sig) != sorted(signatures[first]):
            raise GraphError(f"bench: {name} takes {sig}, {first} takes {signatures[first]}: graphs compared on one "
                             "feed need the same inputs.")
    first_kind, first_name = order[0].split(":", 1)
    result = run_bench(targets[0].path.parent, graphs=graphs, entries=entries, plans=plans,
                       pairs=[(n, first_name) for n in plans[first_kind] if n != first_name],
                       cross_pairs=[(label, order[0]) for label in order[1:] if not label.startswith(f"{first_kind}:")],
                       batch_sizes=batch_sizes,
                       sequence_length=sequence_length, threads=threads, warmup=warmup, rounds=rounds,
                       engines=list(plans), progress=progress, hydra_dir=targets[0].path.parent / ".no-cost-model",
                       seed=0)
    result["skipped"] = skipped
    result["first"] = order[0]
    if out is not None:
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        atomic_write_json(out / f"{stem}.json", result)
        notes = "".join(f"\n- skipped {k}: {v}" for k, v in skipped.items())
        md = (f"# Latency of {len(order)} variant(s)\n\n{machine_line(result['machine'])}\n\n"
              f"{bench_table(result, order[0])}\n{notes}\n")
        atomic_write_text(out / f"{stem}.md", md)
        plot_report(result, out / f"{stem}.png", title="hydra-toolchain bench")
        result["files"] = {k: str(out / f"{stem}.{k}") for k in ("json", "md", "png")}
    return result
