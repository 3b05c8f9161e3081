"""The cost levers of issue 45 (late fork, per-member MLP slices): hand counts and the counted FLOPs
of real fused models (``torch.utils.flop_counter.FlopCounterMode``) against the analytic formula."""

from __future__ import annotations

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from toolchain.hydra import fuse
from toolchain.hydra.cost import (
    EncoderSpec,
    compare,
    compare_of,
    hydra_cost,
    hydra_cost_of,
    members_cost,
    spec_from_hydra,
    stage_size,
)
from toolchain.models.tiny import tiny_bert, tiny_llama, tiny_vit

# D = 4, d = 2, I = 8, 2 layers x 2 heads, T = 3; embeddings 100 floats / 7 FLOPs, head 10 floats / 5 FLOPs
SPEC = EncoderSpec(hidden=4, head_dim=2, intermediate=8, heads=(2, 2), embedding_params=100, head_params=10,
                   embedding_flops=7, head_flops=5)
T = 3
# one sample, one stream, one layer with h heads and MLP width w:
#   projections 4 x 2 x T x D x 2h = 192h ; attention 2 x 2 x T^2 x 2h = 72h ; mlp 2 x 2 x T x D x w = 48w
#   attention params 4 x 2h x D + 3 x 2h + D = 38h + 4 ; mlp 2 x D x w + w + D = 9w + 4 ; LN pair 16


def flops(h: int, w: int = 8) -> int:
    return 192 * h + 72 * h + 48 * w


def attn_params(h: int) -> int:
    return 38 * h + 4


def mlp_params(w: int = 8) -> int:
    return 9 * w + 4


class TestHandCounts:
    def test_defaults_are_todays_numbers(self):
        heads = [[1, 2], [2, 1]]
        for mlp in ("average", "grouped"):
            plain = hydra_cost(SPEC, heads, batch=2, seq=T, mlp=mlp)
            assert hydra_cost(SPEC, heads, batch=2, seq=T, mlp=mlp, fork=0, neurons_per_member=None) == plain
        full = hydra_cost(SPEC, heads, batch=2, seq=T, mlp="grouped", neurons_per_member=[[8, 8], [8, 8]])
        assert full == hydra_cost(SPEC, heads, batch=2, seq=T, mlp="grouped")
        assert members_cost(SPEC, heads, batch=1, seq=T, neurons_per_member=[[8, 8], [8, 8]]) == \
            members_cost(SPEC, heads, batch=1, seq=T)

    def test_fork_runs_the_source_layer_once(self):
        # layer 0: the trunk (2 source heads, one stream); layer 1: 2 streams padded to 2 heads
        cost = hydra_cost(SPEC, [[1, 2], [2, 1]], batch=1, seq=T, fork=1)
        assert cost.flops == flops(2) + 2 * flops(2) + 7 + 2 * 5
        assert cost.breakdown["mlp"] == 3 * 48 * 8 and cost.breakdown["attention"] == 3 * 72 * 2
        trunk = attn_params(2) + 16 + mlp_params()
        member_layer = 2 * attn_params(2) + 2 * 16 + mlp_params()  # M attention and LN sets, one averaged MLP
        assert cost.params == trunk + member_layer + 100 + 10
        # the trunk's entries of heads_per_member are not used: the trunk is the source's layer
        assert hydra_cost(SPEC, [[1, 2], [1, 1]], batch=1, seq=T, fork=1) == cost
        grouped = hydra_cost(SPEC, [[1, 1], [1, 1]], batch=2, seq=T, fork=1, mlp="grouped", layernorm="grouped")
        assert grouped.flops == 2 * (flops(2) + 2 * flops(1) + 7 + 2 * 5)
        assert grouped.params == (attn_params(2) + 16 + mlp_params()) + 2 * (attn_params(1) + 16 + mlp_params()) \
            + 110

    def test_neurons_pad_each_layer_to_its_widest_member(self):
        heads = [[2, 2], [2, 2]]
        cost = hydra_cost(SPEC, heads, batch=1, seq=T, mlp="grouped", neurons_per_member=[[3, 8], [5, 2]])
        assert cost.breakdown["mlp"] == 2 * 48 * 5 + 2 * 48 * 8  # widths 5 and 8, on both streams
        assert cost.flops == 2 * (flops(2, 5) + flops(2, 8)) + 7 + 2 * 5
        assert cost.params == 2 * (2 * attn_params(2) + 2 * 16) + 2 * mlp_params(5) + 2 * mlp_params(8) + 110

    def test_fork_and_neurons_together(self):
        # trunk layer 0 keeps the full MLP whatever its neurons entries say; layer 1 is padded to 6 neurons
        cost = hydra_cost(SPEC, [[2, 1], [2, 2]], batch=1, seq=T, mlp="grouped", fork=1,
                          neurons_per_member=[[1, 6], [2, 4]])
        assert cost.flops == flops(2) + 2 * flops(2, 6) + 7 + 2 * 5
        assert cost.params == (attn_params(2) + 16 + mlp_params()) + 2 * (attn_params(2) + 16 + mlp_params(6)) + 110

    def test_gated_mlp_slices_count_three_matrices(self):
        spec = EncoderSpec(hidden=4, head_dim=2, intermediate=8, heads=(2,), mlp_matrices=3)
        cost = hydra_cost(spec, [[2], [2]], batch=1, seq=T, mlp="grouped", neurons_per_member=[[3], [5]])
        assert cost.breakdown["mlp"] == 2 * (2 * 3 * T * 4 * 5)
        # gate + up + down weights 3 x D x 5, biases 2 x 5 + D, per member
        assert cost.params == 2 * (attn_params(2) + 16 + 3 * 4 * 5 + 2 * 5 + 4)

    def test_members_unfused(self):
        # member 0: layer 0 is the source's (fork), layer 1 keeps 1 head and 3 neurons; no padding
        cost = members_cost(SPEC, [[1, 1], [2, 2]], batch=1, seq=T, fork=1, neurons_per_member=[[1, 3], [8, 8]])
        assert cost.flops == (flops(2) + flops(1, 3) + 12) + (2 * flops(2) + 12)
        m0 = (attn_params(2) + 16 + mlp_params()) + (attn_params(1) + 16 + mlp_params(3))
        m1 = 2 * (attn_params(2) + 16 + mlp_params())
        assert cost.params == m0 + m1 + 2 * 110

    def test_compare_applies_the_levers_to_hydra_and_members(self):
        heads, neurons = [[2, 1], [2, 2]], [[8, 3], [8, 6]]
        out = compare(SPEC, heads, batch=2, seq=T, mlp="grouped", fork=1, neurons_per_member=neurons)
        kw = {"batch": 2, "seq": T, "fork": 1, "neurons_per_member": neurons}
        assert out["hydra"] == hydra_cost(SPEC, heads, mlp="grouped", **kw).as_dict()
        assert out["members"] == members_cost(SPEC, heads, **kw).as_dict()
        plain = compare(SPEC, heads, batch=2, seq=T)
        assert out["single"] == plain["single"] and out["deep_ensemble"] == plain["deep_ensemble"]
        assert out["ratios_vs_single"]["hydra"]["flops"] < plain["ratios_vs_single"]["hydra"]["flops"]

    @pytest.mark.parametrize(("kwargs", "message"), [
        ({"fork": -1}, r"fork must be an int in \[0, 1\].*got -1"),
        ({"fork": 2}, r"fork must be .*got 2"),
        ({"fork": True}, r"fork must be .*got True"),
        ({"fork": 1.0}, r"fork must be .*got 1.0"),
        ({"neurons_per_member": [[8, 8]]}, "neurons_per_member has 1 rows; heads_per_member has 2"),
        ({"neurons_per_member": [[8], [8]]}, r"neurons_per_member\[0\] has 1 layers; the encoder has 2"),
        ({"neurons_per_member": [[8, 0], [8, 8]]}, r"neurons_per_member\[0\]\[1\] must be an int in \[1, 8\].*got 0"),
        ({"neurons_per_member": [[8, 8], [9, 8]]}, r"neurons_per_member\[1\]\[0\] .*got 9"),
        ({"neurons_per_member": [[8, 2.5], [8, 8]]}, r"neurons_per_member\[0\]\[1\] .*got 2.5"),
    ])
    def test_validation_names_the_argument_and_value(self, kwargs, message):
        with pytest.raises(ValueError, match=message):
            hydra_cost(SPEC, [[2, 2], [2, 2]], batch=1, seq=T, mlp="grouped", **kwargs)
        with pytest.raises(ValueError, match=message):
            members_cost(SPEC, [[2, 2], [2, 2]], batch=1, seq=T, **kwargs)

    def test_slices_need_the_grouped_mlp(self):
        with pytest.raises(ValueError, match=r"neurons_per_member needs mlp='grouped'.*got mlp='average'"):
            hydra_cost(SPEC, [[2, 2]], batch=1, seq=T, neurons_per_member=[[8, 4]])


# ------------------------------------------------------------- counted on fused models
def _counted(model, batch: dict) -> tuple[int, int]:
    """(FLOPs FlopCounterMode counts in one forward, the input stage's T)."""
    feed = {k: v for k, v in batch.items() if k in model.config.input_names}
    with torch.no_grad():
        seq = model.embeddings(**feed)[0].shape[1]
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model(**batch)
    return counter.get_total_flops(), seq


def _check_exact(model, batch: dict) -> None:
    counted, seq = _counted(model, batch)
    rows = next(iter(batch.values())).shape[0]
    cost = hydra_cost_of(model, batch=rows, seq=seq, example_inputs=batch)
    assert counted == cost.flops, cost.breakdown
    assert stage_size(model) == cost.params


TINY = {"bert": tiny_bert, "vit": tiny_vit, "llama": tiny_llama}


@pytest.mark.parametrize("lowering", ["conv", "matmul"])
@pytest.mark.parametrize("mlp", ["average", "grouped"])
@pytest.mark.parametrize("family", sorted(TINY))
def test_todays_fused_model_counts_exactly(family, mlp, lowering, unequal_masks):
    """Padded heads, attention matmuls (counted over the padded T: masking does not skip them),
    grouped Convs (FlopCounterMode counts ``C_out x C_in / groups x k`` per output position) and
    the head stage on M rows: the counted FLOPs and stored floats equal the analytic numbers."""
    tiny = TINY[family]()
    model = fuse(tiny.adapter, unequal_masks, mlp=mlp, lowering=lowering)
    _check_exact(model, tiny.make_batch(3))


def _masks_and_neurons(widths: list[list[int]], full: int, seed: int = 0) -> tuple[torch.Tensor, list]:
    """3 members x 3 layers x 4 heads, layer 0 keeps every head (the trunk when forked); neuron
    index lists of ``widths[m] = [w1, w2]`` in layers 1 and 2, every neuron in layer 0."""
    masks = torch.ones(3, 3, 4, dtype=torch.bool)
    masks[0, 1, 0] = False
    masks[1, 2, :2] = False
    masks[2, 1, :3] = False
    g = torch.Generator().manual_seed(seed)
    neurons = [[list(range(full))] + [torch.randperm(full, generator=g)[:w].tolist() for w in row] for row in widths]
    return masks, neurons


@pytest.mark.parametrize("lowering", ["conv", "matmul"])
@pytest.mark.parametrize(("family", "full"), [("bert", 64), ("llama", 48)])
@pytest.mark.parametrize("fork", [0, 1, 2])
@pytest.mark.parametrize("sliced", [False, True])
def test_forked_and_sliced_fused_model_counts_exactly(family, full, fork, sliced, lowering):
    tiny = TINY[family](layers=3)
    masks, neurons = _masks_and_neurons([[10, full], [40, 3], [7, 30]], full)
    if fork == 2:
        masks[:, 1] = True  # the trunk keeps every head
        for row in neurons:
            row[1] = list(range(full))
    model = fuse(tiny.adapter, masks, mlp="grouped" if sliced else "average", lowering=lowering, fork=fork,
                 neurons=neurons if sliced else None)
    assert model.config.fork == fork and model.config.sliced == sliced
    _check_exact(model, tiny.make_batch(3))


def test_helpers_read_the_levers_from_the_config():
    tiny = tiny_bert(layers=3)
    masks, neurons = _masks_and_neurons([[10, 64], [40, 3], [7, 30]], 64)
    model = fuse(tiny.adapter, masks, mlp="grouped", neurons=neurons, fork=1)
    spec = spec_from_hydra(model)
    assert spec.intermediate == 64 and spec.heads == (4, 4, 4)  # the source's sizes, not the padded slices
    heads = model.config.heads_per_member()
    widths = [[64, 10, 64], [64, 40, 3], [64, 7, 30]]
    by_hand = hydra_cost(spec, heads, batch=2, seq=12, mlp="grouped", head_copies=1, fork=1,
                         neurons_per_member=widths)
    assert hydra_cost_of(model, batch=2, seq=12) == by_hand
    out = compare_of(model, batch=2, seq=12)
    assert out["hydra"] == by_hand.as_dict()
    assert out["members"] == members_cost(spec, heads, batch=2, seq=12, fork=1, neurons_per_member=widths).as_dict()
    # the plain fused model of the same masks costs more FLOPs (the trunk runs once; slices are narrower)
    plain = fuse(tiny.adapter, masks, mlp="grouped")
    assert hydra_cost_of(plain, batch=2, seq=12).flops > by_hand.flops
