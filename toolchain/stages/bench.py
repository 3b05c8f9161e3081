"""Stage ``bench``: latency, rows per second and size of single model, deep ensemble and Hydra on every engine."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from toolchain.pipeline import Context, stage
from toolchain.stages.common import load_stage_model, split_feeds


@stage("bench", sections=("model", "data", "finetune", "scoring", "pruning", "fusion", "export", "engines", "bench"),
       upstream=("export", "build"), summary="latency and size: single model vs deep ensemble vs Hydra",
       version=2)  # 2: every engine in one interleaved run, at model.max_length, precisions, rows/s on the test split
def bench_stage(ctx: Context, work: Path) -> dict[str, Any]:
    """:func:`toolchain.bench.run_bench` on every engine kind of the recipe that runs files (``latency.{json,md,png}``).

    Generated feeds at the recipe's batch sizes and ``model.max_length`` tokens (the length users
    run; ``bench.sequence_length`` overrides it), then, with ``bench.rows_batch``, whole passes over
    ``bench.rows`` of the test split's real rows in token-length batches: rows per second per engine. Every kind's
    variants (ONNX Runtime FP32, OpenVINO FP32 and BF16 ...) are timed in one interleaved run.
    """
    from toolchain.bench import run_bench
    from toolchain.engines import engine_kind

    b = ctx.recipe.bench
    engines = [e for e in ctx.recipe.engines if engine_kind(e).runs_files]  # no PyTorch modules here
    real = None
    if b.rows_batch:
        from toolchain.artifacts import read_json

        names = list(read_json(ctx.stage_dir("export") / "graphs.json")["single"]["inputs"])
        tok = load_stage_model(ctx, ctx.stage_dir("finetune") / "model")[2]
        size = min(b.rows_batch, ctx.recipe.export.batch.max)  # engines built for the profile take no more
        real = [feed for feed, _ in split_feeds(ctx, "test", names, tok, size, rows=b.rows)]
    result = run_bench(ctx.stage_dir("export"), batch_sizes=b.batch_sizes,
                       sequence_length=b.sequence_length or ctx.recipe.model.max_length, threads=b.threads,
                       warmup=b.warmup, rounds=b.rounds, engines=engines, out_dir=work, progress=ctx.progress,
                       precisions=b.precisions, real_feeds=real, real_rounds=b.rows_rounds)
    md = work / "latency.md"
    if md.exists():
        ctx.console.print(md.read_text().split("### Ratios")[0].split("### Latency")[-1].strip()[:3000])
    return {"engines": engines, "ran": sorted(k for k, v in result["engines"].items() if v.get("status") == "ok"),
            "skipped": {k: v.get("reason") for k, v in result["engines"].items() if v.get("status") != "ok"}}
