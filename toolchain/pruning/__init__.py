"""Pruning plans, diverse ensemble members, diversity measures and recovery fine-tuning.

* :func:`keep_mask` - scores -> bool ``[layers, max_heads]`` keep mask (ratio or budget,
  global or per layer, a per-layer floor, deterministic ties).
* :func:`make_members` / :class:`Member` - ``M`` seeded members (bootstrap, seeds, ratios,
  circuit-samples).
* :func:`pairwise_jaccard`, :func:`prediction_disagreement` - member diversity.
* :func:`finetune` - seeded AdamW + linear-schedule training loop for any adapter model.
"""

from toolchain.pruning.diversity import jaccard, pairwise_jaccard, prediction_disagreement
from toolchain.pruning.finetune import epoch_seed, finetune
from toolchain.pruning.members import STRATEGIES, Member, make_members, member_seed
from toolchain.pruning.plan import SCOPES, keep_mask, layer_budgets, pruned_heads

__all__ = [
    "SCOPES",
    "STRATEGIES",
    "Member",
    "epoch_seed",
    "finetune",
    "jaccard",
    "keep_mask",
    "layer_budgets",
    "make_members",
    "member_seed",
    "pairwise_jaccard",
    "prediction_disagreement",
    "pruned_heads",
]
