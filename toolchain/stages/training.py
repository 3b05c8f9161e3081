"""Stages ``finetune`` (the base classifier) and ``ensemble`` (the equal-budget deep ensemble)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from toolchain.artifacts import atomic_write_json, read_json
from toolchain.pipeline import Context, stage
from toolchain.stages.common import reseeded_base, train_classifier


@stage("finetune", sections=("model", "data", "finetune"), upstream=("load",),
       summary="fine-tune the base classifier on the in-distribution training split")
def finetune_stage(ctx: Context, work: Path) -> dict[str, Any]:
    """Fine-tune (or train from config) the base classifier; save it under ``model/``."""
    from toolchain.models import save_model

    model, _adapter, tok, info = train_classifier(ctx, ctx.recipe.seed, "base classifier")
    save_model(model, work / "model", tokenizer=tok)
    atomic_write_json(work / "metrics.json", info)
    ctx.console.print(f"  validation accuracy {info['val_accuracy']:.4f}")
    return {"metrics": info}


@stage("ensemble", sections=("model", "data", "finetune", "pruning.members", "baselines"), upstream=("finetune",),
       distributed=True, summary="deep-ensemble baseline: M full models fine-tuned with different seeds")
def ensemble_stage(ctx: Context, work: Path) -> dict[str, Any]:
    """Members 1..M-1 trained exactly as the base (same steps, lr, schedule); member 0 is the base.

    With ``baselines.deep_ensemble: false`` nothing is trained: ``metrics.json`` says so and the
    later stages leave the deep ensemble out.
    """
    import shutil

    from toolchain import distributed as dist
    from toolchain.models import save_model

    if not ctx.recipe.baselines.deep_ensemble:
        if dist.is_main():
            atomic_write_json(work / "metrics.json", {"members": [], "deep_ensemble": False})
        ctx.console.print("  off (baselines.deep_ensemble: false): not trained, evaluated, exported or benched")
        return {"members": 0}
    m = ctx.recipe.pruning.members
    # under torchrun the M - 1 trainings are spread over the ranks (data-parallel when ranks > jobs);
    # every rank calls assign / gather_results in the same order, rank 0 saves
    jobs = dist.assign(m - 1)  # job j trains member j + 1
    local: dict[int, Any] = {}
    for j in jobs.items:
        seed = ctx.recipe.seed + 1000 * (j + 1)
        model, _a, tok, info = train_classifier(ctx, seed, f"deep-ensemble member {j + 1}/{m - 1} (seed {seed})",
                                                process_group=jobs.group)
        if jobs.leads(j):  # one process: the model itself; ranks: its weights travel to rank 0
            local[j] = ((model, tok) if not dist.enabled() else model.state_dict(), info)
    results = dist.gather_results(jobs, local)
    if dist.is_main():
        shutil.copytree(ctx.stage_dir("finetune") / "model", work / "member0")
        infos = [read_json(ctx.stage_dir("finetune") / "metrics.json")]
        for j in sorted(results):
            trained, info = results[j]
            if isinstance(trained, tuple):
                model, tok = trained
            else:
                model, _a, tok = reseeded_base(ctx, info["seed"])
                model.load_state_dict(trained)
            save_model(model, work / f"member{j + 1}", tokenizer=tok)
            infos.append(info)
        atomic_write_json(work / "metrics.json", {"members": infos})
    return {"members": m}
