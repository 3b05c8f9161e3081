"""Post-hoc temperature scaling (Guo et al., 2017), fitted on validation rows and folded into the weights.

One scalar ``T`` per deployed variant divides its logits: ``p = softmax(z / T)``, or for an ensemble
``p = mean_m softmax(z_m / T)`` (one ``T`` shared by the members, fitted on the ensemble's own NLL,
so the mean of the members' softmax is what is calibrated). Accuracy of a single model does not
move; an ensemble's argmax may move by a row or two.

:func:`fit_temperature` minimises the validation NLL over ``log T`` with SciPy's bounded scalar
minimiser (``minimize_scalar``; one smooth parameter: no library adds anything over it, and the
calibration libraries on PyPI (netcal, torchmetrics) measure calibration but do not fit ``T`` for an
ensemble of softmaxes). :func:`fold_temperature` divides the output layer's weights and bias by ``T``
(or the CLIP logit scale), so the exported graphs compute the calibrated logits with no extra op;
it checks the folded module on a probe and refuses a head it cannot fold.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import torch
from torch import nn

__all__ = ["T_BOUNDS", "fit_temperature", "fold_temperature", "scaled_nll"]

#: the range ``T`` is searched in (a temperature at a bound is reported as such by the caller's record)
T_BOUNDS = (0.05, 20.0)


def _log_softmax(z: np.ndarray) -> np.ndarray:
    z = z - z.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


def scaled_nll(logits: np.ndarray, labels: np.ndarray, t: float) -> float:
    """NLL of ``mean_m softmax(logits / t)``; ``logits [N, C]`` (one model) or ``[N, M, C]`` (an ensemble)."""
    z = np.asarray(logits, dtype=np.float64)
    if z.ndim == 2:
        z = z[:, None, :]
    logp = _log_softmax(z / t)  # [N, M, C]
    m = logp.shape[1]
    mixed = np.logaddexp.reduce(logp, axis=1) - math.log(m)  # log mean_m softmax, stable
    y = np.asarray(labels, dtype=np.int64)
    return float(-mixed[np.arange(len(y)), y].mean())


def fit_temperature(logits: np.ndarray, labels: np.ndarray) -> float:
    """The ``T`` in :data:`T_BOUNDS` that minimises :func:`scaled_nll` on these rows (float64).

    Raises:
        ValueError: no rows, or logits and labels of different lengths.
    """
    from scipy.optimize import minimize_scalar

    z = np.asarray(logits, dtype=np.float64)
    y = np.asarray(labels)
    if len(z) == 0 or len(z) != len(y):
        raise ValueError(f"fit_temperature: need logits and labels of the same non-zero length; got {len(z)} and "
                         f"{len(y)}")
    lo, hi = (math.log(b) for b in T_BOUNDS)
    res = minimize_scalar(lambda s: scaled_nll(z, y, math.exp(s)), bounds=(lo, hi), method="bounded",
                          options={"xatol": 1e-6})
    return float(math.exp(res.x))


def _output_layers(module: nn.Module, classes: int) -> tuple[list[nn.Linear], list[tuple[nn.Module, str]]]:
    linears = [m for m in module.modules() if isinstance(m, nn.Linear) and m.out_features == classes]
    scales = [(m, n) for m in module.modules() for n in ("logit_scale",)
              if isinstance(getattr(m, n, None), torch.Tensor)]
    return linears, scales


@torch.no_grad()
def fold_temperature(module: nn.Module, t: float, classes: int,
                     probe: Callable[[], torch.Tensor] | None = None) -> None:
    """Divide ``module``'s logits by ``t`` in place: every ``Linear`` with ``classes`` outputs (weight and bias).

    A CLIP zero-shot head has no such layer: its ``logit_scale`` is divided instead (a buffer that
    holds the scale itself) or shifted by ``-log t`` (Hugging Face's parameter, which holds its log).
    ``probe`` (logits of a fixed input) checks the result: the folded logits must be the old ones over
    ``t``; otherwise the module is restored and ``ValueError`` names why (a head whose logits are not
    linear in its last layer, or a hidden layer as wide as the class count).
    """
    if not (t > 0 and math.isfinite(t)):
        raise ValueError(f"fold_temperature: temperature must be positive and finite; got {t}")
    if t == 1.0:
        return
    linears, scales = _output_layers(module, classes)
    if not linears and not scales:
        raise ValueError(f"fold_temperature: {type(module).__name__} has no output layer with {classes} outputs "
                         "and no logit scale to fold a temperature into")
    before = probe() if probe is not None else None
    saved = {id(p): p.detach().clone() for p in module.parameters()}
    saved_buffers = {id(b): b.detach().clone() for b in module.buffers()}
    for lin in linears:
        lin.weight.div_(t)
        if lin.bias is not None:
            lin.bias.div_(t)
    for owner, name in scales if not linears else []:
        value = getattr(owner, name)
        if isinstance(value, nn.Parameter):
            value.sub_(math.log(t))  # Hugging Face CLIP: the parameter is log(scale)
        else:
            value.div_(t)
    if probe is not None:
        after = probe()
        want = before / t
        if not torch.allclose(after, want, rtol=1e-4, atol=1e-5 * float(want.abs().max().clamp(min=1.0))):
            for p in module.parameters():
                p.copy_(saved[id(p)])
            for b in module.buffers():
                b.copy_(saved_buffers[id(b)])
            raise ValueError(f"fold_temperature: {type(module).__name__}'s logits are not its old logits / {t:.4g} "
                             f"after dividing {len(linears)} output layer(s): its head cannot take a folded "
                             "temperature")
