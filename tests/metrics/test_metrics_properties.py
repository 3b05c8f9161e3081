"""Hypothesis property tests, with brute-force reference implementations of each definition."""

import math

import hypothesis.extra.numpy as hnp
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import toolchain.metrics as M

SETTINGS = settings(max_examples=60, deadline=None)

# Scores from a small pool so that ties (ID-ID, ID-OOD, OOD-OOD) are common.
score_lists = st.lists(
    st.sampled_from([-2.0, -0.5, 0.0, 0.25, 0.5, 1.0, 3.0]) | st.floats(-5, 5), min_size=1, max_size=30
)


def _softmax(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


@st.composite
def probs_and_labels(draw):
    n = draw(st.integers(1, 40))
    c = draw(st.integers(2, 6))
    # integer-valued logits give many ties and exactly repeated confidences
    logits = draw(hnp.arrays(np.float64, (n, c), elements=st.integers(-4, 4).map(float) | st.floats(-8, 8)))
    labels = draw(hnp.arrays(np.int64, (n,), elements=st.integers(0, c - 1)))
    return _softmax(logits), labels


def _brute_auroc(s_id, s_ood):
    total = sum(1.0 if o > i else 0.5 if o == i else 0.0 for o in s_ood for i in s_id)
    return total / (len(s_id) * len(s_ood))


def _brute_ap(s_id, s_ood):
    scores = sorted(set(s_id) | set(s_ood), reverse=True)
    ap, prev_recall = 0.0, 0.0
    for t in scores:
        tp = sum(o >= t for o in s_ood)
        fp = sum(i >= t for i in s_id)
        recall = tp / len(s_ood)
        ap += (recall - prev_recall) * (tp / (tp + fp))
        prev_recall = recall
    return ap


def _brute_fpr95(s_id, s_ood):
    for t in sorted(set(s_id) | set(s_ood), reverse=True):
        if sum(o >= t for o in s_ood) / len(s_ood) >= 0.95:
            return sum(i >= t for i in s_id) / len(s_id)
    raise AssertionError("unreachable")


def _brute_ece(probs, labels, n_bins):
    conf = probs.max(axis=1)
    correct = probs.argmax(axis=1) == labels
    total = 0.0
    for b in range(n_bins):
        lo, hi = b / n_bins, (b + 1) / n_bins
        members = [k for k, c in enumerate(conf) if lo <= c < hi or (b == n_bins - 1 and c == 1.0)]
        if members:
            gap = abs(np.mean(correct[members]) - np.mean(conf[members]))
            total += len(members) / len(conf) * gap
    return total


@SETTINGS
@given(score_lists, score_lists)
def test_ood_metrics_match_brute_force_and_negation_symmetry(s_id, s_ood):
    a = M.auroc(s_id, s_ood)
    assert math.isclose(a, _brute_auroc(s_id, s_ood), abs_tol=1e-12)
    # holds with ties too: ties count 1/2 both ways
    assert math.isclose(a + M.auroc([-x for x in s_id], [-x for x in s_ood]), 1.0, abs_tol=1e-12)
    assert math.isclose(M.aupr(s_id, s_ood), _brute_ap(s_id, s_ood), abs_tol=1e-12)
    assert M.fpr_at_95_tpr(s_id, s_ood) == _brute_fpr95(s_id, s_ood)
    assert 0.0 < M.aupr(s_id, s_ood) <= 1.0


@SETTINGS
@given(probs_and_labels(), st.integers(1, 20))
def test_classification_ranges_and_ece_matches_brute_force(pl, n_bins):
    probs, labels = pl
    e = M.ece(probs, labels, n_bins=n_bins)
    assert 0.0 <= e <= 1.0
    assert math.isclose(e, _brute_ece(probs, labels, n_bins), abs_tol=1e-12)
    assert M.reliability_bins(probs, labels, n_bins).count.sum() == len(labels)
    assert 0.0 <= M.brier(probs, labels) <= 2.0
    assert 0.0 <= M.nll(probs, labels) <= -math.log(M.NLL_EPS) + 1e-9
    assert 0.0 <= M.accuracy(probs, labels) <= 1.0
    f = M.failure_auroc(probs, labels)
    assert math.isnan(f) or 0.0 <= f <= 1.0


@SETTINGS
@given(
    hnp.arrays(
        np.float64,
        st.tuples(st.integers(1, 8), st.integers(1, 5), st.integers(2, 5)),
        elements=st.integers(-3, 3).map(float) | st.floats(-30, 30),
    )
)
def test_ensemble_score_bounds(logits):
    _, m, c = logits.shape
    mi = M.mutual_information(logits)
    assert (mi >= 0.0).all()
    assert (mi <= min(math.log(m), math.log(c)) + 1e-12).all()
    d = M.disagreement(logits)
    # not bounded by (M-1)/M: the mean's argmax can be a class no member ranks first
    assert ((d >= 0.0) & (d <= 1.0)).all()
    if m == 1:
        assert (d == 0.0).all()
    np.testing.assert_allclose(d * m, np.round(d * m), atol=1e-12)  # multiples of 1/M
    h = M.entropy_score(M.ensemble_probs(logits))
    assert (h >= 0).all() and (h <= math.log(c) + 1e-12).all()
    np.testing.assert_allclose(h, mi + M.expected_entropy(logits), atol=1e-12)
