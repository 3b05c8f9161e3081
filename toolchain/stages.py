"""The stage functions of :mod:`toolchain.pipeline`, in pipeline order.

Each writes only into its work folder; the pipeline publishes it with a manifest.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
from rich.table import Table

from toolchain import interrupts
from toolchain.artifacts import atomic_write_json
from toolchain.errors import RecipeError
from toolchain.models import ModelAdapter, adapter_for, load_model
from toolchain.pipeline import Context, set_seed, stage, stage_manifest


# ---------------------------------------------------------------------------- models
def build_base_model(ctx: Context) -> tuple[torch.nn.Module, ModelAdapter, Any]:
    """The starting model: a checkpoint, or a model built from ``model.from_config``.

    Returns ``(model, adapter, tokenizer)``; the tokenizer is ``None`` for image models.
    """
    r = ctx.recipe
    n_classes = len(ctx.class_names)
    set_seed(r.seed)
    if r.model.from_config is not None:
        import transformers

        family = r.model.family
        cfg_cls = {"bert": "BertConfig", "vit": "ViTConfig", "clip": "CLIPConfig"}[family]
        model_cls = {"bert": "BertForSequenceClassification", "vit": "ViTForImageClassification",
                     "clip": "CLIPModel"}[family]
        cfg_args = dict(r.model.from_config)
        if family in ("bert", "vit"):
            cfg_args["num_labels"] = n_classes
        config = getattr(transformers, cfg_cls)(**cfg_args)
        model = getattr(transformers, model_cls)(config).eval()
        tokenizer = None
        kwargs: dict[str, Any] = {}
        if family == "clip":
            tokenizer = _prompt_tokenizer(ctx)
            kwargs["prompts"] = clip_prompts(ctx, tokenizer)
        return model, adapter_for(model, **kwargs), (tokenizer if family == "bert" else None)
    loaded = load_model(r.model.source, num_labels=n_classes, seed=r.seed, labels=ctx.class_names)
    return loaded.model, loaded.adapter, loaded.tokenizer


def _prompt_tokenizer(ctx: Context) -> Any:
    from toolchain.models import load_tokenizer, resolve_source

    if ctx.recipe.model.source is None:
        raise RecipeError("field 'model.source': CLIP needs a tokenizer for its class prompts (e.g. "
                          "'packaged:all-MiniLM-L6-v2').")
    return load_tokenizer(resolve_source(ctx.recipe.model.source))


def clip_prompts(ctx: Context, tokenizer: Any) -> dict[str, torch.Tensor]:
    """Tokenised class prompts (``model.prompt_template``) for CLIP's zero-shot head."""
    texts = [ctx.recipe.model.prompt_template.format(c) for c in ctx.class_names]
    enc = tokenizer(texts, padding=True, truncation=True, max_length=16, return_tensors="pt")
    return {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]}


def count_parameters(model: torch.nn.Module) -> int:
    """Number of parameters."""
    return sum(p.numel() for p in model.parameters())


# ---------------------------------------------------------------------------- stages
@stage("load", sections=("model", "data"), upstream=(), summary="load the model and the data sets")
def load_stage(ctx: Context, work: Path) -> dict[str, Any]:
    """Load model and data, check the recipe against them, write ``summary.json``."""
    model, adapter, _tok = build_base_model(ctx)
    splits = {
        name: {"size": len(part), "classes": part.class_counts(), "fingerprint": part.fingerprint()}
        for name, part in ctx.data.items()
    }
    summary = {
        "model": {
            "family": adapter.family,
            "class": type(model).__name__,
            "layers": adapter.num_layers,
            "heads_per_layer": adapter.heads_per_layer(),
            "head_dim": adapter.head_dims()[0],
            "parameters": count_parameters(model),
        },
        "classes": ctx.class_names,
        "splits": splits,
    }
    atomic_write_json(work / "summary.json", summary)
    table = Table(title=f"{ctx.recipe.name}: model and data")
    table.add_column("item")
    table.add_column("value")
    m = summary["model"]
    table.add_row("model", f"{m['class']} ({m['family']}), {m['layers']} layers x {max(m['heads_per_layer'])} heads, "
                           f"{m['parameters'] / 1e6:.1f}M parameters")
    for name, s in splits.items():
        counts = ", ".join(f"{k}: {v}" for k, v in s["classes"].items())
        table.add_row(f"split {name}", f"{s['size']} samples, {counts}")
    ctx.console.print(table)
    return {"summary": summary["model"]}


# ---------------------------------------------------------------------------- fine-tuning
def _adapter_kwargs(adapter: ModelAdapter) -> dict[str, Any]:
    return adapter.clone_kwargs()


def train_classifier(ctx: Context, seed: int, desc: str,
                     process_group: Any = None) -> tuple[torch.nn.Module, ModelAdapter, Any, dict]:
    """A fresh base model fine-tuned on the training split with ``seed`` (data order, head init).

    ``process_group``: train data-parallel over that group of ranks (see :mod:`toolchain.distributed`).
    """
    from toolchain.pruning.finetune import finetune

    r = ctx.recipe
    set_seed(seed)
    model, adapter, tok = build_base_model(ctx) if seed == r.seed else _reseeded_base(ctx, seed)
    # the deep-ensemble members record the same fields: equal budget, only the seed differs
    info: dict[str, Any] = {"seed": seed, "steps": r.finetune.steps, "lr": r.finetune.lr,
                            "batch_size": r.finetune.batch_size, "weight_decay": r.finetune.weight_decay,
                            "schedule": "AdamW, linear warm-up + linear decay"}
    if r.finetune.steps > 0:
        ctx.console.print(f"  {desc}: {r.finetune.steps} steps, batch {r.finetune.batch_size}, lr {r.finetune.lr}")
        hist = finetune(
            model, adapter,
            lambda bs, s: ctx.batches(ctx.data["train"], bs, tok, seed=s, group_by_length=r.finetune.group_by_length),
            steps=r.finetune.steps, lr=r.finetune.lr, batch_size=r.finetune.batch_size, seed=seed,
            weight_decay=r.finetune.weight_decay, progress=ctx.progress, process_group=process_group,
        )
        info["loss_first"], info["loss_last"] = hist["losses"][0], hist["losses"][-1]
    info["val_accuracy"] = evaluate_accuracy(ctx, adapter, "val", tok)
    return model, adapter, tok, info


def _reseeded_base(ctx: Context, seed: int) -> tuple[torch.nn.Module, ModelAdapter, Any]:
    """The base model with its new head (or from-config weights) initialised from ``seed``."""
    from dataclasses import replace

    other = replace(ctx, recipe=ctx.recipe.model_copy(update={"seed": seed}))
    other.__dict__["data"] = ctx.data  # same splits: only the initialisation differs
    return build_base_model(other)


@torch.no_grad()
def predict(ctx: Context, adapter: ModelAdapter, split: str, tokenizer: Any, batch_size: int = 64) -> torch.Tensor:
    """Logits ``[N, C]`` of ``adapter``'s model on a split."""
    adapter.model.eval()
    part, back = ctx.in_length_order(ctx.data[split], tokenizer)  # short rows together: less padding
    logits = torch.cat([adapter.logits(b) for b, _ in ctx.batches(part, batch_size, tokenizer)])
    return logits if back is None else logits[torch.as_tensor(back)]


def evaluate_accuracy(ctx: Context, adapter: ModelAdapter, split: str, tokenizer: Any) -> float:
    """Top-1 accuracy on a split."""
    logits = predict(ctx, adapter, split, tokenizer)
    labels = torch.as_tensor(ctx.data[split].labels)
    return float((logits.argmax(-1) == labels).float().mean())


def load_stage_model(ctx: Context, folder: Path) -> tuple[torch.nn.Module, ModelAdapter, Any]:
    """Reload a model saved by a stage (with the CLIP prompts when needed)."""
    kwargs: dict[str, Any] = {}
    tok = None
    if ctx.recipe.model.family == "clip":
        tok = _prompt_tokenizer(ctx)
        kwargs["prompts"] = clip_prompts(ctx, tok)
    loaded = load_model(folder, adapter_kwargs=kwargs, tokenizer=ctx.recipe.model.family != "clip")
    return loaded.model, loaded.adapter, loaded.tokenizer


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


@stage("ensemble", sections=("model", "data", "finetune", "pruning.members"), upstream=("finetune",),
       summary="deep-ensemble baseline: M full models fine-tuned with different seeds")
def ensemble_stage(ctx: Context, work: Path) -> dict[str, Any]:
    """Members 1..M-1 trained exactly as the base (same steps, lr, schedule); member 0 is the base."""
    import shutil

    from toolchain import distributed as dist
    from toolchain.models import save_model

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
                model, _a, tok = _reseeded_base(ctx, info["seed"])
                model.load_state_dict(trained)
            save_model(model, work / f"member{j + 1}", tokenizer=tok)
            infos.append(info)
        atomic_write_json(work / "metrics.json", {"members": infos})
    return {"members": m}


def read_json(path: Path) -> Any:
    """Parse a JSON file."""
    import json

    return json.loads(Path(path).read_text())


# ---------------------------------------------------------------------------- scoring, pruning
def _criterion_params(ctx: Context, criterion: str, heads_per_layer: list[int]) -> dict[str, Any]:
    """Recipe fields -> the criterion's keyword parameters."""
    from toolchain.scoring.registry import criterion_params

    s, p = ctx.recipe.scoring, ctx.recipe.pruning
    wanted = criterion_params(criterion)
    out: dict[str, Any] = {}
    if "alpha" in wanted:
        out["alpha"] = s.alpha
    if "norm_scope" in wanted:
        out["norm_scope"] = s.normalize
    if "seed" in wanted:
        out["seed"] = ctx.recipe.seed
    if "objective" in wanted:
        out["objective"] = s.objective
    if "n_heads" in wanted:
        layers, heads = len(heads_per_layer), max(heads_per_layer)
        kept = p.budget if p.budget is not None else round((1 - float(p.ratio or 0)) * layers * heads)
        out["n_heads"] = max(p.min_heads_per_layer, round(kept / layers))
    return out


#: ``ood_val`` rows ``[0, OOD_CALIB_ROWS)`` are the ones scoring may see (the circuit ``ood_auroc``
#: objective takes the first ``scoring.calib_samples`` of them); model selection's OOD metrics
#: (the evaluate stage's ``selection.json``) use the rows after them, so the two never overlap
#: while ``calib_samples <= 64`` (a larger value is warned about and recorded)
OOD_CALIB_ROWS = 64


def selection_ood_rows(n: int) -> tuple[int, int]:
    """``(start, stop)``: the ``ood_val`` rows model selection uses (the same for every variant)."""
    return min(OOD_CALIB_ROWS, n // 2), n


def _circuit_sees_ood(ctx: Context) -> bool:
    """Whether scoring runs the circuit search with the ``ood_auroc`` objective (OOD rows in calibration)."""
    s = ctx.recipe.scoring
    return s.criterion == "circuit" and s.objective == "ood_auroc"


def calibration(ctx: Context, tokenizer: Any) -> list:
    """Calibration batches; with the ``ood_auroc`` objective OOD validation rows are mixed in (label -1)."""
    from toolchain.scoring.calibration import OOD_LABEL

    s = ctx.recipe.scoring
    part = ctx.data["calib"]
    if len(part) > s.calib_samples:
        part = part.subset(list(range(s.calib_samples)))
    calib = list(ctx.batches(part, s.batch_size, tokenizer))
    if _circuit_sees_ood(ctx):
        if "ood_val" not in ctx.data:
            raise RecipeError("field 'scoring.objective': ood_auroc needs data.ood (an OOD validation split).")
        ood = ctx.data["ood_val"]
        if s.calib_samples > selection_ood_rows(len(ood))[0]:
            ctx.console.print(f"  [yellow]note[/yellow]: scoring.calib_samples {s.calib_samples} > "
                              f"{selection_ood_rows(len(ood))[0]}: the circuit objective also sees ood_val rows "
                              "that model selection uses (benchmarks/diversity)")
        ood = ood.subset(list(range(min(len(ood), s.calib_samples))))
        for batch, labels in ctx.batches(ood, s.batch_size, tokenizer):
            calib.append((batch, torch.full_like(labels, OOD_LABEL)))
    return calib


@stage("score", sections=("model", "data", "finetune", "scoring", "pruning"), upstream=("finetune",),
       summary="score every attention head")
def score_stage(ctx: Context, work: Path) -> dict[str, Any]:
    """Head scores of the chosen criterion on the calibration split: ``scores.json`` + heatmap."""
    from toolchain.scoring.registry import score_heads

    _model, adapter, tok = load_stage_model(ctx, ctx.stage_dir("finetune") / "model")
    crit = ctx.recipe.scoring.criterion
    params = _criterion_params(ctx, crit, adapter.heads_per_layer())
    scores = score_heads(adapter, calibration(ctx, tok), crit, **params)
    scores.to_json(work / "scores.json")
    scores.plot_heatmap(work / f"heatmap-{crit}.png", title=f"{ctx.recipe.name}: {crit} head scores")
    ctx.console.print(f"  {crit} scores on {ctx.recipe.scoring.calib_samples} calibration samples "
                      f"(data hash {scores.data_hash[:12]})")
    return {"criterion": crit, "params": params}


@stage("prune", sections=("model", "data", "finetune", "scoring", "pruning"), upstream=("score",),
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
                 "criterion_params": {c: _criterion_params(ctx, c, hpl) for c in dict.fromkeys(p.criteria or [])}}
    else:
        extra = {"criterion": crit, **_criterion_params(ctx, crit, hpl)}
        if p.strategy == "seeds":
            extra.pop("seed", None)
        if p.strategy == "partition":
            extra["core"] = p.core
        if p.strategy == "sampled":
            extra["temperature"] = p.temperature
    members = make_members(
        adapter, calibration(ctx, tok), m=p.members, strategy=p.strategy,
        seed=r.seed, scope=p.scope, min_heads_per_layer=p.min_heads_per_layer, **rule, **extra,
    )
    masks = torch.stack([mb.keep for mb in members])
    val_logits = []
    val, _back = ctx.in_length_order(ctx.data["val"], tok)  # less padding; the labels follow the same order
    with torch.no_grad():
        for mb in members:
            outs = [adapter.gated_logits(b, mb.keep.float()) for b, _ in ctx.batches(val, 64, tok)]
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
    atomic_write_json(work / "members.json", {
        "criterion": crit, "strategy": r.pruning.strategy, "rule": rule,
        "members": [{"index": mb.index, "seed": mb.seed, "keep": mb.keep.int().tolist()} for mb in members],
    })
    atomic_write_json(work / "diversity.json", diversity)
    plot_member_masks(masks, work / "members.png", title=f"{r.name}: heads kept per member")
    if r.pruning.recovery.steps > 0:
        _recover_members(ctx, adapter, tok, masks, work)
    jac = diversity.get("jaccard", {}).get("overall")
    ctx.console.print(f"  {len(members)} members keep {diversity['kept_heads']} heads; "
                      + (f"mean Jaccard {jac:.3f}; " if jac is not None else "")
                      + "val accuracy " + ", ".join(f"{a:.3f}" for a in diversity["member_val_accuracy"]))
    return {"kept_heads": diversity["kept_heads"]}


def _recover_members(ctx: Context, adapter: ModelAdapter, tok: Any, masks: torch.Tensor, work: Path) -> None:
    """Prune each member physically and fine-tune it (per-member seed and data order)."""
    from toolchain import distributed as dist
    from toolchain.models import save_model
    from toolchain.pruning.finetune import finetune

    rec = ctx.recipe.pruning.recovery
    train = ctx.data["train"]
    jobs = dist.assign(len(masks))  # under torchrun: members spread over the ranks, rank 0 saves
    grouped = ctx.recipe.finetune.group_by_length
    local: dict[int, Any] = {}
    for i in jobs.items:
        keep = masks[i]
        pruned = adapter.prune(keep)
        pa = adapter_for(pruned, **_adapter_kwargs(adapter))
        # the fused model computes the embedding stage once for all members: keep it as the base's
        for name, param in pruned.named_parameters():
            if ".embeddings." in f".{name}" or "pre_layrnorm" in name:
                param.requires_grad_(False)
        seed = ctx.recipe.seed + 7919 * (i + 1)
        part = train
        if rec.bootstrap:  # the member's own resample of the training split (with replacement)
            idx = np.sort(np.random.default_rng(seed).integers(0, len(train), size=len(train)))
            part = train.subset(idx)
        ctx.console.print(f"  recovery fine-tuning of member {i}: {rec.steps} steps (seed {seed}"
                          + (", bootstrap of the training split)" if rec.bootstrap else ")"))
        finetune(pruned, pa, lambda bs, s, part=part: ctx.batches(part, bs, tok, seed=s, group_by_length=grouped),
                 steps=rec.steps, lr=rec.lr, batch_size=rec.batch_size, seed=seed, progress=ctx.progress,
                 process_group=jobs.group)
        if jobs.leads(i):
            local[i] = pruned if not dist.enabled() else pruned.state_dict()
    results = dist.gather_results(jobs, local)
    if dist.is_main():
        for i in sorted(results):
            pruned = results[i]
            if not isinstance(pruned, torch.nn.Module):
                state, pruned = pruned, adapter.prune(masks[i])
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


# ---------------------------------------------------------------------------- fusion, export
def member_masks(ctx: Context) -> torch.Tensor:
    """``[M, L, H]`` bool keep masks written by the prune stage."""
    data = read_json(ctx.stage_dir("prune") / "members.json")
    return torch.tensor([m["keep"] for m in data["members"]], dtype=torch.bool)


def build_hydra(ctx: Context, lowering: str | None = None) -> torch.nn.Module:
    """The fused Hydra model from the prune stage (masks, or recovered member models)."""
    from toolchain.hydra.fuse import fuse, fuse_members

    f = ctx.recipe.fusion
    low = lowering or f.lowering
    prune_dir = ctx.stage_dir("prune")
    if ctx.recipe.pruning.recovery.steps > 0:
        members = [load_stage_model(ctx, prune_dir / f"member{i}")[1] for i in range(ctx.recipe.pruning.members)]
        return fuse_members(members, mlp=f.mlp, layernorm=f.layernorm, lowering=low)
    _model, adapter, _tok = load_stage_model(ctx, ctx.stage_dir("finetune") / "model")
    return fuse(adapter, member_masks(ctx), mlp=f.mlp, layernorm=f.layernorm, lowering=low)


@stage("fuse", sections=("model", "data", "finetune", "scoring", "pruning", "fusion"), upstream=("prune",),
       summary="fuse the M members into one Hydra model")
def fuse_stage(ctx: Context, work: Path) -> dict[str, Any]:
    """Fused model saved as safetensors + JSON config (reloads without the checkpoint)."""
    from toolchain.hydra.fuse import format_summary, save_hydra, summary

    model = build_hydra(ctx)
    save_hydra(model, work / "hydra")
    info = summary(model)
    atomic_write_json(work / "summary.json", info)
    ctx.console.print(format_summary(info))
    return {"members": ctx.recipe.pruning.members}


def example_feed(ctx: Context, batch: int, seq: int | None = None, seed: int = 0) -> dict[str, torch.Tensor]:
    """Generated model inputs of a given shape (text: random tokens with ragged padding)."""
    g = torch.Generator().manual_seed(seed)
    m = ctx.recipe.model
    if _is_text(ctx):
        seq = seq or m.max_length
        ids = torch.randint(1000, 20000, (batch, seq), generator=g)
        mask = torch.ones(batch, seq, dtype=torch.long)
        for i in range(batch):  # ragged lengths: row i keeps seq - 3 * i tokens (at least 2)
            mask[i, max(2, seq - 3 * i):] = 0
        ids[:, 0] = 101
        ids = ids * mask
        return {"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids)}
    size = m.image_size or 28
    return {"pixel_values": torch.randn(batch, m.num_channels if m.family != "clip" else 3, size, size, generator=g)}


def _is_text(ctx: Context) -> bool:
    from toolchain.data import TextData

    return isinstance(ctx.data["train"], TextData)


def dynamic_axes(ctx: Context, names: list[str]) -> dict[str, dict[int, str]]:
    """Batch (and sequence for text) are dynamic."""
    return {n: ({0: "batch", 1: "sequence"} if n != "pixel_values" else {0: "batch"}) for n in names}


def trt_profile(ctx: Context, names: list[str]) -> dict[str, tuple]:
    """The recipe's min/opt/max shapes per input (the TensorRT optimisation profile)."""
    e = ctx.recipe.export
    out = {}
    for n in names:
        if n == "pixel_values":
            feed = example_feed(ctx, 1)
            rest = tuple(feed["pixel_values"].shape[1:])
            out[n] = ((e.batch.min, *rest), (e.batch.opt, *rest), (e.batch.max, *rest))
        else:
            out[n] = ((e.batch.min, e.sequence.min), (e.batch.opt, e.sequence.opt), (e.batch.max, e.sequence.max))
    return out


def export_one(ctx: Context, module: torch.nn.Module, outputs: list[str], path: Path) -> dict[str, Any]:
    """Export, check at shapes other than the export shape, lint for TensorRT; return facts."""
    from toolchain.export.lint import lint_tensorrt
    from toolchain.export.onnx_export import check_dynamic, export_onnx

    interrupts.check()  # a graceful SIGTERM stops between graphs, not inside the ONNX exporter
    e = ctx.recipe.export
    feed = example_feed(ctx, 2, min(e.sequence.opt, 32))
    names = [n for n in getattr(module, "input_names", feed) if n in feed]
    feed = {n: feed[n] for n in names}
    module.eval()
    axes = dynamic_axes(ctx, names) | {o: {0: "batch"} for o in outputs}
    res = export_onnx(module, feed, outputs, path, dynamic_axes=axes, opset=e.opset)
    shapes = [(3, min(e.sequence.max, 21)), (1, min(e.sequence.max, 40))]
    report = check_dynamic(path, module, lambda s: {n: v for n, v in example_feed(ctx, s[0], s[1], seed=5).items()
                                                    if n in names}, shapes, atol=1e-4)
    lint = lint_tensorrt(path, trt_version="10", profile=trt_profile(ctx, names))
    return {"path": path.name, "outputs": outputs, "inputs": names, "summary": res.summary,
            "dynamic_check": {"ok": report.ok, "shapes": [list(s) for s in shapes]},
            "lint_ok": lint.ok, "lint": [str(f) for f in lint.findings]}


@stage("export", sections=("model", "data", "finetune", "scoring", "pruning", "fusion", "export"),
       upstream=("fuse", "ensemble"), summary="export ONNX graphs: Hydra (both lowerings), single model, members",
       version=2)  # 2: BF16 constants clamped to the BF16 range (finfo(float32).min became -inf)
def export_stage(ctx: Context, work: Path) -> dict[str, Any]:
    """Export every graph the later stages run.

    FP32 graphs of Hydra (each lowering), the single model and each deep-ensemble member, and
    their FP16/BF16 variants (the recipe's ``export.precisions``).
    """
    from toolchain.export.precision import write_precision_variant
    from toolchain.models.wrappers import SingleModel

    e = ctx.recipe.export
    graphs: dict[str, dict[str, Any]] = {}
    for low in e.lowerings:
        hydra = build_hydra(ctx, lowering=low)
        graphs[f"hydra-{low}"] = {"kind": "hydra", "lowering": low, "precision": "fp32",
                                  **export_one(ctx, hydra, ["probs", "member_logits"], work / f"hydra-{low}.onnx")}
    _m, adapter, _t = load_stage_model(ctx, ctx.stage_dir("finetune") / "model")
    graphs["single"] = {"kind": "single", "precision": "fp32",
                        **export_one(ctx, SingleModel(adapter), ["logits", "probs"], work / "single.onnx")}
    for i in range(1, ctx.recipe.pruning.members):
        _m, member, _t = load_stage_model(ctx, ctx.stage_dir("ensemble") / f"member{i}")
        graphs[f"member{i}"] = {"kind": "member", "precision": "fp32",
                                **export_one(ctx, SingleModel(member), ["logits", "probs"], work / f"member{i}.onnx")}
    members = [f"member{i}" for i in range(1, ctx.recipe.pruning.members)]
    for base in [f"hydra-{low}" for low in e.lowerings] + ["single", *members]:
        for prec in [p for p in e.precisions if p != "fp32"]:
            name = f"{base}.{prec}"
            interrupts.check()
            res = write_precision_variant(work / f"{base}.onnx", work / f"{name}.onnx", prec)
            keep = {k: v for k, v in graphs[base].items() if k in ("kind", "lowering", "outputs", "inputs")}
            graphs[name] = {**keep, "precision": prec, "path": f"{name}.onnx", "precision_report": res.report()}
    atomic_write_json(work / "graphs.json", graphs)
    for name, g in graphs.items():
        extra = ""
        if g["precision"] == "fp32":
            dyn = "ok" if g["dynamic_check"]["ok"] else "FAILED"
            extra = f", dynamic check {dyn}, lint {'ok' if g['lint_ok'] else 'FAILED'}"
        ctx.console.print(f"  {name}.onnx ({g['precision']}){extra}")
    return {"graphs": sorted(graphs)}


# ---------------------------------------------------------------------------- evaluation
@torch.no_grad()
def _outputs(ctx: Context, module: torch.nn.Module, split: str | Any, tok: Any, names: list[str],
             batch_size: int = 64) -> dict[str, np.ndarray]:
    """Run a dict-output module over a split (a name, or a data subset); concatenate each output."""
    module.eval()
    outs: dict[str, list] = {}
    part, back = ctx.in_length_order(ctx.data[split] if isinstance(split, str) else split, tok)  # less padding
    for batch, _ in ctx.batches(part, batch_size, tok):
        res = module(**{k: v for k, v in batch.items() if k in names})
        for k, v in res.items():
            outs.setdefault(k, []).append(v.float().numpy())
    return {k: np.concatenate(v)[slice(None) if back is None else back] for k, v in outs.items()}


def _hydra_variant_outputs(ctx: Context, splits: list[str], tok: Any, names: list[str]) -> dict[str, dict]:
    from toolchain.hydra.fuse import load_hydra

    hydra = load_hydra(ctx.stage_dir("fuse") / "hydra")
    out = {s: _outputs(ctx, hydra, s, tok, names) for s in splits if s != "ood_val"}
    if "ood_val" in splits:  # only the rows model selection uses (see selection_ood_rows)
        part = ctx.data["ood_val"]
        out["ood_val"] = _outputs(ctx, hydra, part.subset(list(range(*selection_ood_rows(len(part))))), tok, names)
    return out


def _same_model(ctx: Context, a: tuple[str, str], b: tuple[str, str]) -> bool:
    """Whether two stage folders hold the same files (by the stages' manifests' sha256): ``(stage, folder)``."""
    def files(stage_name: str, folder: str) -> dict[str, str]:
        listed = stage_manifest(ctx, stage_name).get("files", {})
        return {k.removeprefix(folder + "/"): v for k, v in listed.items() if k.startswith(folder + "/")}

    fa = files(*a)
    return bool(fa) and fa == files(*b)


def _member_metrics(member_logits_id: np.ndarray, labels: np.ndarray,
                    member_logits_ood: np.ndarray | None) -> list[dict[str, float]]:
    """``uq_report`` of every member on its own."""
    from toolchain.metrics import member_probs, uq_report

    pid = member_probs(member_logits_id)
    pood = None if member_logits_ood is None else member_probs(member_logits_ood)
    return [uq_report(pid[:, i], labels, probs_ood=None if pood is None else pood[:, i])
            for i in range(pid.shape[1])]


def ensemble_diversity(member_logits_id: np.ndarray, labels: np.ndarray,
                       member_logits_ood: np.ndarray | None, seed: int) -> dict[str, Any]:
    """Disagreement, pairwise KL and the ensemble gain (paired-bootstrap 95% CIs) of ``[N, M, C]`` logits."""
    from toolchain.metrics.gain import ensemble_gain
    from toolchain.pruning.diversity import pairwise_kl, prediction_disagreement

    by_member = torch.as_tensor(np.ascontiguousarray(member_logits_id.transpose(1, 0, 2)))
    dis = prediction_disagreement(by_member)
    return {
        "disagreement": {k: v for k, v in dis.items() if k != "ensemble_pred"},
        "kl": pairwise_kl(by_member),
        "gain": ensemble_gain(member_logits_id, labels, member_logits_ood, seed=seed),
    }


@stage("evaluate", sections=("model", "data", "finetune", "scoring", "pruning", "fusion"),
       upstream=("fuse", "ensemble"), summary="uncertainty metrics: single model, deep ensemble, Hydra (PyTorch)",
       version=2)
def evaluate_stage(ctx: Context, work: Path) -> dict[str, Any]:
    """UQ metrics on the ID test split and the OOD test split, with plots and per-sample outputs.

    Also: the ensemble gain of Hydra and the deep ensemble (ensemble minus mean member, with
    paired-bootstrap 95% intervals), member diversity on the test split, and Hydra's metrics on the
    validation splits that model selection may use (``selection.json``: ``val`` and the ``ood_val``
    rows of :func:`selection_ood_rows`, which the circuit objective never sees; metrics and the
    ensemble gain with its intervals). In a compare variant (:class:`VariantContext`) only Hydra is
    evaluated.
    """
    from toolchain.metrics import ensemble_probs, reliability_bins, uq_report
    from toolchain.metrics.plots import plot_ood_histograms, plot_reliability
    from toolchain.models.wrappers import SingleModel

    has_ood = "ood_test" in ctx.data
    splits = ["test"] + (["ood_test"] if has_ood else [])
    _m, base, tok = load_stage_model(ctx, ctx.stage_dir("finetune") / "model")
    names = list(base.input_names)
    labels = np.asarray(ctx.data["test"].labels)
    variant_only = isinstance(ctx, VariantContext)
    variants: dict[str, dict[str, np.ndarray | None]] = {}
    if not variant_only:
        single = {s: _outputs(ctx, SingleModel(base), s, tok, names) for s in splits}
        members = []
        for i in range(ctx.recipe.pruning.members):
            if i == 0 and _same_model(ctx, ("finetune", "model"), ("ensemble", "member0")):
                members.append({s: single[s]["logits"] for s in splits})  # member 0 is the single model
                continue
            _m, a, _t = load_stage_model(ctx, ctx.stage_dir("ensemble") / f"member{i}")
            members.append({s: _outputs(ctx, SingleModel(a), s, tok, names)["logits"] for s in splits})
        variants["single"] = {"probs_id": single["test"]["probs"], "probs_ood": single.get("ood_test", {}).get("probs")}
        de_id = np.stack([m["test"] for m in members], 1)
        de_ood = np.stack([m["ood_test"] for m in members], 1) if has_ood else None
        variants["deep-ensemble"] = {"probs_id": ensemble_probs(de_id),
                                     "probs_ood": None if de_ood is None else ensemble_probs(de_ood),
                                     "member_logits_id": de_id, "member_logits_ood": de_ood}
    sel_splits = [s for s in ("val", "ood_val") if s in ctx.data]
    hyd = _hydra_variant_outputs(ctx, splits + sel_splits, tok, names)
    variants["hydra"] = {"probs_id": hyd["test"]["probs"], "probs_ood": hyd.get("ood_test", {}).get("probs"),
                         "member_logits_id": hyd["test"]["member_logits"],
                         "member_logits_ood": hyd.get("ood_test", {}).get("member_logits")}
    several = ctx.recipe.pruning.members >= 2
    metrics: dict[str, Any] = {}
    for name, v in variants.items():
        kw = {k: val for k, val in v.items() if val is not None and k != "probs_id"}
        if not several:
            kw.pop("member_logits_id", None)
            kw.pop("member_logits_ood", None)
        metrics[name] = uq_report(v["probs_id"], labels, **kw)
        plot_reliability(reliability_bins(v["probs_id"], labels), work / f"reliability-{name}.png",
                         title=f"{ctx.recipe.name}: {name}")
        if v.get("probs_ood") is not None:
            plot_ood_histograms(-v["probs_id"].max(-1), -v["probs_ood"].max(-1), work / f"ood-hist-{name}.png",
                                title=f"{name}: -max probability, ID vs OOD")
    # each Hydra member on its own: the ensemble gain is ensemble minus the mean member
    per_member = _member_metrics(hyd["test"]["member_logits"], labels, hyd.get("ood_test", {}).get("member_logits"))
    metrics["hydra-members-mean"] = {k: float(np.mean([p[k] for p in per_member])) for k in per_member[0]}
    diversity: dict[str, Any] = {}
    if several:
        for name in ("hydra", "deep-ensemble"):
            if name in variants:
                v = variants[name]
                diversity[name] = ensemble_diversity(v["member_logits_id"], labels, v.get("member_logits_ood"),
                                                     seed=ctx.recipe.seed)
    selection: dict[str, Any] = {}
    if "val" in hyd:
        from toolchain.metrics.gain import ensemble_gain

        val_labels = np.asarray(ctx.data["val"].labels)
        kw = {"probs_ood": hyd["ood_val"]["probs"]} if "ood_val" in hyd else {}
        if several:
            kw["member_logits_id"] = hyd["val"]["member_logits"]
            if "ood_val" in hyd:
                kw["member_logits_ood"] = hyd["ood_val"]["member_logits"]
        selection["hydra"] = uq_report(hyd["val"]["probs"], val_labels, **kw)
        if "ood_val" in hyd:
            start, stop = selection_ood_rows(len(ctx.data["ood_val"]))
            seen = min(ctx.recipe.scoring.calib_samples, stop) if _circuit_sees_ood(ctx) else 0
            selection["ood_val_rows"] = [start, stop]
            selection["ood_val_rows_seen_by_scoring"] = max(0, seen - start)
        if several:
            selection["gain"] = ensemble_gain(hyd["val"]["member_logits"], val_labels,
                                              hyd.get("ood_val", {}).get("member_logits"), seed=ctx.recipe.seed)
    atomic_write_json(work / "metrics.json", metrics)
    atomic_write_json(work / "diversity.json", diversity)
    atomic_write_json(work / "selection.json", selection)
    np.savez_compressed(work / "outputs.npz", labels=labels,
                        **{f"{n}_{k}": v for n, d in variants.items() for k, v in d.items() if v is not None})
    keys = ["accuracy", "nll", "ece", "brier", "auroc_msp", "fpr95_msp"]
    for name, m in metrics.items():
        ctx.console.print(f"  {name:>18}: " + "  ".join(f"{k} {m[k]:.4f}" for k in keys if k in m))
    for name, d in diversity.items():
        g = d["gain"]
        ctx.console.print(f"  {name:>18} ensemble gain: " + "  ".join(
            f"{k} {g[k]['gain']:+.4f} [{g[k]['ci'][0]:+.4f}, {g[k]['ci'][1]:+.4f}]"
            for k in ("nll", "auroc_msp", "auroc_mi") if k in g))
    return {"variants": sorted(metrics)}


# ---------------------------------------------------------------------------- compare variants
class VariantContext(Context):
    """A compare variant's context: its own prune/fuse/evaluate stages, the parent's load/fine-tune/ensemble."""

    LINKED = ("load", "finetune", "ensemble")

    def __init__(self, parent: Context, recipe: Any) -> None:
        super().__init__(recipe=recipe, console=parent.console, force=parent.force, progress=parent.progress)
        self.parent = parent
        self.__dict__["data"] = parent.data  # same splits

    def stage_dir(self, name: str) -> Path:
        """The parent's folder for the linked stages, else ``variants/<name>/<stage>``."""
        return self.parent.stage_dir(name) if name in self.LINKED else super().stage_dir(name)

    def key(self, name: str) -> str:
        """The parent's key for the linked stages."""
        return self.parent.key(name) if name in self.LINKED else super().key(name)


#: the stages a compare variant runs (its score stage only draws a heatmap: prune scores itself)
VARIANT_STAGES = ["prune", "fuse", "evaluate"]


@stage("compare", sections=("model", "data", "finetune", "scoring", "pruning", "fusion", "compare"),
       upstream=("finetune", "ensemble"), summary="more Hydra variants side by side (recipe 'compare')")
def compare_stage(ctx: Context, work: Path) -> dict[str, Any]:
    """Prune, fuse and evaluate every ``compare`` variant (each cached under ``variants/<name>/``)."""
    from toolchain.pipeline import run_pipeline

    results: dict[str, Any] = {}
    for entry in ctx.recipe.compare:
        sub = VariantContext(ctx, ctx.recipe.variant(entry))
        ctx.console.print(f"  variant [bold]{entry.name}[/bold]: criterion {sub.recipe.scoring.criterion}, "
                          f"strategy {sub.recipe.pruning.strategy}")
        run_pipeline(sub, only=VARIANT_STAGES)
        ev = sub.stage_dir("evaluate")
        results[entry.name] = {
            "criterion": sub.recipe.scoring.criterion,
            "strategy": sub.recipe.pruning.strategy,
            "overrides": entry.model_dump(exclude={"name"}),
            "metrics": read_json(ev / "metrics.json"),
            "diversity": read_json(ev / "diversity.json"),
            "selection": read_json(ev / "selection.json"),
            "members": read_json(sub.stage_dir("prune") / "diversity.json"),
            "size": read_json(sub.stage_dir("fuse") / "summary.json"),
        }
    atomic_write_json(work / "compare.json", results)
    return {"variants": list(results)}


# ---------------------------------------------------------------------------- engines, parity
@stage("build", sections=("model", "data", "finetune", "scoring", "pruning", "fusion", "export", "engines"),
       upstream=("export",), summary="build TensorRT engines (where tensorrt and a CUDA GPU are available)")
def build_stage(ctx: Context, work: Path) -> dict[str, Any]:
    """One engine per Hydra graph and precision; absent TensorRT is recorded, not fatal, for ``run``."""
    from toolchain.engines.tensorrt.builder import build_engine
    from toolchain.errors import MissingDependencyError

    if "tensorrt" not in ctx.recipe.engines:
        atomic_write_json(work / "engines.json", {"skipped": "the recipe's engines list has no 'tensorrt'"})
        ctx.console.print("  no TensorRT engines requested (engines: " + ", ".join(ctx.recipe.engines) + ")")
        return {"engines": []}
    graphs = read_json(ctx.stage_dir("export") / "graphs.json")
    built: dict[str, Any] = {}
    for name, g in graphs.items():
        if g["kind"] != "hydra" or g.get("lowering") != "conv":
            continue
        try:
            path = build_engine(ctx.stage_dir("export") / g["path"], work / f"{name}.engine",
                                precision=g["precision"], profile=trt_profile(ctx, g["inputs"]),
                                timing_cache=ctx.root / "timing.cache")
            built[name] = {"engine": path.name, "precision": g["precision"], "onnx": g["path"]}
        except MissingDependencyError as exc:
            atomic_write_json(work / "engines.json", {"skipped": str(exc)})
            ctx.console.print(f"  [yellow]TensorRT engines skipped[/yellow]: {exc}")
            return {"engines": [], "skipped": str(exc)}
    atomic_write_json(work / "engines.json", built)
    return {"engines": sorted(built)}


def parity_inputs(ctx: Context, names: list[str], tok: Any) -> tuple[list, list, list]:
    """Generated feeds at several shapes, the ID test split with labels, the OOD test split."""
    e = ctx.recipe.export

    def np_feed(feed: dict[str, torch.Tensor]) -> dict[str, np.ndarray]:
        return {k: v.numpy() for k, v in feed.items() if k in names}

    shapes = [(e.batch.min, e.sequence.min), (min(e.batch.opt, 8), min(e.sequence.opt, 64)),
              (2, min(e.sequence.max, 96))]
    generated = [np_feed(example_feed(ctx, b, s, seed=11 + i)) for i, (b, s) in enumerate(shapes)]
    def by_length(split: str) -> Any:  # rows by token length: less padding; the labels travel with them
        return ctx.in_length_order(ctx.data[split], tok)[0]

    ident = [(np_feed(b), y.numpy()) for b, y in ctx.batches(by_length("test"), 64, tok)]
    ood = [np_feed(b) for b, _ in ctx.batches(by_length("ood_test"), 64, tok)] if "ood_test" in ctx.data else []
    return generated, ident, ood


def _input_specs(ctx: Context, names: list[str]) -> dict[str, tuple]:
    feed = example_feed(ctx, 1, 8)
    return {n: (np.float32 if n == "pixel_values" else np.int64,
                ("batch", *feed[n].shape[1:]) if n == "pixel_values" else ("batch", "sequence")) for n in names}


@stage("parity", sections=("model", "data", "finetune", "scoring", "pruning", "fusion", "export", "engines",
                           "parity"),
       upstream=("build",), summary="numerical and UQ-metric parity of every engine vs the PyTorch reference",
       version=2)
def parity_stage(ctx: Context, work: Path) -> dict[str, Any]:
    """Verdicts for the Hydra engines (vs the fused PyTorch model) and the single model's engines.

    BF16 graphs run as ``onnxrt-cpu-bf16emu`` (ONNX Runtime's CPU provider has no BF16 MatMul/Conv
    kernels; :mod:`toolchain.engines.onnxrt.bf16emu` runs FP32 kernels with every BF16 result
    rounded to BF16) on the same feeds as the others, so they get numeric and UQ verdicts too.
    Version 2: BF16 graphs gated; rank metrics can be ``unresolved``; deterministic reports.
    """
    from toolchain.engines import make_runner
    from toolchain.hydra.fuse import load_hydra
    from toolchain.models.wrappers import SingleModel
    from toolchain.parity import run_parity

    graphs = read_json(ctx.stage_dir("export") / "graphs.json")
    _m, base, tok = load_stage_model(ctx, ctx.stage_dir("finetune") / "model")
    names = list(graphs["single"]["inputs"])
    generated, ident, ood = parity_inputs(ctx, names, tok)
    hydra = load_hydra(ctx.stage_dir("fuse") / "hydra")
    groups = {"hydra": (hydra, ["probs", "member_logits"]), "single": (SingleModel(base), ["logits", "probs"])}
    engines = read_json(ctx.stage_dir("build") / "engines.json")
    results: dict[str, Any] = {}
    skipped: dict[str, str] = {}
    for group, (module, outputs) in groups.items():
        reference = make_runner("torch", module=module, input_specs=_input_specs(ctx, names), output_names=outputs,
                                name=f"torch-{group}")
        candidates, precisions = {}, {}
        for gname, g in graphs.items():
            if (g["kind"] == "hydra") != (group == "hydra") or g["kind"] == "member":
                continue
            label = f"onnxrt-cpu:{gname}"
            if g["precision"] == "bf16":
                if "onnxrt-cpu" in ctx.recipe.engines:
                    el = f"onnxrt-cpu-bf16emu:{gname}"
                    candidates[el] = make_runner("onnxrt-cpu-bf16emu", path=ctx.stage_dir("export") / g["path"],
                                                 intra_op_threads=ctx.recipe.bench.threads, name=el)
                    precisions[el] = "bf16"
                if "onnxrt-cuda" in ctx.recipe.engines:
                    skipped[f"onnxrt-cuda:{gname}"] = ("BF16 graphs are checked on CPU (onnxrt-cpu-bf16emu); ONNX "
                                                       "Runtime's CUDA provider lacks BF16 kernels for some ops")
                continue
            if "onnxrt-cpu" in ctx.recipe.engines:
                candidates[label] = make_runner("onnxrt-cpu", path=ctx.stage_dir("export") / g["path"],
                                                intra_op_threads=ctx.recipe.bench.threads, name=label)
                precisions[label] = g["precision"]
            if "onnxrt-cuda" in ctx.recipe.engines:
                cl = f"onnxrt-cuda:{gname}"
                candidates[cl] = make_runner("onnxrt-cuda", path=ctx.stage_dir("export") / g["path"], name=cl)
                precisions[cl] = g["precision"]
        if group == "hydra":
            for ename, info in engines.items() if isinstance(engines, dict) and "skipped" not in engines else []:
                tl = f"tensorrt:{ename}"
                candidates[tl] = make_runner("tensorrt", engine_path=ctx.stage_dir("build") / info["engine"], name=tl)
                precisions[tl] = info["precision"]
        verdict = run_parity(reference, candidates, generated, ident, ood, out_dir=work / group,
                             precisions=precisions, **parity_tolerances(ctx))
        results[group] = {"exit_code": verdict.exit_code, "status": verdict.status, "problems": verdict.problems(),
                          "failing_engines": sorted({c.engine for c in verdict.failures}),
                          "unresolved": verdict.notes()}
        ctx.console.print(f"  {group}: {verdict.status} ({len(candidates)} engines)")
        for p in verdict.problems():
            ctx.console.print(f"    [red]x[/red] {p}")
        for note in verdict.notes():
            ctx.console.print(f"    [yellow]?[/yellow] {note}")
    summary = {"groups": results, "skipped": skipped,
               "exit_code": max([r["exit_code"] for r in results.values()] or [0])}
    atomic_write_json(work / "verdict.json", summary)
    md = ["| group | status | exit code |", "|---|---|---|"]
    md += [f"| {g} | {r['status']} | {r['exit_code']} |" for g, r in results.items()]
    md += ["", *[f"- skipped `{k}`: {v}" for k, v in skipped.items()]]
    md += ["", *[(work / g / "summary.md").read_text() for g in results if (work / g / "summary.md").exists()]]
    (work / "summary.md").write_text("\n".join(md) + "\n")
    return {"exit_code": summary["exit_code"]}


def parity_tolerances(ctx: Context) -> dict[str, Any]:
    """The recipe's parity overrides, in :func:`toolchain.parity.run_parity`'s terms."""
    from toolchain.parity import DEFAULT_UQ_TOLERANCES, parse_uq_tolerances

    p = ctx.recipe.parity
    out: dict[str, Any] = {}
    if p.uq_tolerances:
        uq = dict(p.uq_tolerances)
        if "" in uq:
            every = uq.pop("")
            uq = {k: every for k in DEFAULT_UQ_TOLERANCES} | uq
        try:
            out["uq_tolerances"] = parse_uq_tolerances(uq)
        except (ValueError, TypeError) as exc:
            raise RecipeError(f"field 'parity.uq_tolerances': {exc}") from None
    if p.tolerances:
        out["tolerances"] = p.tolerances
    return out


def parity_outcome(ctx: Context) -> None:
    """Raise the parity verdict's error (exit 1/2/3) after the stage published it."""
    from toolchain.errors import CheckFailed, MissingDependencyError, ToolchainError

    verdict = read_json(ctx.stage_dir("parity") / "verdict.json")
    code = verdict["exit_code"]
    if code == 0:
        return
    problems = [p for g in verdict["groups"].values() for p in g["problems"]]
    text = f"parity failed (see {ctx.stage_dir('parity')}/summary.md): " + "; ".join(problems[:10])
    raise {1: CheckFailed, 3: MissingDependencyError}.get(code, ToolchainError)(text)


# ---------------------------------------------------------------------------- latency
@stage("bench", sections=("model", "data", "finetune", "scoring", "pruning", "fusion", "export", "engines", "bench"),
       upstream=("export", "build"), summary="latency and size: single model vs deep ensemble vs Hydra")
def bench_stage(ctx: Context, work: Path) -> dict[str, Any]:
    """Interleaved latency rounds on every engine the recipe names (``latency.{json,md,png}``)."""
    from toolchain.bench import run_bench

    b = ctx.recipe.bench
    engines = [e for e in ctx.recipe.engines if e != "torch"]
    result = run_bench(ctx.stage_dir("export"), batch_sizes=b.batch_sizes, sequence_length=b.sequence_length,
                       threads=b.threads, warmup=b.warmup, rounds=b.rounds, engines=engines, out_dir=work,
                       progress=ctx.progress)
    md = work / "latency.md"
    if md.exists():
        ctx.console.print(md.read_text().split("### Ratios")[0].split("### Latency")[-1].strip()[:3000])
    return {"engines": engines, "skipped": result.get("skipped", {}) if isinstance(result, dict) else {}}


# ---------------------------------------------------------------------------- report
@stage("report", sections=("model", "data", "finetune", "scoring", "pruning", "fusion", "export", "engines", "bench",
                            "compare"),
       upstream=("evaluate", "compare", "parity", "bench"), summary="results report (Markdown + HTML with plots)")
def report_stage(ctx: Context, work: Path) -> dict[str, Any]:
    """``report.md`` and ``report.html`` from every stage's outputs."""
    from toolchain.report import build_report

    paths = build_report(ctx.root, work, title=f"hydra-toolchain report: {ctx.recipe.name}")
    ctx.console.print(f"  report: {ctx.stage_dir('report') / paths['md'].name}")
    return {}




def rescue_failing_graphs(ctx: Context) -> list[dict[str, Any]]:
    """Run ``parity --rescue``: make failing FP16/BF16 ONNX Runtime graphs pass.

    For each, search the smallest set of nodes to keep in FP32 and write the passing graph to
    ``<artifacts>/rescue/`` (a folder with its own manifest).
    """
    from toolchain.artifacts import StageDir
    from toolchain.engines import make_runner
    from toolchain.hydra.fuse import load_hydra
    from toolchain.models.wrappers import SingleModel
    from toolchain.parity import rescue_precision

    verdict = read_json(ctx.stage_dir("parity") / "verdict.json")
    graphs = read_json(ctx.stage_dir("export") / "graphs.json")
    engines = {e for g in verdict["groups"].values() for e in g.get("failing_engines", [])}
    failing = sorted(e.split(":", 1)[1] for e in engines if e.startswith("onnxrt-cpu:"))
    failing = [f for f in failing if f in graphs and graphs[f]["precision"] in ("fp16", "bf16")]
    if not failing:
        ctx.console.print("  rescue: no failing FP16/BF16 graph to rescue")
        return []
    _m, base, tok = load_stage_model(ctx, ctx.stage_dir("finetune") / "model")
    names = list(graphs["single"]["inputs"])
    generated, ident, ood = parity_inputs(ctx, names, tok)
    sd = StageDir(ctx.root, "rescue", key=ctx.key("parity"))
    work = sd.begin()
    results = []
    try:
        for name in failing:
            g = graphs[name]
            module = load_hydra(ctx.stage_dir("fuse") / "hydra") if g["kind"] == "hydra" else SingleModel(base)
            outputs = ["probs", "member_logits"] if g["kind"] == "hydra" else ["logits", "probs"]
            reference = make_runner("torch", module=module, input_specs=_input_specs(ctx, names),
                                    output_names=outputs, name="torch-reference")
            fp32 = ctx.stage_dir("export") / g["path"].replace(f".{g['precision']}", "")
            res = rescue_precision(fp32, work / g["path"], g["precision"], reference, generated, ident, ood,
                                   uq_tolerances=parity_tolerances(ctx).get("uq_tolerances"))
            results.append({"graph": name, "passed": res.passed, "kept_fp32_nodes": list(res.kept_fp32_nodes),
                            "path": g["path"]})
            ctx.console.print(f"  rescue {name}: {'pass' if res.passed else 'FAIL'} keeping "
                              f"{len(res.kept_fp32_nodes)} node(s) in FP32: {', '.join(res.kept_fp32_nodes[:8])}")
        atomic_write_json(work / "rescue.json", results)
        sd.publish({"rescued": [r["graph"] for r in results if r["passed"]]})
    except BaseException:
        sd.abort()
        raise
    return results
