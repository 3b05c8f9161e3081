"""ELECTRA discriminators: BERT's post-LayerNorm layers behind an embedding projection.

When ``embedding_size`` differs from ``hidden_size`` the encoder maps the embeddings up with
``embeddings_project`` (a Linear) before the first layer: the adapter's embedding stage
carries it, so the Hydra members share it like the embeddings. The classification head
(dense + GELU + out_proj) reads the first token itself; there is no pooler.
"""

from __future__ import annotations

from toolchain.models.base import register_adapter
from toolchain.models.bert import BertAdapter


@register_adapter
class ElectraAdapter(BertAdapter):
    """``ElectraForSequenceClassification`` / ``ElectraModel``."""

    family = "electra"
    model_types = ("electra",)
    classifier_class = "ElectraForSequenceClassification"
    encoder_class = "ElectraModel"
    config_class = "ElectraConfig"
    model_classes = ("ElectraModel", "ElectraForSequenceClassification")
    encoder_attr = "electra"
    classifier_reads_sequence = True
    classifier_weights = ("classifier.out_proj.weight",)
