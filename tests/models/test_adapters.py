"""Model adapters: gating, attention capture, pruning, save/load, ONNX - every family."""

from __future__ import annotations

import json

import numpy as np
import onnxruntime as ort
import pytest
import torch

from toolchain.errors import ModelError
from toolchain.hydra import fuse_members
from toolchain.models import adapter_for, load_model, registered_adapters, save_model
from toolchain.models.tiny import TINY_MODELS
from toolchain.models.wrappers import SingleModel

FAMILIES = sorted(TINY_MODELS)


def test_every_registered_family_has_a_tiny_model():
    assert {cls.family for cls in registered_adapters()} == set(TINY_MODELS)


@pytest.fixture(params=FAMILIES)
def tiny(request):
    return TINY_MODELS[request.param]()


def _mask_with_single_head_layer(adapter) -> torch.Tensor:
    keep = torch.ones(adapter.num_layers, adapter.max_heads, dtype=torch.bool)
    keep[0, :] = False
    keep[0, 2] = True  # layer 0 keeps one head
    keep[1, 0] = False
    keep[1, 3] = False
    return keep


def test_structure_lists_heads(tiny):
    a = tiny.adapter
    assert a.heads_per_layer() == [4, 4]
    assert a.head_dims() == [8, 8]
    pruned = adapter_for(a.prune(_mask_with_single_head_layer(a)), **a.clone_kwargs())
    assert pruned.heads_per_layer() == [1, 2]
    assert pruned.head_dims() == [8, 8]
    assert a.heads_per_layer() == [4, 4], "pruning must leave the input model untouched"


def test_all_gates_one_equals_unmodified(tiny):
    batch = tiny.make_batch(4)
    a = tiny.adapter
    with torch.no_grad():
        ref = a.logits(batch)
        out = a.gated_logits(batch, torch.ones(a.num_layers, a.max_heads))
        out_per_sample = a.gated_logits(batch, torch.ones(4, a.num_layers, a.max_heads))
    assert (ref - out).abs().max() <= 1e-6
    assert (ref - out_per_sample).abs().max() <= 1e-6


def test_zero_gates_equal_physical_pruning(tiny):
    batch = tiny.make_batch(4)
    a = tiny.adapter
    keep = _mask_with_single_head_layer(a)
    before = {k: v.clone() for k, v in tiny.model.state_dict().items()}
    pruned = adapter_for(a.prune(keep), **a.clone_kwargs())
    with torch.no_grad():
        gated = a.gated_logits(batch, keep.float())
        physical = pruned.logits(batch)
        full = a.logits(batch)
    assert (gated - physical).abs().max() <= 1e-5
    assert (gated - full).abs().max() > 1e-4, "pruning must change the output (else the test proves nothing)"
    for k, v in tiny.model.state_dict().items():
        assert torch.equal(v, before[k]), f"input model changed: {k}"


def test_per_sample_gates_match_one_mask_per_pass(tiny):
    batch = tiny.make_batch(3)
    a = tiny.adapter
    masks = torch.stack([torch.ones(2, 4), _mask_with_single_head_layer(a).float(), torch.rand(2, 4)])
    with torch.no_grad():
        batched = a.gated_logits(batch, masks)
        for i in range(3):
            one = {k: v[i : i + 1] for k, v in batch.items()}
            looped = a.gated_logits(one, masks[i])
            assert (batched[i] - looped[0]).abs().max() <= 1e-5


def _rms_norm_in_float64(self, hidden):  # LlamaRMSNorm's formula without its cast to float32
    return self.weight * (hidden * torch.rsqrt(hidden.pow(2).mean(-1, keepdim=True) + self.variance_epsilon))


def test_gate_gradient_matches_finite_difference(tiny, monkeypatch):
    # Hugging Face's RMSNorm (LLaMA) computes in float32 whatever the model's dtype: its rounding
    # (~1e-7) over the 2e-6 step would swamp the difference quotient, so here it keeps float64
    for norm in {type(m) for m in tiny.model.modules() if type(m).__name__.endswith("RMSNorm")}:
        monkeypatch.setattr(norm, "forward", _rms_norm_in_float64)
    tiny.model.double()
    a = tiny.adapter
    batch = {k: (v.double() if v.is_floating_point() else v) for k, v in tiny.make_batch(2).items()}
    gates = torch.full((a.num_layers, a.max_heads), 0.7, dtype=torch.float64, requires_grad=True)
    out = a.gated_logits(batch, gates)
    target = out.detach().argmax(-1)
    loss = torch.nn.functional.cross_entropy(out, target)
    (grad,) = torch.autograd.grad(loss, gates)
    eps = 1e-6
    for layer, head in [(0, 1), (1, 3)]:
        g_plus, g_minus = gates.detach().clone(), gates.detach().clone()
        g_plus[layer, head] += eps
        g_minus[layer, head] -= eps
        with torch.no_grad():
            lp = torch.nn.functional.cross_entropy(a.gated_logits(batch, g_plus), target)
            lm = torch.nn.functional.cross_entropy(a.gated_logits(batch, g_minus), target)
        fd = (lp - lm) / (2 * eps)
        assert abs(fd.item() - grad[layer, head].item()) <= 1e-6 + 1e-4 * abs(fd.item())
    assert grad.abs().sum() > 0


def test_attention_rows_sum_to_one_and_padding_gets_zero(tiny):
    batch = tiny.make_batch(4, pad=True)
    a = tiny.adapter
    with torch.no_grad():
        ref = a.logits(batch)
        atts = a.attentions(batch)
        after = a.logits(batch)
    assert (ref - after).abs().max() <= 1e-6, "capturing attentions must not change outputs"
    mask = a.token_mask(batch)
    assert len(atts) == a.num_layers
    for att in atts:
        b, h, tq, tk = att.shape
        assert (b, h) == (4, 4) and tq == tk == mask.shape[1]
        rows = att.sum(-1)  # [B, H, Tq]
        assert torch.allclose(rows, torch.ones_like(rows), atol=1e-5)
        pad_keys = ~mask[:, None, None, :].expand_as(att)
        assert att[pad_keys].abs().max() == 0 if pad_keys.any() else True


def test_head_weights_slices_rebuild_projections(tiny):
    lv = tiny.adapter.layers()[1]
    w = lv.head_weights()
    assert torch.equal(w["q_w"].reshape(lv.q.weight.shape), lv.q.weight)
    assert torch.equal(w["o_w"].permute(1, 0, 2).reshape(lv.o.weight.shape), lv.o.weight)
    x = torch.randn(3, lv.o.in_features)
    per_head = torch.einsum("hdk,bhk->bd", w["o_w"], x.reshape(3, lv.num_heads, lv.head_dim))
    assert torch.allclose(per_head + w["o_b"], lv.o(x), atol=1e-6)


def test_bad_gate_shapes_are_rejected(tiny):
    a = tiny.adapter
    with pytest.raises(ValueError, match="gates must be"):
        a.gated_logits(tiny.make_batch(2), torch.ones(5, 4))
    with pytest.raises(ValueError, match=r"at least one head|keep no head"):
        a.prune(torch.zeros(a.num_layers, a.max_heads, dtype=torch.bool))


def _export_and_compare(model, batch, path) -> float:
    wrapper = SingleModel(adapter_for(model, **getattr(model, "_hydra_kwargs", {}))).eval()
    names = [n for n in wrapper.input_names if n in batch]
    dyn = {n: {0: "batch"} | ({1: "seq"} if batch[n].dim() == 2 else {}) for n in names}
    torch.onnx.export(
        wrapper, tuple(batch[n] for n in names), str(path), input_names=names,
        output_names=["logits", "probs"], dynamic_axes=dyn, opset_version=17, dynamo=False,
    )
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    feed = {n: batch[n].numpy() for n in names}
    with torch.no_grad():
        ref = wrapper(**{n: batch[n] for n in names})["logits"].numpy()
    return float(np.abs(sess.run(["logits"], feed)[0] - ref).max())


@pytest.mark.parametrize("family", [f for f in FAMILIES if f != "clip"])  # CLIP: test_pruned_clip_save_load
def test_pruned_model_save_load_and_onnx(tmp_path, family):
    tiny = TINY_MODELS[family]()
    a = tiny.adapter
    pruned = a.prune(_mask_with_single_head_layer(a))
    folder = save_model(pruned, tmp_path / "pruned")
    assert json.loads((folder / "config.json").read_text())["hydra_heads_per_layer"] == [1, 2]
    reloaded = load_model(folder, tokenizer=False)
    assert reloaded.adapter.heads_per_layer() == [1, 2]
    batch = tiny.make_batch(3)
    with torch.no_grad():
        assert torch.equal(adapter_for(pruned).logits(batch), reloaded.adapter.logits(batch))
    # export at batch 3 and check ORT at another batch and sequence length
    assert _export_and_compare(reloaded.model, batch, tmp_path / "m.onnx") <= 1e-4
    other = tiny.make_batch(5, seed=3)
    if "input_ids" in other:
        other = {k: v[:, :9] for k, v in other.items()}
    sess = ort.InferenceSession(str(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"])
    feed = {i.name: other[i.name].numpy() for i in sess.get_inputs()}
    with torch.no_grad():
        ref = reloaded.adapter.logits(other).numpy()
    assert np.abs(sess.run(["logits"], feed)[0] - ref).max() <= 1e-4


def test_pruned_clip_save_load(tmp_path):
    tiny = TINY_MODELS["clip"]()
    a = tiny.adapter
    pruned = a.prune(_mask_with_single_head_layer(a))
    folder = save_model(pruned, tmp_path / "clip")
    reloaded = load_model(folder, tokenizer=False, adapter_kwargs=a.clone_kwargs())
    assert reloaded.adapter.heads_per_layer() == [1, 2]
    assert reloaded.model.text_model.encoder.layers[0].self_attn.q_proj.out_features == 32
    batch = tiny.make_batch(2)
    with torch.no_grad():
        assert torch.allclose(adapter_for(pruned, **a.clone_kwargs()).logits(batch),
                              reloaded.adapter.logits(batch), atol=1e-6)


def test_clip_text_tower_gating_and_pruning():
    tiny = TINY_MODELS["clip"]()
    text = adapter_for(tiny.model, prompts=tiny.adapter.prompts, tower="text")
    batch = tiny.make_batch(2)
    keep = _mask_with_single_head_layer(text)
    with torch.no_grad():
        gated = text.gated_logits(batch, keep.float())
        pruned = adapter_for(text.prune(keep), prompts=text.prompts, tower="text").logits(batch)
        full = text.logits(batch)
    assert (gated - pruned).abs().max() <= 1e-5
    assert (gated - full).abs().max() > 1e-5


def test_missing_and_unsupported_model_folders(tmp_path):
    with pytest.raises(ModelError, match="does not exist"):
        load_model(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelError, match=r"no config\.json"):
        load_model(tmp_path / "empty")
    (tmp_path / "gpt").mkdir()
    (tmp_path / "gpt" / "config.json").write_text('{"model_type": "gpt2"}')
    with pytest.raises(ModelError, match="not a supported family"):
        load_model(tmp_path / "gpt")


def test_missing_tokenizer_is_reported(tmp_path):
    tiny = TINY_MODELS["bert"]()
    folder = save_model(tiny.model, tmp_path / "notok")
    with pytest.raises(ModelError, match="no tokenizer"):
        load_model(folder)


def test_unsupported_model_class():
    with pytest.raises(ModelError, match="not a supported family"):
        adapter_for(torch.nn.Linear(2, 2))


# ------------------------------------------------------------------ what the fused members share
def test_shared_parameters_are_the_embedding_stage(tiny):
    """The adapter's declaration (input_modules) is exactly what its fused embedding stage holds."""
    shared = tiny.adapter.shared_parameters()
    stage = dict(tiny.adapter.embeddings().named_parameters())
    assert shared and len(shared) == len(stage)
    assert sorted(p.numel() for p in shared.values()) == sorted(p.numel() for p in stage.values())
    for name, value in stage.items():
        assert any(p.shape == value.shape and torch.equal(p, value) for p in shared.values()), name


def _recover(tiny, keep, *, freeze: bool):
    """A pruned member fine-tuned a few steps at a high rate (recovery), its shared stage frozen or not."""
    from toolchain.pruning import finetune

    member = tiny.adapter.prune(keep)
    adapter = adapter_for(member, **tiny.adapter.clone_kwargs())
    frozen = adapter.freeze_shared() if freeze else []
    data = tiny.labelled_batches((4, 4, 4), seed=int(keep.sum()))
    finetune(member, adapter, lambda _bs, _seed: iter(data), steps=3, lr=5e-2, batch_size=4, seed=0,
             warmup_ratio=0.0, progress=False)
    return adapter, frozen


def test_recovered_members_keep_the_shared_stage_and_fuse(tiny):
    """Recovery of each member freezes what the adapter declares shared: the members fuse; unfrozen, they drift.

    A family whose declaration misses a shared module (ELECTRA's embeddings_project, CLIP's pre_layrnorm, LLaMA's
    embed_tokens) fails here: its members' embedding stages differ and fuse_members refuses them.
    """
    keep = torch.ones(2, tiny.adapter.num_layers, tiny.adapter.max_heads, dtype=torch.bool)
    keep[0, :, 0] = False  # member 0 drops head 0 of every layer, member 1 keeps all
    base = {k: v.clone() for k, v in tiny.adapter.shared_parameters().items()}
    members = [_recover(tiny, k, freeze=True) for k in keep]
    for adapter, frozen in members:
        assert frozen == sorted(base)
        now = adapter.shared_parameters()
        assert all(torch.equal(now[k], v) for k, v in base.items())  # frozen during recovery
        trained = {k: v for k, v in adapter.model.named_parameters() if k not in base}
        before = dict(tiny.adapter.model.named_parameters())
        assert any(v.shape == before[k].shape and not torch.equal(v, before[k]) for k, v in trained.items())
    fused = fuse_members([a for a, _ in members])
    assert fused.config.members == 2
    drifted = [_recover(tiny, k, freeze=False)[0] for k in keep]
    with pytest.raises(ModelError, match="embeddings differ"):
        fuse_members(drifted)
