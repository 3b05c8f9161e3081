"""``hydra-toolchain bench GRAPH...``: latency of any ONNX graphs, interleaved, as ratios to the first.

The recipe's ``bench`` stage and this command run the same :func:`toolchain.bench.run_bench`
(interleaved rounds ``A B C A B C ...``, every sample kept, per-round ratios with p10/p90): here
the variants are the given files, each on its own, and every graph is compared with the first.
Inputs are generated from the first graph's input signature (token ids inside its embedding
table). Writes ``<stem>.json``, ``<stem>.md`` and ``<stem>.png``.
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
    """Markdown: median (p50), p90, p99 and the per-round ratio to ``first`` per engine, batch and graph."""
    rows = ["| engine | batch | graph | p50 ms | p90 ms | p99 ms | spread | samples/s | / " + first + " (p10, p90) |",
            "|---|---:|---|---:|---:|---:|---:|---:|---:|"]
    for case in result.get("cases", []):
        for name, v in case["variants"].items():
            r = case["ratios"].get(f"{name}/{first}")
            ratio = "-" if r is None else f"{r['median']:.3f} [{r['p10']:.3f}, {r['p90']:.3f}]"
            ratio = "1" if name == first else ratio
            rows.append(f"| {case['engine']} | {case['batch']} | {name} | {1e3 * v['median']:.3f} | "
                        f"{1e3 * v['p90']:.3f} | {1e3 * v['p99']:.3f} | {v['spread']:.2f} | {v['throughput']:.1f} | "
                        f"{ratio} |")
    return "\n".join(rows)


def bench_graphs(paths: Sequence[str | Path], *, engine: str | None = None, batch_sizes: Sequence[int] = (1, 8),
                 sequence_length: int = 128, threads: int = 2, warmup: int = 3, rounds: int = 15,
                 out: str | Path | None = None, stem: str = "bench", progress: bool = True) -> dict[str, Any]:
    """Time ``paths`` side by side (see the module docstring); return the result, written under ``out``.

    ``engine``: a kind that runs graph files (default: the CPU kind every recipe has).
    """
    from toolchain.artifacts import atomic_write_json, atomic_write_text
    from toolchain.bench import run_bench
    from toolchain.bench.report import machine_line, plot_report
    from toolchain.engines import default_engines, engine_kind
    from toolchain.export.graph import graph_summary

    engine = engine or next(k for k in default_engines() if engine_kind(k).runs_files)
    files = [Path(p).resolve() for p in paths]
    for f in files:
        if not f.is_file() or f.suffix != ".onnx":
            raise GraphError(f"bench: '{f}' is not an .onnx file.")
    names = _names(files)
    graphs = {}
    for name, f in zip(names, files, strict=True):
        summary = graph_summary(f)
        outputs = {o["name"] for o in summary["outputs"]}
        graphs[name] = {"path": str(f), "kind": "hydra" if "member_logits" in outputs else "single",
                        "precision": "fp32", "summary": summary}
    first_inputs = [(e["name"], e["dtype"]) for e in graphs[names[0]]["summary"]["inputs"]]
    for name in names[1:]:
        theirs = [(e["name"], e["dtype"]) for e in graphs[name]["summary"]["inputs"]]
        if theirs != first_inputs:
            raise GraphError(f"bench: {name} takes {theirs}, {names[0]} takes {first_inputs}: graphs compared on one "
                             "feed need the same inputs.")
    result = run_bench(files[0].parent, graphs=graphs, plan={n: [n] for n in names},
                       pairs=[(n, names[0]) for n in names[1:]], batch_sizes=batch_sizes,
                       sequence_length=sequence_length, threads=threads, warmup=warmup, rounds=rounds,
                       engines=[engine], progress=progress, hydra_dir=files[0].parent / ".no-cost-model", seed=0)
    if out is not None:
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        atomic_write_json(out / f"{stem}.json", result)
        md = (f"# Latency of {len(names)} graph(s)\n\n{machine_line(result['machine'])}\n\n"
              f"{bench_table(result, names[0])}\n")
        atomic_write_text(out / f"{stem}.md", md)
        plot_report(result, out / f"{stem}.png", title="hydra-toolchain bench")
        result["files"] = {k: str(out / f"{stem}.{k}") for k in ("json", "md", "png")}
    return result
