"""The model families: the only place the pipeline learns which families exist.

A family is a registered :class:`~toolchain.models.base.ModelAdapter` subclass (the
``@register_adapter`` decorator; its module is imported in ``toolchain/models/__init__.py``).
Everything else asks here: the recipe validates ``model.family`` against :func:`family_names`,
the loader maps a checkpoint's ``model_type`` with :func:`family_for_model_type`, the stages
build and feed models through the class :func:`family` returns.
"""

from __future__ import annotations

from toolchain.errors import ModelError
from toolchain.models.base import ModelAdapter, registered_adapters

#: what adding a family takes (named in the errors for unknown families)
ADD_A_FAMILY = (
    "A family needs one adapter module in toolchain/models/ (a ModelAdapter subclass declaring its model_types, "
    "classes, inputs and tokenizer use, decorated with @register_adapter), one import line in "
    "toolchain/models/__init__.py, its tiny model in toolchain/models/tiny.py (TINY_MODELS), and tests."
)


def families() -> dict[str, type[ModelAdapter]]:
    """Family name -> adapter class, in registration order."""
    return {cls.family: cls for cls in registered_adapters()}


def family_names() -> tuple[str, ...]:
    """The registered family names, in registration order."""
    return tuple(families())


def family(name: str) -> type[ModelAdapter]:
    """The adapter class of family ``name``; a ModelError listing the families when unknown."""
    known = families()
    if name not in known:
        raise ModelError(f"'{name}' is not a supported model family (supported: {', '.join(sorted(known))}).",
                         hint=ADD_A_FAMILY)
    return known[name]


def family_for_model_type(model_type: str | None) -> type[ModelAdapter] | None:
    """The adapter class whose ``model_types`` include ``model_type`` (a config.json field); None if none."""
    for cls in registered_adapters():
        if model_type in cls.model_types:
            return cls
    return None
