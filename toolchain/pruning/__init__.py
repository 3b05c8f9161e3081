"""Pruning plans, diverse ensemble members, diversity measures and recovery fine-tuning.

* :func:`keep_mask` - scores -> bool ``[layers, max_heads]`` keep mask (ratio or budget,
  global or per layer, a per-layer floor, deterministic ties).
* :func:`make_members` / :class:`Member` - ``M`` seeded members (bootstrap, seeds, ratios,
  circuit-samples, partition, sampled, mixed-criteria).
* :func:`pairwise_jaccard`, :func:`prediction_disagreement`, :func:`pairwise_kl` - member diversity.
* :func:`finetune` - seeded AdamW + linear-schedule training loop for any adapter model.
"""

from toolchain.pruning.diversity import jaccard, pairwise_jaccard, pairwise_kl, prediction_disagreement
from toolchain.pruning.finetune import epoch_seed, finetune
from toolchain.pruning.members import (
    STRATEGIES,
    Member,
    gumbel_perturb,
    make_members,
    member_seed,
    partition_layer,
)
from toolchain.pruning.plan import SCOPES, keep_mask, layer_budgets, pruned_heads

__all__ = [
    "SCOPES",
    "STRATEGIES",
    "Member",
    "epoch_seed",
    "finetune",
    "gumbel_perturb",
    "jaccard",
    "keep_mask",
    "layer_budgets",
    "make_members",
    "member_seed",
    "pairwise_jaccard",
    "pairwise_kl",
    "partition_layer",
    "prediction_disagreement",
    "pruned_heads",
]
