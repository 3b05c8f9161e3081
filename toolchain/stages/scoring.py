"""Stages ``score`` (head importance) and ``prune`` (M member masks, optional recovery fine-tune)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch

from toolchain import distributed as dist
from toolchain.artifacts import atomic_write_json, read_json
from toolchain.data import batching
from toolchain.models import ModelAdapter, adapter_for
from toolchain.pipeline import Context, stage
from toolchain.stages.common import adapter_kwargs, calibration, criterion_params_for, load_stage_model


@stage("score", sections=("model", "data", "finetune", "scoring", "pruning"), upstream=("finetune",), distributed=True,
       summary="score every attention head")
def score_stage(ctx: Context, work: Path) -> dict[str, Any]:
    """Head scores of the chosen criterion on the calibration split: ``scores.json`` + heatmap."""
    from toolchain.scoring.registry import score_heads

    _model, adapter, tok = load_stage_model(ctx, ctx.stage_dir("finetune") / "model")
    crit = ctx.recipe.scoring.criterion
    params = criterion_params_for(ctx, crit, adapter.heads_per_layer())
    scores = score_heads(adapter, calibration(ctx, tok), crit, **params)
    scores.to_json(work / "scores.json")
    scores.plot_heatmap(work / f"heatmap-{crit}.png", title=f"{ctx.recipe.name}: {crit} head scores")
    ctx.console.print(f"  {crit} scores on {ctx.recipe.scoring.calib_samples} calibration samples "
                      f"(data hash {scores.data_hash[:12]})")
    return {"criterion": crit, "params": params}


@stage("prune", sections=("model", "data", "finetune", "scoring", "pruning"), upstream=("score",), distributed=True,
       summary="make M diverse pruned members")
def prune_stage(ctx: Context, work: Path) -> dict[str, Any]:
    """Member keep masks, their diversity, and (optionally) recovery-fine-tuned member models."""
    from toolchain.pruning.diversity import pairwise_jaccard, prediction_disagreement
    from toolchain.pruning.members import make_members

    r = ctx.recipe
    p = r.pruning
    _model, adapter, tok = load_stage_model(ctx, ctx.stage_dir("finetune") / "model")
    hpl = adapter.heads_per_layer()
    crit = r.scoring.criterion
    rule = p.keep_rule()
    extra: dict[str, Any] = {}
    if p.strategy == "mixed-criteria":
        crit = "+".join(p.criteria or [])
        extra = {"criteria": list(p.criteria or []),
                 "criterion_params": {c: criterion_params_for(ctx, c, hpl) for c in dict.fromkeys(p.criteria or [])}}
    else:
        extra = {"criterion": crit, **criterion_params_for(ctx, crit, hpl)}
        extra.pop("fork", None)  # make_members passes pruning.fork to the criterion that reads it
        if p.strategy == "seeds":
            extra.pop("seed", None)
        if p.strategy == "partition":
            extra["core"] = p.core
        if p.strategy == "sampled":
            extra["temperature"] = p.temperature
    cached = masks_cache(ctx)
    # --force prune, or prune rerunning because an upstream stage was forced or rebuilt under the same
    # keys (the masks cache is keyed like them): search again
    members = None if "prune" in ctx.force or ctx.forced_reruns.get("prune") else _cached_members(cached)
    searched = members is None
    if not searched:  # the same search inputs as an earlier prune (e.g. only the recovery differs)
        ctx.console.print(f"  member masks reused: cache/member-masks/{cached.name}")
    else:
        members = make_members(
            adapter, calibration(ctx, tok), m=p.members, strategy=p.strategy,
            seed=r.seed, scope=p.scope, min_heads_per_layer=p.min_heads_per_layer, fork=p.fork, **rule, **extra,
        )
    masks = torch.stack([mb.keep for mb in members])
    neurons = _member_neurons(ctx, adapter, tok) if p.mlp_share is not None else None
    val_logits = []
    val, _back = batching.in_length_order(ctx.data["val"], tok, r.model.max_length)  # less padding; labels follow
    with torch.no_grad():
        for i, mb in enumerate(members):
            if neurons is None:
                outs = [adapter.gated_logits(b, mb.keep.float()) for b, _ in batching.batches(val, 64, tok, r.model)]
            else:  # the member as it will be: its heads and its MLP neurons
                pa = adapter_for(adapter.prune(mb.keep, neurons=neurons[i]), **adapter_kwargs(adapter))
                outs = [pa.logits(b) for b, _ in batching.batches(val, 64, tok, r.model)]
            val_logits.append(torch.cat(outs))
    stacked = torch.stack(val_logits)
    labels = torch.as_tensor(val.labels)
    diversity: dict[str, Any] = {
        "kept_heads": [int(m.sum()) for m in masks],
        "member_val_accuracy": [float((lg.argmax(-1) == labels).float().mean()) for lg in stacked],
    }
    if len(members) > 1:
        diversity["jaccard"] = pairwise_jaccard(masks)
        dis = prediction_disagreement(stacked)
        diversity["disagreement_val"] = {k: v for k, v in dis.items() if k != "ensemble_pred"}
    kept = [{"index": mb.index, "seed": mb.seed, "keep": mb.keep.int().tolist()} for mb in members]
    record = {"criterion": crit, "strategy": r.pruning.strategy, "rule": rule, "members": kept}
    if p.fork:
        record["fork"] = p.fork
    if neurons is not None:
        record["mlp"] = {"share": p.mlp_share, "core": p.mlp_core, "criterion": "taylor",
                         "neurons": neurons}  # [M][L] kept intermediate neuron indices
        diversity["mlp_neurons_kept"] = [[len(layer) for layer in member] for member in neurons]
    atomic_write_json(work / "members.json", record)
    atomic_write_json(work / "diversity.json", diversity)
    if searched and dist.is_main():
        cached.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_json(cached, {"members": kept})
    plot_member_masks(masks, work / "members.png", title=f"{r.name}: heads kept per member")
    if r.pruning.recovery.steps > 0:
        _recover_members(ctx, adapter, tok, masks, work, neurons)
    jac = diversity.get("jaccard", {}).get("overall")
    ctx.console.print(f"  {len(members)} members keep {diversity['kept_heads']} heads; "
                      + (f"mean Jaccard {jac:.3f}; " if jac is not None else "")
                      + "val accuracy " + ", ".join(f"{a:.3f}" for a in diversity["member_val_accuracy"]))
    return {"kept_heads": diversity["kept_heads"]}


#: bump when :func:`toolchain.pruning.members.make_members` changes what it returns for the same inputs
MASKS_VERSION = 1


def masks_cache(ctx: Context) -> Path:
    """Where the member masks of this recipe's search inputs are kept, shared by the recipe and its variants.

    The key covers every input of the search (``make_members``) and no more: the ``finetune`` stage's key
    (the ``model``, ``data`` and ``finetune`` sections, the seed, the data files' and checkpoint's
    content), the ``scoring`` section and every ``pruning`` field but ``recovery``, ``mlp_share`` and
    ``mlp_core``, which only the steps after the search read. So rows
    that differ only in recovery (steps, data, distillation) search once: the default recipe's three
    circuit searches take about 106 s on 2 cores.
    """
    import hashlib
    import json

    pruning = ctx.recipe.pruning.model_dump(mode="json")
    for name in ("recovery", "mlp_share", "mlp_core"):  # read after the search (fine-tune, MLP slices)
        pruning.pop(name, None)
    if not pruning.get("fork"):
        pruning.pop("fork", None)  # at its default: the key from before the field existed
    h = hashlib.sha256(f"member masks {MASKS_VERSION}".encode())
    h.update(ctx.key("finetune").encode())
    h.update(ctx.recipe.digest("scoring").encode())
    h.update(json.dumps(pruning, sort_keys=True).encode())
    return ctx.stage_dir("finetune").parent / "cache" / "member-masks" / f"{h.hexdigest()[:16]}.json"


def _cached_members(path: Path) -> list[SimpleNamespace] | None:
    """The members kept at ``path`` (index, seed, keep mask), or None when absent or unreadable."""
    try:
        return [SimpleNamespace(index=int(m["index"]), seed=int(m["seed"]),
                                keep=torch.tensor(m["keep"], dtype=torch.bool)) for m in read_json(path)["members"]]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _member_neurons(ctx: Context, adapter: ModelAdapter, tok: Any) -> list[list[list[int]]]:
    """``[M][L]`` MLP neurons each member keeps: Taylor importance on the calibration data, split by share and core."""
    from toolchain.pruning.neurons import split_neurons
    from toolchain.scoring.calibration import subset
    from toolchain.scoring.neurons import neuron_scores

    p = ctx.recipe.pruning
    calib = calibration(ctx, tok)
    labels = torch.cat([lab for _, lab in calib])
    # the rows with labels: OOD rows (label -1) have no loss to take a gradient of
    calib = subset(calib, torch.nonzero(labels >= 0).flatten().numpy())
    scores = neuron_scores(adapter, calib, layers=range(p.fork, adapter.num_layers))
    neurons = split_neurons(scores, p.members, p.mlp_share, core=p.mlp_core, fork=p.fork)
    widths = [len(layer) for layer in neurons[0]]
    ctx.console.print(f"  MLP neurons per member from layer {p.fork} on: {widths[p.fork:]} of "
                      f"{[int(s.numel()) for s in scores][p.fork:]} (share {p.mlp_share}, core {p.mlp_core})")
    return neurons


def _recover_members(ctx: Context, adapter: ModelAdapter, tok: Any, masks: torch.Tensor, work: Path,
                     neurons: list[list[list[int]]] | None = None) -> None:
    """Prune each member physically (heads, and MLP neurons when sliced) and fine-tune it (own seed and data order).

    The shared input stage and the layers before ``pruning.fork`` stay frozen: the fused model runs them once.
    """
    from toolchain.models import save_model
    from toolchain.pruning.finetune import finetune

    rec = ctx.recipe.pruning.recovery
    train = ctx.data["train"]
    jobs = dist.assign(len(masks))  # under torchrun: members spread over the ranks, rank 0 saves
    grouped = ctx.recipe.finetune.group_by_length
    local: dict[int, Any] = {}
    adapter.model.eval()  # the fine-tuned, unpruned model: the teacher of recovery.distill
    teacher = adapter.logits if rec.distill > 0 else None
    for i in jobs.items:
        keep = masks[i]
        pruned = adapter.prune(keep, neurons=None if neurons is None else neurons[i])
        pa = adapter_for(pruned, **adapter_kwargs(adapter))
        pa.freeze_shared()  # the fused model runs the input stage once for all members: keep it the base's
        if ctx.recipe.pruning.fork:
            pa.freeze_layers(ctx.recipe.pruning.fork)  # and the trunk before the fork
        seed = ctx.recipe.seed + 7919 * (i + 1)
        part = train
        if rec.bootstrap:  # the member's own resample of the training split (with replacement)
            idx = np.sort(np.random.default_rng(seed).integers(0, len(train), size=len(train)))
            part = train.subset(idx)
        ctx.console.print(f"  recovery fine-tuning of member {i}: {rec.steps} steps (seed {seed}"
                          + (", bootstrap of the training split" if rec.bootstrap else "")
                          + (f", distilled from the fine-tuned model: weight {rec.distill}, T {rec.temperature}"
                             if rec.distill > 0 else "") + ")")
        finetune(pruned, pa, lambda bs, s, part=part: batching.batches(part, bs, tok, ctx.recipe.model, seed=s,
                                                                       group_by_length=grouped),
                 steps=rec.steps, lr=rec.lr, batch_size=rec.batch_size, seed=seed, progress=ctx.progress,
                 process_group=jobs.group, desc=f"recovery of member {i}",
                 teacher=teacher, distill=rec.distill, temperature=rec.temperature)
        if jobs.leads(i):
            local[i] = pruned if not dist.enabled() else pruned.state_dict()
    results = dist.gather_results(jobs, local)
    if dist.is_main():
        for i in sorted(results):
            pruned = results[i]
            if not isinstance(pruned, torch.nn.Module):
                state, pruned = pruned, adapter.prune(masks[i], neurons=None if neurons is None else neurons[i])
                pruned.load_state_dict(state)
            save_model(pruned, work / f"member{i}", tokenizer=tok)


def plot_member_masks(masks: torch.Tensor, path: Path, title: str) -> Path:
    """One panel per member: layers x heads, kept heads dark. PNG written atomically."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    m = masks.shape[0]
    fig = Figure(figsize=(3.2 * m, 2.6))
    axes = fig.subplots(1, m, squeeze=False)[0]
    for i, ax in enumerate(axes):
        ax.imshow(masks[i].float().numpy(), cmap="Greys", vmin=0, vmax=1, aspect="auto")
        ax.set_title(f"member {i} ({int(masks[i].sum())} heads)", fontsize=9)
        ax.set_xlabel("head")
        ax.set_ylabel("layer")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    tmp = path.with_name(f".{path.name}.tmp.png")
    fig.savefig(tmp, dpi=110)
    tmp.replace(path)
    return path
