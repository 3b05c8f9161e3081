"""Tiny random-initialised models, one per registered family: fast tests and structural checks.

A meta-test asserts that every registered adapter family has an entry here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from toolchain.models.base import ModelAdapter, adapter_for


@dataclass
class TinyModel:
    """A tiny model, its adapter and a batch maker ``make_batch(batch_size, seed) -> dict``."""

    model: nn.Module
    adapter: ModelAdapter
    make_batch: Callable[..., dict[str, torch.Tensor]]

    def labelled_batches(self, sizes: tuple[int, ...] = (4, 3), seed: int = 0,
                         ood_every: int = 0) -> list[tuple[dict[str, torch.Tensor], torch.Tensor]]:
        """Calibration-style ``(batch, labels)`` with seeded random labels over the model's classes.

        Label -1 (OOD) on every ``ood_every``-th row when ``ood_every > 0``.
        """
        out = []
        for i, n in enumerate(sizes):
            batch = self.make_batch(n, seed + i)
            with torch.no_grad():
                classes = self.adapter.logits(batch).shape[-1]
            labels = torch.randint(0, classes, (n,), generator=torch.Generator().manual_seed(100 + seed + i))
            if ood_every:
                labels[::ood_every] = -1
            out.append((batch, labels))
        return out


def _text_batch(vocab: int, seq: int, names: tuple[str, ...] = ("input_ids", "attention_mask", "token_type_ids"),
                pad_id: int = 0) -> Callable[..., dict[str, torch.Tensor]]:
    """Random ids in ``[5, vocab)`` with ragged padding (``pad_id``), first token 2; the family's ``names``."""

    def make(batch_size: int = 4, seed: int = 0, pad: bool = True) -> dict[str, torch.Tensor]:
        g = torch.Generator().manual_seed(seed)
        ids = torch.randint(5, vocab, (batch_size, seq), generator=g)
        mask = torch.ones(batch_size, seq, dtype=torch.long)
        if pad:  # unequal lengths in one batch: row i keeps seq - 2*i tokens (at least 2)
            for i in range(batch_size):
                n = max(2, seq - 2 * i)
                mask[i, n:] = 0
                ids[i, n:] = pad_id
        ids[:, 0] = 2
        full = {"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids)}
        return {name: full[name] for name in names}

    return make


def _image_batch(channels: int, size: int) -> Callable[..., dict[str, torch.Tensor]]:
    def make(batch_size: int = 4, seed: int = 0, pad: bool = True) -> dict[str, torch.Tensor]:
        del pad
        g = torch.Generator().manual_seed(seed)
        return {"pixel_values": torch.randn(batch_size, channels, size, size, generator=g)}

    return make


def _scale_classifier(module: nn.Module, factor: float) -> None:
    """Scale a classifier's weights so probabilities are far from uniform (a wrong fusion shows)."""
    with torch.no_grad():
        module.weight.mul_(factor)


_BERT_LAYOUT = {"vocab_size": 100, "hidden_size": 32, "intermediate_size": 64, "hidden_dropout_prob": 0.0,
                "attention_probs_dropout_prob": 0.0}


#: the tiny image layout of ViT and DeiT: 16x16 one-channel images, patch 4, hidden 32
_VIT_LAYOUT = {"image_size": 16, "patch_size": 4, "num_channels": 1, "hidden_size": 32, "intermediate_size": 64,
               "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}


def tiny_bert(seed: int = 0, num_labels: int = 3, layers: int = 2, heads: int = 4) -> TinyModel:
    """BertForSequenceClassification, hidden 32, ``layers`` x ``heads``, vocab 100."""
    return _tiny_text("BertConfig", "BertForSequenceClassification", seed, 300.0, **_BERT_LAYOUT,
                      num_hidden_layers=layers, num_attention_heads=heads, num_labels=num_labels,
                      max_position_embeddings=64)


def tiny_vit(seed: int = 0, num_labels: int = 10, layers: int = 2, heads: int = 4) -> TinyModel:
    """ViTForImageClassification, 16x16 one-channel images, patch 4, hidden 32."""
    from transformers import ViTConfig, ViTForImageClassification

    torch.manual_seed(seed)
    cfg = ViTConfig(**_VIT_LAYOUT, num_hidden_layers=layers, num_attention_heads=heads, num_labels=num_labels)
    model = ViTForImageClassification(cfg).eval()
    _scale_classifier(model.classifier, 20.0)
    return TinyModel(model, adapter_for(model), _image_batch(1, 16))


def tiny_clip(seed: int = 0, num_labels: int = 4, layers: int = 2, heads: int = 4) -> TinyModel:
    """CLIPModel with tiny vision (16x16, patch 4) and text towers; random class prompts."""
    from transformers import CLIPConfig, CLIPModel, CLIPTextConfig, CLIPVisionConfig

    torch.manual_seed(seed)
    text = CLIPTextConfig(vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                          num_attention_heads=heads, max_position_embeddings=16, projection_dim=16,
                          bos_token_id=98, eos_token_id=99, pad_token_id=0)
    vision = CLIPVisionConfig(image_size=16, patch_size=4, num_channels=3, hidden_size=32,
                              intermediate_size=64, num_hidden_layers=layers, num_attention_heads=heads,
                              projection_dim=16)
    cfg = CLIPConfig(text_config=text.to_dict(), vision_config=vision.to_dict(), projection_dim=16)
    model = CLIPModel(cfg).eval()
    g = torch.Generator().manual_seed(seed + 1)
    ids = torch.randint(3, 98, (num_labels, 6), generator=g)
    ids[:, 0] = 98
    ids[:, -1] = 99  # CLIP's text tower pools at the eos token
    prompts = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    return TinyModel(model, adapter_for(model, prompts=prompts), _image_batch(3, 16))


def _tiny_text(config_class: str, classifier_class: str, seed: int, scale: float,
               **config: object) -> TinyModel:
    """A tiny text classifier of any BERT-layout family (vocab 100, 12 tokens per row)."""
    import transformers

    torch.manual_seed(seed)
    cfg = getattr(transformers, config_class)(**config)
    model = getattr(transformers, classifier_class)(cfg).eval()
    head = model.classifier
    _scale_classifier(getattr(head, "out_proj", head), scale)
    if hasattr(head, "dense"):  # RoBERTa/ELECTRA heads squash a small first-token projection (tanh/GELU)
        _scale_classifier(head.dense, 2.0)
    adapter = adapter_for(model)
    return TinyModel(model, adapter, _text_batch(100, 12, adapter.input_names, int(cfg.pad_token_id or 0)))


def tiny_roberta(seed: int = 0, num_labels: int = 3, layers: int = 2, heads: int = 4) -> TinyModel:
    """RobertaForSequenceClassification, hidden 32, padding index 1 (positions start at 2)."""
    return _tiny_text("RobertaConfig", "RobertaForSequenceClassification", seed, 300.0, **_BERT_LAYOUT,
                      num_hidden_layers=layers, num_attention_heads=heads, num_labels=num_labels,
                      max_position_embeddings=16, pad_token_id=1, type_vocab_size=1)


def tiny_xlm_roberta(seed: int = 0, num_labels: int = 3, layers: int = 2, heads: int = 4) -> TinyModel:
    """XLMRobertaForSequenceClassification, hidden 32, padding index 1."""
    return _tiny_text("XLMRobertaConfig", "XLMRobertaForSequenceClassification", seed, 300.0, **_BERT_LAYOUT,
                      num_hidden_layers=layers, num_attention_heads=heads, num_labels=num_labels,
                      max_position_embeddings=16, pad_token_id=1, type_vocab_size=1)


def tiny_electra(seed: int = 0, num_labels: int = 3, layers: int = 2, heads: int = 4) -> TinyModel:
    """ElectraForSequenceClassification, embeddings of 16 projected to hidden 32."""
    return _tiny_text("ElectraConfig", "ElectraForSequenceClassification", seed, 300.0, **_BERT_LAYOUT,
                      embedding_size=16, num_hidden_layers=layers, num_attention_heads=heads,
                      num_labels=num_labels, max_position_embeddings=64)


def tiny_distilbert(seed: int = 0, num_labels: int = 3, layers: int = 2, heads: int = 4) -> TinyModel:
    """DistilBertForSequenceClassification, dim 32, hidden_dim 64, no token types."""
    return _tiny_text("DistilBertConfig", "DistilBertForSequenceClassification", seed, 300.0, vocab_size=100,
                      dim=32, hidden_dim=64, n_layers=layers, n_heads=heads, num_labels=num_labels,
                      max_position_embeddings=64, dropout=0.0, attention_dropout=0.0, seq_classif_dropout=0.0)


def tiny_deit(seed: int = 0, num_labels: int = 10, layers: int = 2, heads: int = 4) -> TinyModel:
    """DeiTForImageClassificationWithTeacher (CLS + distillation heads averaged), 16x16 one-channel images."""
    from transformers import DeiTConfig, DeiTForImageClassificationWithTeacher

    torch.manual_seed(seed)
    cfg = DeiTConfig(**_VIT_LAYOUT, num_hidden_layers=layers, num_attention_heads=heads, num_labels=num_labels)
    model = DeiTForImageClassificationWithTeacher(cfg).eval()
    emb = model.deit.embeddings
    with torch.no_grad():  # initialised to zeros: CLS and distillation tokens would be the same token
        for tensor in (emb.cls_token, emb.distillation_token, emb.position_embeddings):
            tensor.normal_(0.0, 0.02)  # ViT initialises its tokens this way
    _scale_classifier(model.cls_classifier, 40.0)
    _scale_classifier(model.distillation_classifier, 40.0)
    return TinyModel(model, adapter_for(model), _image_batch(1, 16))


def tiny_llama(seed: int = 0, num_labels: int = 3, layers: int = 2, heads: int = 4) -> TinyModel:
    """LlamaForSequenceClassification, hidden 32, ``heads`` query heads over ``heads // 2`` K/V heads (GQA), SwiGLU."""
    import transformers

    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(vocab_size=100, hidden_size=32, intermediate_size=48, num_hidden_layers=layers,
                                   num_attention_heads=heads, num_key_value_heads=max(1, heads // 2), head_dim=8,
                                   max_position_embeddings=64, rms_norm_eps=1e-6, num_labels=num_labels,
                                   pad_token_id=0, attention_dropout=0.0)
    model = transformers.LlamaForSequenceClassification(cfg).eval()
    with torch.no_grad():  # HF initialises RMSNorm weights to 1: members' averaged norms would hide a mix-up
        for name, param in model.named_parameters():
            if "norm" in name:
                param.normal_(1.0, 0.1)
    _scale_classifier(model.score, 40.0)
    adapter = adapter_for(model)
    return TinyModel(model, adapter, _text_batch(100, 12, adapter.input_names, 0))


TINY_MODELS: dict[str, Callable[..., TinyModel]] = {
    "bert": tiny_bert, "vit": tiny_vit, "clip": tiny_clip, "roberta": tiny_roberta, "xlm-roberta": tiny_xlm_roberta,
    "electra": tiny_electra, "distilbert": tiny_distilbert, "deit": tiny_deit, "llama": tiny_llama,
}
