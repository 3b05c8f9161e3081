"""The cost levers of issue 45 (Hydra at one model's compute): every row of ``rows.py`` against the baselines.

Each row of :data:`rows.ROWS` (recipe overrides: MLP neurons per member, the fork layer, heads per member)
is a ``compare`` variant of the recipe, as in ``benchmarks/diversity/run.py``: its prune, fuse and evaluate
stages are cached under ``artifacts/<recipe>/variants/<row>/`` (a row whose stage key equals the recipe's or
another row's links that folder: ``reuse_stages``); the fine-tuned model and the deep ensemble are the
recipe's own stages. Per row: the analytic FLOPs and parameter ratios to the single model
(``toolchain.hydra.cost.compare_of`` of the row's fused model, batch 1, the recipe's ``max_length``), the
measured latency ratio to the single model at batch 1 and 8 on ONNX Runtime FP32 and OpenVINO BF16
(``latency.measure``; ``--no-latency`` skips it), and the validation numbers of the selection (accuracy,
NLL, ECE, far-OOD AUROC with MSP and MI, the ensemble gain over the mean member): the ``val`` rows and the
``ood_val`` rows no scoring saw (``selection.json`` of the evaluate stage). The rule (``rule.py``, fixed
before the run, written into the header) selects the cheapest row that clears both baselines.

    python benchmarks/cost_levers/run.py                                   # every row (about 1.5 h on 2 cores)
    python benchmarks/cost_levers/run.py --only averaged,mlp-0.33 --no-latency
    python benchmarks/cost_levers/run.py --profile quick --artifacts /tmp/a --out /tmp/o   # smoke run

Writes ``results.md``, ``results.json`` and ``frontier.png`` (FLOPs ratio against far-OOD AUROC and NLL)
into ``--out``.
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent

#: the latency columns: (engine, precision) x batch, each a median ratio to the single model
ENGINES = (("onnxrt-cpu", "fp32"), ("openvino-cpu", "bf16"))
BATCHES = (1, 8)
ENGINE_LABEL = {"onnxrt-cpu": "ORT", "openvino-cpu": "OV"}
#: the validation metrics reported per row (selection.json keys -> column)
METRICS = [("accuracy", "val acc"), ("nll", "NLL"), ("ece", "ECE"), ("auroc_msp", "AUROC MSP"),
           ("auroc_mi", "AUROC MI")]
GAINS = [("nll", "gain NLL"), ("auroc_msp", "gain AUROC MSP")]
BASELINES = ("single", "deep-ensemble")
BASELINE_LABEL = {"single": "single model", "deep-ensemble": "deep ensemble"}


def sibling(name: str) -> Any:
    """``benchmarks/cost_levers/<name>.py`` (rows, rule, latency), loaded by path once as ``cost_levers_<name>``:
    plain ``import rule`` would clash with ``benchmarks/diversity/rule.py`` in one process (the tests)."""
    key = f"cost_levers_{name}"
    if key not in sys.modules:
        spec = importlib.util.spec_from_file_location(key, HERE / f"{name}.py")
        mod = importlib.util.module_from_spec(spec)
        sys.modules[key] = mod
        try:
            spec.loader.exec_module(mod)
        except BaseException:
            del sys.modules[key]
            raise
    return sys.modules[key]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--recipe", default=str(ROOT / "recipes" / "minilm-tweets.yaml"))
    p.add_argument("--profile", default=None, help="recipe profile, e.g. quick (smoke run)")
    p.add_argument("--only", default=None, help="comma-separated row names of rows.py (default: every row)")
    p.add_argument("--out", default=str(HERE), help="where results.{md,json} and frontier.png go")
    p.add_argument("--no-latency", action="store_true", help="skip the measured latency (analytic cost only)")
    p.add_argument("--artifacts", default=None, metavar="DIR",
                   help="artifacts folder instead of the recipe's artifacts_dir (a smoke run under /tmp)")
    return p.parse_args(argv)


def args_text(args: argparse.Namespace) -> str:
    """The command-line options that differ from the defaults, as typed."""
    parts = []
    if Path(args.recipe).resolve() != (ROOT / "recipes" / "minilm-tweets.yaml").resolve():
        parts.append(f"--recipe {os.path.relpath(Path(args.recipe).resolve(), ROOT)}")
    if args.profile:
        parts.append(f"--profile {args.profile}")
    if args.only:
        parts.append(f"--only {args.only}")
    if Path(args.out).resolve() != HERE:
        parts.append(f"--out {args.out}")
    if args.no_latency:
        parts.append("--no-latency")
    if args.artifacts:
        parts.append(f"--artifacts {args.artifacts}")
    return "python benchmarks/cost_levers/run.py" + "".join(" " + p for p in parts)


def commit() -> str:
    """``git describe``-like: the short commit, ``+dirty`` when the work tree has changes (read-only git calls)."""
    def git(*a: str) -> str:
        try:
            return subprocess.run(["git", *a], cwd=ROOT, capture_output=True, text=True, timeout=30).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""

    head = git("rev-parse", "--short", "HEAD")
    return (head + ("+dirty" if git("status", "--porcelain", "--untracked-files=no") else "")) if head else "unknown"


def _cell(v: Any, fmt: str = ".4f") -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, fmt)


def latency_key(engine: str, precision: str, batch: int) -> str:
    """The JSON key of one latency cell: ``onnxrt-cpu fp32 b1``."""
    return f"{engine} {precision} b{batch}"


def latency_cells(measured: dict[str, Any], name: str) -> dict[str, dict[str, Any]]:
    """One model's cells of ``latency.measure``'s answer, keyed by :func:`latency_key`: ``{"ratio": median over
    rounds of its time / the single model's, "spread": [p10, p90], "median_ms"}``; cells not measured are left out
    (an engine unavailable on this CPU: ``measured["engines"]`` says why)."""
    out: dict[str, dict[str, Any]] = {}
    for engine_key, by_batch in ((measured.get("models") or {}).get(name) or {}).items():
        engine, _, precision = engine_key.partition(":")
        for batch, cell in by_batch.items():
            r = cell.get("ratio") or {}
            if "median" in r:
                out[latency_key(engine, precision, int(batch))] = {
                    "ratio": float(r["median"]), "spread": [float(r["p10"]), float(r["p90"])] if "p10" in r else None,
                    "median_ms": cell.get("median_ms")}
    return out


def _lat_cell(cell: dict[str, Any] | None) -> str:
    if not cell:
        return "-"
    s = cell.get("spread")
    return f"{cell['ratio']:.2f}" + (f" [{s[0]:.2f}, {s[1]:.2f}]" if s else "")


def summarize(rows: dict[str, dict], baselines: dict[str, dict]) -> dict[str, Any]:
    """The rule's verdict (``rule.select_by_cost``) on the rows' validation metrics and FLOPs ratios."""
    select_by_cost = sibling("rule").select_by_cost
    cands = {n: {**{k: r["validation"].get(k) for k in ("accuracy", "nll", "auroc_msp")},
                 "flops_ratio": r["flops_ratio"]} for n, r in rows.items()}
    return select_by_cost(cands, {b: baselines[b]["validation"] for b in BASELINES if b in baselines})


def markdown(result: dict[str, Any]) -> str:
    """``results.md``: header (command, commit, machine, rule, wall time), the table, the verdict, the picture."""
    rule = sibling("rule")
    CONDITIONS, RULE, TARGET = rule.CONDITIONS, rule.RULE, rule.TARGET

    from toolchain.report import gain_cell

    rows, baselines, verdict = result["rows"], result["baselines"], result["verdict"]
    lat_cols = [(e, p, b) for e, p in ENGINES for b in BATCHES]
    head = ("| row | FLOPs x | params x | " + " | ".join(f"{ENGINE_LABEL.get(e, e)} {p.upper()} b{b}"
                                                        for e, p, b in lat_cols)
            + " | " + " | ".join(c for _, c in METRICS) + " | " + " | ".join(c for _, c in GAINS)
            + " | fails | s |")
    lines = [head, "|---|" + "---:|" * (2 + len(lat_cols) + len(METRICS) + len(GAINS)) + "---|---:|"]

    def line(label: str, r: dict[str, Any], fails: str) -> str:
        lat = r.get("latency") or {}
        v, g = r.get("validation") or {}, r.get("gain") or {}
        return (f"| {label} | {_cell(r.get('flops_ratio'), '.2f')} | {_cell(r.get('params_ratio'), '.2f')} | "
                + " | ".join(_lat_cell(lat.get(latency_key(*c))) for c in lat_cols) + " | "
                + " | ".join(_cell(v.get(k)) for k, _ in METRICS) + " | "
                + " | ".join(gain_cell(g.get(k)) for k, _ in GAINS)
                + f" | {fails} | {_cell(r.get('seconds'), '.0f')} |")

    for b in BASELINES:
        if b in baselines:
            lines.append(line(f"{BASELINE_LABEL[b]} (baseline)", baselines[b], "-"))
    front = set(verdict["frontier"])
    for name in sorted(rows, key=lambda n: (rows[n]["flops_ratio"], n)):
        fails = verdict["failing"].get(name, {})
        mark = " **(selected)**" if name == verdict["selected"] else ""
        mark += " (frontier)" if name in front else ""
        cell = ", ".join(f"{c} {'missing' if math.isnan(m) else f'{m:+.4f}'}" for c, m in fails.items()) or "none"
        lines.append(line(name + mark, rows[name], cell))
    t = verdict["thresholds"]
    bounds = (f"accuracy >= {t['accuracy']:.4f}, NLL <= {t['nll']:.4f}, AUROC (MSP) >= {t['auroc_msp']:.4f}")
    lat = result.get("latency") or {}
    lat_note = ("Latency: not measured (`--no-latency`)." if not lat.get("measured") else
                f"Latency: median ratio to the single model [spread], {lat.get('note', '')}".rstrip(", ") + ".")
    binding = "; ".join(f"{c}: {', '.join(verdict['binding'][c]) or 'none'}" for c in CONDITIONS)
    return "\n".join([
        f"# Cost levers ({result['recipe']}{', profile ' + result['profile'] if result.get('profile') else ''}): "
        "Hydra at one model's compute (issue 45)",
        "",
        f"Command: `{result['command']}` at commit {result['commit']}; wall time {result['wall_s']:.0f} s.",
        "",
        f"Machine: {result['machine']}.",
        "",
        f"**Selection rule** (`rule.py`, fixed before the run; validation data only): {RULE}.",
        "",
        f"Columns: analytic FLOPs and parameter ratios to the single model (`toolchain.hydra.cost.compare_of`, "
        f"batch 1, sequence {result['seq']}); measured latency ratios (engine, precision, batch); validation "
        f"metrics ({result['validation_rows']}); gain = ensemble minus its mean member on the same rows (positive = "
        "better, 95% paired-bootstrap interval, `*` where it excludes 0); fails: the conditions of the rule a row "
        f"misses and by how much ({bounds}); (frontier): no other row is as cheap and as good on accuracy, NLL and "
        "AUROC; s: the row's wall time (0 where every stage was cached).",
        "",
        *lines,
        "",
        lat_note,
        "",
        f"Selected: **{verdict['selected'] or 'none (deploy the single model)'}**: {verdict['why']}.",
        "",
        f"What binds (rows failing each condition, cheapest first): {binding}.",
        "",
        f"![FLOPs ratio vs far-OOD AUROC and NLL; dashed: {TARGET}x](frontier.png)",
        "",
    ])


def plot(result: dict[str, Any], path: Path) -> None:
    """Two panels: FLOPs ratio (x) against far-OOD validation AUROC (MSP) and against NLL; the target line."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure
    TARGET = sibling("rule").TARGET

    rows, baselines, verdict = result["rows"], result["baselines"], result["verdict"]
    fig = Figure(figsize=(11, 4.5))
    axes = fig.subplots(1, 2)
    style = {"single": dict(marker="s", color="black", ms=8), "deep-ensemble": dict(marker="D", color="tab:red", ms=8)}
    for ax, (key, label) in zip(axes, [("auroc_msp", "far-OOD AUROC (MSP), validation"),
                                       ("nll", "NLL, validation (lower is better)")], strict=True):
        points = []
        for name, r in rows.items():
            x, y = r.get("flops_ratio"), (r.get("validation") or {}).get(key)
            if x is None or y is None:
                continue
            ok = name in verdict["eligible"]
            ax.plot([x], [y], marker="*" if name == verdict["selected"] else "o", ms=11 if ok else 6,
                    color="tab:green" if ok else "tab:blue", ls="none")
            points.append((name, x, y))
        _label(ax, points)
        for b, st in style.items():
            r = baselines.get(b) or {}
            x, y = r.get("flops_ratio"), (r.get("validation") or {}).get(key)
            if x is not None and y is not None:
                ax.plot([x], [y], ls="none", label=BASELINE_LABEL[b], **st)
                ax.annotate(BASELINE_LABEL[b], (x, y), fontsize=7, xytext=(3, -9),
                            textcoords="offset points")
                if b == "deep-ensemble":
                    ax.axhline(y, color="tab:red", lw=0.8, ls=":")
        ax.axvline(TARGET, color="grey", lw=1, ls="--", label=f"{TARGET}x the single model's FLOPs")
        ax.set_xlabel("analytic FLOPs / single model")
        ax.set_ylabel(label)
        ax.legend(fontsize=7, loc="best")
    fig.suptitle("Cost levers: green = clears both baselines, star = selected (validation data)", fontsize=10)
    fig.tight_layout()
    tmp = path.with_name(f".{path.name}.tmp.png")
    fig.savefig(tmp, dpi=110)
    tmp.replace(path)


def _label(ax: Any, points: list[tuple[str, float, float]]) -> None:
    """Name every point, moving a label down a line at a time while it would cover one already placed
    (rows of equal cost and close metrics otherwise print on top of each other)."""
    ax.autoscale_view()
    (x0, x1), (y0, y1) = ax.get_xlim(), ax.get_ylim()
    width, height = ax.figure.get_size_inches() * ax.figure.dpi * np.array(ax.get_position().size)
    placed: list[tuple[float, float, float, float]] = []  # label boxes in pixels
    for name, x, y in sorted(points, key=lambda p: (-p[2], p[1])):
        px, py = (x - x0) / (x1 - x0) * width + 4, (y - y0) / (y1 - y0) * height + 4
        w, h, dy = 4.6 * len(name), 9.0, 0.0
        while any(px < bx + bw and bx < px + w and py + dy < by + bh and by < py + dy + h
                  for bx, by, bw, bh in placed):
            dy -= 10.0
        placed.append((px, py + dy, w, h))
        ax.annotate(name, (x, y), fontsize=7, xytext=(3, 3 + dy * 72 / ax.figure.dpi), textcoords="offset points",
                    arrowprops={"arrowstyle": "-", "lw": 0.4, "color": "grey"} if dy else None)


def write(result: dict[str, Any], out: Path) -> str:
    """Write ``results.md``, ``results.json`` and ``frontier.png`` into ``out``; returns the Markdown."""
    from toolchain.artifacts import atomic_write_json, atomic_write_text

    out.mkdir(parents=True, exist_ok=True)
    plot(result, out / "frontier.png")
    md = markdown(result)
    atomic_write_text(out / "results.md", md)
    atomic_write_json(out / "results.json", result)
    return md


def row_record(sub, overrides: dict, seq: int) -> tuple[dict[str, Any], Any]:
    """One row's numbers from its stage folders, and its fused model (for the latency)."""
    from toolchain.artifacts import read_json
    from toolchain.hydra.cost import compare_of
    from toolchain.hydra.io import load_hydra

    model = load_hydra(sub.stage_dir("fuse") / "hydra")
    cost = compare_of(model, batch=1, seq=seq)
    sel = read_json(sub.stage_dir("evaluate") / "selection.json")
    ratios = cost["ratios_vs_single"]
    return {
        "overrides": overrides,
        "flops_ratio": ratios["hydra"]["flops"],
        "params_ratio": ratios["hydra"]["weight_bytes"],
        "cost": {k: {"flops": cost[k]["flops"], "params": cost[k]["params"]} for k in ratios},
        "deep_ensemble_ratio": ratios["deep_ensemble"],
        "validation": sel.get("hydra") or {},
        "members_mean": sel.get("hydra-members-mean") or {},
        "gain": sel.get("gain") or {},
        "ood_val_rows": sel.get("ood_val_rows"),
    }, model


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    sys.path.insert(0, str(ROOT))
    from rich.console import Console

    from toolchain.artifacts import read_json
    from toolchain.bench.report import machine_info, machine_line
    from toolchain.pipeline import Context, run_pipeline
    from toolchain.recipe import CompareEntry, load_recipe
    from toolchain.stages import VARIANT_STAGES, VariantContext

    # diversity's run.py by path (this file is a run.py too): its reuse_stages
    spec = importlib.util.spec_from_file_location("diversity_run", HERE.parent / "diversity" / "run.py")
    diversity = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(diversity)

    ROWS = sibling("rows").ROWS
    console = Console(stderr=True)
    recipe = load_recipe(args.recipe, profile=args.profile)
    if args.artifacts:
        recipe = recipe.model_copy(update={"artifacts_dir": str(Path(args.artifacts).resolve())})
    if not recipe.data.ood:
        console.print(f"error: recipe {args.recipe} has no data.ood: the rule needs validation OOD AUROC")
        return 2
    names = list(ROWS) if args.only is None else [n.strip() for n in args.only.split(",") if n.strip()]
    unknown = [n for n in names if n not in ROWS]
    if unknown:
        console.print(f"error: --only: unknown rows {unknown}; known: {list(ROWS)}")
        return 2
    ctx = Context(recipe=recipe, console=console, progress=sys.stderr.isatty())
    t0 = time.time()
    machine = machine_info(threads=recipe.bench.threads)  # load average at the start
    seq = recipe.model.max_length
    run_pipeline(ctx, only=["load", "finetune", "ensemble", "score", "prune", "fuse", "evaluate"])
    print(f"recipe stages (load to evaluate): {time.time() - t0:.0f} s", flush=True)
    base_sel = read_json(ctx.stage_dir("evaluate") / "selection.json")
    missing = [b for b in BASELINES if b not in base_sel]
    if missing:
        console.print(f"error: {ctx.stage_dir('evaluate') / 'selection.json'} has no {missing} "
                      "(the recipe needs a deep ensemble and validation splits)")
        return 2
    rows: dict[str, dict] = {}
    models: dict[str, Any] = {}
    for name in names:
        t = time.time()
        entry = CompareEntry(name=name, **ROWS[name])
        sub = VariantContext(ctx, recipe.variant(entry))
        if all(sub.key(st) == ctx.key(st) for st in VARIANT_STAGES):
            # the recipe's own Hydra (today the selected row, mlp-0.33): read its stages where they are, no copy
            sub, reused = ctx, {st: "the recipe's own" for st in VARIANT_STAGES}
        else:
            reused = diversity.reuse_stages(ctx, sub, console)
            run_pipeline(sub, only=VARIANT_STAGES)
        rows[name], model = row_record(sub, ROWS[name], seq)
        rows[name]["keys"] = {st: sub.key(st) for st in VARIANT_STAGES}
        rows[name]["reused"] = reused
        rows[name]["seconds"] = time.time() - t
        if not args.no_latency:
            models[name] = model
        print(f"row {name}: {rows[name]['seconds']:.0f} s, FLOPs {rows[name]['flops_ratio']:.2f}x, val acc "
              f"{_cell(rows[name]['validation'].get('accuracy'))}" + (f" (reused {', '.join(reused)})" if reused
                                                                       else ""), flush=True)
    de_ratio = next((r["deep_ensemble_ratio"] for r in rows.values()), None)
    baselines = {"single": {"flops_ratio": 1.0, "params_ratio": 1.0, "validation": base_sel["single"]},
                 "deep-ensemble": {"flops_ratio": de_ratio["flops"] if de_ratio else None,
                                   "params_ratio": de_ratio["weight_bytes"] if de_ratio else None,
                                   "validation": base_sel["deep-ensemble"]}}
    latency: dict[str, Any] = {"measured": False}
    if models:
        t = time.time()
        latency = measure_latency(ctx, models, seq)
        cells = latency.pop("cells")
        for name in rows:
            rows[name]["latency"] = cells.get(name, {})
        baselines["deep-ensemble"]["latency"] = cells.get("deep-ensemble", {})
        baselines["single"]["latency"] = {latency_key(e, p, b): {"ratio": 1.0, "spread": None}
                                          for e, p in ENGINES for b in BATCHES}
        print(f"latency: {time.time() - t:.0f} s", flush=True)
    ood_rows = base_sel.get("ood_val_rows")
    result = {
        "recipe": recipe.name, "profile": args.profile, "command": args_text(args), "commit": commit(),
        "date": time.strftime("%Y-%m-%d"),
        "machine": machine_line({**machine, "loadavg_end": _load()}),
        "seq": seq,
        "validation_rows": f"{recipe.data.id} `val`, {recipe.data.ood} `ood_val` rows "
                           + (f"{ood_rows[0]}-{ood_rows[1] - 1}" if ood_rows else "-") + " that no scoring saw",
        "rows": rows, "baselines": baselines, "latency": latency,
    }
    result["verdict"] = summarize(rows, baselines)
    result["wall_s"] = time.time() - t0
    print(write(result, Path(args.out)))
    return 0


def _load() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def measure_latency(ctx, models: dict[str, Any], seq: int) -> dict[str, Any]:
    """``latency.measure`` on the rows' fused models and the deep ensemble against the fine-tuned single model.

    The recipe's bench section gives warm-up, rounds and threads; graphs and engines go to
    ``artifacts/<recipe>/cost_levers`` (reused while a model's weights are unchanged). Returns
    ``{"measured": True, "note": str, "engines": {kind:precision: status}, "cells": {name: {latency_key: cell}},
    "measure": measure's answer}``; ``cells`` has the deep ensemble too (``"deep-ensemble"``).
    """
    measure = sibling("latency").measure  # imported here: only this needs it (torch, the engines)

    from toolchain.models.wrappers import SingleModel
    from toolchain.stages.common import baseline_models, example_feed

    single, members, _tok, _record = baseline_models(ctx)
    timed = dict(models)
    if members:
        timed["deep-ensemble"] = [SingleModel(a).eval() for a in members]
    bench = ctx.recipe.bench
    work = ctx.root / "cost_levers"
    raw = measure(timed, SingleModel(single).eval(), example_feed(ctx, 2, seq), seq=seq, batches=BATCHES,
                  engines=ENGINES, warmup=bench.warmup, rounds=bench.rounds, work=work, threads=bench.threads,
                  progress=sys.stderr.isatty())
    engines = raw.get("engines") or {}
    off = [f"{k}: {e.get('status')} ({e.get('reason')})" for k, e in engines.items() if e.get("status") != "ok"]
    lower = [f"{k}: {e['note']}" for k, e in engines.items() if e.get("note")]
    note = (f"{bench.rounds} interleaved rounds after {bench.warmup} warm-up, {bench.threads} threads (the recipe's "
            f"bench section), sequence {seq}, ratio per round then the median, [p10, p90] over rounds"
            + ("; not measured: " + "; ".join(off) if off else "") + ("; " + "; ".join(lower) if lower else ""))
    return {"measured": True, "note": note, "engines": engines,
            "cells": {name: latency_cells(raw, name) for name in timed}, "measure": raw}


if __name__ == "__main__":
    raise SystemExit(main())
