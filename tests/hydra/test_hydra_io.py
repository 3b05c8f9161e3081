"""Saving and loading fused models (no source checkpoint on load), configs, summaries."""

from __future__ import annotations

import json

import pytest
import torch

from toolchain.errors import ModelError
from toolchain.hydra import HydraConfig, format_summary, fuse, fuse_members, load_hydra, save_hydra, summary
from toolchain.hydra.io import CONFIG_FILE, WEIGHTS_FILE
from toolchain.hydra.reference import member_adapters


def _outputs(model, batch):
    with torch.no_grad():
        return model(**batch)


@pytest.mark.parametrize(("mlp", "layernorm"), [("average", "grouped"), ("grouped", "average")])
def test_round_trip_gives_identical_outputs(tiny, unequal_masks, tmp_path, mlp, layernorm):
    model = fuse(tiny.adapter, unequal_masks, mlp=mlp, layernorm=layernorm, lowering="matmul")
    folder = save_hydra(model, tmp_path / "hydra")
    assert sorted(p.name for p in folder.iterdir()) == [CONFIG_FILE, WEIGHTS_FILE]
    rng = torch.get_rng_state()
    loaded = load_hydra(folder)
    assert torch.equal(rng, torch.get_rng_state()), "loading must not move the caller's RNG"
    assert loaded is not model and loaded.config == model.config
    assert not loaded.training and loaded.lowering == "matmul"
    loaded_ptrs = {p.data_ptr() for p in loaded.parameters()}
    assert loaded_ptrs.isdisjoint(p.data_ptr() for p in tiny.model.parameters())
    for batch in (tiny.make_batch(1, seed=7), tiny.make_batch(4, seed=8)):
        want, got = _outputs(model, batch), _outputs(loaded, batch)
        for key in ("probs", "member_logits"):
            assert torch.equal(want[key], got[key])


def test_round_trip_of_separate_members(unequal_masks, tmp_path):
    from toolchain.models.tiny import tiny_bert

    tiny = tiny_bert()
    members = member_adapters(tiny.adapter, unequal_masks)
    with torch.no_grad():
        for i, a in enumerate(members):
            a.model.classifier.bias.add_(float(i))  # per-member heads must survive the trip
    model = fuse_members(members, mlp="grouped")
    loaded = load_hydra(save_hydra(model, tmp_path / "members"))
    assert len(loaded.heads) == 3
    batch = tiny.make_batch(3, seed=9)
    assert torch.equal(_outputs(model, batch)["member_logits"], _outputs(loaded, batch)["member_logits"])


def test_save_replaces_atomically(unequal_masks, tmp_path):
    from toolchain.models.tiny import tiny_vit

    tiny = tiny_vit()
    first = fuse(tiny.adapter, unequal_masks)
    second = fuse(tiny.adapter, unequal_masks[:2])
    save_hydra(first, tmp_path / "h")
    save_hydra(second, tmp_path / "h")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["h"]  # no temporary folder left behind
    assert load_hydra(tmp_path / "h").config.members == 2


class TestLoadErrors:
    def test_missing_files(self, tmp_path):
        with pytest.raises(ModelError, match=CONFIG_FILE):
            load_hydra(tmp_path)

    def test_bad_config(self, unequal_masks, tmp_path):
        from toolchain.models.tiny import tiny_bert

        folder = save_hydra(fuse(tiny_bert().adapter, unequal_masks), tmp_path / "h")
        data = json.loads((folder / CONFIG_FILE).read_text())
        data["mlp"] = "median"
        (folder / CONFIG_FILE).write_text(json.dumps(data))
        with pytest.raises(ModelError, match="mlp must be one of"):
            load_hydra(folder)
        data["mlp"], data["colour"] = "average", "red"
        (folder / CONFIG_FILE).write_text(json.dumps(data))
        with pytest.raises(ModelError, match="colour"):
            load_hydra(folder)

    def test_weights_of_another_model(self, unequal_masks, equal_masks, tmp_path):
        from toolchain.models.tiny import tiny_bert

        a = tiny_bert().adapter
        one = save_hydra(fuse(a, unequal_masks), tmp_path / "one")
        two = save_hydra(fuse(a, equal_masks), tmp_path / "two")
        (one / WEIGHTS_FILE).write_bytes((two / WEIGHTS_FILE).read_bytes())
        with pytest.raises(ModelError, match="cannot load the weights"):
            load_hydra(one)


class TestConfig:
    def test_dict_round_trip(self, unequal_masks):
        from toolchain.models.tiny import tiny_bert

        cfg = fuse(tiny_bert().adapter, unequal_masks).config
        assert HydraConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg

    def test_configs_written_before_the_decoder_fields_still_load(self, unequal_masks):
        from toolchain.models.tiny import tiny_bert

        cfg = fuse(tiny_bert().adapter, unequal_masks).config
        data = cfg.to_dict()
        for layer in data["layers"]:  # an encoder's config as saved before norm / mlp_gated / rope existed
            assert (layer.pop("norm"), layer.pop("mlp_gated"), layer.pop("rope")) == ("layer", False, False)
        assert HydraConfig.from_dict(data) == cfg
        data["layers"][0].pop("head_dim")
        with pytest.raises(ValueError, match=r"layers\[0\] must have the keys .*head_dim"):
            HydraConfig.from_dict(data)

    def test_heads_must_match_members(self, unequal_masks):
        from toolchain.models.tiny import tiny_bert

        data = fuse(tiny_bert().adapter, unequal_masks).config.to_dict()
        data["layers"][1]["heads"] = [1, 2]
        with pytest.raises(ValueError, match=r"layers\[1\].heads has 2 entries"):
            HydraConfig.from_dict(data)


def test_summary_counts(tiny, unequal_masks):
    model = fuse(tiny.adapter, unequal_masks)
    info = summary(model)
    assert info["heads_kept"] == [[1, 3], [4, 1], [2, 4]]
    assert info["padded_heads"] == [4, 4] and info["zero_heads"] == 9
    assert info["kept_head_indices"][0] == [[2], [0, 1, 3]]
    counted = sum(t.numel() for t in model.state_dict().values() if t.is_floating_point())
    assert info["params"]["hydra"] == counted == info["params_analytic_hydra"]
    single = sum(t.numel() for t in tiny.model.state_dict().values() if t.is_floating_point())
    if tiny.adapter.family != "clip":  # CLIP's single model also holds the text tower
        assert info["params"]["single"] == single
    assert info["params"]["deep_ensemble"] == 3 * info["params"]["single"]
    assert info["params"]["hydra"] < info["params"]["members"]
    text = format_summary(info)
    assert "member 2:  2  4" in text and "deep ensemble" in text
    json.dumps(info)
