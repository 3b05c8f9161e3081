"""Fusing with the cost levers (issue 45): a late fork and per-member MLP neuron slices, every tiny family.

Reference for member ``m``: the source model with ``m``'s heads gated and the MLP neurons it drops zeroed in
fc2 (``fuse``), or the physically pruned member model (``fuse_members``); both lowerings; unequal slice widths
(padding with zero neurons) and a trunk run once.
"""

from __future__ import annotations

import copy

import pytest
import torch

from toolchain.errors import ModelError
from toolchain.hydra import fuse, fuse_members, load_hydra, save_hydra
from toolchain.models.base import adapter_for
from toolchain.models.tiny import TINY_MODELS

M = 3


def plan(adapter, fork: int, seed: int = 0):
    """Random masks (the trunk keeps every head) and unequal neuron slices (the trunk keeps every neuron)."""
    g = torch.Generator().manual_seed(seed)
    masks = torch.rand(M, adapter.num_layers, adapter.max_heads, generator=g) > 0.4
    for l, n in enumerate(adapter.heads_per_layer()):
        masks[:, l, n:] = False
        masks[:, l, 0] = True
        if l < fork:
            masks[:, l, :n] = True
    widths = [lv.fc1.out_features for lv in adapter.layers()]
    neurons = [[sorted(torch.randperm(w, generator=g)[: w if l < fork else w // 3 + m].tolist())
                for l, w in enumerate(widths)] for m in range(M)]
    return masks, neurons, widths


@pytest.mark.parametrize("family", sorted(TINY_MODELS))
@pytest.mark.parametrize("fork", [0, 1])
def test_fuse_with_fork_and_slices_reproduces_every_member(family, fork, tmp_path):
    tiny = TINY_MODELS[family]()
    a = tiny.adapter
    masks, neurons, widths = plan(a, fork)
    batch = tiny.make_batch(3, 0)
    for lowering in ("conv", "matmul"):
        hydra = fuse(a, masks, mlp="grouped", lowering=lowering, fork=fork, neurons=neurons)
        assert hydra.config.fork == fork and hydra.config.layers[-1].neurons == tuple(w // 3 + m for m in range(M)
                                                                                      for w in widths[-1:])
        out = hydra(**batch)["member_logits"]
        for m in range(M):
            ref = adapter_for(copy.deepcopy(tiny.model), **a.clone_kwargs())
            with torch.no_grad():
                for l, lv in enumerate(ref.layers()):
                    drop = torch.ones(widths[l], dtype=torch.bool)
                    drop[neurons[m][l]] = False
                    lv.fc2.weight[:, drop] = 0
                expected = ref.gated_logits(batch, masks[m].float())
            torch.testing.assert_close(out[:, m], expected, atol=1e-4, rtol=1e-4)
    loaded = load_hydra(save_hydra(hydra, tmp_path / "h"))
    assert torch.equal(loaded(**batch)["probs"], hydra(**batch)["probs"])
    assert [b.ln_attn.streams for b in hydra.blocks] == [1] * fork + [M] * (len(hydra.blocks) - fork)


@pytest.mark.parametrize("family", ["bert", "vit", "llama", "distilbert", "clip"])
def test_fuse_members_of_sliced_members_with_a_shared_trunk(family):
    tiny = TINY_MODELS[family]()
    a = tiny.adapter
    masks, neurons, _ = plan(a, fork=1, seed=1)
    members = [adapter_for(a.prune(masks[m], neurons=neurons[m]), **a.clone_kwargs()) for m in range(M)]
    batch = tiny.make_batch(3, 2)
    hydra = fuse_members(members, mlp="grouped", fork=1)
    assert hydra.config.source == "members" and hydra.config.layers[1].sliced
    out = hydra(**batch)["member_logits"]
    for m, member in enumerate(members):
        with torch.no_grad():
            torch.testing.assert_close(out[:, m], member.logits(batch), atol=1e-4, rtol=1e-4)
    with pytest.raises(ValueError, match="mlp='average' cannot merge"):
        fuse_members(members, mlp="average", fork=1)
    with torch.no_grad():  # a member whose trunk trained: the fused model cannot run it once
        next(members[1].layers()[0].fc1.parameters()).add_(0.01)
    with pytest.raises(ModelError, match="member 1's layer 0 differs"):
        fuse_members(members, mlp="grouped", fork=1)


def test_bad_lever_arguments_name_what_is_wrong():
    tiny = TINY_MODELS["bert"]()
    a = tiny.adapter
    masks, neurons, _ = plan(a, fork=1)
    with pytest.raises(ValueError, match="fork must be an int in"):
        fuse(a, masks, fork=2)
    with pytest.raises(ValueError, match="need mlp='grouped'"):
        fuse(a, masks, mlp="average", neurons=neurons)
    pruned = masks.clone()
    pruned[0, 0, 1] = False
    with pytest.raises(ValueError, match="before the fork"):
        fuse(a, pruned, fork=1)
    bad = copy.deepcopy(neurons)
    bad[0][0] = bad[0][0][:-1]  # a trunk layer sliced
    with pytest.raises(ValueError, match=r"neurons\[0\]\[0\] slices a layer before the fork"):
        fuse(a, masks, mlp="grouped", fork=1, neurons=bad)
    bad = copy.deepcopy(neurons)
    bad[1][1] = [0, 0]
    with pytest.raises(ValueError, match=r"neurons\[1\]\[1\] must be distinct"):
        fuse(a, masks, mlp="grouped", fork=1, neurons=bad)
