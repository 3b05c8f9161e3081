"""ViT image classifiers (ViTForImageClassification): pre-LayerNorm layers."""

from __future__ import annotations

import copy
from typing import ClassVar

import torch
from torch import nn

from toolchain.models.base import IMAGE_AXES, InputSpec, LayerView, ModelAdapter, random_pixels, register_adapter


class ViTEmbeddingStage(nn.Module):
    """Patch embedding + CLS token + positions; ViT has no attention mask."""

    def __init__(self, embeddings: nn.Module) -> None:
        super().__init__()
        self.embeddings = embeddings

    def forward(self, pixel_values: torch.Tensor) -> tuple[torch.Tensor, None]:
        """``pixel_values [B, C, H, W]`` -> ``hidden [B, 1 + patches, D]``, no bias."""
        return self.embeddings(pixel_values), None


class ViTHeadStage(nn.Module):
    """Final LayerNorm, first (CLS) token, classifier."""

    def __init__(self, layernorm: nn.Module, classifier: nn.Module) -> None:
        super().__init__()
        self.layernorm = layernorm
        self.classifier = classifier

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """``hidden [B, T, D]`` -> ``logits [B, classes]``."""
        return self.classifier(self.layernorm(hidden[:, 0]))


@register_adapter
class ViTAdapter(ModelAdapter):
    """ViT classifiers (trained here from a config: no ViT weights exist offline)."""

    family = "vit"
    model_types = ("vit",)
    classifier_class = "ViTForImageClassification"
    encoder_class = "ViTForImageClassification"
    config_class = "ViTConfig"
    model_classes = ("ViTForImageClassification",)
    inputs = (InputSpec("pixel_values", "float32", IMAGE_AXES),)
    modality = "image"
    norm_style = "pre"
    #: the attribute of the classifier that holds the encoder; tokens before the patches (CLS)
    encoder_attr: ClassVar[str] = "vit"
    extra_tokens: ClassVar[int] = 1

    @classmethod
    def example_inputs(cls, batch: int, *, sequence: int, image_size: int, num_channels: int,
                       seed: int = 0) -> dict[str, torch.Tensor]:
        """Standard normal ``pixel_values [batch, num_channels, image_size, image_size]``."""
        return random_pixels(batch, num_channels, image_size, seed)

    @property
    def encoder_model(self) -> nn.Module:
        """The encoder (embeddings, layers, final LayerNorm) inside the classifier."""
        return getattr(self.model, self.encoder_attr)

    def layers(self) -> list[LayerView]:
        """One view per ``ViTLayer``."""
        views = []
        for layer in self.encoder_model.layers:
            att = layer.attention
            views.append(
                LayerView(
                    attention=att,
                    probs_module=att,
                    q=att.q_proj,
                    k=att.k_proj,
                    v=att.v_proj,
                    o=att.o_proj,
                    ln_attn=layer.layernorm_before,
                    ln_mlp=layer.layernorm_after,
                    fc1=layer.mlp.fc1,
                    fc2=layer.mlp.fc2,
                    act=layer.mlp.activation_fn,
                    act_name=str(self.model.config.hidden_act),
                    norm_style=self.norm_style,
                    head_dim=int(att.head_dim),
                    scaling=float(att.scaling),
                    heads_attr="num_attention_heads",
                )
            )
        return views

    def logits(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """Classifier logits."""
        return self.model(pixel_values=batch["pixel_values"]).logits

    def token_mask(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """Every token (CLS + patches) is real."""
        n = batch["pixel_values"].shape[0]
        emb = self.encoder_model.embeddings
        return torch.ones(n, emb.patch_embeddings.num_patches + self.extra_tokens, dtype=torch.bool)

    def input_modules(self) -> tuple[nn.Module | None, ...]:
        """The embeddings (patches, CLS token, positions)."""
        return (self.encoder_model.embeddings,)

    def embeddings(self) -> nn.Module:
        """Copy of the embedding stage."""
        return ViTEmbeddingStage(*(copy.deepcopy(m) for m in self.input_modules()))

    def head(self) -> nn.Module:
        """Copy of final LayerNorm + classifier."""
        return ViTHeadStage(copy.deepcopy(self.encoder_model.layernorm), copy.deepcopy(self.model.classifier))

    def config_dict(self) -> dict:
        """Facts the fused model needs."""
        c = self.model.config
        return {
            "family": self.family,
            "hidden_size": int(c.hidden_size),
            "layer_norm_eps": float(c.layer_norm_eps),
            "hidden_act": str(c.hidden_act),
            "num_labels": int(c.num_labels),
            "norm_style": self.norm_style,
            "image_size": int(c.image_size),
            "num_channels": int(c.num_channels),
        }
