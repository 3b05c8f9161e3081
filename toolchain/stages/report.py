"""Stage ``report``: Markdown and HTML from every stage's outputs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from toolchain.pipeline import Context, stage
from toolchain.recipe import EVALUATION_FIELDS


@stage("report", sections=("model", "data", "finetune", "scoring", "pruning", "fusion", "export", "engines", "bench",
                            "compare", *EVALUATION_FIELDS),
       upstream=("evaluate", "compare", "parity", "bench"), summary="results report (Markdown + HTML with plots)",
       version=2)  # 2: exported graphs' node counts
def report_stage(ctx: Context, work: Path) -> dict[str, Any]:
    """``report.md`` and ``report.html`` from every stage's outputs."""
    from toolchain.report import build_report

    paths = build_report(ctx.root, work, title=f"hydra-toolchain report: {ctx.recipe.name}")
    ctx.console.print(f"  report: {ctx.stage_dir('report') / paths['md'].name}")
    return {}
