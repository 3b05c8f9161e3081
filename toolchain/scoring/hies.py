"""HIES: ``alpha * minmax(HIS) + (1 - alpha) * (1 - minmax(AE))`` (arXiv 2510.13832).

Min-max normalisation maps the existing heads' values to ``[0, 1]``, either over all heads
(``norm_scope="global"``, the default) or separately per layer (``"layer"``). Edge cases:

* all values in the scope equal (``max == min``, including a scope with one head): every
  normalised value is **0.5** (no information, neutral midpoint; with ``alpha`` strictly
  between 0 and 1 the ranking is then decided by the other component alone);
* a single layer: global and per-layer scopes coincide;
* NaN (heads a pruned layer no longer has) stays NaN and is ignored by min and max.

``alpha`` has no published default; it is exposed (default 0.5) and should be chosen on a
held-out split. :func:`combine_hies` recombines already computed HIS and entropy scores, so an
alpha sweep costs no extra forward pass.
"""

from __future__ import annotations

import logging

import torch

from toolchain.scoring._checks import check_choice, check_float
from toolchain.scoring.calibration import as_calibration
from toolchain.scoring.entropy import entropy_scores
from toolchain.scoring.his import his_scores
from toolchain.scoring.scores import HeadScores

__all__ = ["NORM_SCOPES", "combine_hies", "hies_scores", "minmax"]

log = logging.getLogger(__name__)

NORM_SCOPES = ("global", "layer")
#: normalised value when every value in the scope is equal
FLAT_VALUE = 0.5


def _minmax_1d(x: torch.Tensor) -> torch.Tensor:
    valid = ~torch.isnan(x)
    out = torch.full_like(x, float("nan"))
    if not bool(valid.any()):
        return out
    v = x[valid]
    lo, hi = v.min(), v.max()
    out[valid] = torch.full_like(v, FLAT_VALUE) if bool(hi == lo) else (v - lo) / (hi - lo)
    return out


def minmax(x: torch.Tensor, scope: str = "global") -> torch.Tensor:
    """Min-max normalise ``x [layers, max_heads]`` (float64, NaN ignored) over all or per layer."""
    check_choice("norm_scope", scope, NORM_SCOPES)
    x = torch.as_tensor(x, dtype=torch.float64)
    if x.dim() != 2:
        raise ValueError(f"x must be [layers, max_heads], got shape {tuple(x.shape)}")
    if scope == "global":
        return _minmax_1d(x.reshape(-1)).reshape(x.shape)
    return torch.stack([_minmax_1d(row) for row in x])


def _attention_entropy_of(entropy: HeadScores) -> torch.Tensor:
    raw = entropy.extras.get("attention_entropy")
    if raw is None:
        return 1.0 - entropy.scores
    return torch.tensor(
        [[float("nan") if v is None else float(v) for v in row] for row in raw], dtype=torch.float64
    )


def combine_hies(
    his: HeadScores, entropy: HeadScores, *, alpha: float = 0.5, norm_scope: str = "global"
) -> HeadScores:
    """HIES from an ``his`` and an ``entropy`` :class:`HeadScores` of the same model.

    Raises:
        ValueError: alpha outside ``[0, 1]``, unknown scope, wrong criteria or mismatched heads.
    """
    alpha = check_float("alpha", alpha, lo=0.0, hi=1.0)
    check_choice("norm_scope", norm_scope, NORM_SCOPES)
    if his.criterion != "his" or entropy.criterion != "entropy":
        raise ValueError(
            f"combine_hies needs 'his' and 'entropy' scores, got {his.criterion!r}, {entropy.criterion!r}"
        )
    if his.heads_per_layer != entropy.heads_per_layer:
        raise ValueError(
            f"his and entropy scores are for different models: heads {his.heads_per_layer} vs {entropy.heads_per_layer}"
        )
    ae = _attention_entropy_of(entropy)
    n_his = minmax(his.scores, norm_scope)
    n_ae = minmax(ae, norm_scope)
    scores = alpha * n_his + (1.0 - alpha) * (1.0 - n_ae)
    same = his.data_hash == entropy.data_hash
    return HeadScores(
        scores=scores,
        criterion="hies",
        params={"alpha": alpha, "norm_scope": norm_scope, "his": dict(his.params)},
        data_hash=his.data_hash if same else f"his:{his.data_hash},entropy:{entropy.data_hash}",
        heads_per_layer=list(his.heads_per_layer),
        extras={
            "his": his.scores.tolist(),
            "attention_entropy": ae.tolist(),
            "his_norm": n_his.tolist(),
            "attention_entropy_norm": n_ae.tolist(),
        },
    )


def hies_scores(
    adapter: object,
    calib: object,
    *,
    alpha: float = 0.5,
    norm_scope: str = "global",
    token_norm: bool = False,
    mode: str = "auto",
) -> HeadScores:
    """HIES on one calibration set (HIS and AE from the same data).

    Args:
        adapter: a :class:`toolchain.models.ModelAdapter`.
        calib: iterable of ``(batch dict, labels [B])``.
        alpha: weight of HIS in ``[0, 1]`` (1 = HIS only, 0 = attention focus only).
        norm_scope: ``"global"`` or ``"layer"`` min-max normalisation.
        token_norm: passed to :func:`toolchain.scoring.his.his_scores`.
        mode: passed to :func:`toolchain.scoring.his.his_scores`.
    """
    alpha = check_float("alpha", alpha, lo=0.0, hi=1.0)
    check_choice("norm_scope", norm_scope, NORM_SCOPES)
    data = as_calibration(calib)
    his = his_scores(adapter, data, token_norm=token_norm, mode=mode)
    ent = entropy_scores(adapter, data)
    out = combine_hies(his, ent, alpha=alpha, norm_scope=norm_scope)
    log.info("hies: alpha=%.3g, norm_scope=%s", alpha, norm_scope)
    return out
