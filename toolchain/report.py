"""The results report: ``report.md`` and a self-contained ``report.html`` (plots embedded).

It only reads what the stages wrote (metrics, diversity, fusion summary, graphs, parity verdict,
latency), so it can be regenerated without rerunning anything.
"""

from __future__ import annotations

import base64
import html
import json
from pathlib import Path
from typing import Any

from toolchain.metrics.registry import view_columns

#: metrics shown in the results table, with how to print them
COLUMNS = view_columns("table")


#: row order of the results table
ORDER = ["single", "deep-ensemble", "hydra", "hydra-members-mean"]


def _read(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None


def results_table(metrics: dict[str, dict[str, float]], sizes: dict[str, dict[str, float]] | None = None,
                  latency: dict[str, float] | None = None, latency_label: str = "latency ms") -> str:
    """Markdown table: one row per variant, UQ metrics (+ parameters, weight MB and latency when given)."""
    head = "| variant | " + " | ".join(c for _, c in COLUMNS)
    sep = "|---|" + "---:|" * len(COLUMNS)
    if sizes:
        head += " | params | weights MB"
        sep += "---:|---:|"
    if latency:
        head += f" | {latency_label}"
        sep += "---:|"
    lines = [head + " |", sep]
    order = [n for n in ORDER if n in metrics] + [n for n in metrics if n not in ORDER]
    for name in order:
        m = metrics[name]
        cells = [f"{m[k]:.4f}" if k in m and m[k] == m[k] else "-" for k, _ in COLUMNS]
        row = f"| {name} | " + " | ".join(cells)
        if sizes:
            s = sizes.get(name, {})
            row += f" | {s.get('params', '-'):,} | {s.get('mb', float('nan')):.1f}" if s else " | - | -"
        if latency:
            row += f" | {latency[name]:.2f}" if name in latency else " | -"
        lines.append(row + " |")
    return "\n".join(lines)


#: ensemble-gain metrics shown (positive = the ensemble beats its mean member)
GAIN_KEYS = view_columns("gain_table")


def gain_cell(g: dict[str, Any] | None) -> str:
    """``+0.0123* [+0.0100, +0.0150]``: a gain, ``*`` when its interval excludes 0; ``-`` when absent or NaN."""
    if not g or g.get("gain") != g.get("gain"):
        return "-"
    star = "*" if g.get("excludes_zero") else ""
    return f"{g['gain']:+.4f}{star} [{g['ci'][0]:+.4f}, {g['ci'][1]:+.4f}]"


def gain_table(diversity: dict[str, dict[str, Any]]) -> str:
    """Ensemble gain with its paired-bootstrap 95% interval; ``*`` marks intervals that exclude 0."""
    rows = [(name, d) for name, d in diversity.items() if d and "gain" in d]
    if not rows:
        return ""
    lines = ["| ensemble | " + " | ".join(c for _, c in GAIN_KEYS)
             + " | Jaccard | disagreement | KL |", "|---|" + "---:|" * (len(GAIN_KEYS) + 3)]
    for name, d in rows:
        cells = [gain_cell(d["gain"].get(key)) for key, _ in GAIN_KEYS]
        jac = d.get("jaccard")
        dis = d.get("disagreement", {}).get("mean")
        kl = d.get("kl", {}).get("mean")
        cells += [f"{jac:.3f}" if jac is not None else "-", f"{dis:.3f}" if dis is not None else "-",
                  f"{kl:.4f}" if kl is not None else "-"]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _sizes(fuse_summary: dict | None) -> dict[str, dict[str, float]]:
    if not fuse_summary:
        return {}
    params, nbytes = fuse_summary.get("params", {}), fuse_summary.get("weight_bytes", {})
    mapping = {"single": "single", "deep-ensemble": "deep_ensemble", "hydra": "hydra"}
    return {variant: {"params": int(params[key]), "mb": float(nbytes.get(key, 0)) / 1e6}
            for variant, key in mapping.items() if key in params}


def bench_latency(latency: dict | None, lowering: str = "conv") -> tuple[dict[str, float], str]:
    """Median ms per report variant from ``latency.json`` (ONNX Runtime CPU, FP32, the smallest batch)."""
    if not latency:
        return {}, ""
    from toolchain.engines import default_engines, engine_kind

    reported = next(k for k in default_engines() if engine_kind(k).runs_files)  # the CPU engine every recipe has
    cases = [c for c in latency.get("cases", []) if c.get("engine") == reported]
    if not cases:
        return {}, ""
    case = min(cases, key=lambda c: c.get("batch", 0))
    names = {"single": "single", "deep-ensemble": "deep-ensemble", "hydra": f"hydra-{lowering}"}
    out = {}
    for row, variant in names.items():
        v = case["variants"].get(variant)
        if v and v.get("median") is not None:
            out[row] = 1e3 * float(v["median"])
    return out, f"ms (ORT CPU, batch {case.get('batch')})"


def diff_cell(d: dict[str, Any] | None) -> str:
    """``+0.0123 [+0.0100, +0.0150]*``: a paired difference, ``*`` when its interval excludes 0.

    ``-`` when absent or NaN.
    """
    if not d or d.get("diff") != d.get("diff"):
        return "-"
    lo, hi = d["ci"]
    return f"{d['diff']:+.4f} [{lo:+.4f}, {hi:+.4f}]{'*' if d['excludes_zero'] else ''}"


def shift_tables(shift: dict[str, Any]) -> str:
    """Markdown: metrics per severity (mean over corruptions) and Hydra minus each baseline with intervals."""
    levels = ["0", *map(str, shift["severities"])]
    variants = sorted(shift["mean"]["0"], key=lambda v: _VARIANT_ORDER.get(v, len(_VARIANT_ORDER)))
    head = "| severity | " + " | ".join(f"{v} acc / NLL / ECE" for v in variants) + " | " + \
        " | ".join(f"{v} NLL gap" for v in variants) + " |"
    rows = [head, "|---|" + "---:|" * (2 * len(variants))]
    for lv in levels:
        cells = [f"{m['accuracy']:.4f} / {m['nll']:.4f} / {m['ece']:.4f}" for m in
                 (shift["mean"][lv][v] for v in variants)]
        gaps = ["-" if lv == "0" else f"{shift['gap'][v][lv]:+.4f}" for v in variants]
        rows.append(f"| {'clean' if lv == '0' else lv} | " + " | ".join(cells + gaps) + " |")
    pairs = sorted({p for d in shift["differences"].values() for p in d})
    keys = (("nll", "NLL"), ("accuracy", "accuracy"))
    diff = ["| severity | " + " | ".join(f"{p.replace('-minus-', ' - ')} {label}" for p in pairs for _k, label in keys)
            + " |", "|---|" + "---:|" * (2 * len(pairs))]
    for lv in levels[1:]:
        d = shift["differences"].get(lv, {})
        diff.append(f"| {lv} | " + " | ".join(diff_cell(d.get(p, {}).get(k)) for p in pairs for k, _l in keys) + " |")
    return "\n".join(rows) + "\n\n" + "\n".join(diff)


def shift_kind_table(shift: dict[str, Any]) -> str:
    """Markdown: per corruption kind and severity, NLL and accuracy of each variant and Hydra minus each baseline."""
    variants = sorted(shift["mean"]["0"], key=lambda v: _VARIANT_ORDER.get(v, len(_VARIANT_ORDER)))
    by_kind = shift.get("differences_by_kind") or {}
    pairs = sorted({p for d in by_kind.values() for sev in d.values() for p in sev})
    rows = ["| corruption | severity | " + " | ".join(f"{v} acc / NLL" for v in variants) + " | "
            + " | ".join(f"{p.replace('-minus-', ' - ')} NLL" for p in pairs) + " |",
            "|---|---:|" + "---:|" * (len(variants) + len(pairs))]
    for kind in shift["kinds"]:
        for lv in map(str, shift["severities"]):
            m = shift["metrics"][kind][lv]
            d = by_kind.get(kind, {}).get(lv, {})
            rows.append(f"| {kind} | {lv} | " + " | ".join(f"{m[v]['accuracy']:.4f} / {m[v]['nll']:.4f}"
                                                          for v in variants) + " | "
                        + " | ".join(diff_cell(d.get(p, {}).get("nll")) for p in pairs) + " |")
    return "\n".join(rows)


#: row order of the baselines and Hydra in the tables
_VARIANT_ORDER = {"single": 0, "deep-ensemble": 1, "hydra": 2}
#: OOD detection columns of :func:`ood_table`
_OOD_KEYS = (("auroc_msp", "AUROC MSP"), ("aupr_msp", "AUPR MSP"), ("fpr95_msp", "FPR95 MSP"),
             ("auroc_entropy", "AUROC ent"), ("auroc_mi", "AUROC MI"))


def ood_table(rep: dict[str, Any]) -> str:
    """Markdown: one OOD set's detection metrics per variant, then Hydra minus each baseline (AUROC, intervals)."""
    rows = ["| variant | " + " | ".join(label for _k, label in _OOD_KEYS) + " |", "|---|" + "---:|" * len(_OOD_KEYS)]
    for variant, m in sorted(rep["metrics"].items(), key=lambda kv: _VARIANT_ORDER.get(kv[0], len(_VARIANT_ORDER))):
        rows.append(f"| {variant} | " + " | ".join(f"{m[k]:.4f}" if k in m else "-" for k, _l in _OOD_KEYS) + " |")
    keys = [k for k, _l in _OOD_KEYS if k.startswith("auroc")]
    diff = ["| difference | " + " | ".join(label for k, label in _OOD_KEYS if k in keys) + " |",
            "|---|" + "---:|" * len(keys)]
    for pair, d in rep["differences"].items():
        diff.append(f"| {pair.replace('-minus-', ' - ')} | " + " | ".join(diff_cell(d.get(k)) for k in keys) + " |")
    return "\n".join(rows) + ("\n\n" + "\n".join(diff) if rep["differences"] else "")


def build_report(root: Path, out_dir: Path, title: str) -> dict[str, Path]:
    """Write ``report.md`` and ``report.html`` into ``out_dir`` from the stage folders under ``root``."""
    metrics = dict(_read(root / "evaluate" / "metrics.json") or {})
    members = _read(root / "prune" / "diversity.json") or {}
    diversity = dict(_read(root / "evaluate" / "diversity.json") or {})
    compare = _read(root / "compare" / "compare.json") or {}
    fuse_summary = _read(root / "fuse" / "summary.json")
    parity_md = root / "parity" / "summary.md"
    prune_cfg = _read(root / "prune" / "members.json") or {}
    bench_md = root / "bench" / "latency.md"
    sizes = _sizes(fuse_summary)
    latency, latency_label = bench_latency(_read(root / "bench" / "latency.json"),
                                           (fuse_summary or {}).get("lowering", "conv"))
    if "hydra" in diversity and members.get("jaccard"):
        diversity["hydra"] = {**diversity["hydra"], "jaccard": members["jaccard"]["overall"]}
    own = f"hydra ({prune_cfg.get('criterion', '?')}, {prune_cfg.get('strategy', '?')})"
    for name, res in compare.items():
        row = f"hydra-{name}"
        metrics[row] = res["metrics"]["hydra"]
        size = _sizes(res.get("size")).get("hydra")
        if size:
            sizes[row] = size
        d = dict(res.get("diversity", {}).get("hydra") or {})
        if d:
            jac = (res.get("members") or {}).get("jaccard", {}).get("overall")
            diversity[row] = {**d, "jaccard": jac}
    parts = [f"# {title}", "", "## Uncertainty (PyTorch reference, ID test split and OOD test split)", "",
             f"`hydra` is {own}; `hydra-<name>` rows are the recipe's `compare` variants (same model, data "
             "and budget). Latency: the bench stage's median (compare variants are not exported).", "",
             results_table(metrics, sizes, latency, latency_label), ""]
    ensemble = _read(root / "ensemble" / "metrics.json") or {}
    if ensemble.get("deep_ensemble") is False:
        parts += ["Deep-ensemble baseline: off (`baselines.deep_ensemble: false`): not trained, evaluated, exported "
                  "or benched; the single model is the baseline.", ""]
    if not compare:
        parts += ["Compare variants: none (the recipe has no `compare:` entries).", ""]
    table = gain_table(diversity)
    if table:
        parts += ["## Ensemble gain and diversity (test split)", "",
                  "Gain = ensemble minus its mean member, signed so that positive is better; 95% paired-bootstrap "
                  "interval in brackets, `*` where it excludes 0. MI has no single-member value: its gain is the "
                  "ensemble's MI AUROC minus the members' mean MSP AUROC.", "", table, ""]
    ood = _read(root / "evaluate" / "ood.json") or {}
    for kind, rep in ood.items():
        what = ("the recipe's OOD set (`data.ood`)" if kind == "far" else
                "rows held out of the ID data before splitting (`data.near_ood`); no training, scoring or selection "
                "saw them")
        parts += [f"## {kind.capitalize()}-OOD detection ({rep['split']}, {rep['rows']} rows)", "",
                  f"OOD rows: {what}; ID rows: the test split. Differences: Hydra minus each baseline, AUROC "
                  "(positive = Hydra detects better), 95% paired-bootstrap interval over ID and OOD rows, `*` where "
                  "it excludes 0.", "", ood_table(rep), ""]
    shift = _read(root / "evaluate" / "shift.json") or {}
    if shift:
        parts += ["## Under input corruption (test split)", "",
                  f"{shift['rows']} test rows, each corrupted by {', '.join(shift['kinds'])} at severities "
                  f"{', '.join(map(str, shift['severities']))} (seeded, label-preserving; `toolchain/data/shift.py`); "
                  "metrics are the mean over the corruptions, the NLL gap is NLL(severity) - NLL(clean). Then Hydra "
                  "minus each baseline on the pooled corrupted rows, 95% paired-bootstrap interval in brackets, `*` "
                  "where it excludes 0 (negative NLL = Hydra better).", "", shift_tables(shift), ""]
        if shift.get("differences_by_kind"):
            parts += ["Per corruption kind:", "", shift_kind_table(shift), ""]
    if members:
        jac = members.get("jaccard", {}).get("overall")
        dis = members.get("disagreement_val", {}).get("mean")
        parts += ["## Members", "", f"- heads kept: {members.get('kept_heads')}",
                  f"- mean pairwise Jaccard of kept heads: {jac:.3f}" if jac is not None else "- single member",
                  f"- mean disagreement with the ensemble (validation): {dis:.3f}" if dis is not None else "", ""]
    graphs = _read(root / "export" / "graphs.json") or {}
    counted = {n: g["stats"] for n, g in graphs.items() if g.get("stats") and g.get("kind") != "member"}
    if counted:
        from toolchain.export.stats import stats_table

        parts += ["## Exported graphs", "", "Nodes and the most frequent operators of each graph (FP16/BF16 variants "
                  "add their Cast nodes); `nodes without Constant` is the number to compare.", "",
                  stats_table(counted), ""]
    if parity_md.exists():  # the parity stage's verdict per group (hydra, single) and per engine
        parts += ["## Parity", "", parity_md.read_text().replace("\n## Parity:", "\n### Parity:"), ""]
    if bench_md.exists():
        parts += ["## Latency", "", bench_md.read_text(), ""]
    images = [p for d in ("evaluate", "prune", "score", "compare", "bench") for p in sorted((root / d).glob("*.png"))]
    parts += ["## Figures", ""] + [f"![{p.stem}](../{p.parent.name}/{p.name})" for p in images]
    md = "\n".join(parts) + "\n"
    out_dir.mkdir(parents=True, exist_ok=True)
    md_path = out_dir / "report.md"
    md_path.write_text(md)
    html_path = out_dir / "report.html"
    html_path.write_text(_html(title, md, images))
    return {"md": md_path, "html": html_path}


_STYLE = (
    "body{font-family:system-ui,sans-serif;max-width:1150px;margin:auto;padding:0 1em;color:#222}"
    "table{border-collapse:collapse;margin:.6em 0;font-size:.9em}"
    "th,td{border:1px solid #ccc;padding:.25em .55em}th{background:#f2f2f2}"
    "td{font-variant-numeric:tabular-nums}tr:nth-child(even) td{background:#fafafa}"
    "code{background:#f4f4f4;padding:0 .2em}pre{white-space:pre-wrap}"
    "img{max-width:100%}figure{display:inline-block;width:48%;margin:4px;vertical-align:top}"
)


def _html(title: str, md: str, images: list[Path]) -> str:
    """A self-contained page: the Markdown rendered to HTML (tables as tables), figures embedded.

    Rendered with markdown-it-py (CommonMark plus the GFM table rule; raw HTML in the text is
    escaped, not passed through), which the CLI already depends on through rich.
    """
    from markdown_it import MarkdownIt

    figs = "\n".join(
        f'<figure><img alt="{html.escape(p.stem)}" src="data:image/png;base64,'
        f'{base64.b64encode(p.read_bytes()).decode()}"><figcaption>{html.escape(p.stem)}</figcaption></figure>'
        for p in images
    )
    body = MarkdownIt("commonmark", {"html": False}).enable("table").render(md.split("## Figures")[0])
    heading = "<h2>Figures</h2>" if images else ""
    return (f"<!doctype html><html lang='en'><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            f"<style>{_STYLE}</style></head><body>\n{body}{heading}{figs}</body></html>\n")


def print_table(console: Any, table: Any) -> None:
    """Print a rich ``table``; to a file or pipe (a CI log) at its full width, so no name or header is cut.

    A console that is not a terminal is 80 columns wide unless ``COLUMNS`` says otherwise, and rich
    fits a table to it by cutting cells ("deep-e…", "auroc_…"). There the table is rendered
    at its natural width as plain text and printed without wrapping.
    """
    if console.is_terminal:
        console.print(table)
        return
    import io

    from rich.console import Console
    from rich.measure import Measurement

    probe = Console(file=io.StringIO(), width=100_000, color_system=None)
    width = max(console.width, Measurement.get(probe, probe.options, table).maximum)
    plain = Console(file=io.StringIO(), width=width, color_system=None, legacy_windows=False)
    plain.print(table)
    text = "\n".join(line.rstrip() for line in plain.file.getvalue().rstrip("\n").splitlines())
    console.print(text, markup=False, highlight=False, soft_wrap=True, crop=False)


def print_run_summary(ctx: Any, console: Any) -> None:
    """One screen at the end of ``run``: UQ metrics per variant, parity status, where the report is."""
    import json

    from rich.table import Table

    try:
        metrics = json.loads((ctx.stage_dir("evaluate") / "metrics.json").read_text())
        verdict = json.loads((ctx.stage_dir("parity") / "verdict.json").read_text())
    except (OSError, ValueError):
        return
    table = Table(title=f"{ctx.recipe.name}: test split (ID) and OOD test split")
    from toolchain.metrics.registry import view_keys

    keys = view_keys("summary")
    table.add_column("variant")
    for k in keys:
        table.add_column(k, justify="right")
    try:
        compare = json.loads((ctx.stage_dir("compare") / "compare.json").read_text())
    except (OSError, ValueError):
        compare = {}
    rows = [(n, metrics[n]) for n in ("single", "deep-ensemble", "hydra", "hydra-members-mean") if n in metrics]
    rows += [(f"hydra-{n}", v["metrics"]["hydra"]) for n, v in compare.items()]
    for name, m in rows:
        table.add_row(name, *[f"{m[k]:.4f}" if k in m else "-" for k in keys])
    print_table(console, table)
    groups = ", ".join(f"{g}: {r['status']}" for g, r in verdict["groups"].items())
    console.print(f"parity: {groups}; report: {ctx.stage_dir('report') / 'report.html'}")
