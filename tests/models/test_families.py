"""What each family adds to the shared adapter contract (the shared invariants run for every family
in test_adapters.py, tests/hydra and tests/scoring): DeiT's two averaged heads, ELECTRA's
embedding projection, RoBERTa's padding-offset positions and classification heads found by
the family's own state-dict key."""

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
