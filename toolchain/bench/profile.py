"""Where the time goes: ONNX Runtime's own profiler, totalled per operator type.

:func:`profile_onnx` opens one profiling session per graph (``SessionOptions.enable_profiling``,
same threads and spinning-off options as the bench), runs them round-robin on the same feed
(so load drift hits all alike), then totals the ``*_kernel_time`` events of each session's
trace per ``op_name``. ORT's optimised graph of each file (``optimized_model_filepath``) is
kept and its operator counts reported: they show which fusions happened (a single BERT gets
``SkipLayerNormalization``, ``BiasGelu``, ``FusedMatMul``; a graph whose LayerNorm is spelled
out gets ``ReduceMean``/``Sub``/``Pow``/``Sqrt``/``Div`` instead).

Profiled runs are slower than plain runs (every kernel is timestamped); compare shares and
per-operator totals, not absolute latencies, with the bench.
"""

from __future__ import annotations

import json
import tempfile
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np


def _session(path: Path, threads: int, prefix: str, optimized: Path) -> Any:
    from toolchain.engines.onnxrt import open_session

    return open_session(path, intra_op_threads=threads, inter_op_threads=1, optimized_model_path=optimized,
                        profile_prefix=prefix)


def op_totals(trace: Sequence[Mapping[str, Any]], runs: int) -> dict[str, Any]:
    """Per-op-type kernel time of a parsed ORT trace (the JSON list), per run.

    Returns:
        ``{"total_ms": .., "run_ms": .., "ops": {op: {"ms": .., "share": .., "calls": ..}}}`` with
        ``ops`` sorted by time; ``run_ms`` is the median ``model_run`` event (when present).
    """
    times: Counter[str] = Counter()
    calls: Counter[str] = Counter()
    model_runs = []
    for event in trace:
        if event.get("cat") == "Node" and str(event.get("name", "")).endswith("_kernel_time"):
            op = event.get("args", {}).get("op_name", "?")
            times[op] += int(event.get("dur", 0))
            calls[op] += 1
        elif event.get("cat") == "Session" and event.get("name") == "model_run":
            model_runs.append(int(event.get("dur", 0)))
    total = sum(times.values())
    ops = {op: {"ms": t / runs / 1e3, "share": t / total if total else 0.0, "calls": calls[op] // runs}
           for op, t in times.most_common()}
    model_runs = model_runs[-runs:]
    return {"total_ms": total / runs / 1e3, "run_ms": float(np.median(model_runs)) / 1e3 if model_runs else None,
            "ops": ops}


def profile_onnx(
    graphs: Mapping[str, Path],
    feed: Mapping[str, np.ndarray],
    *,
    threads: int = 2,
    runs: int = 10,
    warmup: int = 2,
    keep_dir: Path | None = None,
) -> dict[str, dict[str, Any]]:
    """Profile each ONNX file on ``feed`` with ONNX Runtime CPU; per-op-type totals per run.

    Args:
        graphs: name -> ``.onnx`` path.
        feed: one input feed every graph accepts.
        threads: intra-op threads.
        runs: profiled runs per graph.
        warmup: runs before those, left out of the totals (the first run allocates its buffers).
        keep_dir: where the traces and ORT-optimised graphs go (default: a temporary folder).

    Returns:
        name -> :func:`op_totals` plus ``optimized_ops`` (op type -> count in ORT's optimised graph).
    """
    if runs < 1 or warmup < 0:
        raise ValueError(f"profile_onnx: runs >= 1 and warmup >= 0 expected; got runs={runs}, warmup={warmup}")
    import onnx

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(keep_dir) if keep_dir is not None else Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        sessions = {name: _session(Path(p), threads, str(folder / f"profile-{name}"), folder / f"optimized-{name}.onnx")
                    for name, p in graphs.items()}
        feed = dict(feed)
        for _ in range(warmup + runs):  # round-robin: drift hits every graph alike
            for s in sessions.values():
                s.run(None, feed)
        out = {}
        for name, s in sessions.items():
            trace = json.loads(Path(s.end_profiling()).read_text())
            out[name] = op_totals(drop_runs(trace, warmup), runs)
            optimized = onnx.load(str(folder / f"optimized-{name}.onnx"), load_external_data=False)
            counts = Counter(n.op_type for n in optimized.graph.node)
            out[name]["optimized_ops"] = dict(counts.most_common())
    return out


def drop_runs(trace: Sequence[Mapping[str, Any]], count: int) -> list[Mapping[str, Any]]:
    """The trace events after the end of the first ``count`` ``model_run`` events (warm-up)."""
    ends = sorted(e["ts"] + e.get("dur", 0) for e in trace
                  if e.get("cat") == "Session" and e.get("name") == "model_run")
    if count <= 0 or not ends:
        return list(trace)
    cut = ends[min(count, len(ends)) - 1]
    return [e for e in trace if e.get("ts", 0) > cut]


def breakdown_table(profiles: Mapping[str, Mapping[str, Any]], top: int = 12) -> str:
    """Markdown: per op type, ms per run and share for every profiled graph, biggest first."""
    names = list(profiles)
    totals: Counter[str] = Counter()
    for p in profiles.values():
        for op, v in p["ops"].items():
            totals[op] += v["ms"]
    ops = [op for op, _ in totals.most_common(top)]
    head = "| op type | " + " | ".join(f"{n} ms (share, calls)" for n in names) + " |"
    rows = [head, "|---|" + "---:|" * len(names)]
    for op in ops:
        cells = []
        for n in names:
            v = profiles[n]["ops"].get(op)
            cells.append(f"{v['ms']:.2f} ({100 * v['share']:.0f}%, {v['calls']})" if v else "-")
        rows.append(f"| {op} | " + " | ".join(cells) + " |")
    rest = []
    for n in names:
        shown = sum(profiles[n]["ops"][op]["ms"] for op in ops if op in profiles[n]["ops"])
        rest.append(f"{profiles[n]['total_ms'] - shown:.2f}")
    rows.append("| (other ops) | " + " | ".join(rest) + " |")
    rows.append("| **all kernels** | " + " | ".join(f"**{profiles[n]['total_ms']:.2f}**" for n in names) + " |")
    return "\n".join(rows)
