"""Physical removal of attention heads and MLP neurons from one layer of a Hugging Face model.

:meth:`toolchain.models.base.ModelAdapter.prune` and ``restructure`` call these on the
:class:`~toolchain.models.base.LayerView` of each layer. Rows and columns are deleted with
``transformers.pytorch_utils.prune_linear_layer`` and the new ``nn.Linear`` replaces the old one
in its parent module, so the family's own forward runs the smaller layer unchanged:

* heads - Q/K/V output rows and O input columns of the removed heads (:func:`_prune_layer`);
* MLP neurons - ``fc1`` (and ``fc_up``, the gated MLP's up projection) output rows and ``fc2``
  input columns of the removed intermediate neurons (:func:`_prune_mlp`). Every family's MLP
  forward reads its modules, not the config's ``intermediate_size``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn
from transformers.pytorch_utils import prune_linear_layer

#: a :class:`toolchain.models.base.LayerView` (not imported: base imports this module)
LayerView = Any


def _prune_layer(lv: LayerView, kept: torch.Tensor) -> None:
    """Keep the heads ``kept`` (sorted indices) of one layer, in place (every head kept: unchanged).

    Grouped-query attention: a key/value head stays while any of its query heads does, and the
    pruned layer gets one K/V head per kept query head (a copy of its group's), so the layer is
    plain multi-head attention (``num_key_value_groups = 1``): Hugging Face maps query head ``h``
    to K/V head ``h // groups``, which holds only for equal group sizes, and heads pruned unevenly
    within groups break that. The K/V weights grow from ``H_kv`` to the kept count.
    """
    if int(kept.numel()) == lv.num_heads:
        return
    d, rep = lv.head_dim, lv.kv_repeat
    index = (kept[:, None] * d + torch.arange(d)[None, :]).flatten()
    kv_index = ((kept // rep)[:, None] * d + torch.arange(d)[None, :]).flatten()
    holder, _ = _owner_of(lv.attention, lv.q)
    for lin, dim, rows in ((lv.q, 0, index), (lv.k, 0, kv_index), (lv.v, 0, kv_index), (lv.o, 1, index)):
        owner, name = _owner_of(lv.attention, lin)
        setattr(owner, name, prune_linear_layer(lin, rows, dim=dim))
    if rep > 1 and hasattr(holder, "num_key_value_groups"):
        holder.num_key_value_groups = 1
    n = int(kept.numel())
    if hasattr(holder, lv.heads_attr):
        setattr(holder, lv.heads_attr, n)
    if lv.size_attr and hasattr(holder, lv.size_attr):
        setattr(holder, lv.size_attr, n * d)


def _neuron_index(kept: Sequence[int], width: int, layer: int) -> torch.Tensor:
    """``kept`` as a sorted int64 index of MLP neurons of a layer ``width`` wide (ValueError if invalid)."""
    index = torch.as_tensor(list(kept), dtype=torch.long).unique(sorted=True)
    if index.numel() != len(kept) or index.numel() == 0 or int(index[0]) < 0 or int(index[-1]) >= width:
        raise ValueError(f"neurons[{layer}] must be at least one distinct index in [0, {width}); got {list(kept)[:8]}")
    return index


def _prune_mlp(root: nn.Module, lv: LayerView, kept: torch.Tensor) -> bool:
    """Keep the MLP neurons ``kept`` (sorted indices) of one layer in place; True when it changed.

    ``fc1`` (and ``fc_up``) lose their other output rows, ``fc2`` its other input columns; a
    list of every neuron leaves the layer unchanged. ``root`` holds the layer's modules.
    """
    if int(kept.numel()) == lv.fc2.in_features:
        return False
    for lin, dim in ((lv.fc1, 0), (lv.fc_up, 0), (lv.fc2, 1)):
        if lin is not None:
            owner, name = _owner_of(root, lin)
            setattr(owner, name, prune_linear_layer(lin, kept, dim=dim))
            if hasattr(owner, "intermediate_size"):  # LLaMA's MLP records its width (its forward does not read it)
                owner.intermediate_size = int(kept.numel())
    return True


def _owner_of(root: nn.Module, target: nn.Module) -> tuple[nn.Module, str]:
    """The module under ``root`` that holds ``target`` as a direct child, and the child's name."""
    for mod in root.modules():
        for name, child in mod.named_children():
            if child is target:
                return mod, name
    raise RuntimeError(f"{type(target).__name__} not found under {type(root).__name__}")
