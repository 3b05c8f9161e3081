"""Criterion registry: :func:`score_heads` dispatches by name to one module per criterion."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from toolchain.scoring.circuit import circuit_scores
from toolchain.scoring.entropy import entropy_scores
from toolchain.scoring.hies import hies_scores
from toolchain.scoring.his import his_scores
from toolchain.scoring.l2 import l2_scores
from toolchain.scoring.random_baseline import random_scores
from toolchain.scoring.scores import HeadScores
from toolchain.scoring.taylor import taylor_scores

__all__ = ["CRITERIA", "SEEDED_CRITERIA", "criterion_params", "score_heads"]

#: name -> ``fn(adapter, calib, **params) -> HeadScores``
CRITERIA: dict[str, Callable[..., HeadScores]] = {
    "his": his_scores,
    "taylor": taylor_scores,
    "entropy": entropy_scores,
    "hies": hies_scores,
    "l2": l2_scores,
    "random": random_scores,
    "circuit": circuit_scores,
}
#: criteria that take a ``seed`` (their scores change with it)
SEEDED_CRITERIA = ("random",)


def criterion_params(criterion: str) -> dict[str, Any]:
    """The keyword parameters of a criterion and their defaults (``inspect.Parameter.empty`` = required)."""
    fn = _lookup(criterion)
    return {
        name: p.default
        for name, p in inspect.signature(fn).parameters.items()
        if p.kind is inspect.Parameter.KEYWORD_ONLY
    }


def _lookup(criterion: str) -> Callable[..., HeadScores]:
    if not isinstance(criterion, str) or criterion not in CRITERIA:
        raise ValueError(f"criterion={criterion!r} is unknown; known criteria: {', '.join(CRITERIA)}")
    return CRITERIA[criterion]


def score_heads(adapter: object, calib: object, criterion: str, **params: Any) -> HeadScores:
    """Score every head of ``adapter``'s model with ``criterion``.

    Under an initialised ``torch.distributed`` process group (:mod:`toolchain.distributed`),
    every rank calls this with the same model and data: ``his``, ``taylor``, ``entropy`` and
    ``hies`` spread whole calibration batches over the ranks and the circuit search spreads each
    layer step's forwards; every rank gets the single-process result (per-batch float64 sums
    and logits are exchanged unchanged and combined in the single-process order; the data hash
    describes all the data). A failure on one rank ends the call on every rank
    (:class:`toolchain.distributed.RemoteRankError` on the others). Inside
    :func:`toolchain.distributed.local_only` it runs alone.

    Args:
        adapter: a :class:`toolchain.models.ModelAdapter`.
        calib: iterable of ``(batch dict, labels [B])`` (may be None for ``l2`` / ``random``).
        criterion: one of :data:`CRITERIA`.
        **params: the criterion's keyword parameters (see :func:`criterion_params`).

    Raises:
        ValueError: unknown criterion (listing the known ones), unknown or missing parameter,
            or a bad parameter value.
    """
    fn = _lookup(criterion)
    accepted = criterion_params(criterion)
    unknown = sorted(set(params) - set(accepted))
    if unknown:
        known = ", ".join(accepted) or "none"
        raise ValueError(f"criterion '{criterion}' got unknown parameter(s) {unknown}; it accepts: {known}")
    missing = [k for k, v in accepted.items() if v is inspect.Parameter.empty and k not in params]
    if missing:
        raise ValueError(f"criterion '{criterion}' needs parameter(s) {missing}")
    return fn(adapter, calib, **params)
