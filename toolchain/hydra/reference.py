"""The member-by-member reference a fused model must reproduce (tests and the parity stage).

A Hydra model is one lowering of an ensemble; running the M members one after another is the
other. :func:`member_adapters` prunes the source model once per keep mask,
:func:`merge_like` applies a fused model's MLP / LayerNorm merge to separate members (so the
comparison is like for like), and :func:`ensemble_outputs` runs them one by one.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

import torch

from toolchain.hydra.block import check_mode
from toolchain.models.base import ModelAdapter


def like_adapter(adapter: ModelAdapter, model: torch.nn.Module) -> ModelAdapter:
    """An adapter of ``adapter``'s family and construction arguments around ``model``."""
    return type(adapter)(model, **adapter.clone_kwargs())


def member_adapters(adapter: ModelAdapter, keep_masks: torch.Tensor) -> list[ModelAdapter]:
    """One pruned copy of the source per mask of ``keep_masks [M, L, H]`` (``adapter.prune``)."""
    return [like_adapter(adapter, adapter.prune(mask)) for mask in torch.as_tensor(keep_masks).bool()]


def merge_like(adapters: Sequence[ModelAdapter], *, mlp: str, layernorm: str) -> list[ModelAdapter]:
    """Copies of the members with the fused model's merges applied.

    Where ``mlp`` (``layernorm``) is ``average``, every member's fc1/fc2 (LayerNorms) become the
    members' mean; ``grouped`` leaves them as they are. The inputs are not modified.
    """
    check_mode("mlp", mlp)
    check_mode("layernorm", layernorm)
    copies = [like_adapter(a, copy.deepcopy(a.model)) for a in adapters]
    views = [c.layers() for c in copies]
    parts = (["fc1", "fc2"] if mlp == "average" else []) + (["ln_attn", "ln_mlp"] if layernorm == "average" else [])
    with torch.no_grad():
        for layer in range(len(views[0])):
            for part in parts:
                params = [dict(getattr(v[layer], part).named_parameters()) for v in views]
                for name in params[0]:
                    tensors = [p[name] for p in params]
                    if all(torch.equal(t, tensors[0]) for t in tensors[1:]):
                        continue  # shared already: keep it bit-exact
                    mean = torch.stack(tensors).mean(dim=0)
                    for t in tensors:
                        t.copy_(mean)
    return copies


def ensemble_outputs(adapters: Sequence[ModelAdapter], batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Members run one by one: ``member_logits [B, M, C]`` and ``probs`` (mean softmax) ``[B, C]``."""
    with torch.no_grad():
        logits = torch.stack([a.logits(batch) for a in adapters], dim=1)
    return {"probs": torch.softmax(logits, dim=-1).mean(dim=1), "member_logits": logits}
