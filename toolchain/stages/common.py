"""Helpers the stages share (not a stage).

The base model, training, calibration data, Hydra building, feeds, compare-variant contexts.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from toolchain.artifacts import read_json
from toolchain.data import batching
from toolchain.errors import RecipeError
from toolchain.inference import evaluate_accuracy
from toolchain.models import InputSpec, ModelAdapter, adapter_for, checkpoint_family, family, load_model
from toolchain.pipeline import Context, set_seed


def model_family(ctx: Context) -> type[ModelAdapter]:
    """The recipe's model family (its adapter class): ``model.family``, or with ``auto`` the checkpoint's."""
    from toolchain.models import resolve_source

    m = ctx.recipe.model
    return family(m.family) if m.family != "auto" else checkpoint_family(resolve_source(m.source))


def build_base_model(ctx: Context) -> tuple[torch.nn.Module, ModelAdapter, Any]:
    """The starting model: a checkpoint, or a model built from ``model.from_config``.

    Returns ``(model, adapter, tokenizer)``; the tokenizer is the one the data is encoded with
    (``None`` for image models).
    """
    r = ctx.recipe
    n_classes = len(ctx.class_names)
    set_seed(r.seed)
    if r.model.from_config is not None:
        fam = model_family(ctx)
        model = fam.from_config(r.model.from_config, n_classes)
        tokenizer = prompt_tokenizer(ctx) if fam.tokenizer_use is not None and r.model.source is not None else None
        kwargs = family_kwargs(ctx, fam, tokenizer)
        return model, adapter_for(model, **kwargs), (tokenizer if fam.tokenizer_use == "inputs" else None)
    loaded = load_model(r.model.source, num_labels=n_classes, seed=r.seed, labels=ctx.class_names)
    return loaded.model, loaded.adapter, loaded.tokenizer


def prompt_tokenizer(ctx: Context) -> Any:
    """The tokenizer of ``model.source`` (the class prompts of a zero-shot family are written with it)."""
    from toolchain.models import load_tokenizer, resolve_source

    if ctx.recipe.model.source is None:
        raise RecipeError(f"field 'model.source': a {ctx.recipe.model.family} model needs a tokenizer for its class "
                          "prompts (e.g. 'packaged:all-MiniLM-L6-v2').")
    return load_tokenizer(resolve_source(ctx.recipe.model.source))


def family_kwargs(ctx: Context, fam: type[ModelAdapter], tokenizer: Any = None) -> dict[str, Any]:
    """The adapter arguments that come from the data (class prompts for a family that uses prompts)."""
    if fam.tokenizer_use != "prompts":
        return {}
    tok = tokenizer if tokenizer is not None else prompt_tokenizer(ctx)
    return fam.construction_kwargs(tok, ctx.class_names, ctx.recipe.model.prompt_template)


def count_parameters(model: torch.nn.Module) -> int:
    """Number of parameters."""
    return sum(p.numel() for p in model.parameters())


def adapter_kwargs(adapter: ModelAdapter) -> dict[str, Any]:
    """What a copy of ``adapter`` needs to be rebuilt (CLIP prompts, tower)."""
    return adapter.clone_kwargs()


def train_classifier(ctx: Context, seed: int, desc: str,
                     process_group: Any = None) -> tuple[torch.nn.Module, ModelAdapter, Any, dict]:
    """A fresh base model fine-tuned on the training split with ``seed`` (data order, head init).

    ``process_group``: train data-parallel over that group of ranks (see :mod:`toolchain.distributed`).
    """
    from toolchain.pruning.finetune import finetune

    r = ctx.recipe
    set_seed(seed)
    model, adapter, tok = build_base_model(ctx) if seed == r.seed else reseeded_base(ctx, seed)
    # the deep-ensemble members record the same fields: equal budget, only the seed differs
    info: dict[str, Any] = {"seed": seed, "steps": r.finetune.steps, "lr": r.finetune.lr,
                            "batch_size": r.finetune.batch_size, "weight_decay": r.finetune.weight_decay,
                            "schedule": "AdamW, linear warm-up + linear decay"}
    if r.finetune.steps > 0 and seed == r.seed and _fine_tuned_for_data(ctx):
        info["steps"] = 0
        info["skipped"] = "the checkpoint's classification head already has the data's labels"
        ctx.console.print(f"  {desc}: not fine-tuned: the checkpoint already classifies into the data's labels "
                          f"({', '.join(map(str, ctx.class_names))})")
    elif r.finetune.steps > 0:
        ctx.console.print(f"  {desc}: {r.finetune.steps} steps, batch {r.finetune.batch_size}, lr {r.finetune.lr}")
        hist = finetune(
            model, adapter,
            lambda bs, s: batching.batches(ctx.data["train"], bs, tok, r.model, seed=s,
                                           group_by_length=r.finetune.group_by_length),
            steps=r.finetune.steps, lr=r.finetune.lr, batch_size=r.finetune.batch_size, seed=seed,
            weight_decay=r.finetune.weight_decay, progress=ctx.progress, process_group=process_group, desc=desc,
        )
        info["loss_first"], info["loss_last"] = hist["losses"][0], hist["losses"][-1]
    info["val_accuracy"] = evaluate_accuracy(ctx, adapter, "val", tok)
    return model, adapter, tok, info


def _fine_tuned_for_data(ctx: Context) -> bool:
    """The recipe starts from a checkpoint whose classification head has the data's labels, in order."""
    from toolchain.models.loading import head_matches_data

    r = ctx.recipe
    if r.model.from_config is not None or r.model.source is None:
        return False
    return head_matches_data(r.model.source, [str(c) for c in ctx.class_names])


def reseeded_base(ctx: Context, seed: int) -> tuple[torch.nn.Module, ModelAdapter, Any]:
    """The base model with its new head (or from-config weights) initialised from ``seed``."""
    from dataclasses import replace

    other = replace(ctx, recipe=ctx.recipe.model_copy(update={"seed": seed}))
    other.__dict__["data"] = ctx.data  # same splits: only the initialisation differs
    return build_base_model(other)


def load_stage_model(ctx: Context, folder: Path) -> tuple[torch.nn.Module, ModelAdapter, Any]:
    """Reload a model saved by a stage (with the class prompts when its family needs them)."""
    from toolchain.models import resolve_source

    kwargs = family_kwargs(ctx, checkpoint_family(resolve_source(folder)))
    loaded = load_model(folder, adapter_kwargs=kwargs)
    return loaded.model, loaded.adapter, loaded.tokenizer


def criterion_params_for(ctx: Context, criterion: str, heads_per_layer: list[int]) -> dict[str, Any]:
    """Recipe fields -> the criterion's keyword parameters."""
    from toolchain.scoring.registry import criterion_params

    s, p = ctx.recipe.scoring, ctx.recipe.pruning
    if p.fork >= len(heads_per_layer):
        raise RecipeError(f"field 'pruning.fork': {p.fork} leaves no layer to the members; this model has "
                          f"{len(heads_per_layer)} layers (fork at most {len(heads_per_layer) - 1}).")
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
    if "task_weight" in wanted and s.task_weight:  # at 0 the criterion's own default (AUROC alone)
        out["task_weight"] = s.task_weight
    if "n_heads" in wanted:  # per searched layer: a fork's trunk is kept whole and not searched
        layers, heads = len(heads_per_layer) - p.fork, max(heads_per_layer)
        kept = p.budget if p.budget is not None else round((1 - float(p.ratio or 0)) * layers * heads)
        out["n_heads"] = max(p.min_heads_per_layer, round(kept / max(layers, 1)))
    if "fork" in wanted and p.fork:
        out["fork"] = p.fork
    return out


#: ``ood_val`` rows ``[0, OOD_CALIB_ROWS)`` are the ones scoring may see (the circuit ``ood_auroc``
#: objective takes the first ``scoring.calib_samples`` of them); model selection's OOD metrics
#: (the evaluate stage's ``selection.json``) use the rows after them, so the two never overlap
#: while ``calib_samples <= 64`` (a larger value is warned about and recorded)
OOD_CALIB_ROWS = 64


def selection_ood_rows(n: int) -> tuple[int, int]:
    """``(start, stop)``: the ``ood_val`` rows model selection uses (the same for every variant)."""
    return min(OOD_CALIB_ROWS, n // 2), n


def circuit_sees_ood(ctx: Context) -> bool:
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
    calib = list(batching.batches(part, s.batch_size, tokenizer, ctx.recipe.model))
    if circuit_sees_ood(ctx):
        if "ood_val" not in ctx.data:
            raise RecipeError("field 'scoring.objective': ood_auroc needs data.ood (an OOD validation split).")
        ood = ctx.data["ood_val"]
        if s.calib_samples > selection_ood_rows(len(ood))[0]:
            ctx.console.print(f"  [yellow]note[/yellow]: scoring.calib_samples {s.calib_samples} > "
                              f"{selection_ood_rows(len(ood))[0]}: the circuit objective also sees ood_val rows "
                              "that model selection uses (benchmarks/diversity)")
        ood = ood.subset(list(range(min(len(ood), s.calib_samples))))
        for batch, labels in batching.batches(ood, s.batch_size, tokenizer, ctx.recipe.model):
            calib.append((batch, torch.full_like(labels, OOD_LABEL)))
    return calib


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
    fork = ctx.recipe.pruning.fork
    if ctx.recipe.pruning.recovery.steps > 0:
        members = [load_stage_model(ctx, prune_dir / f"member{i}")[1] for i in range(ctx.recipe.pruning.members)]
        return fuse_members(members, mlp=f.mlp, layernorm=f.layernorm, lowering=low, fork=fork)
    _model, adapter, _tok = load_stage_model(ctx, ctx.stage_dir("finetune") / "model")
    neurons = read_json(prune_dir / "members.json").get("mlp", {}).get("neurons")
    return fuse(adapter, member_masks(ctx), mlp=f.mlp, layernorm=f.layernorm, lowering=low, fork=fork, neurons=neurons)


def example_feed(ctx: Context, batch: int, seq: int | None = None, seed: int = 0) -> dict[str, torch.Tensor]:
    """Generated model inputs of a given shape (the family's ``example_inputs``; text: ragged padding)."""
    m = ctx.recipe.model
    return model_family(ctx).example_inputs(batch, sequence=seq or m.max_length, image_size=m.image_size or 28,
                                            num_channels=m.num_channels, seed=seed)


def input_specs(ctx: Context, names: list[str]) -> dict[str, InputSpec]:
    """The family's description (dtype, dynamic axes) of each input in ``names``."""
    specs = model_family(ctx).input_specs()
    return {n: specs[n] for n in names}


def dynamic_axes(ctx: Context, names: list[str]) -> dict[str, dict[int, str]]:
    """The family's dynamic axes per input (batch; sequence for text)."""
    return {n: spec.dynamic_axes() for n, spec in input_specs(ctx, names).items()}


def runner_input_specs(ctx: Context, names: list[str]) -> dict[str, tuple]:
    """``name -> (numpy dtype, shape)``: dynamic axes by name, static sizes from an example (engine specs)."""
    import numpy as np

    feed = example_feed(ctx, 1, 8)
    return {n: (getattr(np, spec.dtype), spec.shape(feed[n].shape)) for n, spec in input_specs(ctx, names).items()}


def split_feeds(ctx: Context, split: str, names: list[str], tokenizer: Any,
                batch_size: int, rows: int = 0) -> list[tuple[dict[str, np.ndarray], np.ndarray]]:
    """``(feed, labels)`` batches of a data split in token-length order (little padding), as numpy arrays.

    What the engines are gated (parity) and timed (the bench's rows per second) on: the split's
    real rows, ``names`` the graph's inputs. ``rows`` > 0: that many rows evenly spaced over the
    split (its length mix whatever order it is in), all of them when the split has no more.
    """
    part = ctx.data[split]
    if 0 < rows < len(part):
        part = part.subset(np.unique(np.linspace(0, len(part) - 1, rows).round().astype(int)))
    m = ctx.recipe.model
    ordered = batching.in_length_order(part, tokenizer, m.max_length)[0]
    return [({k: v.numpy() for k, v in b.items() if k in names}, y.numpy())
            for b, y in batching.batches(ordered, batch_size, tokenizer, m)]


def trt_profile(ctx: Context, names: list[str]) -> dict[str, tuple]:
    """The recipe's min/opt/max shapes per input (the TensorRT optimisation profile)."""
    from toolchain.verbs.export import tensorrt_profile

    e = ctx.recipe.export
    return tensorrt_profile(input_specs(ctx, names), example_feed(ctx, 1), names, e.batch, e.sequence)


# ---------------------------------------------------------------------------- compare variants
class VariantContext(Context):
    """A compare variant's context: its own prune/fuse/evaluate stages, the parent's load/fine-tune/ensemble."""

    LINKED = ("load", "finetune", "ensemble")

    def publishes(self, name: str) -> bool:
        """Only the linked stages and :data:`VARIANT_STAGES` (the score stage is the parent's business)."""
        return name in self.LINKED or name in VARIANT_STAGES

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


def _val_labels(ctx: Context) -> np.ndarray:
    from toolchain.errors import RecipeError

    if "val" not in ctx.data or len(ctx.data["val"]) == 0:
        raise RecipeError("temperature scaling (fields 'fusion.temperature', 'baselines.temperature') fits T on the "
                          "validation split: give data.splits a non-zero 'val'")
    return np.asarray(ctx.data["val"].labels)


def _probe(module: torch.nn.Module, ctx: Context, key: str) -> Callable[[], torch.Tensor]:
    feed = example_feed(ctx, 2, min(16, ctx.recipe.model.max_length))
    names = getattr(module, "input_names", tuple(feed))
    return lambda: module(**{k: v for k, v in feed.items() if k in names})[key]


def calibrate_hydra(ctx: Context, model: torch.nn.Module, tok: Any) -> dict[str, float]:
    """``fusion.temperature``: fit one T on the fused Hydra's validation NLL and fold it into its heads.

    Returns the record (``temperature`` and the validation NLL before and after), or ``{}`` when off.
    """
    from toolchain.inference import module_outputs
    from toolchain.models.temperature import fit_temperature, fold_temperature, scaled_nll

    if not ctx.recipe.fusion.temperature:
        return {}
    labels = _val_labels(ctx)
    logits = module_outputs(ctx, model, "val", tok, list(model.input_names))["member_logits"]
    t = fit_temperature(logits, labels)
    probe = _probe(model, ctx, "member_logits")
    with torch.no_grad():
        before = probe()
        for head in {id(h): h for h in model.heads}.values():  # one shared head or one per member
            fold_temperature(head, t, int(logits.shape[-1]))
        after = probe()
    if not torch.allclose(after, before / t, rtol=1e-4, atol=1e-5 * float(before.abs().max().clamp(min=1.0))):
        from toolchain.errors import ModelError

        raise ModelError(f"field 'fusion.temperature': the fused Hydra's member logits are not the old ones / {t:.4g} "
                         "after folding T into its heads (a head whose logits are not linear in its last layer)")
    nll0, nll1 = scaled_nll(logits, labels, 1.0), scaled_nll(logits, labels, t)
    ctx.console.print(f"  temperature {t:.4f} (validation NLL {nll0:.4f} -> {nll1:.4f})")
    return {"temperature": t, "val_nll_before": nll0, "val_nll_after": nll1, "val_rows": len(labels),
            "classes": int(logits.shape[-1])}


def baseline_models(ctx: Context, recorded: Mapping[str, Any] | None = None
                    ) -> tuple[ModelAdapter, list[ModelAdapter], Any, dict[str, Any]]:
    """The single model and the deep-ensemble members as deployed: temperature-scaled where the recipe says so.

    Returns ``(single, members, tokenizer, record)``. ``members`` is empty with
    ``baselines.deep_ensemble: false``; member 0 is the single model's own adapter unless the
    two are scaled by different temperatures (then a second copy). With
    ``baselines.temperature`` one T is fitted for the single model and one for the deep ensemble
    (shared by its members, on the ensemble's NLL), both on the validation split, and folded into
    the weights; ``record`` holds them (``{}`` when off). ``recorded``: the record of an earlier
    call (the export stage's ``temperatures.json``), whose temperatures are folded instead of fitted
    again, so that a reference is the exported graph's model to the last bit (a refit in another
    process, with another thread count, may differ in T's last bits, and the weights check is exact).
    """
    from toolchain.inference import module_outputs
    from toolchain.models.temperature import fit_temperature, fold_temperature, scaled_nll
    from toolchain.models.wrappers import SingleModel
    from toolchain.pipeline import same_stage_files

    _m, single, tok = load_stage_model(ctx, ctx.stage_dir("finetune") / "model")
    n = ctx.recipe.pruning.members if ctx.recipe.baselines.deep_ensemble else 0
    members: list[ModelAdapter] = []
    for i in range(n):
        if i == 0 and same_stage_files(ctx, ("finetune", "model"), ("ensemble", "member0")):
            members.append(single)
        else:
            members.append(load_stage_model(ctx, ctx.stage_dir("ensemble") / f"member{i}")[1])
    if not ctx.recipe.baselines.temperature:
        return single, members, tok, {}
    if recorded and "single" in recorded and (not members or "deep-ensemble" in recorded):
        record = dict(recorded)
        with torch.no_grad():
            classes = int(_probe(SingleModel(single), ctx, "logits")().shape[-1])
        t_single = float(record["single"]["temperature"])
        t_de = float(record["deep-ensemble"]["temperature"]) if members else 1.0
    else:
        labels = _val_labels(ctx)
        names = list(single.input_names)
        val = {id(a): module_outputs(ctx, SingleModel(a), "val", tok, names)["logits"] for a in [single, *members]}
        classes = int(val[id(single)].shape[-1])
        record = {"val_rows": len(labels)}
        t_single = fit_temperature(val[id(single)], labels)
        record["single"] = {"temperature": t_single, "val_nll_before": scaled_nll(val[id(single)], labels, 1.0),
                            "val_nll_after": scaled_nll(val[id(single)], labels, t_single)}
        if members:
            stacked = np.stack([val[id(a)] for a in members], 1)
            t_de = fit_temperature(stacked, labels)
            record["deep-ensemble"] = {"temperature": t_de, "val_nll_before": scaled_nll(stacked, labels, 1.0),
                                       "val_nll_after": scaled_nll(stacked, labels, t_de)}
    if members:
        if members[0] is single:  # scaled differently: member 0 becomes its own copy
            members[0] = load_stage_model(ctx, ctx.stage_dir("finetune") / "model")[1]
        for a in members:
            fold_temperature(a.model, t_de, classes, probe=_probe(SingleModel(a), ctx, "logits"))
    fold_temperature(single.model, t_single, classes, probe=_probe(SingleModel(single), ctx, "logits"))
    for name, r in record.items():
        if isinstance(r, dict):
            ctx.console.print(f"  {name} temperature {r['temperature']:.4f} (validation NLL {r['val_nll_before']:.4f}"
                              f" -> {r['val_nll_after']:.4f})")
    return single, members, tok, record


class _FusedTrainee:
    """What :func:`toolchain.pruning.finetune.finetune` trains: the fused Hydra, its output the log of its prediction.

    ``logits(batch)`` returns ``log(mean_m softmax(member_logits))``: cross-entropy on it is the NLL
    of the mean of the members' softmax, the distribution the deployed Hydra outputs.
    """

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.names = tuple(model.input_names)

    def logits(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        z = self.model(**{k: v for k, v in batch.items() if k in self.names})["member_logits"]
        return torch.logsumexp(torch.log_softmax(z, dim=-1), dim=1) - float(np.log(z.shape[1]))


def recover_fused(ctx: Context, model: torch.nn.Module, tok: Any) -> dict[str, Any]:
    """``fusion.recovery_steps``: fine-tune the fused Hydra end to end (input stage frozen); ``{}`` when off.

    The loss is the NLL of the fused model's own prediction on the training split (every row, seeded
    order), with ``pruning.recovery``'s learning rate, batch size and distillation from the fine-tuned
    model; the averaged MLP and the members' attention learn together what the members learned apart.
    """
    from toolchain.pruning.finetune import finetune

    steps = ctx.recipe.fusion.recovery_steps
    if steps <= 0:
        return {}
    rec = ctx.recipe.pruning.recovery
    for param in model.parameters():
        param.requires_grad_(True)
    for param in model.embeddings.parameters():  # the input stage runs once for all members: the base's
        param.requires_grad_(False)
    teacher = None
    if rec.distill > 0:
        _m, base, _t = load_stage_model(ctx, ctx.stage_dir("finetune") / "model")
        base.model.eval()
        teacher = base.logits
    seed = ctx.recipe.seed + 104729
    ctx.console.print(f"  end-to-end recovery of the fused model: {steps} steps (seed {seed}, the training split"
                      + (f", distilled from the fine-tuned model: weight {rec.distill}, T {rec.temperature}"
                         if rec.distill > 0 else "") + ")")
    train = ctx.data["train"]
    grouped = ctx.recipe.finetune.group_by_length
    out = finetune(model, _FusedTrainee(model), lambda bs, s: batching.batches(
        train, bs, tok, ctx.recipe.model, seed=s, group_by_length=grouped),
        steps=steps, lr=rec.lr, batch_size=rec.batch_size, seed=seed, progress=ctx.progress,
        desc="end-to-end recovery of the fused model", teacher=teacher, distill=rec.distill,
        temperature=rec.temperature)
    for param in model.parameters():
        param.requires_grad_(False)
    model.eval()
    losses = out["losses"]
    tail = losses[-max(1, len(losses) // 10):]
    return {"steps": steps, "seed": seed, "first_loss": float(losses[0]), "last_tenth_loss": float(np.mean(tail))}
