"""ECE parity on the reference's bins: rounding near a bin edge is not a calibration change."""

from __future__ import annotations

import numpy as np

from toolchain.metrics.classification import ece, paired_ece
from toolchain.parity import DEFAULT_UQ_TOLERANCES
from toolchain.parity.uq import uq_parity


def _case(n: int = 1000, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    logits = rng.normal(0, 1.5, (n, 3))
    probs = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
    labels = np.where(rng.random(n) < 0.75, probs.argmax(1), rng.integers(0, 3, n))
    return probs, labels


def _rounded(probs: np.ndarray, rel: float, seed: int = 1) -> np.ndarray:
    noisy = probs * (1 + np.random.default_rng(seed).normal(0, rel, probs.shape))
    return noisy / noisy.sum(1, keepdims=True)


def test_paired_ece_is_ece_on_its_own_bins_and_continuous():
    probs, labels = _case()
    assert abs(paired_ece(probs, labels, probs) - ece(probs, labels)) < 1e-12
    near = _rounded(probs, 0.004)  # BF16-sized rounding
    flips = np.mean(near.argmax(1) != probs.argmax(1))
    bound = np.abs(near.max(1) - probs.max(1)).mean() + flips
    assert abs(paired_ece(near, labels, probs) - ece(probs, labels)) <= bound + 1e-12
    # two samples a rounding either side of a bin edge (0.6 with 5 bins): plain ECE jumps, paired does not
    ref = np.array([[0.5999, 0.4001], [0.5999, 0.4001], [0.9, 0.1], [0.9, 0.1]])
    cand = np.array([[0.6001, 0.3999], [0.6001, 0.3999], [0.9, 0.1], [0.9, 0.1]])
    y = np.array([1, 1, 0, 0])
    assert abs(ece(cand, y, n_bins=5) - ece(ref, y, n_bins=5)) < 1e-3  # both bins hold only these rows...
    mixed_ref = np.vstack([ref, [[0.62, 0.38]] * 4])
    mixed_cand = np.vstack([cand, [[0.62, 0.38]] * 4])
    my = np.array([1, 1, 0, 0, 0, 0, 0, 0])
    jump = abs(ece(mixed_cand, my, n_bins=5) - ece(mixed_ref, my, n_bins=5))
    assert jump > 0.05  # ...but beside other rows the crossing moves plain ECE a lot
    assert abs(paired_ece(mixed_cand, my, mixed_ref, n_bins=5) - ece(mixed_ref, my, n_bins=5)) < 1e-3


def test_ece_gate_passes_rounding_and_fails_a_real_calibration_change():
    probs, labels = _case()
    checks_of = {}
    for name, cand in (("rounded", _rounded(probs, 0.004)),
                       ("overconfident", np.exp(3 * np.log(probs)) / np.exp(3 * np.log(probs)).sum(1, keepdims=True))):
        _, checks = uq_parity([{"probs": probs}], [{"probs": cand}], labels, [], [], DEFAULT_UQ_TOLERANCES,
                              precision="bf16")
        checks_of[name] = {c.metric: c for c in checks}
    assert checks_of["rounded"]["ece"].passed
    assert not checks_of["overconfident"]["ece"].passed
