"""Head-importance criteria, all returning :class:`HeadScores` (higher = more important).

* :func:`score_heads` - the registry entry point (``his``, ``taylor``, ``entropy``, ``hies``,
  ``l2``, ``random``, ``circuit``); one module per criterion.
* :class:`HeadScores` - float64 ``[layers, max_heads]`` scores (NaN past a layer's heads) with
  provenance (criterion, params, calibration-data hash), JSON and heatmap output.
* Pure helpers: :func:`attention_entropy`, :func:`minmax`, :func:`combine_hies`,
  :func:`objective_value`, :func:`evaluate_masks`; calibration utilities in
  :mod:`toolchain.scoring.calibration`.
"""

from toolchain.scoring.calibration import OOD_LABEL, as_calibration, data_hash, subset
from toolchain.scoring.circuit import circuit_scores, evaluate_masks, objective_value
from toolchain.scoring.entropy import attention_entropy, entropy_scores, mean_attention_entropy
from toolchain.scoring.hies import combine_hies, hies_scores, minmax
from toolchain.scoring.his import his_scores
from toolchain.scoring.l2 import l2_scores
from toolchain.scoring.random_baseline import random_scores
from toolchain.scoring.registry import CRITERIA, SEEDED_CRITERIA, criterion_params, score_heads
from toolchain.scoring.scores import HeadScores
from toolchain.scoring.taylor import taylor_scores

__all__ = [
    "CRITERIA",
    "OOD_LABEL",
    "SEEDED_CRITERIA",
    "HeadScores",
    "as_calibration",
    "attention_entropy",
    "circuit_scores",
    "combine_hies",
    "criterion_params",
    "data_hash",
    "entropy_scores",
    "evaluate_masks",
    "hies_scores",
    "his_scores",
    "l2_scores",
    "mean_attention_entropy",
    "minmax",
    "objective_value",
    "random_scores",
    "score_heads",
    "subset",
    "taylor_scores",
]
