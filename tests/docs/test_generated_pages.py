"""The generated blocks of docs/recipes.md and docs/parity.md are what ``scripts/gen_docs.py`` writes now.

Also: the generator documents every schema field, refuses a field without a description, and its
"stages keyed on it" column agrees with the cache keys (:meth:`toolchain.recipe.Recipe.digest` over
each stage's ``sections``, as :meth:`toolchain.pipeline.Context.key` hashes them); every recipe
field the hand-written prose of README.md and docs/*.md names (```bench.sequence_length```) exists.
"""

from __future__ import annotations

import re
import typing
from typing import Any

import pytest
from doc_text import DOC_PAGES, DOCS, ROOT, script
from pydantic import BaseModel, Field

from toolchain.pipeline import stages
from toolchain.recipe import Recipe, load_recipe

gen = script("scripts/gen_docs.py", "gen_docs")


@pytest.mark.parametrize("page", sorted(gen.BLOCKS))
def test_generated_blocks_are_up_to_date(page):
    text = (DOCS / page).read_text()
    assert gen.render(text, page) == text, f"docs/{page} is out of date: run python scripts/gen_docs.py"


def _paths(cls: type, prefix: str = "") -> list[str]:
    out = []
    for name, field in cls.model_fields.items():
        path = f"{prefix}{name}"
        out.append(path)
        inner, _ = gen._unwrap_optional(field.annotation)
        if isinstance(inner, type) and issubclass(inner, BaseModel):
            out += _paths(inner, f"{path}.")
        elif getattr(inner, "__origin__", None) is list and isinstance(inner.__args__[0], type) \
                and issubclass(inner.__args__[0], BaseModel):
            out += _paths(inner.__args__[0], f"{path}[].")
    return out


def test_every_schema_field_has_a_row_with_its_default():
    text = (DOCS / "recipes.md").read_text()
    paths = _paths(Recipe)
    assert {"bench.sequence_length", "data.near_ood.rows", "compare[].name", "export.sequence.max"} <= set(paths)
    missing = [p for p in paths if f"| `{p}` |" not in text]
    assert not missing, missing
    row = next(line for line in text.splitlines() if line.startswith("| `export.sequence.max` |"))
    assert "| `128` |" in row  # the enclosing section's default (Range(8, 64, 128)), not Range's own


def test_a_field_without_a_description_is_refused():
    class Section(BaseModel):
        #: documented by its comment
        commented: int = 1
        described: int = Field(2, description="documented by its Field")
        bare: int = 3

    assert gen.description(Section, "commented", Section.model_fields["commented"]) == "documented by its comment"
    assert gen.description(Section, "described", Section.model_fields["described"]) == "documented by its Field"
    with pytest.raises(gen.UndocumentedField, match=r"Section\.bare"):
        gen.description(Section, "bare", Section.model_fields["bare"])


CHANGES = {  # field -> a different valid value (on the default recipe)
    "seed": 1,
    "model.max_length": 32,
    "finetune.steps": 5,
    "pruning.members": 4,
    "pruning.recovery.steps": 7,
    "baselines.deep_ensemble": False,
    "data.near_ood.rows": 48,
    "export.opset": 18,
    "engines": ["torch", "onnxrt-cpu"],
    "bench.rounds": 7,
    "parity.uq_tolerances": {"": 0.1},
    "shift.rows": 64,
    "compare": [{"name": "taylor", "scoring": {"criterion": "taylor"}}],
}


def _changed(recipe: Recipe, path: str, value) -> Recipe:
    data = recipe.model_dump(mode="json")
    holder = data
    *parents, last = path.split(".")
    for part in parents:
        holder = holder[part]
    holder[last] = value
    return Recipe.model_validate(data)


@pytest.mark.parametrize("path", sorted(CHANGES))
def test_stages_keyed_on_a_field_are_the_stages_whose_key_it_changes(path):
    base = load_recipe(ROOT / "recipes" / "minilm-tweets.yaml")
    other = _changed(base, path, CHANGES[path])
    changed = [name for name, st in stages().items()
               if base.digest(*st.sections, "seed") != other.digest(*st.sections, "seed")]
    assert changed, f"changing {path} changed no stage's key: pick another value in CHANGES"
    assert gen.keyed_stages(tuple(path.split(".")), gen.stage_sections()) == changed


SECTIONS = tuple(Recipe.model_fields)
FIELD_MENTION = re.compile(rf"`((?:{'|'.join(SECTIONS)})\.[a-z_][\w.]*)`")


def _is_field(path: str) -> bool:
    """A dotted recipe path (``bench.sequence_length``; below a map field any key, ``data.splits.train``)."""
    cls: Any = Recipe
    for part in path.split("."):
        fields = getattr(cls, "model_fields", None)
        if fields is None or part not in fields:
            return False
        inner, _ = gen._unwrap_optional(fields[part].annotation)
        if typing.get_origin(inner) is dict:
            return True
        cls = inner
    return True


def test_recipe_fields_named_in_the_pages_exist():
    mentions = [(page.name, m) for page in DOC_PAGES for m in FIELD_MENTION.findall(page.read_text())
                if not re.search(r"\.(json|md|png|py|yaml|onnx|npz)$", m)]
    assert len(mentions) > 10
    assert not [f"{page}: `{m}`" for page, m in mentions if not _is_field(m)]
