"""Hand-computed checks of accuracy, NLL, Brier, ECE and reliability bins."""

import math

import numpy as np
import pytest
from sklearn.metrics import brier_score_loss

from toolchain.metrics import (
    NLL_EPS,
    accuracy,
    bin_edges,
    brier,
    ece,
    nll,
    reliability_bins,
)
from toolchain.metrics.classification import bin_index


def test_accuracy_hand_and_argmax_tie_goes_to_lowest_class():
    probs = np.array([[0.7, 0.2, 0.1], [0.1, 0.6, 0.3], [0.3, 0.3, 0.4], [0.5, 0.5, 0.0]])
    labels = np.array([0, 2, 2, 1])
    # predictions 0, 1, 2, 0 (tie 0.5/0.5 -> class 0): correct, wrong, correct, wrong -> 2/4
    assert accuracy(probs, labels) == 0.5
    assert accuracy(probs, [0, 1, 2, 0]) == 1.0


def test_nll_hand():
    probs = np.array([[0.5, 0.5], [0.25, 0.75]])
    # -(log 0.5 + log 0.75) / 2 = (0.6931471805599453 + 0.2876820724517809) / 2
    assert nll(probs, [0, 1]) == pytest.approx((math.log(2) - math.log(0.75)) / 2, abs=1e-15)
    assert nll([[1.0, 0.0]], [0]) == 0.0


def test_nll_zero_probability_is_clipped_to_known_finite_value():
    # p_y = 0 is clipped to 1e-12: -log(1e-12) = 12 * ln(10) = 27.631021115928547
    assert nll([[1.0, 0.0]], [1]) == pytest.approx(27.631021115928547, abs=1e-12)
    assert nll([[1.0, 0.0]], [1]) == pytest.approx(-math.log(NLL_EPS), abs=1e-12)
    # mixed: (27.631021115928547 + ln 2) / 2
    value = nll([[1.0, 0.0], [0.5, 0.5]], [1, 0])
    assert math.isfinite(value)
    assert value == pytest.approx((27.631021115928547 + math.log(2)) / 2, abs=1e-12)
    # a tiny but non-zero probability below eps is clipped too; custom eps is honoured
    assert nll([[1.0 - 1e-20, 1e-20]], [1]) == pytest.approx(27.631021115928547, abs=1e-12)
    assert nll([[1.0, 0.0]], [1], eps=1e-6) == pytest.approx(6 * math.log(10), abs=1e-12)


def test_brier_two_classes_is_summed_over_classes_not_halved():
    probs = np.array([[0.8, 0.2], [0.4, 0.6]])
    labels = np.array([0, 0])
    # sample 0: (0.8 - 1)^2 + (0.2 - 0)^2 = 0.04 + 0.04 = 0.08
    # sample 1: (0.4 - 1)^2 + (0.6 - 0)^2 = 0.36 + 0.36 = 0.72 -> mean 0.40
    assert brier(probs, labels) == pytest.approx(0.40, abs=1e-15)
    # scikit-learn's binary convention is half of ours: mean((0.2)^2, (0.6)^2) = 0.20
    assert brier_score_loss(labels, probs[:, 1]) == pytest.approx(0.20, abs=1e-15)
    assert brier(probs, labels) == pytest.approx(
        brier_score_loss(labels, probs, labels=[0, 1], scale_by_half=False), abs=1e-15
    )


def test_brier_multiclass_and_extremes():
    # (0.6 - 0)^2 + (0.3 - 1)^2 + (0.1 - 0)^2 = 0.36 + 0.49 + 0.01 = 0.86
    assert brier([[0.6, 0.3, 0.1]], [1]) == pytest.approx(0.86, abs=1e-15)
    assert brier([[0.0, 1.0]], [1]) == 0.0  # perfect
    assert brier([[1.0, 0.0]], [1]) == 2.0  # confidently wrong: 1 + 1


def test_bin_edges_are_exact_rationals():
    edges = bin_edges(15)
    assert edges.dtype == np.float64 and edges.shape == (16,)
    assert edges[0] == 0.0 and edges[-1] == 1.0
    assert edges[3] == 0.2 and edges[6] == 0.4 and edges[7] == 7 / 15 and edges[9] == 0.6


def test_bin_index_rule_lo_inclusive_hi_exclusive_last_bin_closed():
    conf = np.array([0.0, 1 / 15, 0.2, 0.4, 7 / 15, 0.6, 0.19999999999999998, 1.0, 0.9999])
    # [lo, hi): an exact edge i/15 goes to bin i; 0 -> bin 0; 1.0 -> last bin 14
    assert bin_index(conf, 15).tolist() == [0, 1, 3, 6, 7, 9, 2, 14, 14]


@pytest.mark.parametrize(
    ("row", "edge_bin"),
    [
        ([0.2, 0.2, 0.2, 0.2, 0.2], 3),  # confidence exactly 0.2 = 3/15
        ([0.4, 0.3, 0.3], 6),  # exactly 0.4 = 6/15
        ([7 / 15, 0.3, 1 - 7 / 15 - 0.3], 7),  # exactly 7/15
    ],
)
def test_reliability_bins_exact_edges_land_in_upper_bin(row, edge_bin):
    probs = np.zeros((1, 5))
    probs[0, : len(row)] = row
    bins = reliability_bins(probs, [0])
    assert bins.count.tolist() == [1 if b == edge_bin else 0 for b in range(15)]
    assert bins.confidence[edge_bin] == row[0]
    assert np.isnan(bins.confidence[edge_bin - 1]) and np.isnan(bins.accuracy[edge_bin - 1])


def test_ece_on_exact_edge_depends_on_documented_rule():
    # 10 classes, 15 bins. A: conf exactly 0.2, correct. B: conf 0.25, wrong. C: conf 0.15, wrong.
    probs = np.zeros((3, 10))
    probs[0, :5] = 0.2
    probs[1, :4] = 0.25
    probs[2, :6] = 0.15
    probs[2, 6] = 0.1
    labels = np.array([0, 9, 9])
    # [lo, hi): bin 2 = [0.1333, 0.2) holds C: |0 - 0.15| = 0.15
    #           bin 3 = [0.2, 0.2667) holds A, B: acc 0.5, conf 0.225, gap 0.275
    #           ECE = (1 * 0.15 + 2 * 0.275) / 3 = 0.7 / 3 = 0.23333...
    # (the (lo, hi] rule would give (2 * |0.5 - 0.175| + 0.25) / 3 = 0.3)
    assert ece(probs, labels) == pytest.approx(0.7 / 3, abs=1e-15)
    assert reliability_bins(probs, labels).count[[2, 3]].tolist() == [1, 2]


def _torchmetrics_rule_ece(probs: np.ndarray, labels: np.ndarray, n_bins: int = 15) -> float:
    """torchmetrics' ``_binning_bucketize`` binning: n_bins + 1 slots, a confidence of exactly 1.0 alone in the last."""
    conf, correct = probs.max(axis=1), (probs.argmax(axis=1) == labels).astype(np.float64)
    edges = np.linspace(0, 1, n_bins + 1, dtype=np.float32)
    idx = np.searchsorted(edges, conf.astype(np.float32), side="right") - 1  # torch.bucketize(right=True) - 1
    total = 0.0
    for b in np.unique(idx):
        inside = idx == b
        total += inside.mean() * abs(correct[inside].mean() - conf[inside].mean())
    return float(total)


def test_ece_confidence_exactly_one_is_in_the_last_bin():
    # A: conf exactly 1.0, wrong. B: conf 0.95, right. Both in the last bin [14/15, 1]:
    # acc 0.5, mean conf 0.975 -> ECE = |0.5 - 0.975| = 0.475 (Guo et al.'s convention: 1.0 is in the last bin).
    probs = np.array([[1.0, 0.0], [0.95, 0.05]])
    labels = np.array([1, 0])
    assert reliability_bins(probs, labels).count[-1] == 2
    assert bin_index(np.array([1.0]), 15).tolist() == [14]
    assert ece(probs, labels) == pytest.approx(0.475, abs=1e-12)
    # torchmetrics gives 1.0 an extra bin of its own: 0.5 * |0 - 1| + 0.5 * |1 - 0.95| = 0.525
    assert _torchmetrics_rule_ece(probs, labels) == pytest.approx(0.525, abs=1e-6)
    # without a confidence of exactly 1.0 the two rules agree
    shifted = np.array([[0.99, 0.01], [0.95, 0.05]])
    assert ece(shifted, labels) == pytest.approx(_torchmetrics_rule_ece(shifted, labels), abs=1e-6)


def test_ece_matches_torchmetrics_where_documented():
    tm = pytest.importorskip("torchmetrics.functional.classification")
    torch = pytest.importorskip("torch")
    probs = np.array([[1.0, 0.0], [0.95, 0.05], [0.7, 0.3], [0.4, 0.6]])
    labels = np.array([1, 0, 1, 1])
    theirs = float(tm.multiclass_calibration_error(torch.tensor(probs, dtype=torch.float32), torch.tensor(labels),
                                                   num_classes=2, n_bins=15, norm="l1"))
    assert theirs == pytest.approx(_torchmetrics_rule_ece(probs, labels), abs=1e-6)
    assert ece(probs, labels) != pytest.approx(theirs, abs=1e-3)  # the documented difference at confidence 1.0
    assert ece(probs[1:], labels[1:]) == pytest.approx(_torchmetrics_rule_ece(probs[1:], labels[1:]), abs=1e-6)


def test_ece_hand_simple_and_one_bin():
    probs = np.array([[0.9, 0.1], [0.9, 0.1], [0.6, 0.4], [0.6, 0.4]])
    labels = np.array([0, 1, 0, 0])
    # conf 0.9 -> bin 13, acc 1/2, gap 0.4 (x2); conf 0.6 (edge 9/15) -> bin 9, acc 1, gap 0.4 (x2)
    # ECE = (2 * 0.4 + 2 * 0.4) / 4 = 0.4
    assert ece(probs, labels) == pytest.approx(0.4, abs=1e-15)
    # one bin: |acc - mean conf| = |0.75 - 0.75| = 0
    assert ece(probs, labels, n_bins=1) == pytest.approx(0.0, abs=1e-15)
    # two bins [0, 0.5), [0.5, 1]: all in bin 1 -> same as one bin
    assert ece(probs, labels, n_bins=2) == pytest.approx(0.0, abs=1e-15)


def test_ece_perfect_and_worst():
    assert ece([[1.0, 0.0], [0.0, 1.0]], [0, 1]) == 0.0
    assert ece([[1.0, 0.0], [0.0, 1.0]], [1, 0]) == 1.0


def test_reliability_bins_fields():
    probs = np.array([[0.9, 0.1], [0.9, 0.1], [0.6, 0.4], [0.6, 0.4]])
    bins = reliability_bins(probs, [0, 1, 0, 0], n_bins=5)
    assert bins.n_bins == 5
    np.testing.assert_array_equal(bins.edges, [0.0, 0.2, 0.4, 0.6, 0.8, 1.0])
    # 0.6 -> bin 3 = [0.6, 0.8); 0.9 -> bin 4 = [0.8, 1]
    assert bins.count.tolist() == [0, 0, 0, 2, 2]
    assert bins.accuracy[3] == 1.0 and bins.accuracy[4] == 0.5
    assert bins.confidence[3] == pytest.approx(0.6) and bins.confidence[4] == pytest.approx(0.9)
    assert np.isnan(bins.accuracy[:3]).all()
    assert bins.ece == pytest.approx(0.4, abs=1e-15)


def test_float32_inputs_are_accepted_and_compared_at_their_exact_value():
    probs = np.array([[0.2] * 5], dtype=np.float32)
    # float32(0.2) = 0.20000000298... >= 0.2 -> bin 3 as well
    assert reliability_bins(probs, [0]).count[3] == 1
    assert isinstance(ece(probs, [0]), float)
