"""DistilBERT encoders: post-LayerNorm blocks with their own module names, no token types.

A ``TransformerBlock`` is ``sa_layer_norm(x + out_lin(attn(x)))`` then
``output_layer_norm(x + lin2(act(lin1(x))))``: BERT's order, so the fused Hydra block is the
post-LN one. The attention module computes Q/K/V, the probabilities and the output
projection in one forward and returns ``(output, probabilities)``; heads are gated at
``out_lin``'s input like everywhere else. The classifier reads the first token through
``pre_classifier`` + ReLU.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from toolchain.models.base import TEXT_AXES, InputSpec, LayerView, register_adapter
from toolchain.models.bert import BertAdapter, padding_bias


class DistilBertEmbeddingStage(nn.Module):
    """Word + position embeddings and LayerNorm; returns hidden and key bias."""

    def __init__(self, embeddings: nn.Module) -> None:
        super().__init__()
        self.embeddings = embeddings

    def forward(self, input_ids: torch.Tensor,
                attention_mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``input_ids [B, T]`` -> ``hidden [B, T, D]``, ``bias [B, 1, 1, T]``."""
        hidden = self.embeddings(input_ids)
        return hidden, padding_bias(attention_mask, hidden.dtype)


class DistilBertHeadStage(nn.Module):
    """First token -> ``pre_classifier`` -> ReLU -> ``classifier`` (the first token alone for a bare model)."""

    def __init__(self, pre_classifier: nn.Module | None, classifier: nn.Module | None) -> None:
        super().__init__()
        self.pre_classifier = pre_classifier
        self.classifier = classifier

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """``hidden [B, T, D]`` -> ``logits [B, classes]``."""
        first = hidden[:, 0]
        if self.classifier is None:
            return first
        return self.classifier(torch.relu(self.pre_classifier(first)))


@register_adapter
class DistilBertAdapter(BertAdapter):
    """``DistilBertForSequenceClassification`` / ``DistilBertModel``."""

    family = "distilbert"
    model_types = ("distilbert",)
    classifier_class = "DistilBertForSequenceClassification"
    encoder_class = "DistilBertModel"
    config_class = "DistilBertConfig"
    model_classes = ("DistilBertModel", "DistilBertForSequenceClassification")
    inputs = (InputSpec("input_ids", "int64", TEXT_AXES), InputSpec("attention_mask", "int64", TEXT_AXES))
    encoder_attr = "distilbert"

    def layers(self) -> list[LayerView]:
        """One view per ``TransformerBlock``."""
        views = []
        for block in self.encoder_model.transformer.layer:
            att = block.attention
            views.append(
                LayerView(
                    attention=att,
                    probs_module=att,
                    q=att.q_lin,
                    k=att.k_lin,
                    v=att.v_lin,
                    o=att.out_lin,
                    ln_attn=block.sa_layer_norm,
                    ln_mlp=block.output_layer_norm,
                    fc1=block.ffn.lin1,
                    fc2=block.ffn.lin2,
                    act=block.ffn.activation,
                    act_name=str(self.model.config.activation),
                    norm_style=self.norm_style,
                    head_dim=int(att.attention_head_size),
                    scaling=float(att.scaling),
                    heads_attr="n_heads",
                )
            )
        return views

    def logits(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """Classifier logits, or the first token's hidden state for a bare ``DistilBertModel``."""
        feed = {k: batch[k] for k in self.input_names if k in batch}
        out = self.model(**feed)
        return out.logits if hasattr(out, "logits") else out.last_hidden_state[:, 0]

    def input_modules(self) -> tuple[nn.Module | None, ...]:
        """The embeddings (words, positions, LayerNorm)."""
        return (self.encoder_model.embeddings,)

    def embeddings(self) -> nn.Module:
        """Copy of the embedding stage."""
        return DistilBertEmbeddingStage(*(copy.deepcopy(m) for m in self.input_modules()))

    def head(self) -> nn.Module:
        """Copy of pre_classifier + classifier."""
        return DistilBertHeadStage(copy.deepcopy(getattr(self.model, "pre_classifier", None)),
                                   copy.deepcopy(getattr(self.model, "classifier", None)))

    def config_dict(self) -> dict:
        """Facts the fused model needs (DistilBERT's LayerNorms use eps 1e-12, not a config field)."""
        c = self.model.config
        return {
            "family": self.family,
            "hidden_size": int(c.dim),
            "layer_norm_eps": float(self.encoder_model.embeddings.LayerNorm.eps),
            "hidden_act": str(c.activation),
            "num_labels": int(getattr(c, "num_labels", 0) or 0),
            "norm_style": self.norm_style,
        }
