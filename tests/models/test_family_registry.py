"""The family registry: family names live only in toolchain/models; every family is complete."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from toolchain.errors import ModelError, RecipeError
from toolchain.models import (
    ModelAdapter,
    adapter_for,
    checkpoint_family,
    families,
    family,
    family_for_model_type,
    family_names,
    save_model,
)
from toolchain.models.tiny import TINY_MODELS
from toolchain.recipe import parse_recipe

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "toolchain"
#: the families when this test was written, checked even if one were unregistered
KNOWN = {"bert", "vit", "clip"}


@pytest.fixture()
def family_literals(string_literals):
    """``(line, value)`` of every string constant (not a docstring) of a file that is a family name."""
    return lambda path, names: [(line, v) for line, v in string_literals(path) if v.strip().lower() in names]


def test_no_family_name_outside_the_models_package(family_literals):
    names = KNOWN | set(family_names())
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if (PACKAGE / "models") in path.parents:
            continue
        offenders += [f"{path.relative_to(ROOT)}:{line}: {value!r}" for line, value in family_literals(path, names)]
    assert not offenders, "family names belong in toolchain/models (ask the registry):\n" + "\n".join(offenders)


def test_the_scan_finds_family_literals(tmp_path, family_literals):
    probe = tmp_path / "probe.py"
    probe.write_text('"""bert in a docstring is fine."""\n# vit in a comment too\nx = 1\n'
                     'if x == "clip":\n    pass\nfamilies = {"ViT": 1, "a bert model": 2}\n')
    assert sorted(family_literals(probe, KNOWN)) == [(4, "clip"), (6, "ViT")]


def test_registry_lists_the_adapters():
    assert set(family_names()) == set(TINY_MODELS) >= KNOWN
    for name, cls in families().items():
        assert family(name) is cls and issubclass(cls, ModelAdapter) and cls.family == name
        for mt in cls.model_types:
            assert family_for_model_type(mt) is cls
    assert family_for_model_type("gpt2") is None
    with pytest.raises(ModelError, match="not a supported model family") as err:
        family("gpt2")
    assert "tiny model" in (err.value.hint or "")


@pytest.mark.parametrize("name", sorted(TINY_MODELS))
def test_family_declares_its_facts(name):
    cls = family(name)
    assert cls.model_types and cls.classifier_class in cls.model_classes
    assert cls.modality in ("text", "image") and cls.tokenizer_use in ("inputs", "prompts", None)
    assert cls.norm_style in ("pre", "post")
    assert cls.input_names == tuple(s.name for s in cls.inputs)
    import transformers

    for attr in ("classifier_class", "encoder_class", "config_class"):
        assert hasattr(transformers, getattr(cls, attr)), (name, attr)


@pytest.mark.parametrize("name", sorted(TINY_MODELS))
def test_tiny_model_round_trips_through_from_config(name):
    """tiny model -> its config dict -> the family's from_config -> adapter: same structure, runnable."""
    cls = family(name)
    tiny = TINY_MODELS[name]()
    assert type(tiny.adapter) is cls and family_for_model_type(tiny.model.config.model_type) is cls
    classes = int(tiny.adapter.logits(tiny.make_batch(2)).shape[-1])
    model = cls.from_config(tiny.model.config.to_diff_dict(), classes)
    assert type(model).__name__ == cls.classifier_class and not model.training
    adapter = adapter_for(model, **tiny.adapter.clone_kwargs())
    assert type(adapter) is cls
    assert adapter.heads_per_layer() == tiny.adapter.heads_per_layer()
    assert adapter.head_dims() == tiny.adapter.head_dims()
    assert {lv.norm_style for lv in adapter.layers()} == {cls.norm_style}
    with torch.no_grad():
        assert adapter.logits(tiny.make_batch(3)).shape == (3, classes)


@pytest.mark.parametrize("name", sorted(TINY_MODELS))
def test_example_inputs_match_the_input_specs(name):
    cls = family(name)
    tiny = TINY_MODELS[name]()
    image_size = int(tiny.adapter.config_dict().get("image_size", 16))
    channels = int(tiny.adapter.config_dict().get("num_channels", 1))
    feed = cls.example_inputs(3, sequence=10, image_size=image_size, num_channels=channels, seed=4)
    again = cls.example_inputs(3, sequence=10, image_size=image_size, num_channels=channels, seed=4)
    assert tuple(feed) == cls.input_names
    for spec in cls.inputs:
        x = feed[spec.name]
        assert x.numpy().dtype == np.dtype(spec.dtype) and x.dim() == len(spec.axes)
        assert torch.equal(x, again[spec.name])
        assert spec.dynamic_axes()[0] == "batch"
        assert spec.shape(x.shape, {"batch": 7, "sequence": 5})[0] == 7
    if cls.modality == "text":  # ids within the tiny vocabulary would be needed to run it; shapes suffice
        assert feed[cls.input_names[0]].shape == (3, 10)
    else:
        with torch.no_grad():
            assert tiny.adapter.logits(feed).shape[0] == 3


def test_checkpoint_family_and_the_unsupported_family_error(tmp_path):
    folder = save_model(TINY_MODELS["bert"]().model, tmp_path / "bert")
    assert checkpoint_family(folder) is family("bert")
    other = tmp_path / "gpt"
    other.mkdir()
    (other / "config.json").write_text('{"model_type": "gpt2"}')
    with pytest.raises(ModelError, match="not a supported family") as err:
        checkpoint_family(other)
    for name in family_names():
        assert name in str(err.value)
    assert "adapter module" in err.value.hint and "tiny model" in err.value.hint


def _recipe(**model) -> dict:
    return {"name": "r", "model": model, "data": {"id": "digits"}}


def test_recipe_family_is_validated_against_the_registry():
    for name in ("auto", *family_names()):
        assert parse_recipe(_recipe(source="x", family=name)).model.family == name
    with pytest.raises(RecipeError) as err:
        parse_recipe(_recipe(source="x", family="gpt2"))
    text = str(err.value)
    assert "field 'model.family'" in text and "'auto'" in text and "(got 'gpt2')" in text
    for name in family_names():
        assert repr(name) in text
    with pytest.raises(RecipeError, match=r"set model\.family"):
        parse_recipe(_recipe(from_config={"hidden_size": 32}))
