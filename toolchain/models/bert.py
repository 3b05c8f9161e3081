"""BERT encoders (BertModel, BertForSequenceClassification): post-LayerNorm layers.

:class:`BertAdapter` is also the base of the families that share BERT's layer layout
(RoBERTa, XLM-RoBERTa, ELECTRA; DistilBERT overrides the layer view): a subclass names its
encoder attribute, its inputs and how its classification head reads the sequence.
"""

from __future__ import annotations

import copy
from typing import Any, ClassVar

import torch
from torch import nn

from toolchain.models.base import TEXT_AXES, InputSpec, LayerView, ModelAdapter, register_adapter


def padding_bias(attention_mask: torch.Tensor | None, dtype: torch.dtype = torch.float32) -> torch.Tensor | None:
    """Additive key mask ``[B, 1, 1, T]``: 0 for real keys, the dtype's minimum for padding."""
    if attention_mask is None:
        return None
    mask = attention_mask[:, None, None, :].to(dtype)
    return (1.0 - mask) * torch.finfo(dtype).min


class BertEmbeddingStage(nn.Module):
    """Word + position + token-type embeddings and LayerNorm; returns hidden and key bias.

    ``project``: ELECTRA's linear map from the embedding size to the hidden size (None elsewhere).
    """

    def __init__(self, embeddings: nn.Module, project: nn.Module | None = None) -> None:
        super().__init__()
        self.embeddings = embeddings
        self.project = project

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``input_ids [B, T]`` -> ``hidden [B, T, D]``, ``bias [B, 1, 1, T]``."""
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        hidden = self.embeddings(input_ids=input_ids, token_type_ids=token_type_ids)
        if self.project is not None:
            hidden = self.project(hidden)
        return hidden, padding_bias(attention_mask, hidden.dtype)


class BertHeadStage(nn.Module):
    """Pooler (dense + tanh on the first token) and, when present, the classifier.

    ``reads_sequence``: the classifier takes the whole sequence ``[B, T, D]`` and picks its
    token itself (RoBERTa's and ELECTRA's classification heads); otherwise it takes the pooled
    first token.
    """

    def __init__(self, pooler: nn.Module | None, classifier: nn.Module | None, reads_sequence: bool = False) -> None:
        super().__init__()
        self.pooler = pooler
        self.classifier = classifier
        self.reads_sequence = reads_sequence

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """``hidden [B, T, D]`` -> ``logits [B, classes]`` (pooled output for a bare encoder)."""
        if self.reads_sequence and self.classifier is not None:
            return self.classifier(hidden)
        pooled = self.pooler(hidden) if self.pooler is not None else hidden[:, 0]
        return self.classifier(pooled) if self.classifier is not None else pooled


@register_adapter
class BertAdapter(ModelAdapter):
    """BERT encoders: the packaged all-MiniLM-L6-v2 and any ``BertConfig``."""

    family = "bert"
    model_types = ("bert",)
    classifier_class = "BertForSequenceClassification"
    encoder_class = "BertModel"
    config_class = "BertConfig"
    model_classes = ("BertModel", "BertForSequenceClassification")
    inputs = (InputSpec("input_ids", "int64", TEXT_AXES), InputSpec("attention_mask", "int64", TEXT_AXES),
              InputSpec("token_type_ids", "int64", TEXT_AXES))
    modality = "text"
    tokenizer_use = "inputs"
    norm_style = "post"
    #: the attribute of the classifier that holds the bare encoder
    encoder_attr: ClassVar[str] = "bert"
    #: the classification head takes the sequence (True) or the pooled first token (False)
    classifier_reads_sequence: ClassVar[bool] = False

    @classmethod
    def relabel(cls, config: Any, num_labels: int) -> None:
        """A fresh classification head for the data's classes."""
        config.num_labels = num_labels

    @classmethod
    def example_inputs(cls, batch: int, *, sequence: int, image_size: int, num_channels: int,
                       seed: int = 0) -> dict[str, torch.Tensor]:
        """Random WordPiece ids (1000..20000, ``[CLS]`` = 101 first) with ragged padding.

        Row ``i`` keeps ``sequence - 3 * i`` tokens (at least 2); padded positions have id 0.
        """
        g = torch.Generator().manual_seed(seed)
        ids = torch.randint(1000, 20000, (batch, sequence), generator=g)
        mask = torch.ones(batch, sequence, dtype=torch.long)
        for i in range(batch):
            mask[i, max(2, sequence - 3 * i):] = 0
        ids[:, 0] = 101
        ids = ids * mask
        full = {"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids)}
        return {name: full[name] for name in cls.input_names}

    @property
    def encoder_model(self) -> nn.Module:
        """The bare encoder inside (the model itself for a bare encoder)."""
        if type(self.model).__name__ == self.encoder_class:
            return self.model
        return getattr(self.model, self.encoder_attr)

    def layers(self) -> list[LayerView]:
        """One view per ``BertLayer``."""
        views = []
        for layer in self.encoder_model.encoder.layer:
            att = layer.attention
            sa = att.self
            views.append(
                LayerView(
                    attention=att,
                    probs_module=sa,
                    q=sa.query,
                    k=sa.key,
                    v=sa.value,
                    o=att.output.dense,
                    ln_attn=att.output.LayerNorm,
                    ln_mlp=layer.output.LayerNorm,
                    fc1=layer.intermediate.dense,
                    fc2=layer.output.dense,
                    act=layer.intermediate.intermediate_act_fn,
                    act_name=str(self.model.config.hidden_act),
                    norm_style=self.norm_style,
                    head_dim=sa.attention_head_size,
                    scaling=float(sa.scaling),
                    heads_attr="num_attention_heads",
                    size_attr="all_head_size",
                )
            )
        return views

    def logits(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """Classifier logits, or the pooled output (first token) for a bare ``BertModel``."""
        feed = {k: batch[k] for k in self.input_names if k in batch}
        out = self.model(**feed)
        if hasattr(out, "logits"):
            return out.logits
        pooled = getattr(out, "pooler_output", None)
        return pooled if pooled is not None else out.last_hidden_state[:, 0]

    def token_mask(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """Real tokens: the attention mask (all true when absent)."""
        if batch.get("attention_mask") is not None:
            return batch["attention_mask"].bool()
        return torch.ones_like(batch["input_ids"], dtype=torch.bool)

    def input_modules(self) -> tuple[nn.Module | None, ...]:
        """The embeddings and, where the encoder has one (ELECTRA), the projection up to the hidden size."""
        enc = self.encoder_model
        return enc.embeddings, getattr(enc, "embeddings_project", None)

    def embeddings(self) -> nn.Module:
        """Copy of the embedding stage."""
        return BertEmbeddingStage(*(copy.deepcopy(m) for m in self.input_modules()))

    def head(self) -> nn.Module:
        """Copy of pooler + classifier."""
        pooler = copy.deepcopy(getattr(self.encoder_model, "pooler", None))
        classifier = copy.deepcopy(getattr(self.model, "classifier", None))
        return BertHeadStage(pooler, classifier, self.classifier_reads_sequence)

    def config_dict(self) -> dict:
        """Facts the fused model needs."""
        c = self.model.config
        return {
            "family": self.family,
            "hidden_size": int(c.hidden_size),
            "layer_norm_eps": float(c.layer_norm_eps),
            "hidden_act": str(c.hidden_act),
            "num_labels": int(getattr(c, "num_labels", 0) or 0),
            "norm_style": self.norm_style,
        }
