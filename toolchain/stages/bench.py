"""Stage ``bench``: latency and size of single model, deep ensemble and Hydra."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from toolchain.pipeline import Context, stage


@stage("bench", sections=("model", "data", "finetune", "scoring", "pruning", "fusion", "export", "engines", "bench"),
       upstream=("export", "build"), summary="latency and size: single model vs deep ensemble vs Hydra")
def bench_stage(ctx: Context, work: Path) -> dict[str, Any]:
    """Interleaved latency rounds on every engine the recipe names (``latency.{json,md,png}``)."""
    from toolchain.bench import run_bench
    from toolchain.engines import engine_kind

    b = ctx.recipe.bench
    engines = [e for e in ctx.recipe.engines if engine_kind(e).runs_files]  # no PyTorch modules here
    result = run_bench(ctx.stage_dir("export"), batch_sizes=b.batch_sizes, sequence_length=b.sequence_length,
                       threads=b.threads, warmup=b.warmup, rounds=b.rounds, engines=engines, out_dir=work,
                       progress=ctx.progress)
    md = work / "latency.md"
    if md.exists():
        ctx.console.print(md.read_text().split("### Ratios")[0].split("### Latency")[-1].strip()[:3000])
    return {"engines": engines, "skipped": result.get("skipped", {}) if isinstance(result, dict) else {}}
