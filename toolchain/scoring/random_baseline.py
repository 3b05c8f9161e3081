"""Random baseline: i.i.d. uniform scores from a seeded generator (the ``random`` criterion)."""

from __future__ import annotations

import logging

import torch

from toolchain.scoring._checks import check_int
from toolchain.scoring.calibration import as_calibration, data_hash
from toolchain.scoring.scores import HeadScores, nan_scores

__all__ = ["random_scores"]

log = logging.getLogger(__name__)


def random_scores(adapter: object, calib: object = None, *, seed: int = 0) -> HeadScores:
    """Uniform ``[0, 1)`` scores from ``torch.Generator().manual_seed(seed)``; ``calib`` is ignored.

    The draw covers the full ``[layers, max_heads]`` grid in row-major order, so a seed gives
    the same scores for the same grid on every machine.
    """
    seed = check_int("seed", seed, lo=0)
    data = as_calibration(calib, allow_empty=True)
    hpl = adapter.heads_per_layer()
    g = torch.Generator().manual_seed(seed)
    draw = torch.rand(len(hpl), max(hpl), generator=g, dtype=torch.float64)
    scores = nan_scores(hpl)
    for l, n in enumerate(hpl):
        scores[l, :n] = draw[l, :n]
    log.info("random: scored %d heads with seed %d", sum(hpl), seed)
    return HeadScores(
        scores=scores,
        criterion="random",
        params={"seed": seed},
        data_hash=data_hash(data),
        heads_per_layer=hpl,
    )
