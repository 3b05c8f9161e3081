"""Hand-computed checks of AUROC, AUPR, FPR95 and failure AUROC."""

import math

import numpy as np
import pytest

from toolchain.metrics import (
    aupr,
    auroc,
    failure_auroc,
    fpr_at_95_tpr,
    ood_labels_and_scores,
    ood_metrics,
)


def test_concatenation_ood_is_positive():
    y, s = ood_labels_and_scores([0.1, 0.2, 0.3], [5.0, 6.0])
    assert y.tolist() == [0, 0, 0, 1, 1]
    assert s.tolist() == [0.1, 0.2, 0.3, 5.0, 6.0]


def test_perfect_score():
    id_s, ood_s = [0.1, 0.2, 0.3], [0.4, 0.5]
    assert auroc(id_s, ood_s) == 1.0
    assert aupr(id_s, ood_s) == 1.0
    assert fpr_at_95_tpr(id_s, ood_s) == 0.0


def test_reversed_score():
    id_s, ood_s = [0.4, 0.5], [0.1, 0.2, 0.3]
    assert auroc(id_s, ood_s) == 0.0
    # all ID flagged before any OOD is reached -> FPR 1 at TPR >= 0.95
    assert fpr_at_95_tpr(id_s, ood_s) == 1.0


def test_constant_score_is_useless():
    id_s, ood_s = [1.0, 1.0, 1.0], [1.0, 1.0]
    # every pair tied -> 0.5
    assert auroc(id_s, ood_s) == 0.5
    # one threshold: recall 1, precision = prevalence = 2 / 5
    assert aupr(id_s, ood_s) == pytest.approx(0.4, abs=1e-15)
    # the only operating point with TPR >= 0.95 flags everything -> FPR 1
    assert fpr_at_95_tpr(id_s, ood_s) == 1.0


def test_ties_hand_computed():
    id_s = [0.0, 1.0, 1.0, 2.0]
    ood_s = [1.0, 2.0, 3.0]
    # AUROC over 12 (ood, id) pairs, ties count 1/2:
    #   ood 1: > {0} = 1, ties {1, 1} = 2 * 0.5     -> 2.0
    #   ood 2: > {0, 1, 1} = 3, tie {2} = 0.5         -> 3.5
    #   ood 3: > all 4                                 -> 4.0
    #   AUROC = 9.5 / 12
    assert auroc(id_s, ood_s) == pytest.approx(9.5 / 12, abs=1e-15)
    # AP, thresholds descending (predict OOD if s >= t):
    #   t=3: TP 1 FP 0 -> P 1,   R 1/3
    #   t=2: TP 2 FP 1 -> P 2/3, R 2/3
    #   t=1: TP 3 FP 3 -> P 1/2, R 1
    #   AP = 1/3 * 1 + 1/3 * 2/3 + 1/3 * 1/2 = 13/18
    assert aupr(id_s, ood_s) == pytest.approx(13 / 18, abs=1e-15)
    # TPR: 1/3, 2/3, 1 -> first TPR >= 0.95 at t=1, where FPR = 3/4
    assert fpr_at_95_tpr(id_s, ood_s) == 0.75
    assert ood_metrics(id_s, ood_s) == {
        "auroc": pytest.approx(9.5 / 12),
        "aupr": pytest.approx(13 / 18),
        "fpr95": 0.75,
    }


def test_fpr95_takes_first_point_with_tpr_at_least_095_without_interpolation():
    ood_s = np.arange(1.0, 21.0)  # 20 OOD scores 1..20
    id_s = [0.5, 1.5, 5.5, 10.5]
    # t=2 flags OOD 2..20: TPR = 19/20 = 0.95 exactly (>= 0.95); ID >= 2: {5.5, 10.5} -> FPR 2/4
    # (a strict "TPR > 0.95" rule would give t=1 and FPR 3/4)
    assert fpr_at_95_tpr(id_s, ood_s) == 0.5


def test_auroc_of_negated_scores_sums_to_one():
    rng = np.random.default_rng(0)
    id_s, ood_s = rng.normal(size=50), rng.normal(0.5, size=40)
    assert auroc(id_s, ood_s) + auroc(-id_s, -ood_s) == pytest.approx(1.0, abs=1e-12)


def test_failure_auroc_errors_are_positive_and_default_score_is_negative_msp():
    probs = np.array([[0.9, 0.1], [0.6, 0.4], [0.55, 0.45], [0.8, 0.2]])
    # predictions all class 0; -MSP = [-0.9, -0.6, -0.55, -0.8]
    # labels [0, 1, 1, 0]: errors at the two least confident rows -> every error outranks -> 1.0
    assert failure_auroc(probs, [0, 1, 1, 0]) == 1.0
    # labels [1, 0, 0, 1]: errors at the two most confident rows -> 0.0
    assert failure_auroc(probs, [1, 0, 0, 1]) == 0.0
    # labels [0, 1, 0, 1]: errors {-0.6, -0.8} vs correct {-0.9, -0.55}: 2 of 4 pairs -> 0.5
    assert failure_auroc(probs, [0, 1, 0, 1]) == 0.5


def test_failure_auroc_score_options():
    probs = np.array([[0.9, 0.1], [0.6, 0.4], [0.55, 0.45], [0.8, 0.2]])
    labels = [0, 1, 1, 0]
    assert failure_auroc(probs, labels, score="msp") == 1.0
    assert failure_auroc(probs, labels, score="entropy") == 1.0  # same ranking for 2 classes
    # a custom array: it ranks the correct rows highest -> 0.0
    assert failure_auroc(probs, labels, score=[4.0, 1.0, 2.0, 3.0]) == 0.0
    assert failure_auroc(probs, labels, score=lambda p: p.max(axis=1)) == 0.0


def test_failure_auroc_undefined_when_no_errors_or_all_errors():
    probs = np.array([[0.9, 0.1], [0.2, 0.8]])
    assert math.isnan(failure_auroc(probs, [0, 1]))
    assert math.isnan(failure_auroc(probs, [1, 0]))


def test_scores_outside_unit_interval_are_ranked_raw_not_squashed():
    # REFERENCE.md 4 pitfall: per-batch sigmoid of ID scores (they leave [0, 1]) but not of OOD scores.
    # Raw ranking: OOD 0.9 and 0.95 each beat ID 0.5 and lose to ID 1.5 -> AUROC 2/4 = 0.5.
    # (Squashing only the ID batch, sigmoid(0.5)=0.62 and sigmoid(1.5)=0.82, would give 1.0.)
    id_s, ood_s = [0.5, 1.5], [0.9, 0.95]
    assert auroc(id_s, ood_s) == 0.5
    # positive affine maps of the concatenated scores change nothing
    rng = np.random.default_rng(3)
    a, b = rng.normal(size=30), rng.normal(0.3, size=25)
    for metric in (auroc, aupr, fpr_at_95_tpr):
        assert metric(a, b) == pytest.approx(metric(1000 * a - 7, 1000 * b - 7), abs=1e-12)
