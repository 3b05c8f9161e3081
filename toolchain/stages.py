"""The stage functions of :mod:`toolchain.pipeline`, in pipeline order.

Each writes only into its work folder; the pipeline publishes it with a manifest.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from rich.table import Table

from toolchain.artifacts import atomic_write_json
from toolchain.errors import RecipeError
from toolchain.models import ModelAdapter, adapter_for, load_model
from toolchain.pipeline import Context, check_recipe_against_model, set_seed, stage


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
        if family == "auto":
            raise RecipeError("field 'model.family': set it (vit or clip) when the model is built from_config.")
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
    loaded = load_model(r.model.source, num_labels=n_classes, seed=r.seed)
    return loaded.model, loaded.adapter, loaded.tokenizer


def _prompt_tokenizer(ctx: Context) -> Any:
    from toolchain.models import load_tokenizer, resolve_source

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
    check_recipe_against_model(ctx.recipe, adapter.heads_per_layer())
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
