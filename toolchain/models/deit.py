"""DeiT image classifiers: ViT's pre-LayerNorm layers plus a distillation token.

The embeddings put two tokens before the patches (CLS and distillation), so a layer sees
``patches + 2`` tokens. ``DeiTForImageClassificationWithTeacher`` (the distilled checkpoints)
classifies with two heads and averages them: ``(cls_classifier(h[:, 0]) +
distillation_classifier(h[:, 1])) / 2`` after the final LayerNorm. The adapter's head stage
keeps that average, so every Hydra member classifies the way the source model does: fused
from one model the members share the one head stage (both classifiers); fused from separate
members each member has its own pair, averaged within the member before the members'
probabilities are averaged. ``DeiTForImageClassification`` (one head on the CLS token) is
handled too; a checkpoint loads as the class its ``architectures`` names.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn

from toolchain.models.base import register_adapter
from toolchain.models.vit import ViTAdapter, ViTEmbeddingStage

TEACHER = "DeiTForImageClassificationWithTeacher"
PLAIN = "DeiTForImageClassification"


class DeiTHeadStage(nn.Module):
    """Final LayerNorm, then the CLS head alone or the mean of the CLS and distillation heads."""

    def __init__(self, layernorm: nn.Module, cls_head: nn.Module, distillation_head: nn.Module | None) -> None:
        super().__init__()
        self.layernorm = layernorm
        self.cls_head = cls_head
        self.distillation_head = distillation_head

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """``hidden [B, T, D]`` -> ``logits [B, classes]``."""
        logits = self.cls_head(self.layernorm(hidden[:, 0]))
        if self.distillation_head is None:
            return logits
        return (logits + self.distillation_head(self.layernorm(hidden[:, 1]))) / 2


@register_adapter
class DeiTAdapter(ViTAdapter):
    """DeiT classifiers, distilled (two heads, averaged) or not."""

    family = "deit"
    model_types = ("deit",)
    classifier_class = TEACHER
    encoder_class = TEACHER
    config_class = "DeiTConfig"
    model_classes = (TEACHER, PLAIN)
    encoder_attr = "deit"
    extra_tokens = 2
    classifier_weights = ("cls_classifier.weight", "classifier.weight")

    @classmethod
    def checkpoint_class(cls, config: Any, encoder_only: bool = False) -> str:
        """The class the checkpoint was saved as (``architectures``); the distilled one by default."""
        del encoder_only
        return PLAIN if PLAIN in (getattr(config, "architectures", None) or []) else TEACHER

    def input_modules(self) -> tuple[nn.Module | None, ...]:
        """The embeddings (patches, CLS and distillation tokens, positions)."""
        return (self.encoder_model.embeddings,)

    def embeddings(self) -> nn.Module:
        """Copy of the embedding stage (patches, CLS and distillation tokens, positions)."""
        return ViTEmbeddingStage(*(copy.deepcopy(m) for m in self.input_modules()))

    def head(self) -> nn.Module:
        """Copy of final LayerNorm + the classifier(s)."""
        ln = copy.deepcopy(self.encoder_model.layernorm)
        if hasattr(self.model, "cls_classifier"):
            return DeiTHeadStage(ln, copy.deepcopy(self.model.cls_classifier),
                                 copy.deepcopy(self.model.distillation_classifier))
        return DeiTHeadStage(ln, copy.deepcopy(self.model.classifier), None)
