"""Model adapters: one per family (BERT, ViT, CLIP), one interface for the pipeline."""

from toolchain.models import bert, clip, vit  # noqa: F401  (registers the adapters)
from toolchain.models.base import (
    HEADS_ATTR,
    LayerView,
    ModelAdapter,
    adapter_for,
    register_adapter,
    registered_adapters,
)
from toolchain.models.loading import LoadedModel, load_model, load_tokenizer, resolve_source, save_model

__all__ = [
    "HEADS_ATTR",
    "LayerView",
    "LoadedModel",
    "ModelAdapter",
    "adapter_for",
    "load_model",
    "load_tokenizer",
    "register_adapter",
    "registered_adapters",
    "resolve_source",
    "save_model",
]
