"""LLaMA-family decoder classifiers (``LlamaForSequenceClassification``, ``LlamaModel``).

A ``LlamaDecoderLayer`` is pre-norm with RMSNorms: ``x = x + o(attn(rms1(x)))``, then
``x = x + down(silu(gate(rms2(x))) * up(rms2(x)))`` (SwiGLU). Attention is causal, Q and K are
rotated by position (RoPE, applied per head, so per member in the fused model), and K/V may
have fewer heads than Q (grouped-query attention, ``num_key_value_heads``).

* **Scoring and pruning** work on query heads (gates at ``o_proj``'s input, attention maps per
  query head). A key/value head is kept while any query head of its group is; a pruned layer
  stores one K/V copy per kept query head (see :func:`toolchain.models.base._prune_layer`).
* **Classification** reads the last non-padding token, found from ``attention_mask`` (left or
  right padding alike): the final RMSNorm and ``score`` run on that token only. Hugging Face
  looks the token up from ``pad_token_id`` in ``input_ids`` instead, which needs a pad id in the
  config and misreads a text that contains the pad id (LLaMA tokenizers often pad with ``eos``);
  the mask says what is padding, whatever the ids.
* **Fusion**: the input stage computes the token embeddings, the causal + padding key bias
  ``[B, 1, T, T]``, the RoPE angles (positions ``0..T-1``, as Hugging Face's forward without
  ``position_ids``) and the index of the token the head reads; the fused model rotates each
  member's Q and K with those angles and gathers that token before the head stage.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn

from toolchain.models.base import TEXT_AXES, InputSpec, LayerView, ModelAdapter, register_adapter


def last_token_index(attention_mask: torch.Tensor | None, input_ids: torch.Tensor) -> torch.Tensor:
    """``[B]`` index of each row's last real token (``T - 1`` without a mask)."""
    steps = torch.arange(input_ids.shape[1], device=input_ids.device)
    if attention_mask is None:
        return (steps * torch.ones_like(input_ids)).argmax(dim=-1)
    return (steps * attention_mask.to(steps.dtype)).argmax(dim=-1)


def causal_bias(attention_mask: torch.Tensor | None, input_ids: torch.Tensor,
                dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Additive ``[B, 1, T, T]``: 0 where query ``i`` may read key ``j`` (``j <= i``, ``j`` real), else the minimum.

    A padding query whose every key is masked gets a uniform row (no NaN); its output is never read.
    """
    steps = torch.arange(input_ids.shape[1], device=input_ids.device)
    allowed = (steps[None, :] <= steps[:, None])[None, None]  # [1, 1, T, T]: Range + LessOrEqual, no Trilu
    if attention_mask is not None:
        allowed = allowed & attention_mask[:, None, None, :].bool()
    zero = torch.zeros((), dtype=dtype, device=input_ids.device)
    return torch.where(allowed, zero, torch.finfo(dtype).min)


class LlamaInputStage(nn.Module):
    """Token embeddings; the key bias, RoPE angles and pooled-token index for the fused blocks."""

    def __init__(self, embed_tokens: nn.Module, rotary: nn.Module) -> None:
        super().__init__()
        self.embed_tokens = embed_tokens
        self.rotary = rotary

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor, dict[str, Any]]:
        """``input_ids [B, T]`` -> ``hidden [B, T, D]``, ``bias [B, 1, T, T]``, ``{"rope": (cos, sin), "pool": [B]}``.

        ``cos``/``sin``: ``[1, T, head_dim]``; ``pool``: each row's last real token.
        """
        hidden = self.embed_tokens(input_ids)
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)[None]  # [1, T]
        cos, sin = self.rotary(hidden, positions)  # [1, T, head_dim] each
        extras = {"rope": (cos, sin), "pool": last_token_index(attention_mask, input_ids)}
        return hidden, causal_bias(attention_mask, input_ids, hidden.dtype), extras


class LlamaHeadStage(nn.Module):
    """Final RMSNorm and ``score`` on the last token of ``hidden`` (the fused model passes the pooled token)."""

    def __init__(self, norm: nn.Module, score: nn.Module | None) -> None:
        super().__init__()
        self.norm = norm
        self.score = score

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """``hidden [B, T, D]`` -> ``logits [B, classes]`` (the normalised token for a bare model)."""
        last = self.norm(hidden[:, -1])
        return self.score(last) if self.score is not None else last


@register_adapter
class LlamaAdapter(ModelAdapter):
    """LLaMA-family decoders with a sequence-classification head (``score``)."""

    family = "llama"
    model_types = ("llama",)
    classifier_class = "LlamaForSequenceClassification"
    encoder_class = "LlamaModel"
    config_class = "LlamaConfig"
    model_classes = ("LlamaModel", "LlamaForSequenceClassification")
    inputs = (InputSpec("input_ids", "int64", TEXT_AXES), InputSpec("attention_mask", "int64", TEXT_AXES))
    modality = "text"
    tokenizer_use = "inputs"
    norm_style = "pre"
    classifier_weights = ("score.weight",)

    @classmethod
    def relabel(cls, config: Any, num_labels: int) -> None:
        """A fresh classification head for the data's classes."""
        config.num_labels = num_labels

    @classmethod
    def example_inputs(cls, batch: int, *, sequence: int, image_size: int, num_channels: int,
                       seed: int = 0) -> dict[str, torch.Tensor]:
        """Random ids (10..1000), ragged right padding (id 0): row ``i`` keeps ``sequence - 3 * i`` tokens (>= 2)."""
        g = torch.Generator().manual_seed(seed)
        ids = torch.randint(10, 1000, (batch, sequence), generator=g)
        mask = torch.ones(batch, sequence, dtype=torch.long)
        for i in range(batch):
            mask[i, max(2, sequence - 3 * i):] = 0
        ids[:, 0] = 1  # a begin-of-sequence id
        return {"input_ids": ids * mask, "attention_mask": mask}

    @property
    def decoder(self) -> nn.Module:
        """The bare ``LlamaModel`` (the model itself when it is one)."""
        return self.model if type(self.model).__name__ == self.encoder_class else self.model.model

    def layers(self) -> list[LayerView]:
        """One view per ``LlamaDecoderLayer``."""
        act = str(self.decoder.config.hidden_act)
        views = []
        for layer in self.decoder.layers:
            att, mlp = layer.self_attn, layer.mlp
            views.append(LayerView(
                attention=att, probs_module=att, q=att.q_proj, k=att.k_proj, v=att.v_proj, o=att.o_proj,
                ln_attn=layer.input_layernorm, ln_mlp=layer.post_attention_layernorm,
                fc1=mlp.gate_proj, fc2=mlp.down_proj, fc_up=mlp.up_proj, act=mlp.act_fn, act_name=act,
                norm_style=self.norm_style, head_dim=int(att.head_dim), scaling=float(att.scaling),
                heads_attr="num_attention_heads", norm="rms", rope=True,
            ))
        return views

    def logits(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """``score`` of the last real token (its normalised hidden state for a bare ``LlamaModel``)."""
        ids, mask = batch["input_ids"], batch.get("attention_mask")
        hidden = self.decoder(input_ids=ids, attention_mask=mask).last_hidden_state  # final RMSNorm applied
        last = hidden[torch.arange(ids.shape[0], device=ids.device), last_token_index(mask, ids)]
        return self.model.score(last) if hasattr(self.model, "score") else last

    def token_mask(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """Real tokens: the attention mask (all true when absent)."""
        if batch.get("attention_mask") is not None:
            return batch["attention_mask"].bool()
        return torch.ones_like(batch["input_ids"], dtype=torch.bool)

    def input_modules(self) -> tuple[nn.Module | None, ...]:
        """The token embeddings (``embed_tokens``) and the rotary module (angles: buffers, no weights)."""
        return self.decoder.embed_tokens, self.decoder.rotary_emb

    def embeddings(self) -> nn.Module:
        """Copy of the input stage (token embeddings and the rotary module)."""
        return LlamaInputStage(*(copy.deepcopy(m) for m in self.input_modules()))

    def head(self) -> nn.Module:
        """Copy of the final RMSNorm and ``score``."""
        return LlamaHeadStage(copy.deepcopy(self.decoder.norm), copy.deepcopy(getattr(self.model, "score", None)))

    def config_dict(self) -> dict:
        """Facts the fused model needs."""
        c = self.decoder.config
        return {
            "family": self.family,
            "hidden_size": int(c.hidden_size),
            "layer_norm_eps": float(c.rms_norm_eps),
            "hidden_act": str(c.hidden_act),
            "num_labels": int(getattr(self.model.config, "num_labels", 0) or 0),
            "norm_style": self.norm_style,
        }
