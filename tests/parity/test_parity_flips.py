"""Flip-sensitive UQ checks (accuracy, ECE, failure AUROC) judged by which predictions rounding can flip.

The own-checkpoint run's false alarm: a correct OpenVINO BF16 engine flipped one near-tie prediction
of 300 (accuracy 0.746667 -> 0.743333) against an accuracy tolerance of 0.003, smaller than one
sample. Rounding at the candidate's precision explains flips of near-ties only; a clear-margin flip
still fails, and so does a real graph whose classifier weights are wrong.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from parity_models import bf16_verdict

from toolchain.parity.flips import flip_resolution
from toolchain.parity.resolution import MIN_DEFINED, RankResolution, rank_resolutions, reach_eps
from toolchain.parity.tolerances import DEFAULT_UQ_TOLERANCES
from toolchain.parity.uq import uq_parity

N = 300


def _rows(margin: float, wrong: int = 75, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """300 rows of 3-class probabilities, clear margins except row 0 (top two ``margin`` apart, relative)."""
    rng = np.random.default_rng(seed)
    p1 = rng.uniform(0.55, 0.95, N)
    rest = 1.0 - p1
    p2 = rest * rng.uniform(0.2, 0.8, N)
    probs = np.stack([p1, p2, rest - p2], axis=1)
    # row 0: a near-tie between class 0 and 1 (p1 / p2 = 1 + margin)
    probs[0] = [0.45 * (1 + margin) / (1 + 0.45 * margin), 0.45 / (1 + 0.45 * margin), 0.0]
    probs[0, 2] = 1.0 - probs[0, :2].sum()
    labels = np.zeros(N, np.int64)
    labels[1:wrong + 1] = 2  # wrong predictions with a clear margin (failure AUROC has failures to rank)
    return probs, labels


def _swap(probs: np.ndarray, row: int) -> np.ndarray:
    out = probs.copy()
    out[row, [0, 1]] = out[row, [1, 0]]
    return out


def _check(checks, metric):
    return next(c for c in checks if c.metric == metric)


def test_near_tie_flip_at_bf16_passes_accuracy_a_clear_one_fails():
    probs, labels = _rows(margin=0.5 * reach_eps("bf16"))  # within BF16's reach
    assert probs[0].argmax() == 0 and labels[0] == 0
    _, checks = uq_parity([{"probs": probs}], [{"probs": _swap(probs, 0)}], labels, [], [], DEFAULT_UQ_TOLERANCES,
                          precision="bf16")
    acc = _check(checks, "accuracy")
    assert acc.delta == pytest.approx(-1 / N) and acc.limit < 1 / N  # the old rule failed this correct engine
    assert acc.passed and acc.flips.changed == 1 and acc.flips.clear_flips == 0 and acc.flips.can_lose >= 1
    assert "within rounding" in acc.message()
    assert _check(checks, "ece").passed  # one flip within rounding moves the paired ECE by <= 1/N

    # the same flip at FP32 is beyond rounding: FP32 cannot flip a 0.8% margin
    _, checks = uq_parity([{"probs": probs}], [{"probs": _swap(probs, 0)}], labels, [], [], DEFAULT_UQ_TOLERANCES,
                          precision="fp32")
    acc = _check(checks, "accuracy")
    assert not acc.passed and acc.flips.clear_flips == 1 and "rows 0" in acc.message()

    # a clear-margin prediction flipped at BF16 fails, even though the accuracy moves by one sample only
    clear = _swap(probs, N - 1)
    _, checks = uq_parity([{"probs": probs}], [{"probs": clear}], labels, [], [], DEFAULT_UQ_TOLERANCES,
                          precision="bf16")
    acc = _check(checks, "accuracy")
    assert not acc.passed and acc.flips.clear_rows == (N - 1,)
    assert "cannot flip" in acc.message()


def test_tolerance_admits_clear_flips_as_a_number_of_samples():
    probs, labels = _rows(margin=1.0)
    cand = probs.copy()
    for row in (N - 1, N - 2):
        cand = _swap(cand, row)
    tol = dict(DEFAULT_UQ_TOLERANCES)
    flips = flip_resolution(probs, labels, cand, "bf16")
    assert flips.clear_flips == 2 and flips.clear_allowed(0.003) == 0 and flips.clear_allowed(2 / N) == 2
    _, checks = uq_parity([{"probs": probs}], [{"probs": cand}], labels, [], [], tol, precision="bf16")
    assert not _check(checks, "accuracy").passed
    from toolchain.parity.tolerances import MetricTolerance

    tol["accuracy"] = MetricTolerance(atol=2 / N)  # two samples' worth: the same two flips pass
    _, checks = uq_parity([{"probs": probs}], [{"probs": cand}], labels, [], [], tol, precision="bf16")
    assert _check(checks, "accuracy").passed


def test_one_failure_on_a_near_tie_gets_a_finite_failure_auroc_bound_not_one():
    """The reference's only error is a near-tie: in about half the draws rounding leaves no error to rank.

    The former rule counted each such draw as a change of 1.0, so the bound became 1.0 and the
    check could never fail. Undefined draws are now left out (and counted).
    """
    probs, labels = _rows(margin=0.2 * reach_eps("bf16"), wrong=0)
    labels[0] = 1  # the near-tie is the only misclassification
    res = rank_resolutions(probs, labels, None, None, None, "bf16", limits={"failure_auroc": 0.005})["failure_auroc"]
    assert res.n_positive == 1 and res.draws > 0
    assert 0 < res.undefined < res.draws - MIN_DEFINED  # many draws undefined, enough defined
    assert res.bound < 1.0 and math.isfinite(res.bound) and res.resolvable(0.005)
    # the candidate flips the near-tie to right: no failure left, its failure AUROC is undefined
    _, checks = uq_parity([{"probs": probs}], [{"probs": _swap(probs, 0)}], labels, [], [], DEFAULT_UQ_TOLERANCES,
                          precision="bf16")
    fa = _check(checks, "failure_auroc")
    assert math.isnan(fa.candidate) and fa.status == "unresolved" and "too few failures" in fa.message()
    assert _check(checks, "accuracy").passed
    # a broken candidate that ranks the failure as the most confident prediction fails
    broken = probs.copy()
    broken[0] = [0.97, 0.02, 0.01]  # the same wrong class, now the most confident prediction of all
    _, checks = uq_parity([{"probs": probs}], [{"probs": broken}], labels, [], [], DEFAULT_UQ_TOLERANCES,
                          precision="bf16")
    assert _check(checks, "failure_auroc").status == "fail"


def test_too_few_defined_draws_is_not_resolvable_with_its_reason():
    res = RankResolution("failure_auroc", "bf16", 0.01, 0.5, math.inf, 0.2, False, 1, 299, 1 / 299, 1000, 950)
    assert res.too_few and not res.resolvable(0.005)
    assert "too few failures to rank" in res.reason(0.005) and "950 of 1000" in res.reason(0.005)


def test_real_bf16_graph_passes_accuracy_and_a_wrong_classifier_fails_it(vit_case, tmp_path):
    """Real graphs: the tiny ViT's correct BF16 graph passes every flip-sensitive check; its classifier's
    weight given noise (a wrong graph) changes clear-margin predictions and fails uq/accuracy."""
    verdict, _ = bf16_verdict(vit_case, tmp_path, relative=1.0)
    good = {c.name: c for c in verdict.engine_checks("emu-bf16")}
    assert good["uq/accuracy"].status == "pass" and good["uq/ece"].status == "pass"
    bad = {c.name: c for c in verdict.engine_checks("emu-broken")}
    assert bad["uq/accuracy"].status == "fail" and "cannot flip" in bad["uq/accuracy"].message


def test_near_ties_the_candidate_left_alone_do_not_widen_ece():
    """A temperature that keeps every argmax moves ECE; near-ties elsewhere must not excuse it."""
    rng = np.random.default_rng(3)
    z = rng.normal(0, 1.0, (300, 3))
    z[:, 0] += 1.5
    z[:30, 1] = z[:30, 0] - 1e-3  # 30 near-ties, flippable at BF16

    def softmax(x):
        e = np.exp(x - x.max(1, keepdims=True))
        return e / e.sum(1, keepdims=True)

    ref, cand = softmax(z), softmax(2.0 * z)  # a wrong temperature: no prediction changes
    labels = (rng.random((300, 1)) > ref.cumsum(1)).sum(1).clip(0, 2)  # calibrated reference
    assert (ref.argmax(1) == cand.argmax(1)).all()
    _, checks = uq_parity([{"probs": ref}], [{"probs": cand}], labels, [], [], DEFAULT_UQ_TOLERANCES,
                          precision="bf16")
    ece = _check(checks, "ece")
    assert ece.flips.flippable >= 30 and ece.flips.changed == 0
    assert abs(ece.delta) > ece.limit and not ece.passed
