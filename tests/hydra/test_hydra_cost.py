"""Analytic FLOPs and weight bytes against hand counts on a tiny configuration."""

from __future__ import annotations

import pytest

from toolchain.hydra.cost import (
    EncoderSpec,
    compare,
    deep_ensemble_cost,
    hydra_cost,
    members_cost,
    single_cost,
)

# D = 4, d = 2, I = 8, 2 layers x 2 heads; embeddings 100 floats, head 10 floats
SPEC = EncoderSpec(hidden=4, head_dim=2, intermediate=8, heads=(2, 2), embedding_params=100, head_params=10,
                   embedding_flops=7, head_flops=5)
T = 3
# one sample, one layer, h heads (inner = 2h):
#   projections 4 x 2 x T x D x inner = 96 x inner ; attention 2 x 2 x T^2 x inner = 36 x inner
#   mlp 2 x 2 x T x D x I = 384
#   attention params 4 x inner x D + 3 x inner + D = 19 x inner + 4 ; mlp 2 x D x I + I + D = 76 ; LN 16
FLOPS_2_HEADS = 96 * 4 + 36 * 4 + 384  # 912
FLOPS_1_HEAD = 96 * 2 + 36 * 2 + 384  # 648
PARAMS_2_HEADS = (19 * 4 + 4) + 76 + 16  # 172
PARAMS_1_HEAD = (19 * 2 + 4) + 76 + 16  # 134


class TestHandCounts:
    def test_single(self):
        cost = single_cost(SPEC, batch=1, seq=T)
        assert cost.flops == 2 * FLOPS_2_HEADS + 7 + 5
        assert cost.params == 2 * PARAMS_2_HEADS + 110
        assert cost.breakdown == {"projections": 768, "attention": 288, "mlp": 768, "embeddings": 7, "head": 5}
        assert single_cost(SPEC, batch=2, seq=T, dtype_bytes=2).weight_bytes == 2 * cost.params

    def test_members_and_deep_ensemble(self):
        heads = [[1, 2], [2, 1]]
        members = members_cost(SPEC, heads, batch=1, seq=T)
        assert members.flops == 2 * (FLOPS_1_HEAD + FLOPS_2_HEADS + 12)
        assert members.params == 2 * (PARAMS_1_HEAD + PARAMS_2_HEADS + 110)
        deep = deep_ensemble_cost(SPEC, 2, batch=1, seq=T)
        assert deep.flops == 2 * single_cost(SPEC, batch=1, seq=T).flops

    def test_hydra_pads_and_merges(self):
        heads = [[1, 2], [2, 1]]  # padded to 2 heads per member in both layers
        cost = hydra_cost(SPEC, heads, batch=1, seq=T, mlp="average", layernorm="grouped")
        assert cost.flops == 2 * 2 * FLOPS_2_HEADS + 7 + 2 * 5  # embeddings once, head on both streams
        per_layer = 2 * (19 * 4 + 4) + 2 * 16 + 76  # M attention sets, M LN sets, one MLP
        assert cost.params == 2 * per_layer + 100 + 10
        grouped = hydra_cost(SPEC, heads, batch=1, seq=T, mlp="grouped", layernorm="average", head_copies=2)
        assert grouped.flops == cost.flops
        assert grouped.params == 2 * (2 * (19 * 4 + 4) + 16 + 2 * 76) + 100 + 2 * 10

    def test_validation(self):
        with pytest.raises(ValueError, match="has 1 layers"):
            hydra_cost(SPEC, [[1]], batch=1, seq=T)
        with pytest.raises(ValueError, match="keeps no head"):
            members_cost(SPEC, [[0, 1]], batch=1, seq=T)
        with pytest.raises(ValueError, match="hidden"):
            EncoderSpec(hidden=0, head_dim=2, intermediate=8, heads=(2,))


def test_minilm_ratios():
    """all-MiniLM-L6-v2 sizes, M = 3 members keeping 4 of 12 heads: FLOPs x2.26, bytes x1.00."""
    spec = EncoderSpec(hidden=384, head_dim=32, intermediate=1536, heads=(12,) * 6,
                       embedding_params=(30522 + 512 + 2) * 384 + 2 * 384, head_params=384 * 384 + 384 + 384 * 3 + 3)
    out = compare(spec, [[4] * 6] * 3, batch=8, seq=128)
    ratios = out["ratios_vs_single"]
    assert ratios["hydra"]["flops"] == pytest.approx(2.26, abs=0.01)
    assert ratios["hydra"]["weight_bytes"] == pytest.approx(1.00, abs=0.01)
    assert ratios["deep_ensemble"]["flops"] == pytest.approx(3.0)
    assert out["single"]["weight_bytes"] == pytest.approx(90.9e6, rel=0.01)


def test_stage_flops_from_a_fused_model(unequal_masks):
    """Tiny ViT: 16 patches of 1 x 4 x 4 pixels -> D = 32; classifier 32 -> 10."""
    from toolchain.hydra import fuse
    from toolchain.hydra.cost import spec_from_hydra
    from toolchain.models.tiny import tiny_vit

    tiny = tiny_vit()
    model = fuse(tiny.adapter, unequal_masks)
    spec = spec_from_hydra(model, tiny.make_batch(3))
    assert spec.embedding_flops == 2 * 16 * 16 * 32
    assert spec.head_flops == 2 * 32 * 10
    assert spec.heads == (4, 4) and spec.intermediate == 64 and spec.head_dim == 8
