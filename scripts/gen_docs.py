"""Regenerate the generated blocks of docs/recipes.md and docs/parity.md from the code: ``python scripts/gen_docs.py``.

Blocks, each between ``<!-- generated:NAME -->`` and ``<!-- /generated:NAME -->``:

* ``recipe-files``: every shipped recipe (``recipes/**/*.yaml``), its profiles and the first
  paragraph of its header comment;
* ``recipe-fields``: every field of the pydantic schema (:mod:`toolchain.recipe`): its dotted path,
  type and constraints, default, description (the field's ``Field(description=...)``, else its
  ``#:`` comment, else, for a section, its class docstring) and the stages keyed on it (from each
  registered stage's ``sections``, :func:`toolchain.pipeline.stages`; every stage's key also
  hashes ``seed``, :meth:`toolchain.pipeline.Context.key`);
* ``parity-tolerances`` (docs/parity.md): the default numeric tolerances per precision and output
  and the UQ-metric tolerances (:mod:`toolchain.parity.tolerances`).

The prose around the blocks is written by hand. ``--check`` writes nothing and exits 1 when a
committed page differs from what this script would write (tests/docs/test_generated_pages.py checks the same).
"""

from __future__ import annotations

import argparse
import inspect
import os
import re
import sys
import types
import typing
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
COMMAND = "python scripts/gen_docs.py"
_NOTE = f"<!-- written by `{COMMAND}` from the code: edit the code, then rerun it -->"


class UndocumentedField(Exception):
    """A schema field with no description (neither ``Field(description=...)`` nor a ``#:`` comment)."""


# --------------------------------------------------------------------------------------- types
def _unwrap_optional(annotation: Any) -> tuple[Any, bool]:
    """``(X, True)`` for ``X | None``; ``(annotation, False)`` otherwise."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) == 1 and len(typing.get_args(annotation)) == 2:
            return args[0], True
    return annotation, False


def _is_section(annotation: Any) -> bool:
    from pydantic import BaseModel

    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


def type_text(annotation: Any) -> str:
    """A recipe writer's name for a type: ``int``, ``list of fp32 | fp16``, ``map str -> float``, ``section``."""
    inner, optional = _unwrap_optional(annotation)
    origin, args = typing.get_origin(inner), typing.get_args(inner)
    if _is_section(inner):
        text = "section"
    elif origin is typing.Literal:
        text = " \\| ".join(str(a) for a in args)
    elif origin is list:
        item = args[0]
        text = "list of entries" if _is_section(item) else f"list of {type_text(item)}"
    elif origin is dict:
        text = f"map {type_text(args[0])} -> {type_text(args[1])}"
    elif inner is Any:
        text = "any"
    elif isinstance(inner, type):
        text = inner.__name__
    else:
        text = str(inner).replace("typing.", "")
    return f"{text} or null" if optional else text


def _constraints(field: Any) -> str:
    """``>= 1``, ``< 1``, ``pattern ...`` from a field's metadata."""
    marks = {"ge": ">=", "gt": ">", "le": "<=", "lt": "<"}
    out = []
    for item in field.metadata:
        for attr, sign in marks.items():
            value = getattr(item, attr, None)
            if value is not None:
                out.append(f"{sign} {value:g}" if isinstance(value, float) else f"{sign} {value}")
        pattern = getattr(item, "pattern", None)
        if pattern:
            out.append(f"matches `{pattern}`")
    return ", ".join(out)


_NO_VALUE = object()


def default_text(field: Any, value: Any = _NO_VALUE) -> str:
    """The default (``value`` when given: the enclosing section's default) as YAML; ``required`` when none."""
    import yaml
    from pydantic import BaseModel

    if value is _NO_VALUE:
        if field.is_required():
            return "required"
        value = field.default_factory() if field.default_factory is not None else field.default
    if isinstance(value, BaseModel):
        value = value.model_dump(mode="json")
    if value is None:
        return "`null`"
    text = yaml.safe_dump(value, default_flow_style=True, sort_keys=False, width=10_000).strip()
    text = text.removesuffix("\n...").removesuffix("...").strip()
    return f"`{text}`"


# --------------------------------------------------------------------------------- descriptions
def comment_descriptions(cls: type) -> dict[str, str]:
    """Field name -> its ``#:`` comment (the lines right above the field in the class body)."""
    out: dict[str, str] = {}
    pending: list[str] = []
    for line in inspect.getsource(cls).splitlines():
        stripped = line.strip()
        if stripped.startswith("#:"):
            pending.append(stripped[2:].strip())
            continue
        match = re.match(r"^\s+(\w+)\s*:", line)
        if match and pending:
            out[match.group(1)] = " ".join(pending)
        pending = []
    return out


def _first_paragraph(doc: str | None) -> str:
    return " ".join((doc or "").strip().split("\n\n")[0].split())


def description(cls: type, name: str, field: Any) -> str:
    """``Field(description=...)``, else the ``#:`` comment, else (a section) its class docstring."""
    text = field.description or comment_descriptions(cls).get(name)
    if not text:
        inner, _ = _unwrap_optional(field.annotation)
        if typing.get_origin(inner) is list and _is_section(typing.get_args(inner)[0]):
            inner = typing.get_args(inner)[0]
        if _is_section(inner):
            text = _first_paragraph(inner.__doc__)
    if not text:
        raise UndocumentedField(
            f"recipe field {cls.__name__}.{name} has no description: give it Field(description=...) or a "
            f"'#:' comment above it in toolchain/recipe.py, then run {COMMAND}")
    return text


# ---------------------------------------------------------------------------------------- stages
def stage_sections() -> dict[str, tuple[str, ...]]:
    """Stage -> the recipe sections and dotted fields its cache key hashes (every key hashes ``seed`` too)."""
    from toolchain.pipeline import stages

    return {name: (*st.sections, "seed") for name, st in stages().items()}


def keyed_stages(path: tuple[str, ...], sections: dict[str, tuple[str, ...]]) -> list[str]:
    """The stages whose cache key changes with the field at ``path`` (section rows: with the whole section).

    A field of :data:`toolchain.recipe.EVALUATION_FIELDS` hashes at its default inside its section,
    so only the stages that name it keys on it.
    """
    from toolchain.recipe import EVALUATION_FIELDS

    dotted = ".".join(path)
    out = []
    for name, secs in sections.items():
        for sec in secs:
            sp = tuple(sec.split("."))
            if dotted in EVALUATION_FIELDS:
                hit = sec == dotted
            else:
                hit = path[: len(sp)] == sp  # the field's section (or the field itself) is hashed
            if hit:
                out.append(name)
                break
    return out


def stages_text(names: list[str], every: list[str]) -> str:
    """``every stage``, ``every stage but load and finetune`` or the list."""
    if not names:
        return "none (where artifacts go)"
    if names == every:
        return "every stage"
    missing = [n for n in every if n not in names]
    if len(missing) <= 3 and len(names) > len(missing):
        return "every stage but " + (f"{', '.join(missing[:-1])} and {missing[-1]}" if len(missing) > 1 else missing[0])
    return ", ".join(names)


def _escape(text: str) -> str:
    """Table-cell text: ``|`` escaped, ``<`` and ``>`` as entities (``<name>`` is no HTML tag)."""
    return text.replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")


# ----------------------------------------------------------------------------------------- tables
def field_rows(cls: type, prefix: tuple[str, ...], sections: dict[str, tuple[str, ...]],
               defaults: Any = None) -> list[list[str]]:
    """Rows ``[path, type, default, stages, description]`` of ``cls``'s fields, sections recursed into.

    ``defaults``: the enclosing field's default instance of ``cls`` (``export.sequence`` defaults to
    ``Range(8, 64, 128)``, not to ``Range``'s own field defaults).
    """
    every = list(sections)
    rows = []
    for name, field in cls.model_fields.items():
        path = (*prefix, name)
        inner, _ = _unwrap_optional(field.annotation)
        typ = type_text(field.annotation)
        if (c := _constraints(field)):
            typ = f"{typ}, {c}"
        key_path = tuple(p.removesuffix("[]") for p in path)
        stages_cell = stages_text(keyed_stages(key_path, sections), every)
        desc = _escape(description(cls, name, field))
        own = getattr(defaults, name) if defaults is not None else _NO_VALUE
        if _is_section(inner) and (own if own is not _NO_VALUE else field.default) is not None \
                and not field.is_required():
            default = "see below"
        else:
            default = default_text(field, own)
        rows.append([f"`{'.'.join(path)}`", typ, default, stages_cell, desc])
        if _is_section(inner):
            value = own if own is not _NO_VALUE else (None if field.is_required() else field.default)
            rows += field_rows(inner, path, sections, value)
        elif typing.get_origin(inner) is list and _is_section(typing.get_args(inner)[0]):
            rows += field_rows(typing.get_args(inner)[0], (*prefix, f"{name}[]"), sections)
    return rows


def fields_block() -> str:
    """The ``recipe-fields`` block: one table per top-level section (``###`` headings), scalars first."""
    from toolchain.recipe import Recipe

    sections = stage_sections()
    rows = field_rows(Recipe, (), sections)
    head = ["| field | type | default | stages keyed on it | description |", "|---|---|---|---|---|"]
    groups: dict[str, list[list[str]]] = {}
    for row in rows:
        top = row[0].strip("`").split(".")[0].removesuffix("[]")
        groups.setdefault(top if "." in row[0] or _is_section_field(Recipe, top) else "Top level", []).append(row)
    out = [f"Stages, in run order: {', '.join(f'`{s}`' for s in sections)}."]
    for group, items in groups.items():
        out += ["", f"### {group}", "", *head, *("| " + " | ".join(r) + " |" for r in items)]
    return "\n".join(out)


def _is_section_field(cls: Any, name: str) -> bool:
    field = cls.model_fields[name]
    inner, _ = _unwrap_optional(field.annotation)
    return _is_section(inner) or (typing.get_origin(inner) is list and _is_section(typing.get_args(inner)[0]))


def recipe_files_block(root: Path = ROOT) -> str:
    """The ``recipe-files`` block: every shipped recipe, its profiles and its header comment's first paragraph."""
    import yaml

    rows = ["| recipe | profiles | what it is |", "|---|---|---|"]
    for path in sorted((root / "recipes").rglob("*.yaml"), key=lambda p: (len(p.parts), str(p))):
        text = path.read_text()
        comment = []
        for line in text.splitlines():
            if not line.startswith("#"):
                break
            body = line[1:].strip()
            if not body and comment:
                break
            comment.append(body)
        profiles = ", ".join(f"`{p}`" for p in (yaml.safe_load(text).get("profiles") or {})) or "-"
        rel = path.relative_to(root).as_posix()
        rows.append(f"| [`{rel}`](../{rel}) | {profiles} | {_escape(' '.join(comment))} |")
    return "\n".join(rows)


def tolerances_block() -> str:
    """The ``parity-tolerances`` block: the default numeric tolerances per precision and output, and the UQ ones."""
    from toolchain.parity.tolerances import DEFAULT_UQ_TOLERANCES, INT8_UQ_TOLERANCES, PRECISIONS, default_tolerances

    rows = ["| precision | output | atol | rtol | rule |", "|---|---|---:|---:|---|"]
    for precision in PRECISIONS:
        for output, tol in default_tolerances(precision).items():
            if tol.stat == "max":
                rule = "every element"
            else:
                rule = (f"{tol.quantile:g} quantile of all elements, {tol.feed_quantile:g} of every feed's, "
                        f"none beyond {tol.max_limit:g}x")
            rows.append(f"| {precision} | {output or '(any other)'} | {tol.atol:g} | {tol.rtol:g} | {rule} |")
    rows += ["", "UQ metrics, by family (`auroc` covers `auroc_msp`, `auroc_mi` ...): "
             "`|candidate - reference| <= atol + rtol |reference|`.", "",
             "| metric family | atol | rtol | INT8 atol | INT8 rtol |", "|---|---:|---:|---:|---:|"]
    rows += [f"| {k or '(any other)'} | {t.atol:g} | {t.rtol:g} | {INT8_UQ_TOLERANCES[k].atol:g} | "
             f"{INT8_UQ_TOLERANCES[k].rtol:g} |" for k, t in DEFAULT_UQ_TOLERANCES.items()]
    return "\n".join(rows)


#: page -> block name -> the function that writes the block
BLOCKS = {
    "recipes.md": {"recipe-files": recipe_files_block, "recipe-fields": fields_block},
    "parity.md": {"parity-tolerances": tolerances_block},
}


def render(page: str, name: str = "recipes.md") -> str:
    """``page`` (the text of ``docs/<name>``) with every generated block rewritten from the code."""
    for block, make in BLOCKS[name].items():
        start, end = f"<!-- generated:{block} -->", f"<!-- /generated:{block} -->"
        if page.count(start) != 1 or page.count(end) != 1:
            raise ValueError(f"docs/{name} needs exactly one '{start}' ... '{end}' block")
        before, rest = page.split(start)
        after = rest.split(end)[1]
        page = f"{before}{start}\n{_NOTE}\n\n{make()}\n\n{end}{after}"
    return page


def main(argv: list[str] | None = None) -> int:
    """Rewrite the page's generated blocks (``--check``: only compare)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 when the page is out of date")
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    sys.path.insert(0, str(ROOT))
    stale = []
    for name in BLOCKS:
        page = DOCS / name
        old = page.read_text()
        new = render(old, name)
        if new == old:
            continue
        stale.append(name)
        if not args.check:
            page.write_text(new)
            print(f"wrote docs/{name}")
    if args.check and stale:
        print(f"out of date: {', '.join(f'docs/{n}' for n in stale)}; run {COMMAND}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
