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

#: metrics shown in the results table, with how to print them
COLUMNS = [("accuracy", "acc"), ("nll", "NLL"), ("ece", "ECE"), ("brier", "Brier"),
           ("auroc_msp", "AUROC (MSP)"), ("aupr_msp", "AUPR (MSP)"), ("fpr95_msp", "FPR95 (MSP)"),
           ("auroc_mi", "AUROC (MI)")]


#: row order of the results table
ORDER = ["single", "deep-ensemble", "hydra", "hydra-members-mean"]


def _read(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None


def results_table(metrics: dict[str, dict[str, float]], sizes: dict[str, dict[str, float]] | None = None) -> str:
    """Markdown table: one row per variant, UQ metrics (+ parameters and weight MB when given)."""
    head = "| variant | " + " | ".join(c for _, c in COLUMNS)
    sep = "|---|" + "---:|" * len(COLUMNS)
    if sizes:
        head += " | params | weights MB"
        sep += "---:|---:|"
    lines = [head + " |", sep]
    order = [n for n in ORDER if n in metrics] + sorted(n for n in metrics if n not in ORDER)
    for name in order:
        m = metrics[name]
        cells = [f"{m[k]:.4f}" if k in m and m[k] == m[k] else "-" for k, _ in COLUMNS]
        row = f"| {name} | " + " | ".join(cells)
        if sizes:
            s = sizes.get(name, {})
            row += f" | {s.get('params', '-'):,} | {s.get('mb', float('nan')):.1f}" if s else " | - | -"
        lines.append(row + " |")
    return "\n".join(lines)


def _sizes(fuse_summary: dict | None) -> dict[str, dict[str, float]]:
    if not fuse_summary:
        return {}
    params, nbytes = fuse_summary.get("params", {}), fuse_summary.get("weight_bytes", {})
    mapping = {"single": "single", "deep-ensemble": "deep_ensemble", "hydra": "hydra"}
    return {variant: {"params": int(params[key]), "mb": float(nbytes.get(key, 0)) / 1e6}
            for variant, key in mapping.items() if key in params}


def build_report(root: Path, out_dir: Path, title: str) -> dict[str, Path]:
    """Write ``report.md`` and ``report.html`` into ``out_dir`` from the stage folders under ``root``."""
    metrics = _read(root / "evaluate" / "metrics.json") or {}
    diversity = _read(root / "prune" / "diversity.json") or {}
    fuse_summary = _read(root / "fuse" / "summary.json")
    parity = _read(root / "parity" / "report.json")
    bench_md = root / "bench" / "latency.md"
    parts = [f"# {title}", "", "## Uncertainty (PyTorch reference, ID test split and OOD test split)", "",
             results_table(metrics, _sizes(fuse_summary)), ""]
    if "hydra" in metrics and "hydra-members-mean" in metrics:
        gain = {k: metrics["hydra"][k] - metrics["hydra-members-mean"][k] for k in ("nll", "ece", "auroc_msp")
                if k in metrics["hydra"]}
        parts += ["Ensemble gain (Hydra minus its mean member): "
                  + ", ".join(f"{k} {v:+.4f}" for k, v in gain.items()), ""]
    if diversity:
        jac = diversity.get("jaccard", {}).get("overall")
        dis = diversity.get("disagreement_val", {}).get("mean")
        parts += ["## Members", "", f"- heads kept: {diversity.get('kept_heads')}",
                  f"- mean pairwise Jaccard of kept heads: {jac:.3f}" if jac is not None else "- single member",
                  f"- mean disagreement with the ensemble (validation): {dis:.3f}" if dis is not None else "", ""]
    if parity:
        parts += ["## Parity", "", (root / "parity" / "summary.md").read_text()
                  if (root / "parity" / "summary.md").exists() else json.dumps(parity.get("summary", {})), ""]
    if bench_md.exists():
        parts += ["## Latency", "", bench_md.read_text(), ""]
    images = [p for d in ("evaluate", "prune", "score", "bench") for p in sorted((root / d).glob("*.png"))]
    parts += ["## Figures", ""] + [f"![{p.stem}](../{p.parent.name}/{p.name})" for p in images]
    md = "\n".join(parts) + "\n"
    out_dir.mkdir(parents=True, exist_ok=True)
    md_path = out_dir / "report.md"
    md_path.write_text(md)
    html_path = out_dir / "report.html"
    html_path.write_text(_html(title, md, images))
    return {"md": md_path, "html": html_path}


def _html(title: str, md: str, images: list[Path]) -> str:
    """A plain self-contained page: the Markdown as preformatted text plus the embedded figures."""
    figs = "\n".join(
        f'<figure><img alt="{html.escape(p.stem)}" src="data:image/png;base64,'
        f'{base64.b64encode(p.read_bytes()).decode()}"><figcaption>{html.escape(p.stem)}</figcaption></figure>'
        for p in images
    )
    text = md.split("## Figures")[0]
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            "<style>body{font-family:sans-serif;max-width:1100px;margin:auto}pre{white-space:pre-wrap}"
            "img{max-width:100%}figure{display:inline-block;width:48%;margin:4px}</style></head><body>"
            f"<pre>{html.escape(text)}</pre>{figs}</body></html>")
