"""Recipe fields of the cost levers (issue 45): validation, and cache keys unchanged at their defaults."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from toolchain.errors import RecipeError
from toolchain.recipe import parse_recipe

ROOT = Path(__file__).resolve().parents[2]


def default() -> dict:
    """The default recipe with the levers left out (it ships one: ``pruning.mlp_share``, ``fusion.mlp: grouped``)."""
    data = yaml.safe_load((ROOT / "recipes" / "minilm-tweets.yaml").read_text())
    for field in ("fork", "mlp_share", "mlp_core"):
        data["pruning"].pop(field, None)
    data["fusion"]["mlp"] = "average"
    return data


def test_the_levers_at_their_defaults_keep_every_section_digest():
    plain = parse_recipe(default())
    data = default()
    data["pruning"].update(fork=0, mlp_share=None, mlp_core=0.0)
    explicit = parse_recipe(data)
    for section in ("pruning", "fusion", "scoring"):
        assert explicit.digest(section) == plain.digest(section)
    data["pruning"]["fork"] = 2
    assert parse_recipe(data).digest("pruning") != plain.digest("pruning")


@pytest.mark.parametrize(("pruning", "fusion", "message"), [
    ({"mlp_share": 0.5}, {"mlp": "average"}, "field 'fusion.mlp': pruning.mlp_share"),
    ({"mlp_share": 0.3, "mlp_core": 0.4}, {"mlp": "grouped"}, "mlp_core (0.4) is in every member's share"),
    ({"mlp_core": 0.1}, {"mlp": "grouped"}, "mlp_core (0.1) is in every member's share"),
    ({"mlp_share": 0.0}, {"mlp": "grouped"}, "pruning.mlp_share"),
    ({"fork": -1}, {}, "pruning.fork"),
])
def test_bad_lever_settings_name_the_field(pruning, fusion, message):
    data = default()
    data["pruning"].update(pruning)
    data["fusion"].update(fusion)
    with pytest.raises(RecipeError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_recipe(data, "r.yaml")


def test_a_compare_variant_with_slices_needs_the_grouped_mlp_too():
    data = default()
    data["compare"] = [{"name": "sliced", "pruning": {"mlp_share": 0.4}}]
    with pytest.raises(RecipeError, match=r"field 'compare\.0\.fusion\.mlp'"):
        parse_recipe(data, "r.yaml")
    data["compare"][0]["fusion"] = {"mlp": "grouped"}
    recipe = parse_recipe(data, "r.yaml")
    variant = recipe.variant(recipe.compare[0])
    assert variant.pruning.mlp_share == 0.4 and variant.fusion.mlp == "grouped"
