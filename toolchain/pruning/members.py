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
  likely recipe) but works with any criterion;
* ``"partition"`` - one scoring on all the data, then the heads are *dealt out* (see
  :func:`partition_layer`): the plan (:func:`~toolchain.pruning.plan.keep_mask` with the given
  ratio/budget, scope and floor) fixes how many heads ``k_l`` layer ``l`` keeps; every member keeps
  the layer's best ``c = min(core, k_l)`` heads (the shared core, ``core=0`` by default) and
  ``k_l - c`` heads from those ranked below the core. Those are dealt in snake order (member
  ``0, 1, ..., M-1, M-1, ..., 0, 0, 1, ...``, best heads first), so the members' non-core heads are
  pairwise disjoint whenever ``H_l - c >= M (k_l - c)``; otherwise every head below the core is
  used ``floor(M (k_l - c) / (H_l - c))`` or one more time (the better heads the extra time), which
  minimises the total pairwise overlap, and no member gets a head twice. Deterministic except that
  heads of exactly equal score are ordered by a permutation drawn from ``seed``;
* ``"sampled"`` - Gumbel-top-k: one scoring on all the data, scores min-max normalised over the
  existing heads to ``[0, 1]`` (all ``0`` when they are all equal), member ``i`` plans on
  ``normalised / temperature + Gumbel(0, 1)`` noise drawn from its own seed. ``temperature=0``
  plans on the raw scores (identical members, a warning is logged); ``temperature=inf`` plans on
  the noise alone (a uniformly random plan). The plan and the head count are the same as without
  noise;
* ``"mixed-criteria"`` - member ``i`` scores all the data with its own criterion
  ``criteria[i]``; ``**params`` go to every listed criterion that accepts them and
  ``criterion_params={name: {...}}`` to one criterion only (overriding ``**params``). A seeded
  criterion (``random``) gets the member's seed unless a ``seed`` is given.

Member ``i``'s seed is ``SeedSequence([seed, i])``'s first 32-bit word: distinct streams for
every (seed, member) pair, the same on every machine. Resampled rows stay in their original
batches (see :func:`toolchain.scoring.calibration.subset`). Every strategy keeps the plan's head
count (budget, or the count a ratio gives) and its per-layer floor, for both scopes.

For ``circuit`` members pass ``budget = n_heads * layers``: the circuit's scores make any such
plan keep exactly the circuit.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch

from toolchain.pruning.plan import keep_mask
from toolchain.scoring._checks import check_choice, check_int
from toolchain.scoring.calibration import as_calibration, num_samples, subset
from toolchain.scoring.registry import CRITERIA, SEEDED_CRITERIA, score_heads
from toolchain.scoring.registry import criterion_params as accepted_params
from toolchain.scoring.scores import HeadScores, jsonable

__all__ = ["STRATEGIES", "Member", "gumbel_perturb", "make_members", "member_seed", "partition_layer"]

log = logging.getLogger(__name__)

STRATEGIES = ("bootstrap", "seeds", "ratios", "circuit-samples", "partition", "sampled", "mixed-criteria")
#: strategies that score once on all the data (or per member on all of it): no calibration
#: data is needed when the criterion reads none (``l2``, ``random``)
_ALL_DATA = ("seeds", "partition", "sampled", "mixed-criteria")


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
        scores: the head scores it was planned from (for ``"sampled"`` the unperturbed scores;
            the perturbed ones are in ``extras["perturbed"]``).
        ratio: prune ratio of its plan (or None).
        budget: kept-head budget of its plan (or None).
        sample_indices: calibration samples it scored on (flat positions, repeats for a
            bootstrap), None when it used all of them.
        extras: strategy details, JSON-able: ``"partition"``: ``core`` (the shared ``[layer, head]``
            pairs) and ``core_size``; ``"sampled"``: ``temperature`` (None for inf) and
            ``perturbed`` (the ``[layers, max_heads]`` scores planned on, NaN past a layer's heads
            as None).
    """

    index: int
    seed: int
    keep: torch.Tensor
    scores: HeadScores
    ratio: float | None = None
    budget: int | None = None
    sample_indices: list[int] | None = field(default=None, repr=False)
    extras: dict[str, Any] = field(default_factory=dict, repr=False)

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
            "extras": jsonable(self.extras),
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


# ---------------------------------------------------------------------------------- partition
def partition_layer(ranked: Sequence[int], keep: int, m: int, core: int) -> list[list[int]]:
    """Deal one layer's heads to ``m`` members (the ``"partition"`` strategy, see the module doc).

    Args:
        ranked: the layer's head indices, best first.
        keep: heads every member keeps in this layer (``k_l``), ``1 <= keep <= len(ranked)``.
        m: number of members.
        core: shared core size; the core is the best ``min(core, keep)`` heads.

    Returns:
        ``m`` lists of ``keep`` distinct head indices: the core first, then the member's dealt
        heads in the order dealt.
    """
    c = min(core, keep)
    shared, pool = list(ranked[:c]), list(ranked[c:])
    r, p = keep - c, len(pool)
    dealt: list[list[int]] = [[] for _ in range(m)]
    if r == 0:
        return [list(shared) for _ in range(m)]
    if m * r <= p:  # disjoint: snake over the best m * r heads below the core
        for t in range(m * r):
            rnd, pos = divmod(t, m)
            dealt[pos if rnd % 2 == 0 else m - 1 - pos].append(pool[t])
    else:
        # overlap is unavoidable: head j is used q or q + 1 times (the best s heads q + 1), its
        # copies are consecutive in the deal and dealt round-robin, so (q + 1 <= m) no member
        # gets one head twice, and every member gets exactly r heads
        q, s = divmod(m * r, p)
        seq = [h for j, h in enumerate(pool) for _ in range(q + (j < s))]
        for t, h in enumerate(seq):
            dealt[t % m].append(h)
    return [shared + d for d in dealt]


def _partition_masks(
    scores: HeadScores, plan: torch.Tensor, m: int, core: int, seed: int
) -> tuple[list[torch.Tensor], list[list[int]]]:
    tie = np.random.default_rng(seed)
    masks = [torch.zeros_like(plan) for _ in range(m)]
    cores: list[list[int]] = []
    for l, n in enumerate(scores.heads_per_layer):
        perm = tie.permutation(n)  # order of heads with exactly equal scores
        ranked = sorted(range(n), key=lambda h: (-float(scores.scores[l, h]), int(perm[h])))
        k = int(plan[l].sum())
        for i, heads in enumerate(partition_layer(ranked, k, m, core)):
            masks[i][l, heads] = True
        cores.extend([l, h] for h in sorted(ranked[: min(core, k)]))
    return masks, cores


# ------------------------------------------------------------------------------------ sampled
def _check_temperature(temperature: Any) -> float:
    if isinstance(temperature, bool) or not hasattr(temperature, "__float__"):
        raise ValueError(f"temperature must be a number, got {temperature!r}")
    t = float(temperature)
    if math.isnan(t) or t < 0:
        raise ValueError(f"temperature={temperature!r} is out of range; it must lie in [0, inf]")
    return t


def gumbel_perturb(scores: HeadScores, temperature: float, seed: int) -> HeadScores:
    """Scores for one ``"sampled"`` member: ``minmax(scores) / temperature + Gumbel(0, 1)``.

    Args:
        scores: the criterion's scores (higher = keep).
        temperature: ``> 0`` (``inf``: noise only); at 0 use the raw scores instead.
        seed: the member's seed (the noise stream).

    Returns:
        A copy of ``scores`` whose existing heads carry the perturbed scores (NaN elsewhere).
    """
    valid = scores.valid_mask()
    raw = scores.scores[valid].numpy()
    lo, hi = float(raw.min()), float(raw.max())
    norm = (raw - lo) / (hi - lo) if hi > lo else np.zeros_like(raw)
    noise = np.random.default_rng(seed).gumbel(size=raw.shape)
    signal = np.zeros_like(raw) if math.isinf(temperature) else norm / temperature
    out = torch.full_like(scores.scores, float("nan"))
    out[valid] = torch.from_numpy(signal + noise)
    return replace(scores, scores=out)


# ----------------------------------------------------------------------------- mixed-criteria
def _check_criteria(criteria: Any, m: int) -> list[str]:
    if criteria is None or isinstance(criteria, str) or not isinstance(criteria, Sequence):
        raise ValueError(f"strategy='mixed-criteria' needs criteria as a sequence of m={m} names, got {criteria!r}")
    if len(criteria) != m:
        raise ValueError(f"criteria={list(criteria)!r} has {len(criteria)} names; it needs one per member (m={m})")
    for i, name in enumerate(criteria):
        if not isinstance(name, str) or name not in CRITERIA:
            raise ValueError(f"criteria[{i}]={name!r} is unknown; known criteria: {', '.join(CRITERIA)}")
    return list(criteria)


def _mixed_params(
    criteria: list[str], shared: dict[str, Any], per_criterion: Mapping[str, Mapping[str, Any]] | None
) -> dict[str, dict[str, Any]]:
    per_criterion = {} if per_criterion is None else per_criterion
    if not isinstance(per_criterion, Mapping):
        raise ValueError(f"criterion_params must be a dict {{criterion: {{param: value}}}}, got {per_criterion!r}")
    extra = sorted(set(per_criterion) - set(criteria))
    if extra:
        raise ValueError(f"criterion_params names {extra}, which are not in criteria={criteria!r}")
    accepted = {c: accepted_params(c) for c in criteria}
    unused = sorted(k for k in shared if not any(k in accepted[c] for c in criteria))
    if unused:
        raise ValueError(f"parameter(s) {unused} are accepted by none of criteria={criteria!r}")
    out = {}
    for c in dict.fromkeys(criteria):
        own = per_criterion.get(c, {})
        if not isinstance(own, Mapping):
            raise ValueError(f"criterion_params[{c!r}] must be a dict of parameters, got {own!r}")
        out[c] = {**{k: v for k, v in shared.items() if k in accepted[c]}, **own}
    return out


# ---------------------------------------------------------------------------------- members
def make_members(
    adapter: object,
    calib: object,
    *,
    m: int,
    criterion: str | None = None,
    strategy: str,
    ratio: float | Sequence[float] | None = None,
    budget: int | Sequence[int] | None = None,
    seed: int = 0,
    scope: str = "global",
    min_heads_per_layer: int = 1,
    subset_size: int | None = None,
    core: int | None = None,
    temperature: float | None = None,
    criteria: Sequence[str] | None = None,
    criterion_params: Mapping[str, Mapping[str, Any]] | None = None,
    fork: int = 0,
    **params: Any,
) -> list[Member]:
    """Build ``m`` members of one model.

    Args:
        adapter: a :class:`toolchain.models.ModelAdapter`.
        calib: iterable of ``(batch dict, labels [B])`` (may be None for the strategies that score
            on all the data, ``seeds`` / ``partition`` / ``sampled`` / ``mixed-criteria``, when the
            criteria read no data: ``l2``, ``random``).
        m: number of members, >= 1.
        criterion: a :data:`toolchain.scoring.CRITERIA` name; required, except with
            ``"mixed-criteria"``, which takes ``criteria`` instead and rejects it.
        strategy: one of :data:`STRATEGIES`.
        ratio: prune ratio (a sequence of ``m`` for ``"ratios"``).
        budget: kept-head budget (a sequence of ``m`` for ``"ratios"``).
        seed: ensemble seed; member seeds derive from it.
        scope: plan scope (``"global"`` / ``"layer"``).
        min_heads_per_layer: plan floor.
        subset_size: samples per member for ``"circuit-samples"`` (default half, at least 1).
        core: shared core heads per layer for ``"partition"`` (default 0), >= 0.
        temperature: Gumbel-top-k temperature for ``"sampled"`` (default 1.0), in ``[0, inf]``.
        criteria: ``m`` criterion names for ``"mixed-criteria"`` (member ``i`` uses ``criteria[i]``).
        fork: layers before it keep every head in every member (a Hydra model's shared trunk); the
            plan (ratio, budget, scope, floor) covers the layers from ``fork`` on. Scoring still sees
            every layer (a circuit search steps through the trunk too; its scores there are unused).
        criterion_params: ``{criterion: {param: value}}`` for ``"mixed-criteria"``: parameters of one
            criterion only (they override ``**params``).
        **params: the criterion's parameters (for ``"mixed-criteria"``: given to every listed
            criterion that accepts them; each must be accepted by at least one).

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
    for name, value, owner in (
        ("subset_size", subset_size, "circuit-samples"),
        ("core", core, "partition"),
        ("temperature", temperature, "sampled"),
        ("criteria", criteria, "mixed-criteria"),
        ("criterion_params", criterion_params, "mixed-criteria"),
    ):
        if value is not None and strategy != owner:
            raise ValueError(f"{name}={value!r} is only used by strategy={owner!r}")
    if strategy == "mixed-criteria":
        if criterion is not None:
            raise ValueError(
                f"criterion={criterion!r}: strategy='mixed-criteria' takes one criterion per member in criteria=[...]"
            )
        names = _check_criteria(criteria, m)
        mixed = _mixed_params(names, params, criterion_params)
    elif criterion is None:
        raise ValueError(f"criterion is required for strategy={strategy!r}")
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
    if fork and strategy != "mixed-criteria" and "fork" in accepted_params(criterion):
        params = {**params, "fork": fork}  # a search that steps through the layers (circuit) skips the trunk
    elif fork and strategy == "mixed-criteria":
        mixed = {c: {**kw, "fork": fork} if "fork" in accepted_params(c) else kw for c, kw in mixed.items()}
    core = 0 if core is None else check_int("core", core, lo=0)
    temp = 1.0 if temperature is None else _check_temperature(temperature)
    data = as_calibration(calib, allow_empty=strategy in _ALL_DATA)
    n = num_samples(data)
    if strategy == "circuit-samples":
        size = max(1, n // 2) if subset_size is None else check_int("subset_size", subset_size, lo=1, hi=n)

    plan_args = {"scope": scope, "min_heads_per_layer": min_heads_per_layer, "fork": fork}
    shared: HeadScores | None = (
        score_heads(adapter, data, criterion, **params) if strategy in ("ratios", "partition", "sampled") else None
    )
    if strategy == "partition":
        plan = keep_mask(shared, ratio=ratios[0], budget=budgets[0], **plan_args)
        part_masks, core_heads = _partition_masks(shared, plan, m, core, seed)
    if strategy == "sampled" and temp == 0.0 and m > 1:
        log.warning("sampled members at temperature=0 plan on the raw scores: all %d members are identical", m)
    cache: dict[str, HeadScores] = {}
    members = []
    for i in range(m):
        s_i = member_seed(seed, i)
        indices = None
        extras: dict[str, Any] = {}
        keep = None
        if strategy in ("ratios", "partition", "sampled"):
            scores = shared
        elif strategy == "seeds":
            scores = score_heads(adapter, data, criterion, **params, seed=s_i)
        elif strategy == "mixed-criteria":
            scores = _mixed_member_scores(adapter, data, names, mixed, i, s_i, cache)
        else:
            rng = np.random.default_rng(s_i)
            if strategy == "bootstrap":
                idx = np.sort(rng.integers(0, n, size=n))
            else:
                idx = np.sort(rng.choice(n, size=size, replace=False))
            indices = [int(v) for v in idx]
            scores = score_heads(adapter, subset(data, idx), criterion, **params)
        if strategy == "partition":
            keep = part_masks[i]
            extras = {"core_size": core, "core": core_heads}
        elif strategy == "sampled":
            planned = scores if temp == 0.0 else gumbel_perturb(scores, temp, s_i)
            keep = keep_mask(planned, ratio=ratios[i], budget=budgets[i], **plan_args)
            extras = {
                "temperature": None if math.isinf(temp) else temp,
                "perturbed": [[None if math.isnan(v) else v for v in row] for row in planned.scores.tolist()],
            }
        else:
            keep = keep_mask(scores, ratio=ratios[i], budget=budgets[i], **plan_args)
        members.append(Member(i, s_i, keep, scores, ratios[i], budgets[i], indices, extras))
        log.info(
            "member %d (seed %d, %s, %s): keeps %d heads", i, s_i, strategy, scores.criterion, int(keep.sum())
        )
    return members


def _mixed_member_scores(
    adapter: object,
    data: object,
    names: list[str],
    params: dict[str, dict[str, Any]],
    i: int,
    s_i: int,
    cache: dict[str, HeadScores],
) -> HeadScores:
    """Member ``i``'s scores under ``names[i]``; deterministic criteria are scored once per name."""
    name = names[i]
    own = dict(params[name])
    if name in SEEDED_CRITERIA and "seed" not in own:
        own["seed"] = s_i
        return score_heads(adapter, data, name, **own)
    if name in cache:
        log.warning("members %d and %d use the same criterion %r and get identical scores", names.index(name), i, name)
        return cache[name]
    cache[name] = score_heads(adapter, data, name, **own)
    return cache[name]
