"""MLP neuron slicing (``prune(keep, neurons)``), its save/load round trip, and ``freeze_layers`` - every family."""

from __future__ import annotations

import json

import pytest
import torch

from toolchain.models import MLP_ATTR, adapter_for, load_model, save_model
from toolchain.models.tiny import TINY_MODELS

FAMILIES = sorted(TINY_MODELS)


@pytest.fixture(params=FAMILIES)
def tiny(request):
    return TINY_MODELS[request.param]()


def _all_heads(adapter) -> torch.Tensor:
    return torch.ones(adapter.num_layers, adapter.max_heads, dtype=torch.bool)


def _some_neurons(adapter) -> list[list[int]]:
    """Layer 0 keeps every third neuron plus the last one, layer 1 a single neuron; the rest untouched."""
    out = []
    for l, width in enumerate(adapter.mlp_per_layer()):
        if l == 0:
            out.append(sorted(set(range(0, width, 3)) | {width - 1}))
        elif l == 1:
            out.append([5])
        else:
            out.append(list(range(width)))
    return out


def _zero_dropped_columns(adapter, neurons) -> None:
    """In place: the fc2 input columns of the neurons not in ``neurons`` become 0 (what slicing removes)."""
    with torch.no_grad():
        for lv, kept in zip(adapter.layers(), neurons, strict=True):
            dropped = sorted(set(range(lv.fc2.in_features)) - set(kept))
            lv.fc2.weight[:, dropped] = 0.0


def _reference(tiny, keep, neurons):
    """The head-pruned model (heads only) with the dropped neurons' fc2 columns zeroed."""
    ref = adapter_for(tiny.adapter.prune(keep), **tiny.adapter.clone_kwargs())
    _zero_dropped_columns(ref, neurons)
    return ref


@pytest.mark.parametrize("prune_heads", [False, True])
def test_sliced_model_equals_zeroed_fc2_columns(tiny, prune_heads):
    a = tiny.adapter
    keep = _all_heads(a)
    if prune_heads:
        keep[0, 0] = keep[1, 3] = False
    neurons = _some_neurons(a)
    before = [p.clone() for p in a.model.parameters()]
    sliced = adapter_for(a.prune(keep, neurons), **a.clone_kwargs())
    assert sliced.mlp_per_layer() == [len(n) for n in neurons]
    assert sliced.heads_per_layer() == [int(r.sum()) for r in keep]
    for lv, kept in zip(sliced.layers(), neurons, strict=True):
        assert lv.fc1.out_features == lv.fc2.in_features == len(kept)
        assert lv.fc_up is None or lv.fc_up.out_features == len(kept)
    assert all(torch.equal(p, q) for p, q in zip(a.model.parameters(), before, strict=True)), "input model changed"
    assert a.mlp_per_layer() == [lv.fc2.in_features for lv in a.layers()]
    ref = _reference(tiny, keep, neurons)
    batch = tiny.make_batch(4)
    with torch.no_grad():
        got, want, full = sliced.logits(batch), ref.logits(batch), a.logits(batch)
    assert (got - want).abs().max() <= 1e-5
    assert (got - full).abs().max() > 1e-3, "the slice must change the output (else the test proves nothing)"


def test_sliced_weights_are_the_kept_rows_and_columns(tiny):
    a = tiny.adapter
    neurons = _some_neurons(a)
    sliced = adapter_for(a.prune(_all_heads(a), neurons), **a.clone_kwargs())
    for old, new, kept in zip(a.layers(), sliced.layers(), neurons, strict=True):
        idx = torch.tensor(kept)
        assert torch.equal(new.fc1.weight, old.fc1.weight[idx])
        assert torch.equal(new.fc2.weight, old.fc2.weight[:, idx])
        if old.fc1.bias is not None:
            assert torch.equal(new.fc1.bias, old.fc1.bias[idx])
        if old.fc2.bias is not None:
            assert torch.equal(new.fc2.bias, old.fc2.bias)
        if old.fc_up is not None:
            assert torch.equal(new.fc_up.weight, old.fc_up.weight[idx])


def test_full_neuron_lists_leave_the_mlp_and_config_unchanged(tiny):
    a = tiny.adapter
    full = [list(range(w)) for w in a.mlp_per_layer()]
    for neurons in (None, full):
        model = a.prune(_all_heads(a), neurons)
        pruned = adapter_for(model, **a.clone_kwargs())
        assert pruned.mlp_per_layer() == a.mlp_per_layer()
        assert getattr(pruned._layer_config(), MLP_ATTR, None) is None
        for old, new in zip(a.layers(), pruned.layers(), strict=True):
            assert torch.equal(old.fc1.weight, new.fc1.weight) and torch.equal(old.fc2.weight, new.fc2.weight)


def test_unsorted_neuron_lists_keep_the_model_order():
    tiny = TINY_MODELS["bert"]()
    a = tiny.adapter
    sliced = adapter_for(a.prune(_all_heads(a), [[9, 2, 40], [63, 0]]))
    assert torch.equal(sliced.layers()[0].fc1.weight, a.layers()[0].fc1.weight[[2, 9, 40]])
    assert torch.equal(sliced.layers()[1].fc2.weight, a.layers()[1].fc2.weight[:, [0, 63]])


@pytest.mark.parametrize(("neurons", "match"), [
    ([[0, 1]], r"one list per layer \(2\); got 1"),
    ([[0, 0, 1], [1]], r"neurons\[0\] must be at least one distinct index in \[0, 64\)"),
    ([[0], []], r"neurons\[1\] must be at least one distinct index"),
    ([[0], [64]], r"neurons\[1\] must be at least one distinct index in \[0, 64\); got \[64\]"),
    ([[-1], [3]], r"neurons\[0\]"),
])
def test_bad_neuron_lists_are_rejected(neurons, match):
    a = TINY_MODELS["bert"]().adapter
    with pytest.raises(ValueError, match=match):
        a.prune(_all_heads(a), neurons)


def test_llama_mlp_records_its_new_width():
    tiny = TINY_MODELS["llama"]()
    sliced = tiny.adapter.prune(_all_heads(tiny.adapter), _some_neurons(tiny.adapter))
    assert [layer.mlp.intermediate_size for layer in sliced.model.layers] == [17, 1]
    assert sliced.config.intermediate_size == 48  # the source width stays in the config; MLP_ATTR has the new ones
    assert getattr(sliced.config, MLP_ATTR) == [17, 1]


def test_save_load_round_trip_keeps_shapes_and_outputs(tiny, tmp_path):
    a = tiny.adapter
    keep = _all_heads(a)
    keep[0, 1] = False
    neurons = _some_neurons(a)
    model = a.prune(keep, neurons)
    folder = save_model(model, tmp_path / "sliced")
    cfg = json.loads((folder / "config.json").read_text())
    recorded = [c.get(MLP_ATTR) for c in (cfg, cfg.get("vision_config") or {}, cfg.get("text_config") or {})]
    assert [len(n) for n in neurons] in recorded
    reloaded = load_model(folder, tokenizer=False, adapter_kwargs=a.clone_kwargs())
    assert reloaded.adapter.mlp_per_layer() == [len(n) for n in neurons]
    assert reloaded.adapter.heads_per_layer() == [3, 4]
    batch = tiny.make_batch(3)
    with torch.no_grad():
        want = adapter_for(model, **a.clone_kwargs()).logits(batch)
        assert (reloaded.adapter.logits(batch) - want).abs().max() <= 1e-6


def test_neuron_only_checkpoint_reloads_without_head_counts(tmp_path):
    """A config that records MLP widths but no head counts is rebuilt too (heads as the config says)."""
    tiny = TINY_MODELS["bert"]()
    model = tiny.adapter.prune(_all_heads(tiny.adapter), [[1, 2, 3], list(range(64))])
    delattr(model.config, "hydra_heads_per_layer")
    folder = save_model(model, tmp_path / "mlp-only")
    reloaded = load_model(folder, tokenizer=False)
    assert reloaded.adapter.mlp_per_layer() == [3, 64]
    batch = tiny.make_batch(2)
    with torch.no_grad():
        assert torch.equal(adapter_for(model).logits(batch), reloaded.adapter.logits(batch))


def test_restructure_keeps_the_first_neurons():
    tiny = TINY_MODELS["vit"]()
    a = tiny.adapter
    old = [lv.fc2.weight.clone() for lv in a.layers()]
    a.restructure([4, 2], [10, 64])
    assert a.mlp_per_layer() == [10, 64] and a.heads_per_layer() == [4, 2]
    assert torch.equal(a.layers()[0].fc2.weight, old[0][:, :10])
    assert getattr(a.model.config, MLP_ATTR) == [10, 64]


# ------------------------------------------------------------------------ freeze_layers
@pytest.mark.parametrize("count", [0, 1, 2])
def test_freeze_layers_freezes_exactly_the_first_layers(tiny, count):
    a = tiny.adapter
    modules = a.layer_modules()
    assert modules is not None
    ids = [{id(p) for p in m.parameters()} for m in modules]
    frozen = a.freeze_layers(count)
    assert frozen == sorted(frozen)
    params = dict(a.model.named_parameters())
    want = {n for n, p in params.items() if any(id(p) in s for s in ids[:count])}
    assert set(frozen) == want
    assert (len(frozen) > 0) == (count > 0)
    for name, p in params.items():
        assert p.requires_grad == (name not in want), name
    # what is frozen includes the layer's attention and MLP weights
    for lv in a.layers()[:count]:
        assert not lv.q.weight.requires_grad and not lv.fc1.weight.requires_grad and not lv.fc2.weight.requires_grad
    for lv in a.layers()[count:]:
        assert lv.q.weight.requires_grad and lv.fc2.weight.requires_grad


@pytest.mark.parametrize("count", [-1, 3, 1.0, True])
def test_freeze_layers_rejects_bad_counts(count):
    a = TINY_MODELS["bert"]().adapter
    with pytest.raises(ValueError, match=r"count=.* must be an integer in \[0, 2\]"):
        a.freeze_layers(count)


def test_frozen_trunk_survives_recovery_fine_tuning():
    """A late-fork member: layer 0 and the input stage frozen, recovery changes only layer 1 and the head."""
    from toolchain.pruning import finetune

    tiny = TINY_MODELS["bert"]()
    a = tiny.adapter
    member = a.prune(_all_heads(a), [list(range(64)), list(range(0, 64, 2))])
    adapter = adapter_for(member)
    frozen = set(adapter.freeze_layers(1)) | set(adapter.freeze_shared())
    before = {k: v.detach().clone() for k, v in member.named_parameters()}
    data = tiny.labelled_batches((4, 4, 4))
    finetune(member, adapter, lambda _bs, _seed: iter(data), steps=3, lr=5e-2, batch_size=4, seed=0,
             warmup_ratio=0.0, progress=False)
    after = dict(member.named_parameters())
    assert all(torch.equal(after[k], before[k]) for k in frozen)
    changed = {k for k in after if not torch.equal(after[k], before[k])}
    assert changed and all(".layer.1." in k or "classifier" in k or "pooler" in k for k in changed), changed
