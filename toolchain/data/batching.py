"""A recipe's data as the stages use it: its splits, its batches, its rows in token-length order.

Plain functions of the data, the tokenizer, the recipe's sections and its seed (the pipeline's
``Context`` holds the loaded splits and calls :func:`recipe_splits` once; the stages call the rest):

* Splits: :func:`recipe_splits` (train/val/calib/test, ood_val/ood_test, near_ood_test),
  :func:`carve` (one data set's splits, optionally more after them), :func:`near_ood_rows`,
  :func:`class_names`.
* Batches: :func:`batches` (``(inputs, labels)``, shuffled and grouped by token length when
  seeded), :func:`model_inputs`.
* Length order: :func:`token_lengths`, :func:`length_order`, :func:`in_length_order`.

``section`` is the recipe's ``data`` section (``id``, ``ood``, ``splits``, ``ood_splits``,
``near_ood``), ``model`` its ``model`` section (``max_length``, ``image_size``, ``num_channels``);
``seed`` is the recipe's seed (ID splits: ``seed``, OOD splits: ``seed + 1``, the near-OOD sample:
``seed + 2``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np
import torch

from toolchain import interrupts
from toolchain.data.encoding import encode
from toolchain.data.near_ood import hold_out
from toolchain.data.overlap import drop_id_rows
from toolchain.data.registry import load_dataset
from toolchain.data.splits import _resolve_sizes, make_splits
from toolchain.errors import DataError

__all__ = [
    "LENGTH_GROUP",
    "batches",
    "carve",
    "class_names",
    "dataset_kwargs",
    "in_length_order",
    "length_order",
    "model_inputs",
    "near_ood_rows",
    "recipe_splits",
    "split_sizes",
    "token_lengths",
]

#: batches per length group when training batches are grouped by token length (:func:`batches`)
LENGTH_GROUP = 50


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


# ------------------------------------------------------------------ batches
def batches(part: Any, batch_size: int, tokenizer: Any, model: Any, *, seed: int | None = None,
            group_by_length: bool = False) -> Iterator[tuple[dict[str, torch.Tensor], torch.Tensor]]:
    """Yield ``(inputs, labels)`` over a split; shuffled by ``seed`` when given.

    ``group_by_length`` (with ``seed``, text only): batches of similar token length, so that
    little of each batch is padding (the tweets: mean 33 tokens, padded to a batch mean of 57
    without it). The shuffled rows are cut into groups of :data:`LENGTH_GROUP` batches, each
    group is sorted by length and cut into batches, and the batch order is shuffled (Hugging
    Face's ``group_by_length`` sampler, plus the batch shuffle).
    """
    order = np.arange(len(part))
    if seed is not None:
        rng = np.random.default_rng(seed)
        order = rng.permutation(len(part))
        lengths = token_lengths(part, tokenizer, model.max_length) if group_by_length else None
        if lengths is not None:
            chunks = []
            for g in range(0, len(order), LENGTH_GROUP * batch_size):
                group = order[g : g + LENGTH_GROUP * batch_size]
                group = group[np.argsort(-lengths[group], kind="stable")]
                chunks += [group[i : i + batch_size] for i in range(0, len(group), batch_size)]
            order = np.concatenate([chunks[i] for i in rng.permutation(len(chunks))])
    for start in range(0, len(part), batch_size):
        interrupts.check()  # a graceful SIGTERM stops between batches
        sub = part.subset(order[start : start + batch_size])
        yield model_inputs(sub, tokenizer, model), torch.as_tensor(sub.labels, dtype=torch.long)


def model_inputs(part: Any, tokenizer: Any, model: Any) -> dict[str, torch.Tensor]:
    """Model inputs for a data split (text: tokenised to ``model.max_length``, padded to the longest row)."""
    return encode(part, tokenizer=tokenizer, max_length=model.max_length, padding="longest",
                  image_size=model.image_size, num_channels=model.num_channels)


# ------------------------------------------------------------------ length order
def token_lengths(part: Any, tokenizer: Any, max_length: int) -> np.ndarray | None:
    """Tokens per row of a text split (truncated to ``max_length``); None for images."""
    texts = getattr(part, "texts", None)
    if texts is None or tokenizer is None or len(texts) == 0:
        return None
    ids = tokenizer(list(texts), truncation=True, max_length=max_length)["input_ids"]
    return np.asarray([len(x) for x in ids])


def length_order(part: Any, tokenizer: Any, max_length: int) -> np.ndarray | None:
    """Row order by token length (stable), for inference with little padding; None for images.

    Outputs computed in this order go back with ``out[np.argsort(order)]``; a row's outputs do
    not depend on the other rows of its batch beyond float rounding (the padding is masked).
    """
    lengths = token_lengths(part, tokenizer, max_length)
    return None if lengths is None else np.argsort(lengths, kind="stable")


def in_length_order(part: Any, tokenizer: Any, max_length: int) -> tuple[Any, np.ndarray | None]:
    """``(part sorted by token length, back)``: ``outputs[back]`` restores the split's order.

    ``back`` is None where there is nothing to sort (images): the part is returned as is.
    """
    order = length_order(part, tokenizer, max_length)
    return (part, None) if order is None else (part.subset(order), np.argsort(order))
