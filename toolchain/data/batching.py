"""A recipe's data as the stages use it: its splits.

Plain functions of the data, the recipe's sections and its seed (the pipeline's ``Context`` holds
the loaded splits and calls :func:`recipe_splits` once):

* Splits: :func:`recipe_splits` (train/val/calib/test, ood_val/ood_test, near_ood_test),
  :func:`carve` (one data set's splits, optionally more after them), :func:`near_ood_rows`,
  :func:`class_names`.

``section`` is the recipe's ``data`` section (``id``, ``ood``, ``splits``, ``ood_splits``,
``near_ood``); ``seed`` is the recipe's seed (ID splits: ``seed``, OOD splits: ``seed + 1``, the
near-OOD sample: ``seed + 2``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from toolchain.data.near_ood import hold_out
from toolchain.data.overlap import drop_id_rows
from toolchain.data.registry import load_dataset
from toolchain.data.splits import _resolve_sizes, make_splits
from toolchain.errors import DataError

__all__ = [
    "carve",
    "class_names",
    "dataset_kwargs",
    "near_ood_rows",
    "recipe_splits",
    "split_sizes",
]


# ------------------------------------------------------------------ splits
def split_sizes(sizes: Mapping[str, float]) -> dict[str, int | float]:
    """Recipe sizes: whole numbers >= 1 are counts, values below 1 are fractions."""
    return {k: int(v) if v >= 1 and float(v).is_integer() else float(v) for k, v in sizes.items()}


def dataset_kwargs(name: str, ood: bool = False) -> dict[str, Any]:
    """Loader arguments of data set ``name`` (:func:`toolchain.data.load_dataset`) as the recipe uses it."""
    if ood and name.startswith("csv:"):
        return {"min_classes": 1}  # OOD labels are not used
    if name == "fashion-mnist":
        return {"split": "train"}
    return {}


def recipe_splits(section: Any, seed: int, *, warn: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Deterministic splits: train/val/calib/test (ID), ood_val/ood_test (OOD), near_ood_test.

    ``warn`` gets the message when a few OOD rows that are also ID rows are dropped
    (:func:`toolchain.data.overlap.drop_id_rows`).
    """
    ident, splits = carve(section, seed, "id")
    for name, part in splits.items():
        if len(part) == 0:
            raise DataError(f"split '{name}' of data set '{section.id}' is empty (data.splits.{name}).")
    if section.ood:  # OOD rows that are also ID rows: dropped (a few) or refused (toolchain/data/overlap.py)
        splits.update(drop_id_rows(ident, carve(section, seed, "ood")[1], id_name=section.id,
                                   ood_name=section.ood, warn=warn))
    if section.near_ood is not None:  # rows held out of the ID set before it was split: evaluate only
        held = near_ood_rows(section)
        pick = np.random.default_rng(seed + 2).permutation(len(held))[: section.near_ood.rows]
        splits["near_ood_test"] = held.subset(np.sort(pick), name=f"{held.name.split('/')[0]}/near_ood_test")
    return splits


def near_ood_rows(section: Any) -> Any:
    """Every ID row that ``data.near_ood`` holds out (:func:`toolchain.data.near_ood.hold_out`)."""
    near = section.near_ood
    if near is None:
        raise DataError("the recipe has no data.near_ood section")
    data = load_dataset(section.id, **dataset_kwargs(section.id))
    return hold_out(data, classes=near.classes, match=near.match)[1]


def carve(section: Any, seed: int, which: str, more: dict[str, int | None] | None = None) -> tuple[Any, dict[str, Any]]:
    """``(data set, splits)`` of the recipe's ``"id"`` or ``"ood"`` data, with the recipe's sizes and seed.

    ``more`` carves further splits after the recipe's, from the rows they leave (at most the
    given count; None: every row left). The recipe's splits come out unchanged: the splitter
    carves in order from one seeded ordering (:func:`toolchain.data.split_indices`).
    """
    ood = which == "ood"
    name, sizes = (section.ood, section.ood_splits) if ood else (section.id, section.splits)
    data = load_dataset(name, **dataset_kwargs(name, ood=ood))
    if not ood and section.near_ood is not None:  # the near-OOD rows never reach an ID split
        data = hold_out(data, classes=section.near_ood.classes, match=section.near_ood.match)[0]
    sizes = split_sizes(sizes)
    if more:
        left = len(data) - sum(_resolve_sizes(sizes, len(data), data.name).values())
        for split, most in more.items():
            count = left if most is None else min(most, left)
            if count < 1:
                raise DataError(f"data set '{name}': no rows left for split '{split}' after the recipe's splits")
            sizes[split] = count
            left -= count
    checks = {"class_checked": ()} if ood else {}  # OOD labels are not used
    return data, make_splits(data, sizes, seed=seed + 1 if ood else seed, **checks)


def class_names(splits: Mapping[str, Any]) -> list[str]:
    """In-distribution class names (the training split's)."""
    return list(splits["train"].class_names)
