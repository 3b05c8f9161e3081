"""A finished recipe's headline results: accuracy, NLL, OOD AUROC and latency per engine, from its artifacts.

Reads ``artifacts/<name>/`` of a recipe that ``hydra-toolchain run RECIPE`` finished:

* ``evaluate/metrics.json``: accuracy and NLL per variant (``single``, ``deep-ensemble``, ``hydra``);
* ``evaluate/ood.json``: AUROC of the MSP score on the far-OOD (``far``) and near-OOD (``near``) test rows;
* ``bench/latency.json``: per engine column (``onnxrt-cpu`` FP32, ``openvino-cpu`` FP32 and BF16 ...)
  the median latency at the smallest batch of ``single[.p]``, ``deep-ensemble[.p]`` and
  ``hydra-<lowering>[.p]``, the Hydra/single and Hydra/deep-ensemble per-round ratio medians, and the
  test split's rows per second (``latency.json["throughput"]``);
* ``parity/verdict.json`` (and ``parity/<group>/report.json``): the parity verdict per group.

Writes ``<out>/<name>.json`` (every number, full precision) and ``<out>/<name>.md`` (the headline
table, the ratios, rows/s and parity), default ``<out>``: this folder. ``--readme FILE`` also rewrites
the block between ``<!-- headline:<name> -->`` and ``<!-- /headline -->`` in FILE with the headline
and ratio tables (tests/docs/test_headline.py checks README.md against the committed JSON).

    python benchmarks/recipes/results.py --recipe recipes/minilm-tweets.yaml --readme README.md
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
OUT = Path(__file__).resolve().parent
SCHEMA = "hydra-toolchain.recipe-results/1"
VARIANTS = ("single", "deep-ensemble", "hydra")
LABELS = {"single": "single", "deep-ensemble": "deep ensemble", "hydra": "Hydra"}
PRECISION_ORDER = ("fp32", "fp16", "bf16")
ENGINE_NAMES = {"onnxrt-cpu": "ONNX Runtime", "openvino-cpu": "OpenVINO", "onnxrt-cuda": "ONNX Runtime CUDA",
                "tensorrt": "TensorRT", "torch": "PyTorch"}


def _read(path: Path) -> Any:
    if not path.is_file():
        raise SystemExit(f"{path} is missing: run 'hydra-toolchain run' on the recipe first.")
    return json.loads(path.read_text())


def _created(stage_dir: Path) -> dict[str, Any]:
    manifest = stage_dir / "manifest.json"
    if not manifest.is_file():
        return {}
    m = json.loads(manifest.read_text())
    return {"key": m.get("key"), "created": m.get("created"), "seconds": m.get("seconds")}


def _suffix(precision: str) -> str:
    return "" if precision == "fp32" else f".{precision}"


def _variant_precision(name: str) -> tuple[str, str]:
    """``hydra-conv.bf16`` -> ``("hydra-conv", "bf16")``."""
    base, _, precision = name.partition(".")
    return base, precision or "fp32"


RATIOS = ("hydra/single", "hydra/deep-ensemble")


def _runs(kind: str, precision: str) -> bool:
    """Whether engine ``kind`` runs ``precision`` itself (the registry; a substitute such as the BF16 emulator does
    not count: the bench never times it)."""
    from toolchain.engines import engine_kind
    from toolchain.errors import EngineError

    try:
        return precision in engine_kind(kind).precisions
    except EngineError:  # a kind this checkout does not know
        return False


def _stat(stats: dict[str, Any] | None, key: str = "median") -> float | None:
    return None if not stats else stats.get(key)


def collect(art: Path, *, recipe: str, profile: str | None, name: str, lowering: str) -> dict[str, Any]:
    """Every number of the headline from a finished recipe's artifacts folder ``art``."""
    metrics = _read(art / "evaluate" / "metrics.json")
    ood = _read(art / "evaluate" / "ood.json")
    latency = _read(art / "bench" / "latency.json")
    verdict = _read(art / "parity" / "verdict.json")
    hydra = f"hydra-{lowering}"
    deployed = {"single": "single", "deep-ensemble": "deep-ensemble", "hydra": hydra}

    rows: dict[str, dict[str, float | None]] = {}
    for v in VARIANTS:
        if v not in metrics:
            continue
        m = metrics[v]
        rows[v] = {"accuracy": m.get("accuracy"), "nll": m.get("nll"),
                   "far_auroc_msp": ood.get("far", {}).get("metrics", {}).get(v, {}).get("auroc_msp"),
                   "near_auroc_msp": ood.get("near", {}).get("metrics", {}).get(v, {}).get("auroc_msp")}

    batch = min(c["batch"] for c in latency["cases"])
    engines_order = list(latency.get("settings", {}).get("engines") or [])
    columns: list[dict[str, Any]] = []
    for case in latency["cases"]:
        if case["batch"] != batch:
            continue
        kind = case["engine"]
        precisions = sorted({_variant_precision(n)[1] for n in case["variants"]},
                            key=lambda p: PRECISION_ORDER.index(p) if p in PRECISION_ORDER else 99)
        for p in precisions:
            sfx = _suffix(p)
            ms = {v: (1000 * s if (s := _stat(case["variants"].get(f"{d}{sfx}"))) is not None else None)
                  for v, d in deployed.items()}
            ratios = {f"hydra/{den}": _stat(case["ratios"].get(f"{hydra}{sfx}/{den}{sfx}"))
                      for den in ("single", "deep-ensemble")}
            ratio_spread = {f"hydra/{den}": [_stat(case["ratios"].get(f"{hydra}{sfx}/{den}{sfx}"), q)
                                             for q in ("p10", "p90")] for den in ("single", "deep-ensemble")}
            tput = latency.get("throughput", {}).get("engines", {}).get(kind, {})
            rows_per_s = {v: _stat(tput.get(f"{d}{sfx}"), "rows_per_s") for v, d in deployed.items()}
            columns.append({"engine": kind, "precision": p, "ms": ms, "ratios": ratios, "ratio_p10_p90": ratio_spread,
                            "rows_per_s": rows_per_s})
    have = {(c["engine"], c["precision"]) for c in columns}
    for kind in engines_order:  # a precision the bench asked for and the kind runs, but nothing was timed: "-"
        for p in latency.get("settings", {}).get("precisions") or []:
            if (kind, p) not in have and _runs(kind, p):
                empty = {v: None for v in deployed}
                columns.append({"engine": kind, "precision": p, "ms": empty, "ratios": {k: None for k in RATIOS},
                                "ratio_p10_p90": {k: [None, None] for k in RATIOS}, "rows_per_s": dict(empty)})
    columns.sort(key=lambda c: (engines_order.index(c["engine"]) if c["engine"] in engines_order else 99,
                                PRECISION_ORDER.index(c["precision"]) if c["precision"] in PRECISION_ORDER else 99))
    skipped = {f"{kind} {what}": why for kind, e in latency.get("engines", {}).items()
               for what, why in (e.get("skipped_variants") or {}).items()}
    skipped.update({kind: e.get("reason", "") for kind, e in latency.get("engines", {}).items()
                    if e.get("status") not in (None, "ok")})

    parity: dict[str, Any] = {}
    for group, g in verdict.get("groups", {}).items():
        report = art / "parity" / group / "report.json"
        summary = json.loads(report.read_text()).get("summary", {}) if report.is_file() else {}
        parity[group] = {"status": g.get("status"), "exit_code": g.get("exit_code"),
                         "engines": len(g.get("precisions") or {}), "checks": summary.get("checks"),
                         "passed": summary.get("passed"), "failed": summary.get("failed"),
                         "unresolved": summary.get("unresolved", len(g.get("unresolved") or []))}
    settings = latency.get("settings", {})
    machine = latency.get("machine", {})
    command = f"hydra-toolchain run {recipe}" + (f" --profile {profile}" if profile else "")
    return {
        "schema": SCHEMA, "name": name, "recipe": recipe, "profile": profile, "command": command,
        "results_command": f"python benchmarks/recipes/results.py --recipe {recipe}"
                           + (f" --profile {profile}" if profile else ""),
        "stages": {s: _created(art / s) for s in ("evaluate", "parity", "bench")},
        "ood_rows": {k: {"split": v.get("split"), "rows": v.get("rows")} for k, v in ood.items()},
        "metrics": rows, "hydra_variant": hydra,
        "latency": {"batch": batch, "sequence": settings.get("sequence_length"), "threads": settings.get("threads"),
                    "rounds": (settings.get("rounds") or {}).get(str(batch)), "columns": columns,
                    "skipped": skipped, "rows_batch": latency.get("throughput", {}).get("batch_size"),
                    "rows": latency.get("throughput", {}).get("rows"),
                    "rows_rounds": latency.get("throughput", {}).get("rounds"),
                    "machine": {"processor": machine.get("processor"), "usable_cores": machine.get("usable_cores"),
                                **_cpu(machine), "loadavg_start": machine.get("loadavg_start"),
                                "loadavg_end": machine.get("loadavg_end")}},
        "parity": parity, "parity_exit_code": verdict.get("exit_code"),
        "parity_skipped": len(verdict.get("skipped", {})),
        "parity_not_gated": sorted(verdict.get("not_gated", {})),
    }


def _cpu(machine: dict[str, Any]) -> dict[str, Any]:
    """The CPU's generation and vector extensions (``cpu_id``, ``vector_isa``), each where the bench recorded it.

    The brand string alone can name two generations alike (``AMD EPYC``), and latency compares only
    between machines with the same label (:func:`toolchain.bench.report.vector_isa`).
    """
    from toolchain.bench.report import vector_isa

    isa = vector_isa(machine.get("cpu_flags") or [])
    return {k: v for k, v in (("cpu_id", machine.get("cpu_id")), ("vector_isa", isa)) if v}


# ----------------------------------------------------------------------------------------- render
def _f(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def column_title(column: dict[str, Any]) -> str:
    """``ONNX Runtime FP32``, ``OpenVINO BF16``."""
    return f"{ENGINE_NAMES.get(column['engine'], column['engine'])} {column['precision'].upper()}"


def headline_table(summary: dict[str, Any]) -> str:
    """The headline: one row per variant, accuracy, NLL, far/near AUROC (MSP), latency per engine column."""
    lat = summary["latency"]
    cols = lat["columns"]
    head = ["variant", "accuracy", "NLL", "far-OOD AUROC (MSP)", "near-OOD AUROC (MSP)",
            *(f"{column_title(c)} ms" for c in cols)]
    lines = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
    for v, m in summary["metrics"].items():
        label = LABELS[v] + (f" (`{summary['hydra_variant']}`)" if v == "hydra" else "")
        cells = [label, _f(m["accuracy"], 4), _f(m["nll"], 4), _f(m["far_auroc_msp"], 4),
                 _f(m["near_auroc_msp"], 4), *(_f(c["ms"].get(v), 2) for c in cols)]
        lines.append("| " + " | ".join(cells) + " |")
    ood = summary.get("ood_rows", {})
    rows = ", ".join(f"{k} OOD {v['rows']} rows of `{v['split']}`" for k, v in ood.items())
    caption = (f"`{summary['command']}`, then `{summary['results_command']}`. Metrics in PyTorch on the "
               f"recipe's test split ({rows}); latency: batch {lat['batch']}, sequence {lat['sequence']}, "
               f"{lat['threads']} threads, median of {lat['rounds']} interleaved rounds"
               + (f" on {lat['machine']['processor']} ({lat['machine']['usable_cores']} cores"
                  + "".join(f", {lat['machine'][k]}" for k in ("cpu_id", "vector_isa") if lat["machine"].get(k))
                  + ")" if lat["machine"].get("processor") else "")
               + f"; evaluate of {summary['stages'].get('evaluate', {}).get('created', '?')}, "
               f"bench of {summary['stages'].get('bench', {}).get('created', '?')}.")
    if any(value is None for c in cols for value in c["ms"].values()):
        caption += f" `-`: not timed in this run (the reasons are in `benchmarks/recipes/{summary['name']}.md`)."
    if summary.get("profile"):
        caption += (f" Profile `{summary['profile']}`: a few steps on small splits, numbers that say nothing "
                    "about the recipe's quality or speed.")
    if summary.get("note"):
        caption = f"**{summary['note']}** {caption}"
    return "\n".join(lines) + "\n\n" + caption


def ratio_table(summary: dict[str, Any]) -> str:
    """Hydra / single and Hydra / deep ensemble per engine column (median of per-round ratios, p10-p90)."""
    lat = summary["latency"]
    out = [f"Hydra's latency as a ratio (batch {lat['batch']}, median of per-round ratios, [p10, p90]):", "",
           "| engine | Hydra / single | Hydra / deep ensemble |", "|---|---:|---:|"]
    for c in lat["columns"]:
        cells = []
        for key in ("hydra/single", "hydra/deep-ensemble"):
            lo, hi = c["ratio_p10_p90"][key]
            cells.append("-" if c["ratios"][key] is None else f"{c['ratios'][key]:.2f} [{_f(lo, 2)}, {_f(hi, 2)}]")
        out.append(f"| {column_title(c)} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def readme_block(summary: dict[str, Any]) -> str:
    """What the README's ``<!-- headline:<name> -->`` block holds: the headline and the ratio table."""
    return headline_table(summary) + "\n\n" + ratio_table(summary)


def markdown(summary: dict[str, Any]) -> str:
    """The whole page: the headline, ratios, rows/s, what was not timed, the parity verdict."""
    lat = summary["latency"]
    out = [f"# {summary['name']}: headline results", "", headline_table(summary), "", "## Ratios", "",
           ratio_table(summary)]
    out += ["", f"## Rows per second on the test split ({lat['rows']} rows in token-length batches of "
            f"{lat['rows_batch']}, median of {lat['rows_rounds']} pass(es))", "",
            "| engine | " + " | ".join(LABELS[v] for v in summary["metrics"]) + " |",
            "|---|" + "---:|" * len(summary["metrics"])]
    for c in lat["columns"]:
        out.append(f"| {column_title(c)} | " + " | ".join(_f(c["rows_per_s"].get(v), 1)
                                                      for v in summary["metrics"]) + " |")
    if lat["skipped"]:
        out += ["", "Not timed: " + "; ".join(f"{k}: {v}" for k, v in lat["skipped"].items()) + "."]
    out += ["", f"## Parity (exit {summary['parity_exit_code']}; {summary['parity_skipped']} engine(s) skipped "
            "on this machine)", "", "| group | status | engines | checks | passed | failed | not resolvable |",
            "|---|---|---:|---:|---:|---:|---:|"]
    for group, p in summary["parity"].items():
        out.append(f"| {group} | {p['status']} | {p['engines']} | {_f(p['checks'], 0)} | {_f(p['passed'], 0)} | "
                   f"{_f(p['failed'], 0)} | {_f(p['unresolved'], 0)} |")
    if summary.get("parity_not_gated"):
        out += ["", "Not gated (`parity.deep_ensemble: false`): " + ", ".join(summary["parity_not_gated"]) + "."]
    return "\n".join(out) + "\n"


def replace_block(text: str, name: str, table: str) -> str:
    """``text`` with the block ``<!-- headline:<name> -->`` ... ``<!-- /headline -->`` holding ``table``."""
    start, end = f"<!-- headline:{name} -->", "<!-- /headline -->"
    if text.count(start) != 1:
        raise SystemExit(f"expected one '{start}' marker, found {text.count(start)}")
    before, rest = text.split(start)
    if end not in rest:
        raise SystemExit(f"'{start}' has no '{end}' after it")
    return f"{before}{start}\n{table}\n{end}{rest.split(end, 1)[1]}"


def read_block(text: str, name: str) -> str:
    """The table between ``<!-- headline:<name> -->`` and ``<!-- /headline -->``."""
    start, end = f"<!-- headline:{name} -->", "<!-- /headline -->"
    return text.split(start, 1)[1].split(end, 1)[0].strip("\n")


def main(argv: list[str] | None = None) -> int:
    """Collect, write ``<name>.json`` and ``<name>.md``, optionally rewrite a README's headline block."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", required=True, help="the recipe YAML file that was run")
    parser.add_argument("--profile", help="the profile it was run with (e.g. quick)")
    parser.add_argument("--artifacts", type=Path, help="its artifacts folder (default: the recipe's "
                        "artifacts_dir/<name>)")
    parser.add_argument("--name", help="file stem and README marker (default: the recipe's name)")
    parser.add_argument("--out", type=Path, default=OUT, help="output folder (default: benchmarks/recipes)")
    parser.add_argument("--readme", type=Path, help="also rewrite this file's <!-- headline:<name> --> block")
    parser.add_argument("--note", help="a sentence shown in bold before the table's caption (e.g. a placeholder's)")
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    sys.path.insert(0, str(ROOT))
    from toolchain.recipe import load_recipe

    recipe = load_recipe(args.recipe, profile=args.profile)
    art = args.artifacts or recipe.artifacts()
    name = args.name or recipe.name
    path = Path(args.recipe).resolve()
    shown = path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else str(args.recipe)
    summary = collect(Path(art), recipe=shown, profile=args.profile, name=name, lowering=recipe.fusion.lowering)
    if name != recipe.name:
        summary["results_command"] += f" --name {name}"
    if args.note:
        summary["note"] = args.note
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{name}.json").write_text(json.dumps(summary, indent=2, sort_keys=False) + "\n")
    (args.out / f"{name}.md").write_text(markdown(summary))
    print(f"wrote {args.out / (name + '.json')} and {name}.md")
    if args.readme is not None:
        args.readme.write_text(replace_block(args.readme.read_text(), name, readme_block(summary)))
        print(f"rewrote the headline:{name} block of {args.readme}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
