"""Synthetic Hydra outputs for the rank gate: a reference, correct low-precision candidates, broken ones.

Used by ``run.py`` (part a) and by tests/parity/test_rank_gate.py. Pure numpy (``ml_dtypes``,
installed with onnx, rounds to BF16/FP16 exactly: round to nearest even).

* :func:`reference`: ``M`` members' logits ``[N, M, C]`` on ID rows (a class signal of strength
  ``spread`` in logit units, member noise 0.3) and OOD rows (signal ``0.4 * spread``, member noise
  0.6), ID labels drawn from the mean prediction (so the ensemble is calibrated and makes errors).
* :func:`correct`: what a correct engine of ``precision`` returns: every member logit moved by
  ``upstream`` unit roundoffs of upstream error (``N(0, 1) * upstream * u * max(|z|, 1)``, the
  accumulated rounding of the layers before), rounded to the precision; each member's softmax
  rounded, their mean rounded (the graph's ``probs`` output).
* :func:`broken`: the same after a fault: ``bias`` (a systematic shift: ``+b`` on class 0's logit of
  every member, a wrong classifier bias), ``swap`` (a fraction of rows get another row's outputs:
  mixed-up batches), ``noise`` (every logit moved by ``k`` times its resolution, ``N(0, 1) * k * 4u *
  max(|z|, 1)``: an engine a few times less accurate than the precision allows).
"""

from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes
import numpy as np

UNIT_ROUNDOFF = {"fp32": 2.0**-24, "fp16": 2.0**-11, "bf16": 2.0**-8}
_DTYPE = {"fp32": np.float32, "fp16": np.float16, "bf16": ml_dtypes.bfloat16}


@dataclass(frozen=True)
class Outputs:
    """One engine's outputs on the ID and OOD rows (``probs`` = mean of the members' softmax)."""

    logits_id: np.ndarray  # [N_id, M, C]
    logits_ood: np.ndarray  # [N_ood, M, C]
    probs_id: np.ndarray  # [N_id, C]
    probs_ood: np.ndarray  # [N_ood, C]

    def feeds(self) -> tuple[list[dict[str, np.ndarray]], list[dict[str, np.ndarray]]]:
        """``(ID batches, OOD batches)`` as :func:`toolchain.parity.uq_parity` takes them (one batch each)."""
        return ([{"probs": self.probs_id, "member_logits": self.logits_id}],
                [{"probs": self.probs_ood, "member_logits": self.logits_ood}])


def rounded(x: np.ndarray, precision: str) -> np.ndarray:
    """``x`` rounded to ``precision`` (round to nearest even) and back to float64."""
    return np.asarray(x).astype(_DTYPE[precision]).astype(np.float64)


def _softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _outputs(logits_id: np.ndarray, logits_ood: np.ndarray, precision: str | None = None) -> Outputs:
    def probs(z: np.ndarray) -> np.ndarray:
        if precision is None:
            return _softmax(z).mean(axis=1)
        p = rounded(rounded(_softmax(z), precision).mean(axis=1), precision)
        return p / p.sum(axis=-1, keepdims=True)  # rows sum to 1 within float64 (the candidate check's rule)

    return Outputs(logits_id, logits_ood, probs(logits_id), probs(logits_ood))


def reference(n_id: int, n_ood: int, spread: float, *, members: int = 3, classes: int = 3,
              seed: int = 0) -> tuple[Outputs, np.ndarray]:
    """``(reference outputs in float64, ID labels)``; see the module docstring."""
    rng = np.random.default_rng(seed)

    def logits(n: int, signal: float, member_noise: float) -> np.ndarray:
        base = rng.normal(0.0, 1.0, (n, 1, classes))
        base[np.arange(n), 0, rng.integers(0, classes, n)] += signal * np.abs(rng.normal(1.0, 0.5, n))
        return base + rng.normal(0.0, member_noise, (n, members, classes))

    out = _outputs(logits(n_id, spread, 0.3), logits(n_ood, 0.4 * spread, 0.6))
    cum = out.probs_id.cumsum(axis=1)
    labels = np.minimum((rng.random((n_id, 1)) > cum).sum(axis=1), classes - 1)  # y ~ the mean prediction
    return out, labels


def _moved(ref: Outputs, precision: str, scale: float, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    u = UNIT_ROUNDOFF[precision]
    return tuple(z + rng.normal(0.0, 1.0, z.shape) * scale * u * np.maximum(np.abs(z), 1.0)
                 for z in (ref.logits_id, ref.logits_ood))


def correct(ref: Outputs, precision: str, upstream: float, seed: int) -> Outputs:
    """A correct engine: ``upstream`` unit roundoffs of accumulated error, then the precision's rounding."""
    z_id, z_ood = _moved(ref, precision, upstream, np.random.default_rng(seed))
    return _outputs(rounded(z_id, precision), rounded(z_ood, precision), precision)


def broken(ref: Outputs, precision: str, fault: str, size: float, seed: int) -> Outputs:
    """A broken engine of ``precision``: ``fault`` ``bias`` | ``swap`` | ``noise`` of ``size`` (module docstring)."""
    rng = np.random.default_rng(seed)
    z_id, z_ood = _moved(ref, precision, 1.0, rng)  # the engine's ordinary rounding comes on top of the fault
    if fault == "bias":
        z_id, z_ood = z_id.copy(), z_ood.copy()
        z_id[..., 0] += size
        z_ood[..., 0] += size
    elif fault == "swap":
        z = np.concatenate([z_id, z_ood])
        rows = rng.choice(len(z), max(2, round(size * len(z))), replace=False)
        z[rows] = z[rng.permutation(rows)]
        z_id, z_ood = z[:len(z_id)], z[len(z_id):]
    elif fault == "noise":
        u = UNIT_ROUNDOFF[precision]
        z_id, z_ood = (z + rng.normal(0.0, 1.0, z.shape) * size * 4.0 * u * np.maximum(np.abs(z), 1.0)
                       for z in (z_id, z_ood))
    else:
        raise ValueError(f"unknown fault {fault!r}")
    return _outputs(rounded(z_id, precision), rounded(z_ood, precision), precision)
