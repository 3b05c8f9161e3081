"""CLIP (CLIPModel): pre-LayerNorm vision and text towers, zero-shot logits from class prompts.

The adapter prunes one tower (``tower="vision"`` by default, or ``"text"``). Zero-shot logits
are ``logit_scale.exp() * normalise(image_embeds) @ normalise(text_embeds).T`` against the class
prompts given at construction (tokenised ``input_ids`` / ``attention_mask``, one row per class).
For fusion (vision tower) the prompt embeddings are computed once and become a fixed classifier:
the text tower does not run at inference.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from toolchain.models.base import IMAGE_AXES, InputSpec, LayerView, ModelAdapter, random_pixels, register_adapter

#: tokens per class prompt
PROMPT_TOKENS = 16


class CLIPVisionEmbeddingStage(nn.Module):
    """Patch embedding + class token + positions, then CLIP's ``pre_layrnorm``."""

    def __init__(self, embeddings: nn.Module, pre_layernorm: nn.Module) -> None:
        super().__init__()
        self.embeddings = embeddings
        self.pre_layernorm = pre_layernorm

    def forward(self, pixel_values: torch.Tensor) -> tuple[torch.Tensor, None]:
        """``pixel_values [B, 3, S, S]`` -> ``hidden [B, 1 + patches, D]``."""
        return self.pre_layernorm(self.embeddings(pixel_values)), None


class CLIPZeroShotHead(nn.Module):
    """Post-LayerNorm on the class token, projection, cosine similarity with fixed class embeddings."""

    def __init__(self, post_layernorm: nn.Module, projection: nn.Module, text_embeds: torch.Tensor,
                 logit_scale: torch.Tensor) -> None:
        super().__init__()
        self.post_layernorm = post_layernorm
        self.projection = projection
        self.register_buffer("text_embeds", text_embeds.detach().clone())  # [classes, P], unit norm
        self.register_buffer("logit_scale", logit_scale.detach().exp().reshape(()))

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """``hidden [B, T, D]`` -> zero-shot ``logits [B, classes]``."""
        img = self.projection(self.post_layernorm(hidden[:, 0]))
        img = img / img.norm(p=2, dim=-1, keepdim=True)
        return self.logit_scale * img @ self.text_embeds.t()


@register_adapter
class CLIPAdapter(ModelAdapter):
    """CLIP dual encoder; ``prompts`` holds the tokenised class prompts (one row per class)."""

    family = "clip"
    model_types = ("clip",)
    classifier_class = "CLIPModel"
    encoder_class = "CLIPModel"
    config_class = "CLIPConfig"
    model_classes = ("CLIPModel",)
    inputs = (InputSpec("pixel_values", "float32", IMAGE_AXES),)
    modality = "image"
    tokenizer_use = "prompts"
    norm_style = "pre"
    classifier_weights = ()  # zero-shot: the class prompts are the head

    @classmethod
    def from_config(cls, config: Mapping[str, Any], num_labels: int) -> nn.Module:
        """An untrained ``CLIPModel``; the classes come from the prompts, so ``num_labels`` is unused."""
        import transformers

        del num_labels
        return transformers.CLIPModel(transformers.CLIPConfig(**dict(config))).eval()

    @classmethod
    def construction_kwargs(cls, tokenizer: Any, class_names: Sequence[str], prompt_template: str) -> dict:
        """``prompts``: the class prompts (``prompt_template.format(class)``) tokenised."""
        texts = [prompt_template.format(c) for c in class_names]
        enc = tokenizer(texts, padding=True, truncation=True, max_length=PROMPT_TOKENS, return_tensors="pt")
        return {"prompts": {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]}}

    @classmethod
    def example_inputs(cls, batch: int, *, sequence: int, image_size: int, num_channels: int,
                       seed: int = 0) -> dict[str, torch.Tensor]:
        """Standard normal ``pixel_values [batch, 3, image_size, image_size]`` (CLIP's vision tower is RGB)."""
        return random_pixels(batch, 3, image_size, seed)

    def __init__(self, model: nn.Module, prompts: dict[str, torch.Tensor] | None = None,
                 tower: str = "vision") -> None:
        super().__init__(model)
        if tower not in ("vision", "text"):
            raise ValueError(f"tower must be 'vision' or 'text', got {tower!r}")
        self.tower = tower
        self.prompts = prompts

    def clone_kwargs(self) -> dict:
        """The class prompts and the pruned tower."""
        return {"prompts": self.prompts, "tower": self.tower}

    def _tower(self) -> nn.Module:
        return self.model.vision_model if self.tower == "vision" else self.model.text_model

    def _layer_config(self):
        return self._tower().config

    def _record_heads(self) -> None:
        heads = self.heads_per_layer()
        self._tower().config.hydra_heads_per_layer = heads
        sub = self.model.config.vision_config if self.tower == "vision" else self.model.config.text_config
        sub.hydra_heads_per_layer = heads

    def layers(self) -> list[LayerView]:
        """One view per encoder layer of the pruned tower."""
        views = []
        for layer in self._tower().encoder.layers:
            att = layer.self_attn
            views.append(
                LayerView(
                    attention=att,
                    probs_module=att,
                    q=att.q_proj,
                    k=att.k_proj,
                    v=att.v_proj,
                    o=att.out_proj,
                    ln_attn=layer.layer_norm1,
                    ln_mlp=layer.layer_norm2,
                    fc1=layer.mlp.fc1,
                    fc2=layer.mlp.fc2,
                    act=layer.mlp.activation_fn,
                    act_name=str(self._tower().config.hidden_act),
                    norm_style=self.norm_style,
                    head_dim=int(att.head_dim),
                    scaling=float(att.scale),
                    heads_attr="num_heads",
                )
            )
        return views

    def _require_prompts(self) -> dict[str, torch.Tensor]:
        if self.prompts is None:
            raise ValueError("CLIP zero-shot logits need class prompts: pass prompts={'input_ids': ..., ...}")
        return self.prompts

    def text_embeds(self) -> torch.Tensor:
        """Unit-norm class-prompt embeddings ``[classes, projection_dim]``."""
        prompts = self._require_prompts()
        feats = self.model.get_text_features(
            input_ids=prompts["input_ids"], attention_mask=prompts.get("attention_mask")
        )
        feats = feats.pooler_output if hasattr(feats, "pooler_output") else feats
        return feats / feats.norm(p=2, dim=-1, keepdim=True)

    def logits(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """Zero-shot logits of the images against the class prompts ``[B, classes]``."""
        prompts = self._require_prompts()
        out = self.model(
            pixel_values=batch["pixel_values"],
            input_ids=prompts["input_ids"],
            attention_mask=prompts.get("attention_mask"),
        )
        return out.logits_per_image

    def token_mask(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """Real tokens of the pruned tower: every patch (vision) or the prompts' mask (text)."""
        if self.tower == "text":
            return self._require_prompts()["attention_mask"].bool()
        n = batch["pixel_values"].shape[0]
        return torch.ones(n, self.model.vision_model.embeddings.num_positions, dtype=torch.bool)

    def _require_vision(self, what: str) -> None:
        if self.tower != "vision":
            raise NotImplementedError(f"{what} is defined for the vision tower; the text tower is fixed prompts")

    def input_modules(self) -> tuple[nn.Module | None, ...]:
        """The vision embeddings and the LayerNorm before the first layer (``pre_layrnorm``)."""
        self._require_vision("fusion")
        vm = self.model.vision_model
        return vm.embeddings, vm.pre_layrnorm

    def embeddings(self) -> nn.Module:
        """Copy of the vision input stage."""
        return CLIPVisionEmbeddingStage(*(copy.deepcopy(m) for m in self.input_modules()))

    def head(self) -> nn.Module:
        """Zero-shot head with the class-prompt embeddings frozen in."""
        self._require_vision("fusion")
        with torch.no_grad():
            text = self.text_embeds()
        return CLIPZeroShotHead(
            copy.deepcopy(self.model.vision_model.post_layernorm),
            copy.deepcopy(self.model.visual_projection),
            text,
            self.model.logit_scale,
        )

    def config_dict(self) -> dict:
        """Facts the fused model needs."""
        vc = self.model.config.vision_config
        return {
            "family": self.family,
            "hidden_size": int(vc.hidden_size),
            "layer_norm_eps": float(vc.layer_norm_eps),
            "hidden_act": str(vc.hidden_act),
            "num_labels": int(self._require_prompts()["input_ids"].shape[0]) if self.prompts else 0,
            "norm_style": self.norm_style,
            "image_size": int(vc.image_size),
            "num_channels": int(vc.num_channels),
        }
