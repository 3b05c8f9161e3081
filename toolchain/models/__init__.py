"""Model adapters: one per family, one interface for the pipeline.

Registering a family is its import line below (the module's ``@register_adapter`` does the rest);
:mod:`toolchain.models.registry` is where the rest of the toolchain looks families up.
"""

from toolchain.models import bert, clip, deit, distilbert, electra, llama, roberta, vit  # noqa: F401  (registers the adapters)
from toolchain.models.base import (
    HEADS_ATTR,
    MLP_ATTR,
    InputSpec,
    LayerView,
    ModelAdapter,
    adapter_for,
    register_adapter,
    registered_adapters,
)
from toolchain.models.loading import (
    LoadedModel,
    checkpoint_family,
    load_model,
    load_tokenizer,
    resolve_source,
    save_model,
)
from toolchain.models.registry import families, family, family_for_model_type, family_names

__all__ = [
    "HEADS_ATTR",
    "MLP_ATTR",
    "InputSpec",
    "LayerView",
    "LoadedModel",
    "ModelAdapter",
    "adapter_for",
    "checkpoint_family",
    "families",
    "family",
    "family_for_model_type",
    "family_names",
    "load_model",
    "load_tokenizer",
    "register_adapter",
    "registered_adapters",
    "resolve_source",
    "save_model",
]
