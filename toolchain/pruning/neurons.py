"""The split of every layer's MLP neurons among Hydra members (issue 45), by neuron scores.

Each member keeps its own subset of every layer's MLP intermediate neurons: a shared core of the
best neurons, the rest dealt among members like heads under the ``"partition"`` strategy
(:func:`toolchain.pruning.members.partition_layer`). With a late fork the layers before ``fork``
stay whole (and shared, frozen during recovery: :meth:`ModelAdapter.freeze_layers`). The scores come
from :func:`toolchain.scoring.neurons.neuron_scores`; the lists feed ``ModelAdapter.prune(keep, neurons)``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from toolchain.pruning.members import partition_layer
from toolchain.scoring._checks import check_float, check_int

__all__ = ["split_neurons"]


def split_neurons(scores: Sequence[torch.Tensor], members: int, share: float, core: float = 0.0,
                  fork: int = 0) -> list[list[list[int]]]:
    """Each member's kept MLP neurons: ``[member][layer]`` sorted index lists.

    Layers before ``fork`` keep every neuron for every member. In a later layer of ``I`` neurons
    each member keeps ``n = max(1, round(share * I))``: the best ``c = round(core * I)`` (the core,
    shared by all members) and ``n - c`` dealt by
    :func:`~toolchain.pruning.members.partition_layer` over the neurons ranked by descending
    score (ties: lower index first); members are disjoint outside the core while
    ``members * (n - c) <= I - c`` (e.g. ``share = 1 / members``, ``core = 0``). ``round`` is
    Python's (halves to even).

    Args:
        scores: one tensor ``[I_l]`` per layer (:func:`neuron_scores`); the layers from ``fork``
            on must have no NaN.
        members: number of members (>= 1).
        share: fraction of each forked layer's neurons a member keeps, in ``(0, 1]``.
        core: fraction of each forked layer's neurons every member keeps, in ``[0, share]``.
        fork: the first layer whose neurons are split, in ``[0, len(scores)]``.
    """
    m = check_int("members", members, lo=1)
    share = check_float("share", share, lo=0.0, hi=1.0, lo_open=True)
    core = check_float("core", core, lo=0.0, hi=share)
    fork = check_int("fork", fork, lo=0, hi=len(scores))
    out: list[list[list[int]]] = [[] for _ in range(m)]
    for l, layer_scores in enumerate(scores):
        s = torch.as_tensor(layer_scores, dtype=torch.float64)
        if s.dim() != 1 or s.numel() == 0:
            raise ValueError(f"scores[{l}] must be a non-empty 1-D tensor (one score per neuron); "
                             f"got shape {tuple(s.shape)}")
        width = int(s.numel())
        if l < fork:
            for kept in out:
                kept.append(list(range(width)))
            continue
        if bool(torch.isnan(s).any()):
            raise ValueError(f"scores[{l}] has NaN scores but layer {l} is split (fork={fork}); "
                             f"score the layers from {fork} on")
        n = max(1, round(share * width))
        c = min(round(core * width), n)
        values = s.tolist()
        ranked = sorted(range(width), key=lambda j: (-values[j], j))
        for kept, dealt in zip(out, partition_layer(ranked, n, m, c), strict=True):
            kept.append(sorted(dealt))
    return out
