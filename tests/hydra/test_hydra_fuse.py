"""Hydra invariants on every family's tiny model (float32).

* M = 1 with nothing pruned reproduces the original model;
* M members reproduce the mean of the M pruned members run one by one (same MLP merge and
  LayerNorm choice), with equal and unequal head counts, one-head and all-head layers;
* conv and MatMul lowerings give the same numbers;
* batch 1 and larger, text padded to different lengths in one batch.
"""

from __future__ import annotations

import pytest
import torch

from toolchain.hydra import fuse, fuse_members
from toolchain.hydra.reference import ensemble_outputs, member_adapters, merge_like

PROBS_ATOL = 1e-5
LOGITS_ATOL = 1e-4


def max_abs_diff(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """The error statistic of every tolerance here; shapes must match and NaN/inf fail."""
    assert actual.shape == expected.shape, f"shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    assert torch.isfinite(actual).all(), "non-finite values in the output"
    return float((actual.double() - expected.double()).abs().max())


def run(model, batch):
    with torch.no_grad():
        return model(**batch)


def perturb(members, seed=1, scale=0.05):
    """In place: give every member its own MLP, LayerNorms and Q/K/V/O (as after fine-tuning).

    The embeddings stay shared (a Hydra model computes them once).
    """
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for a in members:
            for lv in a.layers():
                for mod in (lv.fc1, lv.fc2, lv.ln_attn, lv.ln_mlp, lv.q, lv.k, lv.v, lv.o):
                    for p in mod.parameters():
                        p.add_(scale * torch.randn(p.shape, generator=g))
    return members


def _check_against(model, references, batch):
    ref = ensemble_outputs(references, batch)
    assert float(torch.softmax(ref["member_logits"], -1).max()) > 0.5, "reference probabilities near uniform"
    out = run(model, batch)
    assert max_abs_diff(out["probs"], ref["probs"]) <= PROBS_ATOL
    assert max_abs_diff(out["member_logits"], ref["member_logits"]) <= LOGITS_ATOL
    return out


def test_single_member_unpruned_reproduces_the_original(tiny):
    a = tiny.adapter
    keep = torch.ones(1, a.num_layers, a.max_heads, dtype=torch.bool)
    model = fuse(a, keep)
    for batch_size in (1, 4):
        batch = tiny.make_batch(batch_size, seed=batch_size)
        with torch.no_grad():
            ref = a.logits(batch)
        assert float(torch.softmax(ref, -1).max()) > 0.5
        out = run(model, batch)
        assert out["member_logits"].shape == (batch_size, 1, ref.shape[-1])
        assert max_abs_diff(out["member_logits"][:, 0], ref) <= 1e-5
        assert max_abs_diff(out["probs"], torch.softmax(ref, -1)) <= 1e-6


@pytest.mark.parametrize("masks_kind", ["equal", "unequal"])
@pytest.mark.parametrize(("mlp", "layernorm", "head"),
                         [("average", "grouped", "shared"), ("grouped", "average", "member")])
def test_members_from_masks_match_pruned_models(tiny, equal_masks, unequal_masks, masks_kind, mlp, layernorm, head):
    a = tiny.adapter
    masks = equal_masks if masks_kind == "equal" else unequal_masks
    model = fuse(a, masks, mlp=mlp, layernorm=layernorm, head=head)
    if masks_kind == "unequal":
        assert [s.heads for s in model.config.layers] == [(1, 4, 2), (3, 1, 4)]
        assert [s.zero_heads for s in model.config.layers] == [3 + 2, 1 + 3]
    references = member_adapters(a, masks)
    _check_against(model, references, tiny.make_batch(4, seed=1))
    _check_against(model, references, tiny.make_batch(1, seed=2))


@pytest.mark.parametrize(("mlp", "layernorm"), [("grouped", "grouped"), ("average", "grouped"),
                                                ("average", "average"), ("grouped", "average")])
def test_fine_tuned_members(tiny, unequal_masks, mlp, layernorm):
    """Members with their own weights: ``grouped`` MLP + LN is exactly their deep ensemble."""
    a = tiny.adapter
    masks = unequal_masks
    members = perturb(member_adapters(a, masks))
    model = fuse_members(members, mlp=mlp, layernorm=layernorm)
    assert model.config.source == "members" and len(model.heads) == 3
    references = merge_like(members, mlp=mlp, layernorm=layernorm)
    _check_against(model, references, tiny.make_batch(4, seed=3))
    if mlp == "average":  # the merge changes the members: the fused model is not their deep ensemble
        deep = ensemble_outputs(members, tiny.make_batch(4, seed=3))["member_logits"]
        assert max_abs_diff(run(model, tiny.make_batch(4, seed=3))["member_logits"], deep) > 1e-3


def test_lowerings_agree(tiny, unequal_masks):
    a = tiny.adapter
    model = fuse(a, unequal_masks, mlp="grouped", lowering="conv")
    batch = tiny.make_batch(3, seed=4)
    conv = run(model, batch)
    model.set_lowering("matmul")
    assert model.lowering == "matmul" and model.blocks[0].attention.q.lowering == "matmul"
    matmul = run(model, batch)
    assert max_abs_diff(conv["probs"], matmul["probs"]) <= 1e-6
    # logits (|z| up to ~6) differ by a few float32 ulps: atol 1e-6 plus rtol 1e-5
    torch.testing.assert_close(conv["member_logits"], matmul["member_logits"], atol=1e-6, rtol=1e-5)
    shared = fuse(a, unequal_masks, lowering="matmul")  # averaged MLP (StreamLinear) too
    shared_out = run(shared, batch)
    assert max_abs_diff(shared_out["probs"], conv["probs"]) <= 1e-6
    torch.testing.assert_close(shared_out["member_logits"], conv["member_logits"], atol=1e-6, rtol=1e-5)


def test_padding_of_different_lengths_in_one_batch(unequal_masks):
    """Row i of the batch keeps 12 - 2i tokens: each row must equal the same text unpadded."""
    from toolchain.models.tiny import tiny_bert

    tiny = tiny_bert()
    model = fuse(tiny.adapter, unequal_masks)
    batch = tiny.make_batch(5, seed=5, pad=True)
    lengths = batch["attention_mask"].sum(1).tolist()
    assert len(set(lengths)) == 5
    out = run(model, batch)
    for i, n in enumerate(lengths):
        alone = run(model, {k: v[i:i + 1, :n] for k, v in batch.items()})
        assert max_abs_diff(out["member_logits"][i:i + 1], alone["member_logits"]) <= 1e-4
    _check_against(model, member_adapters(tiny.adapter, unequal_masks), batch)


def test_inputs_positional_and_optional(equal_masks):
    from toolchain.models.tiny import tiny_bert

    tiny = tiny_bert()
    model = fuse(tiny.adapter, equal_masks)
    batch = tiny.make_batch(2)
    by_name = run(model, batch)
    with torch.no_grad():
        positional = model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
        no_types = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
    assert torch.equal(by_name["probs"], positional["probs"])
    assert torch.equal(by_name["probs"], no_types["probs"])  # token types default to zeros
    with pytest.raises(TypeError, match="pixel_values"):
        model(pixel_values=torch.zeros(1))


class TestValidation:
    def test_mask_shape(self, tiny):
        with pytest.raises(ValueError, match="keep_masks must be"):
            fuse(tiny.adapter, torch.ones(2, tiny.adapter.num_layers + 1, 4, dtype=torch.bool))

    def test_empty_layer_names_member_and_layer(self, tiny, equal_masks):
        masks = equal_masks
        masks[1, 1] = False
        with pytest.raises(ValueError, match=r"member\(s\) \[1\] keep no head in layer 1"):
            fuse(tiny.adapter, masks)

    def test_head_beyond_the_layer(self, tiny):
        masks = torch.ones(1, 2, 5, dtype=torch.bool)
        with pytest.raises(ValueError, match="keeps a head >= 4"):
            fuse(tiny.adapter, masks)

    @pytest.mark.parametrize(("kw", "field"), [({"mlp": "mean"}, "mlp"), ({"layernorm": "x"}, "layernorm"),
                                               ({"lowering": "einsum"}, "lowering"), ({"head": "one"}, "head")])
    def test_options(self, tiny, equal_masks, kw, field):
        with pytest.raises(ValueError, match=field):
            fuse(tiny.adapter, equal_masks, **kw)

    def test_members_must_share_embeddings(self, equal_masks):
        from toolchain.models.tiny import tiny_bert

        a = tiny_bert().adapter
        one, two = a.prune(equal_masks[0]), a.prune(equal_masks[1])
        with torch.no_grad():
            two.bert.embeddings.word_embeddings.weight.add_(0.1)
        from toolchain.errors import ModelError

        with pytest.raises(ModelError, match="word_embeddings") as info:
            fuse_members([one, two])
        assert info.value.exit_code == 2 and "freeze_shared" in str(info.value)
        model = fuse_members([one, two], strict_embeddings=False)  # member 0's embeddings, logged
        assert model.config.members == 2

    def test_members_must_share_the_architecture(self):
        from toolchain.models.tiny import tiny_bert, tiny_vit

        with pytest.raises(ValueError, match="member 1"):
            fuse_members([tiny_bert().model, tiny_vit().model])
        with pytest.raises(ValueError, match="member 1 has 3 layers"):
            fuse_members([tiny_bert().model, tiny_bert(layers=3).model])
