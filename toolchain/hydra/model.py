"""The fused Hydra model: shared input stage, M member streams side by side, per-member heads.

```
inputs -> embeddings stage (once)         hidden [B, T, D], key bias [B, 1, 1, T]
       -> fork x HydraBlock (one stream)  the source's first layers, run once (config.fork, default 0)
       -> M copies (one Concat)           stream [B, M * D, T] (conv: channels-first)
                                              or [B, M, T, D]  (matmul: token-major)
       -> (L - fork) x HydraBlock         GFC attention, merged or per-member (sliced) MLP,
                                          per-member LayerNorms
       -> member rows [B * M, T, D]       head stage: shared (on B * M rows) or one per member
       -> member_logits [B, M, C];  probs = mean_m softmax(member_logits) [B, C]
```

An input stage may return a third item, a dict of extras for decoders: ``"rope"`` ``(cos, sin)``
``[., T, d]`` (every block rotates its members' Q and K; converted to the lowering's head layout
once) and ``"pool"`` ``[B]``, the token the head stage reads (gathered from every member's stream
before the head: the last real token of a LLaMA classifier). Its key bias may be causal
``[B, 1, T, T]``.

The lowering picks the layout (:data:`~toolchain.hydra.gfc.LAYOUTS`): the grouped Conv works on
channels-first streams; the batched MatMul runs token-major, where its bias is added along the
last axis and each LayerNorm is one ``LayerNormalization`` with no transposes around it.
Reshapes export as one ``Reshape`` with a constant ``0`` / ``-1`` shape
(:func:`~toolchain.hydra.gfc.reshape`), so the graph computes no shape arithmetic per layer.

Everything structural (M, head counts, sizes, residual style) is a Python constant taken from
:class:`~toolchain.hydra.config.HydraConfig`; batch and sequence only flow through tensor
shapes, so ``torch.onnx.export`` (TorchScript exporter, opset 17) keeps them dynamic.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import torch
from torch import nn

from toolchain.hydra.block import HydraBlock, StreamLayerNorm
from toolchain.hydra.config import HydraConfig
from toolchain.hydra.gfc import GroupedLinear, StreamLinear, check_lowering, fold_streams, reshape, split_channels


class HydraModel(nn.Module):
    """M pruned members of one transformer fused into one graph.

    Args:
        config: the structure (see :class:`HydraConfig`).
        embeddings: the family's input stage, ``module(**inputs) -> (hidden [B, T, D], bias | None)``.
        heads: output stages, ``module(hidden [B, T, D]) -> logits [B, C]``: one (``head="shared"``)
            or M (``head="member"``).

    ``forward`` takes the family's inputs by name (or positionally in ``config.input_names``
    order) and returns ``{"probs": [B, C], "member_logits": [B, M, C]}``. Weights are zeros
    until filled by :func:`toolchain.hydra.fuse.fuse` or loaded by ``load_hydra``.
    """

    def __init__(self, config: HydraConfig, embeddings: nn.Module, heads: Sequence[nn.Module]) -> None:
        super().__init__()
        expected = 1 if config.head == "shared" else config.members
        if len(heads) != expected:
            raise ValueError(f"head={config.head!r} needs {expected} head stage(s); got {len(heads)}")
        self.config = config
        self.members = config.members
        self.hidden_size = config.hidden_size
        self.input_names = tuple(config.input_names)
        self.embeddings = embeddings
        self.fork = config.fork
        # the trunk (layers before the fork) is one stream: one MLP, one LayerNorm affine, the source's heads
        self.blocks = nn.ModuleList(
            HydraBlock(spec, 1, config.hidden_size, mlp="average", layernorm="average", lowering=config.lowering)
            if idx < config.fork else
            HydraBlock(spec, config.members, config.hidden_size, mlp=config.mlp, layernorm=config.layernorm,
                       lowering=config.lowering)
            for idx, spec in enumerate(config.layers)
        )
        self.heads = nn.ModuleList(heads)

    # ------------------------------------------------------------------ forward
    def forward(self, *args: torch.Tensor | None, **inputs: torch.Tensor | None) -> dict[str, torch.Tensor]:
        """Family inputs (e.g. ``input_ids, attention_mask, token_type_ids`` or ``pixel_values``).

        Returns:
            ``probs [B, C]`` (mean of the members' softmax) and ``member_logits [B, M, C]``.
        """
        feed = self._bind(args, inputs)
        hidden, key_bias, *rest = self.embeddings(**feed)
        extras = rest[0] if rest else {}
        if key_bias is not None:
            key_bias = key_bias.unsqueeze(1)  # [B, 1, 1, 1, T]: broadcasts over [B, M, Hp, T, T] scores
        conv = self.lowering == "conv"
        rope = extras.get("rope")
        if rope is not None:  # [., T, d] -> [., 1, 1, d, T] (conv heads) or [., 1, T, 1, d] (matmul heads)
            rope = tuple(t.transpose(1, 2)[:, None, None] if conv else t[:, None, :, None] for t in rope)
        # channels-first [B, M * D, T] (conv) or token-major [B, M, T, D] (matmul): LAYOUTS
        x = hidden.transpose(1, 2) if conv else hidden.unsqueeze(1)
        for block in self.blocks[: self.fork]:  # the shared trunk: one stream
            x = block(x, key_bias, rope)
        if self.members > 1:
            x = torch.cat([x] * self.members, dim=1)  # every member sees the same input; one Concat
        for block in self.blocks[self.fork:]:
            x = block(x, key_bias, rope)
        if extras.get("pool") is not None:
            x = self._gather_token(x, extras["pool"])
        logits = self._member_logits(x)
        probs = torch.softmax(logits, dim=-1).mean(dim=1)
        return {"probs": probs, "member_logits": logits}

    def _bind(self, args: tuple, inputs: dict) -> dict[str, torch.Tensor]:
        if len(args) > len(self.input_names):
            raise TypeError(f"HydraModel takes at most {len(self.input_names)} positional inputs "
                            f"{self.input_names}; got {len(args)}")
        feed = dict(zip(self.input_names, args, strict=False))
        for name, value in inputs.items():
            if name not in self.input_names:
                raise TypeError(f"unexpected input {name!r}; this model takes {self.input_names}")
            if name in feed:
                raise TypeError(f"input {name!r} given both positionally and by name")
            feed[name] = value
        return {k: v for k, v in feed.items() if v is not None}

    def _gather_token(self, x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        """The stream at token ``index[b]`` of each row: ``[B, M * D, 1]`` (conv) or ``[B, M, 1, D]`` (matmul)."""
        if self.lowering == "conv":
            at = index.reshape(-1, 1, 1).expand(-1, x.shape[1], 1)
            return torch.gather(x, 2, at)
        at = index.reshape(-1, 1, 1, 1).expand(-1, x.shape[1], 1, x.shape[3])
        return torch.gather(x, 2, at)

    def _member_logits(self, x: torch.Tensor) -> torch.Tensor:
        """The stream -> ``[B, M, C]`` through the head stage(s)."""
        m, d, conv = self.members, self.hidden_size, self.lowering == "conv"
        if len(self.heads) == 1:
            # [B * M, T, D] rows; token-major needs a short Shape chain for it, once per graph
            rows = fold_streams(x, m, d).transpose(1, 2) if conv else x.flatten(0, 1)
            logits = self.heads[0](rows)  # [B * M, C]
            # [B * M, 1, C] -> [B, M, C]: the 0 keeps C, so no Shape arithmetic (unflatten traces one)
            return reshape(logits.unsqueeze(1), (-1, m, 0))
        hidden = split_channels(x, m, d).transpose(2, 3) if conv else x  # [B, M, T, D]
        return torch.stack([head(hidden[:, i]) for i, head in enumerate(self.heads)], dim=1)

    # ------------------------------------------------------------------ lowering
    @property
    def lowering(self) -> str:
        """The GFC lowering in use (``conv`` or ``matmul``)."""
        return self.config.lowering

    def set_lowering(self, lowering: str) -> HydraModel:
        """Switch every GFC / shared linear / LayerNorm to ``lowering`` in place (same weights); returns self.

        The lowering also picks the stream layout (:data:`~toolchain.hydra.gfc.LAYOUTS`).
        """
        check_lowering(lowering)
        for mod in self.modules():
            if isinstance(mod, GroupedLinear | StreamLinear | StreamLayerNorm):
                mod.lowering = lowering
        self.config = replace(self.config, lowering=lowering)
        return self

    def extra_repr(self) -> str:
        """Options shown by ``repr``."""
        c = self.config
        return (f"family={c.family!r}, members={c.members}, mlp={c.mlp!r}, layernorm={c.layernorm!r}, "
                f"head={c.head!r}, fork={c.fork}, sliced={c.sliced}")
