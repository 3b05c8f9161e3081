"""Pruning plans: turn :class:`~toolchain.scoring.HeadScores` into a keep mask.

Rules (higher score = more important = kept first):

* exactly one of ``ratio`` (fraction of the existing heads to prune, ``0 <= ratio < 1``) and
  ``budget`` (exact number of heads to keep);
* ``ratio`` prunes ``floor(ratio * n + 1e-9)`` heads, never more than asked: ``n`` is the total
  head count (``scope="global"``) or each layer's (``scope="layer"``);
* ``scope="global"`` ranks all heads together; ``scope="layer"`` ranks within each layer. A
  global ``budget`` with ``scope="layer"`` is split over layers in proportion to their head
  counts (water-filling from the floor: each next head goes to the layer furthest below its
  proportional share, ties to the lower layer index);
* every layer keeps at least ``min_heads_per_layer`` heads, its best ones. The floor takes
  precedence and counts toward the budget: a ``ratio`` that would leave fewer heads keeps the
  floor (and logs it); a ``budget`` below ``layers * floor`` is an error;
* ties are broken by ``(layer, head)`` index: the lower index is kept first.
"""

from __future__ import annotations

import dataclasses
import logging
import math

import torch

from toolchain.scoring._checks import check_choice, check_float, check_int
from toolchain.scoring.scores import HeadScores

__all__ = ["SCOPES", "keep_mask", "layer_budgets", "pruned_heads"]

log = logging.getLogger(__name__)

SCOPES = ("global", "layer")
_EPS = 1e-9


def _order(scores: torch.Tensor, heads: list[tuple[int, int]]) -> list[tuple[int, int]]:
    return sorted(heads, key=lambda lh: (-float(scores[lh]), lh[0], lh[1]))


def layer_budgets(heads_per_layer: list[int], budget: int, floor: int) -> list[int]:
    """Split ``budget`` kept heads over layers in proportion to their head counts (see module doc)."""
    total = sum(heads_per_layer)
    quota = [budget * n / total for n in heads_per_layer]
    out = [min(floor, n) for n in heads_per_layer]
    for _ in range(budget - sum(out)):
        open_layers = [l for l, n in enumerate(heads_per_layer) if out[l] < n]
        best = max(open_layers, key=lambda l: (quota[l] - out[l], -l))
        out[best] += 1
    return out


def keep_mask(
    scores: HeadScores,
    *,
    ratio: float | None = None,
    budget: int | None = None,
    scope: str = "global",
    min_heads_per_layer: int = 1,
    fork: int = 0,
) -> torch.Tensor:
    """Which heads to keep.

    Args:
        scores: head scores (higher = keep).
        ratio: fraction of heads to prune, in ``[0, 1)``.
        budget: number of heads to keep, in ``[layers * min_heads_per_layer, total heads]``.
        scope: ``"global"`` or ``"layer"``.
        min_heads_per_layer: floor of kept heads per layer (>= 1, at most the smallest layer).
        fork: layers before it keep every head (a Hydra model's shared trunk, run once); the
            ratio, budget and scope apply to the layers from ``fork`` on only.

    Returns:
        bool ``[layers, max_heads]``; False past a layer's head count.

    Raises:
        ValueError: naming the argument and value (both or neither of ratio/budget, out of
            range, unknown scope, NaN score on an existing head).
    """
    check_choice("scope", scope, SCOPES)
    hpl = list(scores.heads_per_layer)
    fork = check_int("fork", fork, lo=0, hi=len(hpl) - 1)
    if fork:  # plan the member layers alone; the trunk keeps every head
        tail = dataclasses.replace(scores, scores=scores.scores[fork:, : max(hpl[fork:])].clone(),
                                   heads_per_layer=hpl[fork:])
        planned = keep_mask(tail, ratio=ratio, budget=budget, scope=scope, min_heads_per_layer=min_heads_per_layer)
        keep = torch.zeros(len(hpl), max(hpl), dtype=torch.bool)
        for l, n in enumerate(hpl[:fork]):
            keep[l, :n] = True
        keep[fork:, : planned.shape[1]] = planned
        return keep
    n_layers, total = len(hpl), sum(hpl)
    floor = check_int("min_heads_per_layer", min_heads_per_layer, lo=1)
    if floor > min(hpl):
        layer = hpl.index(min(hpl))
        raise ValueError(f"min_heads_per_layer={floor} exceeds the {hpl[layer]} heads of layer {layer}")
    if (ratio is None) == (budget is None):
        raise ValueError(f"give exactly one of ratio and budget; got ratio={ratio!r}, budget={budget!r}")
    s = scores.scores
    heads = [(l, h) for l, n in enumerate(hpl) for h in range(n)]
    nan = [lh for lh in heads if math.isnan(float(s[lh]))]
    if nan:
        raise ValueError(f"scores ({scores.criterion}) are NaN for existing heads, e.g. {nan[:3]}")

    if ratio is not None:
        ratio = check_float("ratio", ratio, lo=0.0, hi=1.0, hi_open=True)
        if scope == "global":
            per_layer = None
            want = total - math.floor(ratio * total + _EPS)
            count = max(want, n_layers * floor)
            if count > want:
                log.info(
                    "keep_mask: ratio=%.3g leaves %d heads; the floor of %d per layer keeps %d",
                    ratio,
                    want,
                    floor,
                    count,
                )
        else:
            per_layer = [max(floor, n - math.floor(ratio * n + _EPS)) for n in hpl]
            count = sum(per_layer)
    else:
        count = check_int("budget", budget, lo=n_layers * floor, hi=total)
        per_layer = layer_budgets(hpl, count, floor) if scope == "layer" else None

    keep = torch.zeros(n_layers, max(hpl), dtype=torch.bool)
    if per_layer is not None:
        for l, n in enumerate(hpl):
            for lh in _order(s, [(l, h) for h in range(n)])[: per_layer[l]]:
                keep[lh] = True
    else:
        for l, n in enumerate(hpl):
            for lh in _order(s, [(l, h) for h in range(n)])[:floor]:
                keep[lh] = True
        left = count - n_layers * floor
        for lh in _order(s, heads):
            if left == 0:
                break
            if not keep[lh]:
                keep[lh] = True
                left -= 1
    log.info(
        "keep_mask (%s, scope=%s, %s): keep %d of %d heads; pruned %s",
        scores.criterion,
        scope,
        f"ratio={ratio}" if ratio is not None else f"budget={budget}",
        int(keep.sum()),
        total,
        pruned_heads(keep, hpl),
    )
    return keep


def pruned_heads(keep: torch.Tensor, heads_per_layer: list[int]) -> dict[int, list[int]]:
    """``{layer: [pruned head indices]}`` for a keep mask."""
    return {l: [h for h in range(n) if not bool(keep[l, h])] for l, n in enumerate(heads_per_layer)}
