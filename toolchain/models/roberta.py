"""RoBERTa and XLM-RoBERTa encoders: BERT's post-LayerNorm layers under other names.

What differs from BERT is in modules the adapter copies whole, so the fused model inherits it:
position ids start after the padding index (``padding_idx + cumsum`` of the non-padding
tokens, from ``input_ids`` at run time, so an exported graph keeps it for every shape), there
is no pooler, and the classification head (dense + tanh + out_proj)
reads the first token of the sequence itself. Tokenizers of these families return no
``token_type_ids``: the inputs are ids and mask.

The adapter computes those position ids itself (:func:`padding_positions`) and passes them to
the model, in the single model and in the fused input stage alike: Hugging Face's version takes
a cumulative sum over int32, which TensorRT's ONNX parser refuses (CumSum is float-only there;
the export lint found it); ours sums in float32, exact for any sequence below 2**24 tokens.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from toolchain.models.base import TEXT_AXES, InputSpec, register_adapter
from toolchain.models.bert import BertAdapter, BertEmbeddingStage, padding_bias


def padding_positions(input_ids: torch.Tensor, padding_idx: int) -> torch.Tensor:
    """RoBERTa position ids ``[B, T]``: ``padding_idx + i`` for the i-th real token (from 1), else ``padding_idx``.

    The same numbers as ``RobertaEmbeddings.create_position_ids_from_input_ids``, summed in float32.
    """
    real = input_ids.ne(padding_idx).to(torch.float32)
    return (torch.cumsum(real, dim=1) * real).to(torch.int64) + padding_idx


class RobertaEmbeddingStage(BertEmbeddingStage):
    """RoBERTa's embeddings with the position ids of :func:`padding_positions`."""

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``input_ids [B, T]`` -> ``hidden [B, T, D]``, ``bias [B, 1, 1, T]``."""
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        positions = padding_positions(input_ids, int(self.embeddings.padding_idx))
        hidden = self.embeddings(input_ids=input_ids, token_type_ids=token_type_ids, position_ids=positions)
        return hidden, padding_bias(attention_mask, hidden.dtype)


@register_adapter
class RobertaAdapter(BertAdapter):
    """``RobertaForSequenceClassification`` / ``RobertaModel``."""

    family = "roberta"
    model_types = ("roberta",)
    classifier_class = "RobertaForSequenceClassification"
    encoder_class = "RobertaModel"
    config_class = "RobertaConfig"
    model_classes = ("RobertaModel", "RobertaForSequenceClassification")
    inputs = (InputSpec("input_ids", "int64", TEXT_AXES), InputSpec("attention_mask", "int64", TEXT_AXES))
    encoder_attr = "roberta"
    classifier_reads_sequence = True
    classifier_weights = ("classifier.out_proj.weight",)

    def logits(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """Classifier logits (first-token hidden state for a bare encoder), with float-summed position ids."""
        feed = {k: batch[k] for k in self.input_names if k in batch}
        pad = int(self.encoder_model.embeddings.padding_idx)
        out = self.model(**feed, position_ids=padding_positions(feed["input_ids"], pad))
        if hasattr(out, "logits"):
            return out.logits
        pooled = getattr(out, "pooler_output", None)
        return pooled if pooled is not None else out.last_hidden_state[:, 0]

    def input_modules(self) -> tuple[nn.Module | None, ...]:
        """The embeddings (words, positions, token types, LayerNorm)."""
        return (self.encoder_model.embeddings,)

    def embeddings(self) -> nn.Module:
        """Copy of the embedding stage."""
        return RobertaEmbeddingStage(*(copy.deepcopy(m) for m in self.input_modules()))


@register_adapter
class XLMRobertaAdapter(RobertaAdapter):
    """``XLMRobertaForSequenceClassification`` / ``XLMRobertaModel`` (RoBERTa's layout)."""

    family = "xlm-roberta"
    model_types = ("xlm-roberta",)
    classifier_class = "XLMRobertaForSequenceClassification"
    encoder_class = "XLMRobertaModel"
    config_class = "XLMRobertaConfig"
    model_classes = ("XLMRobertaModel", "XLMRobertaForSequenceClassification")
