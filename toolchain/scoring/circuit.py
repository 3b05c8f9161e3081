"""Circuit / HeadMap layer-conditioned locating (Wang et al., ICLR 2025), with Hydra's objectives.

Algorithm: ``S = {}``. For each layer ``l`` in order, evaluate the objective with the heads
``S + {(l, h)}`` masked (gate 0) for every head ``h`` of layer ``l``, plus once with ``S`` alone
(the step's reference); add to ``S`` the ``n_heads`` heads of layer ``l`` whose masking hurts
most (ties: lower head index first). The final ``S`` (``n_heads`` per layer, or every head of a
layer that has fewer) is the circuit, which is **kept**.

Objectives, evaluated on the calibration data (labels ``>= 0`` are in-distribution classes,
:data:`~toolchain.scoring.calibration.OOD_LABEL` ``-1`` marks OOD rows):

* ``"loss"``: mean cross-entropy of the ID rows (HeadMap's task loss), damage = increase;
* ``"nll"``: mean ``-log p_y`` of the ID rows in float64 with ``p_y`` clipped at ``1e-12``
  (Hydra's uncertainty objective, meant for a held-out validation set); damage = increase.
  On the same data it equals ``"loss"`` up to rounding and the clip;
* ``"ood_auroc"``: ``sklearn.metrics.roc_auc_score`` with OOD as the positive class and score
  ``-max softmax probability``; needs ID and OOD rows; damage = the drop in AUROC.

Scores (higher = keep): each head's damage at its layer's step (objective with ``S + {h}``
masked minus the reference with ``S`` masked, for AUROC reference minus masked). Circuit heads
get ``+ offset`` with ``offset = 2 + (max damage - min damage)`` (a damage of ``-inf``, from an
undefined objective, is first set to ``min damage - 1``), so every circuit head scores
above every other head: ``keep_mask(scores, budget=n_heads * layers)`` (global or per-layer)
keeps exactly the circuit. ``extras`` holds the circuit in selection order, the damage and the
step references.

Modes: ``"batched"`` replicates each calibration batch ``K`` times with ``K`` different masks
as per-sample gates ``[K * B, layers, max_heads]`` (``K`` chosen so that ``K * B <=
max_batch_size``; a batch larger than that is split by rows); ``"looped"`` runs one forward per
mask and batch with gates ``[layers, max_heads]`` (the reference). Both feed the same float64
objective code, so they select the same heads up to float-rounding ties. Cost: ``sum_l (H_l + 1)``
mask evaluations of the whole calibration set, no gradients. A step's masks gate the layers below
``l`` alike (the circuit so far), so those layers run once per batch and each mask runs from layer
``l`` on (``evaluate_masks(share_prefix=True)``): 38% fewer layer runs on 6 x 12 heads, the same
logits where a row's result does not depend on its batch's size (bit for bit on the real MiniLM
search here: the default recipe's score stage 101 s -> 64 s with an identical ``scores.json``).

Under torch.distributed (:mod:`toolchain.distributed`) the forwards of each layer step (the same
forwards, with the same rows and masks, that one process runs) are dealt round-robin to the
ranks and their float64 logits exchanged unchanged; every rank then computes every objective
value from identical logits, so the selection is the single-process one bit for bit (given the
same per-forward numerics, i.e. the same torch build and thread count per process). A layer
step has ``ceil((H_l + 1) / masks per forward)`` forwards per calibration batch: with few, large
forwards the ranks cannot share the work evenly.
"""

from __future__ import annotations

import logging
import math

import numpy as np
import torch
import torch.nn.functional as F

from toolchain.distributed import map_shards
from toolchain.scoring._checks import check_choice, check_int
from toolchain.scoring.calibration import (
    OOD_LABEL,
    Calibration,
    as_calibration,
    check_labels,
    data_hash,
    eval_mode,
    gate_dtype,
    layers_see_batch,
    subset,
)
from toolchain.scoring.scores import HeadScores, nan_scores

__all__ = ["MODES", "OBJECTIVES", "circuit_scores", "evaluate_masks", "objective_damage", "objective_value"]

log = logging.getLogger(__name__)

OBJECTIVES = ("loss", "nll", "ood_auroc")
MODES = ("batched", "looped")
NLL_CLIP = 1e-12


def objective_value(objective: str, logits: torch.Tensor, labels: torch.Tensor, task_weight: float = 0.0) -> float:
    """The objective on ``logits [N, C]`` and ``labels [N]`` (``-1`` = OOD), computed in float64.

    ``task_weight`` (``ood_auroc`` only): the value is ``AUROC - task_weight x NLL`` of the ID rows,
    so the search also keeps heads the task needs (0: AUROC alone).
    """
    check_choice("objective", objective, OBJECTIVES)
    logits = logits.double()
    ood = labels == OOD_LABEL
    if objective == "ood_auroc":
        from sklearn.metrics import roc_auc_score

        score = -torch.softmax(logits, dim=-1).max(dim=-1).values
        auroc = float(roc_auc_score(ood.numpy().astype(np.int64), score.numpy()))
        return auroc - task_weight * objective_value("nll", logits, labels) if task_weight else auroc
    if task_weight:
        raise ValueError(f"task_weight weighs the task NLL into the ood_auroc objective; objective is {objective!r}")
    idl, idy = logits[~ood], labels[~ood]
    if objective == "loss":
        return float(F.cross_entropy(idl, idy, reduction="mean"))
    p = torch.softmax(idl, dim=-1).gather(1, idy[:, None]).squeeze(1)
    return float(-torch.log(p.clamp(min=NLL_CLIP)).mean())


def objective_damage(objective: str, masked: float, reference: float) -> float:
    """How much masking hurt: increase of a loss, drop of an AUROC (NaN -> -inf, never chosen first)."""
    d = reference - masked if objective == "ood_auroc" else masked - reference
    return d if math.isfinite(d) else -math.inf


def _chunks(n: int, size: int) -> list[tuple[int, int]]:
    return [(s, min(s + size, n)) for s in range(0, n, size)]


def _replicate(batch: dict[str, torch.Tensor], n: int, k: int) -> dict[str, torch.Tensor]:
    """Stack ``k`` copies of the per-sample tensors (mask-major: copy ``j`` is rows ``j*n..``)."""
    return {
        key: (v.repeat(k, *([1] * (v.dim() - 1))) if v.dim() > 0 and v.shape[0] == n else v)
        for key, v in batch.items()
    }


def evaluate_masks(
    adapter: object,
    data: Calibration,
    masks: torch.Tensor,
    *,
    mode: str = "batched",
    max_batch_size: int = 128,
    share_prefix: bool = True,
) -> torch.Tensor:
    """Logits of every calibration sample under every head mask.

    Args:
        adapter: a :class:`toolchain.models.ModelAdapter`.
        data: validated calibration data (:func:`~toolchain.scoring.calibration.as_calibration`).
        masks: ``[K, layers, max_heads]`` gates (1 keep, 0 mask).
        mode: ``"batched"`` (per-sample gates, several masks per forward) or ``"looped"``.
        max_batch_size: most rows in one batched forward.
        share_prefix: when the K masks agree on the first ``p`` layers (a circuit step at layer
            ``p``), run those layers once per batch and every mask from layer ``p`` on
            (:meth:`~toolchain.models.ModelAdapter.resumed`); the same logits as ``False`` where
            a row's result does not depend on its batch's size (bit for bit on the CPUs we
            measured), for ``sum_p p / (layers * (H_p + 1))`` fewer layer runs (38% for 6 x 12
            heads). ``False`` (or a model whose layer stack is unclear) runs every layer per mask.

    Returns:
        float64 ``[K, N, classes]`` (samples in calibration order).
    """
    check_choice("mode", mode, MODES)
    max_batch_size = check_int("max_batch_size", max_batch_size, lo=1)
    k_total = int(masks.shape[0])
    masks = masks.to(gate_dtype(adapter.model))
    # The work as a fixed list of forwards ("units"), independent of the number of ranks: under
    # torch.distributed each rank runs a share of the units and every rank gets every unit's
    # logits back unchanged (float64, pickled), so each logit is computed by exactly the same
    # forward (same rows, same masks, same shapes) as in a single process.
    units: list[tuple[int, int, int, int, int]] = []  # (batch, row0, row1, mask0, mask1)
    for b, (_batch, labels) in enumerate(data):
        n = int(labels.shape[0])
        if mode == "looped":
            units += [(b, 0, n, k, k + 1) for k in range(k_total)]
            continue
        for r0, r1 in _chunks(n, max_batch_size):
            k_per = max(1, max_batch_size // (r1 - r0))
            units += [(b, r0, r1, k0, k1) for k0, k1 in _chunks(k_total, k_per)]

    shared = _shared_layers(masks) if share_prefix and k_total > 1 else 0
    if shared and getattr(adapter, "layer_modules", lambda: None)() is None:
        shared = 0
    prefixes: dict[tuple[int, int, int], torch.Tensor | None] = {}  # (batch, row0, row1) -> layer shared-1 output

    def gated(inputs: dict[str, torch.Tensor], gates: torch.Tensor, part: dict[str, torch.Tensor], r: int, k: int,
              key: tuple[int, int, int]) -> torch.Tensor:
        """``adapter.gated_logits(inputs, gates)``: ``part`` (``r`` rows) repeated ``k`` times, mask-major.

        With ``shared`` layers, those run once per ``key`` on ``part`` alone (the unit's first mask;
        every mask gates them alike) and their output, repeated ``k`` times, feeds the rest.
        """
        if not shared:
            return adapter.gated_logits(inputs, gates)
        if key not in prefixes:
            prefixes[key] = adapter.layer_output(part, gates if gates.dim() == 2 else gates[:r], shared - 1)
        out = prefixes[key]
        if out is None:  # the layer returns something other than one tensor
            return adapter.gated_logits(inputs, gates)
        with adapter.resumed(shared, out.repeat(k, *([1] * (out.dim() - 1)))):
            return adapter.gated_logits(inputs, gates)

    def run(u: int) -> torch.Tensor:
        b, r0, r1, k0, k1 = units[u]
        batch, labels = data[b]
        n = int(labels.shape[0])
        if mode == "looped":
            return gated(batch, masks[k0], batch, n, 1, (b, 0, n)).double()[None]
        part = batch if (r0, r1) == (0, n) else subset([(batch, labels)], np.arange(r0, r1))[0][0]
        r, k = r1 - r0, k1 - k0
        gates = masks[k0:k1].repeat_interleave(r, dim=0)  # [k*r, L, H], mask-major
        return gated(_replicate(part, r, k), gates, part, r, k, (b, r0, r1)).double().reshape(k, r, -1)

    with torch.no_grad():
        outs = map_shards(len(units), run)
    per_batch = []
    for b, (_batch, labels) in enumerate(data):
        n = int(labels.shape[0])
        mine = [(units[u], o) for u, o in enumerate(outs) if units[u][0] == b]
        rows = []
        for r0, r1 in sorted({(r0, r1) for (_b, r0, r1, _k0, _k1), _o in mine}):
            rows.append(torch.cat([o for (_b, a0, a1, _k0, _k1), o in mine if (a0, a1) == (r0, r1)], dim=0))
        out = torch.cat(rows, dim=1)
        if tuple(out.shape[:2]) != (k_total, n):
            raise RuntimeError(f"evaluate_masks: assembled {tuple(out.shape)} logits for {k_total} masks x {n} rows")
        per_batch.append(out)
    return torch.cat(per_batch, dim=1)


def _shared_layers(masks: torch.Tensor) -> int:
    """How many leading layers every mask of ``masks [K, layers, heads]`` gates alike (at most layers - 1)."""
    same = (masks == masks[:1]).all(dim=2).all(dim=0)  # [layers]
    n = int(same.long().cumprod(0).sum())
    return min(n, int(masks.shape[1]) - 1)


def _mask(layers: int, heads: int, masked: list[tuple[int, int]]) -> torch.Tensor:
    m = torch.ones(layers, heads)
    for l, h in masked:
        m[l, h] = 0.0
    return m


def circuit_scores(
    adapter: object,
    calib: object,
    *,
    n_heads: int,
    objective: str = "loss",
    task_weight: float = 0.0,
    mode: str = "batched",
    max_batch_size: int = 128,
    share_prefix: bool = True,
    fork: int = 0,
) -> HeadScores:
    """Layer-conditioned circuit search; the circuit is expressed as scores (see the module docstring).

    Args:
        adapter: a :class:`toolchain.models.ModelAdapter`.
        calib: iterable of ``(batch dict, labels [B])``; label ``-1`` marks an OOD row.
        n_heads: heads kept per layer (the circuit size per layer), >= 1.
        objective: ``"loss"``, ``"nll"`` or ``"ood_auroc"``.
        task_weight: ``ood_auroc`` only: keep ``AUROC - task_weight x NLL`` of the ID rows (0: AUROC alone).
        mode: ``"batched"`` or ``"looped"`` (falls back to looped, with a warning, when the
            prunable layers do not see the batch's samples).
        max_batch_size: most rows per batched forward (128 suits a 2-core CPU, where a forward
            costs the same per row from 32 to 128 rows and more per row beyond; raise it on a GPU).
        share_prefix: run the layers a step's masks gate alike once per batch (:func:`evaluate_masks`);
            the same selection, not recorded in ``params``.
        fork: layers before it are a Hydra model's shared trunk, kept whole: the search starts at
            layer ``fork`` (no trunk head is ever masked) and the trunk's heads score above every
            other head (their damage stays NaN in ``extras``).
    """
    n_heads = check_int("n_heads", n_heads, lo=1)
    check_choice("objective", objective, OBJECTIVES)
    check_choice("mode", mode, MODES)
    if not (task_weight >= 0 and math.isfinite(task_weight)):
        raise ValueError(f"task_weight must be a finite number >= 0; got {task_weight}")
    if task_weight and objective != "ood_auroc":
        raise ValueError(f"task_weight weighs the task NLL into objective='ood_auroc'; objective is {objective!r}")
    max_batch_size = check_int("max_batch_size", max_batch_size, lo=1)
    data = as_calibration(calib)
    labels = torch.cat([lab for _, lab in data])
    ood = labels == OOD_LABEL
    if objective == "ood_auroc" and (bool(ood.all()) or not bool(ood.any())):
        raise ValueError(
            f"objective='ood_auroc' needs ID and OOD rows (label {OOD_LABEL}); calib has {int(ood.sum())} OOD "
            f"of {len(labels)}"
        )
    if objective != "ood_auroc" and bool(ood.all()):
        raise ValueError(f"objective={objective!r} needs in-distribution rows (labels >= 0); calib has none")
    used = mode
    if mode == "batched" and not all(layers_see_batch(adapter, b, int(lab.shape[0])) for b, lab in data):
        log.warning(
            "circuit: the prunable layers do not see the batch's samples; falling back to mode='looped'"
        )
        used = "looped"

    hpl = adapter.heads_per_layer()
    n_layers, max_h = len(hpl), max(hpl)
    fork = check_int("fork", fork, lo=0, hi=n_layers - 1)
    damage = nan_scores(hpl)
    circuit: list[tuple[int, int]] = []
    references: list[float] = []
    with eval_mode(adapter.model):
        for l, n_l in enumerate(hpl):
            if l < fork:  # the trunk: never masked
                continue
            masks = torch.stack(
                [_mask(n_layers, max_h, circuit)]
                + [_mask(n_layers, max_h, [*circuit, (l, h)]) for h in range(n_l)]
            )
            logits = evaluate_masks(adapter, data, masks, mode=used, max_batch_size=max_batch_size,
                                    share_prefix=share_prefix)
            if l == fork:
                check_labels(labels, logits.shape[-1], criterion="circuit", allow_ood=True)
            values = [objective_value(objective, logits[k], labels, task_weight) for k in range(len(masks))]
            references.append(values[0])
            for h in range(n_l):
                damage[l, h] = objective_damage(objective, values[h + 1], values[0])
            order = sorted(range(n_l), key=lambda h, l=l: (-float(damage[l, h]), h))
            chosen = sorted(order[: min(n_heads, n_l)])
            circuit.extend((l, h) for h in chosen)
            log.info(
                "circuit: layer %d keeps heads %s (objective %s, reference %.6g)",
                l,
                chosen,
                objective,
                values[0],
            )
    finite = damage[torch.isfinite(damage)]
    offset = 2.0 + (float(finite.max() - finite.min()) if finite.numel() else 0.0)
    scores = damage.clone()
    scores[torch.isinf(scores)] = float(finite.min()) - 1.0 if finite.numel() else 0.0
    for l, h in circuit:
        scores[l, h] += offset
    for l, n_l in enumerate(hpl[:fork]):  # the trunk: kept whole, above every searched head
        scores[l, :n_l] = (float(finite.max()) if finite.numel() else 0.0) + offset + 1.0
    return HeadScores(
        scores=scores,
        criterion="circuit",
        params={
            "n_heads": n_heads,
            "objective": objective,
            **({"task_weight": task_weight} if task_weight else {}),
            **({"fork": fork} if fork else {}),
            "mode": mode,
            "mode_used": used,
            "max_batch_size": max_batch_size,
        },
        data_hash=data_hash(data),
        heads_per_layer=hpl,
        extras={
            "circuit": [list(lh) for lh in circuit],
            "damage": damage.tolist(),
            "offset": offset,
            "step_reference": references,
            "unmasked_objective": references[0],
            "num_samples": len(labels),
            "mask_evaluations": sum(n + 1 for n in hpl[fork:]),
        },
    )
