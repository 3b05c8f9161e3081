"""What each family adds to the shared adapter contract (the shared invariants run for every family
in test_adapters.py, tests/hydra and tests/scoring): DeiT's two averaged heads, ELECTRA's
embedding projection, RoBERTa's padding-offset positions, classification heads found by the
family's own state-dict key, and LLaMA's grouped K/V pruning, last-token pooling, per-member RoPE
and averaged SwiGLU."""

from __future__ import annotations

import pytest
import torch

from toolchain.errors import ModelError
from toolchain.hydra import fuse, fuse_members
from toolchain.models import adapter_for, load_model, save_model
from toolchain.models.roberta import padding_positions
from toolchain.models.tiny import TINY_MODELS


def test_deit_head_averages_the_cls_and_distillation_heads_in_every_member():
    tiny = TINY_MODELS["deit"]()
    model, batch = tiny.model, tiny.make_batch(3, seed=1)
    keep = torch.ones(2, 2, 4, dtype=torch.bool)
    keep[0, :, :2] = False  # member 0 keeps heads 2-3, member 1 all
    with torch.no_grad():
        hidden = model.deit(pixel_values=batch["pixel_values"]).last_hidden_state
        both = (model.cls_classifier(hidden[:, 0]) + model.distillation_classifier(hidden[:, 1])) / 2
        torch.testing.assert_close(tiny.adapter.logits(batch), both)
        fused = fuse(tiny.adapter, keep)
        before = fused(**batch)["member_logits"]
        fused.heads[0].distillation_head.weight.mul_(0.5)  # the fused head reads the distillation token too
        assert (fused(**batch)["member_logits"] - before).abs().max() > 1e-3
        # separate members: each member's own pair of heads, averaged within the member
        members = [tiny.adapter.prune(k) for k in keep]
        for m in members:
            m.distillation_classifier.weight.mul_(1.5)
        sep = fuse_members(members, mlp="grouped")
        assert len(sep.heads) == 2
        want = torch.stack([adapter_for(m).logits(batch) for m in members], dim=1)
        torch.testing.assert_close(sep(**batch)["member_logits"], want, atol=1e-5, rtol=1e-5)


def test_plain_deit_classifier_loads_as_its_own_class(tmp_path):
    from transformers import DeiTForImageClassification

    teacher = TINY_MODELS["deit"]().model
    plain = DeiTForImageClassification(teacher.config).eval()
    folder = save_model(plain, tmp_path / "plain")
    loaded = load_model(folder, tokenizer=False)
    assert type(loaded.model).__name__ == "DeiTForImageClassification" and loaded.adapter.family == "deit"
    batch = TINY_MODELS["deit"]().make_batch(2)
    with torch.no_grad():
        torch.testing.assert_close(fuse(loaded.adapter, torch.ones(1, 2, 4, dtype=torch.bool))(**batch)["probs"],
                                   torch.softmax(plain(**batch).logits, -1), atol=1e-6, rtol=1e-5)


def test_electra_embedding_projection_is_part_of_the_shared_input_stage():
    tiny = TINY_MODELS["electra"]()
    assert tiny.model.config.embedding_size == 16 and tiny.model.config.hidden_size == 32
    stage = tiny.adapter.embeddings()
    batch = tiny.make_batch(2)
    hidden, bias = stage(**batch)
    assert hidden.shape[-1] == 32 and stage.project is not None and bias.shape == (2, 1, 1, 12)


def test_roberta_positions_start_after_the_padding_index():
    tiny = TINY_MODELS["roberta"]()
    batch = tiny.make_batch(3)
    pad = tiny.model.config.pad_token_id
    assert pad == 1 and bool((batch["input_ids"] == pad).any())  # ragged rows padded with the padding index
    emb = tiny.model.roberta.embeddings
    positions = emb.create_position_ids_from_input_ids(batch["input_ids"], pad)
    assert positions[0, 0] == pad + 1 and bool((positions[batch["attention_mask"] == 0] == pad).all())
    # ours (float cumsum, for TensorRT) are the same numbers, so the same hidden states as the family's own
    assert torch.equal(padding_positions(batch["input_ids"], pad), positions)
    with torch.no_grad():
        hidden, _ = tiny.adapter.embeddings()(**batch)
        torch.testing.assert_close(hidden, emb(input_ids=batch["input_ids"]))
        logits = tiny.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        torch.testing.assert_close(tiny.adapter.logits(batch), logits)


@pytest.mark.parametrize("family", ["roberta", "xlm-roberta", "electra", "distilbert", "deit"])
def test_checkpoint_head_of_other_labels_is_named_for_every_family(tmp_path, family):
    tiny = TINY_MODELS[family]()
    folder = save_model(tiny.model, tmp_path / family)
    classes = int(tiny.adapter.logits(tiny.make_batch(1)).shape[-1])
    with pytest.raises(ModelError, match=f"head for {classes} labels") as err:
        load_model(folder, num_labels=classes + 1, tokenizer=False, labels=[f"c{i}" for i in range(classes + 1)])
    assert f"{classes + 1} classes" in str(err.value)
    assert load_model(folder, num_labels=classes, tokenizer=False).adapter.family == family


def test_llama_pruning_keeps_a_key_value_group_while_any_of_its_query_heads_is(tmp_path):
    tiny = TINY_MODELS["llama"]()  # 4 query heads over 2 K/V heads: groups {0, 1} and {2, 3}
    a = tiny.adapter
    assert [lv.kv_repeat for lv in a.layers()] == [2, 2]
    keep = torch.tensor([[True, False, False, True],   # one head of each group: both groups stay
                         [False, True, True, True]])    # head 1 alone in group 0, group 1 whole
    pruned = a.prune(keep)
    batch = tiny.make_batch(3)
    with torch.no_grad():
        torch.testing.assert_close(adapter_for(pruned).logits(batch), a.gated_logits(batch, keep.float()),
                                   atol=1e-5, rtol=1e-5)
    att = pruned.model.layers[0].self_attn
    # one K/V head per kept query head, copied from its group: query heads 0 and 3 read K/V heads 0 and 1
    k_src = tiny.model.model.layers[0].self_attn.k_proj.weight.reshape(2, 8, -1)
    assert att.k_proj.out_features == 2 * 8 and att.num_key_value_groups == 1
    torch.testing.assert_close(att.k_proj.weight.reshape(2, 8, -1), k_src[[0, 1]])
    assert pruned.model.layers[1].self_attn.k_proj.out_features == 3 * 8
    full = a.prune(torch.ones(2, 4, dtype=torch.bool))  # a layer that keeps every head keeps its groups
    assert full.model.layers[0].self_attn.k_proj.out_features == 2 * 8
    assert full.model.layers[0].self_attn.num_key_value_groups == 2
    loaded = load_model(save_model(pruned, tmp_path / "p"), tokenizer=False)
    with torch.no_grad():
        torch.testing.assert_close(loaded.adapter.logits(batch), adapter_for(pruned).logits(batch))


def test_llama_classifies_from_the_last_real_token_with_left_or_right_padding():
    tiny = TINY_MODELS["llama"]()
    keep = torch.ones(2, 2, 4, dtype=torch.bool)
    keep[0, :, :2] = False
    keep[1, :, 2:] = False
    fused = fuse(tiny.adapter, keep, lowering="conv")
    rows = [torch.tensor([2, 17, 33, 41, 9]), torch.tensor([2, 56, 8])]
    with torch.no_grad():
        alone = [tiny.adapter.logits({"input_ids": r[None], "attention_mask": torch.ones(1, len(r), dtype=torch.long)})
                 for r in rows]
        alone_fused = [fused(input_ids=r[None], attention_mask=torch.ones(1, len(r), dtype=torch.long))
                       for r in rows]
        for side in ("right", "left"):
            ids = torch.zeros(2, 5, dtype=torch.long)
            mask = torch.zeros(2, 5, dtype=torch.long)
            for i, r in enumerate(rows):
                at = slice(0, len(r)) if side == "right" else slice(5 - len(r), 5)
                ids[i, at], mask[i, at] = r, 1
            batch = {"input_ids": ids, "attention_mask": mask}
            got = tiny.adapter.logits(batch)
            out = fused(**batch)
            if side == "right":  # left padding shifts the positions (HF's forward counts from 0): right only
                for i in range(2):
                    torch.testing.assert_close(got[i], alone[i][0], atol=1e-5, rtol=1e-5)
                    torch.testing.assert_close(out["probs"][i], alone_fused[i]["probs"][0], atol=1e-5, rtol=1e-5)
            member = torch.stack([tiny.adapter.gated_logits(batch, k.float()) for k in keep], dim=1)
            torch.testing.assert_close(out["member_logits"], member, atol=1e-5, rtol=1e-5)


def test_llama_hydra_rotates_every_member_and_averages_swiglu_matrices_each():
    tiny = TINY_MODELS["llama"]()
    keep = torch.ones(2, 2, 4, dtype=torch.bool)
    keep[0, :, :2] = False
    keep[1, :, 2:] = False
    members = [tiny.adapter.prune(k) for k in keep]
    with torch.no_grad():  # members with their own MLPs (as after recovery fine-tuning)
        for i, m in enumerate(members):
            for layer in m.model.layers:
                layer.mlp.up_proj.weight.mul_(1.0 + 0.3 * i)
    fused = fuse_members(members, mlp="average")
    mlp = fused.blocks[0].mlp
    gate = torch.stack([m.model.layers[0].mlp.gate_proj.weight for m in members]).mean(0)
    up = torch.stack([m.model.layers[0].mlp.up_proj.weight for m in members]).mean(0)
    assert mlp.gated and mlp.fc1.weight.shape == (2 * 48, 32)
    torch.testing.assert_close(mlp.fc1.weight, torch.cat([gate, up]))  # gate and up averaged each, then joined
    assert fused.config.layers[0].rope and fused.config.layers[0].norm == "rms"
    batch = tiny.make_batch(3)
    exact = fuse_members(members, mlp="grouped")
    with torch.no_grad():
        want = torch.stack([adapter_for(m).logits(batch) for m in members], dim=1)
        torch.testing.assert_close(exact(**batch)["member_logits"], want, atol=1e-5, rtol=1e-5)
        # without the rotation the members would read another model: RoPE is not optional in the fused blocks
        stage = exact.embeddings
        original = stage.forward

        def no_rope(*args, **kwargs):
            hidden, bias, extras = original(*args, **kwargs)
            cos, sin = extras["rope"]
            return hidden, bias, {**extras, "rope": (torch.ones_like(cos), torch.zeros_like(sin))}

        stage.forward = no_rope
        assert (exact(**batch)["member_logits"] - want).abs().max() > 1e-3
