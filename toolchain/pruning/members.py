"""Diverse ensemble members: ``M`` keep masks of one model, each seeded and reproducible.

Strategies (how the members come to differ):

* ``"bootstrap"`` - member ``i`` scores the heads on a bootstrap resample (``N`` draws with
  replacement, from its own seed) of the ``N`` calibration samples, then plans;
* ``"seeds"`` - a seeded criterion (``random``) gets each member's seed; a deterministic
  criterion would give ``M`` identical members and is rejected;
* ``"ratios"`` - one scoring on all the data, a different ``ratio`` (or ``budget``) per member:
  pass a sequence of ``M`` values;
* ``"circuit-samples"`` - member ``i`` scores on its own random subset (without replacement,
  ``subset_size`` samples, default half) of the calibration data; made for ``circuit`` (Hydra's
  likely recipe) but works with any criterion.

Member ``i``'s seed is ``SeedSequence([seed, i])``'s first 32-bit word: distinct streams for
every (seed, member) pair, the same on every machine. Resampled rows stay in their original
batches (see :func:`toolchain.scoring.calibration.subset`).

For ``circuit`` members pass ``budget = n_heads * layers``: the circuit's scores make any such
plan keep exactly the circuit.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from toolchain.pruning.plan import keep_mask
from toolchain.scoring._checks import check_choice, check_int
from toolchain.scoring.calibration import as_calibration, num_samples, subset
from toolchain.scoring.registry import SEEDED_CRITERIA, score_heads
from toolchain.scoring.scores import HeadScores

__all__ = ["STRATEGIES", "Member", "make_members", "member_seed"]

log = logging.getLogger(__name__)

STRATEGIES = ("bootstrap", "seeds", "ratios", "circuit-samples")


def member_seed(seed: int, index: int) -> int:
    """Seed of member ``index`` of an ensemble built with ``seed`` (a 32-bit int)."""
    return int(np.random.SeedSequence([int(seed), int(index)]).generate_state(1)[0])


@dataclass
class Member:
    """One ensemble member: its keep mask and how it was chosen.

    Attributes:
        index: position in the ensemble.
        seed: the member's own seed (:func:`member_seed`).
        keep: bool ``[layers, max_heads]``.
        scores: the head scores its plan used.
        ratio: prune ratio of its plan (or None).
        budget: kept-head budget of its plan (or None).
        sample_indices: calibration samples it scored on (flat positions, repeats for a
            bootstrap), None when it used all of them.
    """

    index: int
    seed: int
    keep: torch.Tensor
    scores: HeadScores
    ratio: float | None = None
    budget: int | None = None
    sample_indices: list[int] | None = field(default=None, repr=False)

    @property
    def num_kept(self) -> int:
        """Number of kept heads."""
        return int(self.keep.sum())

    def kept_heads(self) -> list[tuple[int, int]]:
        """Kept ``(layer, head)`` pairs in index order."""
        return [(int(l), int(h)) for l, h in torch.nonzero(self.keep).tolist()]

    def to_dict(self) -> dict[str, Any]:
        """JSON-able summary (the scores as their own dict)."""
        return {
            "index": self.index,
            "seed": self.seed,
            "ratio": self.ratio,
            "budget": self.budget,
            "keep": self.keep.tolist(),
            "num_kept": self.num_kept,
            "sample_indices": self.sample_indices,
            "scores": self.scores.to_dict(),
        }


def _per_member(name: str, value: Any, m: int, vary: bool) -> list[Any]:
    if value is None:
        return [None] * m
    if isinstance(value, Sequence) and not isinstance(value, str):
        if not vary:
            raise ValueError(f"{name}={value!r}: a sequence is only allowed with strategy='ratios'")
        if len(value) != m:
            raise ValueError(
                f"{name}={value!r} has {len(value)} values; strategy='ratios' needs one per member (m={m})"
            )
        return list(value)
    if vary:
        raise ValueError(f"strategy='ratios' needs {name} as a sequence of m={m} values, got {value!r}")
    return [value] * m


def make_members(
    adapter: object,
    calib: object,
    *,
    m: int,
    criterion: str,
    strategy: str,
    ratio: float | Sequence[float] | None = None,
    budget: int | Sequence[int] | None = None,
    seed: int = 0,
    scope: str = "global",
    min_heads_per_layer: int = 1,
    subset_size: int | None = None,
    **params: Any,
) -> list[Member]:
    """Build ``m`` members of one model.

    Args:
        adapter: a :class:`toolchain.models.ModelAdapter`.
        calib: iterable of ``(batch dict, labels [B])`` (may be None for ``seeds`` with ``random``).
        m: number of members, >= 1.
        criterion: a :data:`toolchain.scoring.CRITERIA` name.
        strategy: one of :data:`STRATEGIES`.
        ratio: prune ratio (a sequence of ``m`` for ``"ratios"``).
        budget: kept-head budget (a sequence of ``m`` for ``"ratios"``).
        seed: ensemble seed; member seeds derive from it.
        scope: plan scope (``"global"`` / ``"layer"``).
        min_heads_per_layer: plan floor.
        subset_size: samples per member for ``"circuit-samples"`` (default half, at least 1).
        **params: the criterion's parameters.

    Raises:
        ValueError: naming the argument and value.
    """
    m = check_int("m", m, lo=1)
    check_choice("strategy", strategy, STRATEGIES)
    seed = check_int("seed", seed, lo=0)
    vary = strategy == "ratios"
    if (ratio is None) == (budget is None):
        raise ValueError(f"give exactly one of ratio and budget; got ratio={ratio!r}, budget={budget!r}")
    ratios = _per_member("ratio", ratio, m, vary)
    budgets = _per_member("budget", budget, m, vary)
    if strategy == "seeds":
        if criterion not in SEEDED_CRITERIA:
            raise ValueError(
                f"strategy='seeds' needs a seeded criterion ({', '.join(SEEDED_CRITERIA)}); criterion={criterion!r} "
                "is deterministic and would give identical members"
            )
        if "seed" in params:
            raise ValueError(
                "strategy='seeds' sets each member's criterion seed; do not pass seed= in params"
            )
    data = as_calibration(calib, allow_empty=strategy == "seeds")
    n = num_samples(data)
    if strategy == "circuit-samples":
        size = max(1, n // 2) if subset_size is None else check_int("subset_size", subset_size, lo=1, hi=n)
    elif subset_size is not None:
        raise ValueError(f"subset_size={subset_size!r} is only used by strategy='circuit-samples'")

    shared: HeadScores | None = (
        score_heads(adapter, data, criterion, **params) if strategy == "ratios" else None
    )
    members = []
    for i in range(m):
        s_i = member_seed(seed, i)
        indices = None
        if strategy == "ratios":
            scores = shared
        elif strategy == "seeds":
            scores = score_heads(adapter, data, criterion, **params, seed=s_i)
        else:
            rng = np.random.default_rng(s_i)
            if strategy == "bootstrap":
                idx = np.sort(rng.integers(0, n, size=n))
            else:
                idx = np.sort(rng.choice(n, size=size, replace=False))
            indices = [int(v) for v in idx]
            scores = score_heads(adapter, subset(data, idx), criterion, **params)
        keep = keep_mask(
            scores, ratio=ratios[i], budget=budgets[i], scope=scope, min_heads_per_layer=min_heads_per_layer
        )
        members.append(Member(i, s_i, keep, scores, ratios[i], budgets[i], indices))
        log.info("member %d (seed %d, %s): keeps %d heads", i, s_i, strategy, int(keep.sum()))
    return members
