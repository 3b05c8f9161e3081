"""Hand-computed checks of the uncertainty scores (MSP, entropy, MI, disagreement)."""

import math

import numpy as np
import pytest

from toolchain.metrics import (
    disagreement,
    ensemble_probs,
    entropy_score,
    expected_entropy,
    member_probs,
    msp_score,
    mutual_information,
)

LOG3 = math.log(3.0)


def test_msp_score():
    np.testing.assert_array_equal(msp_score([[0.7, 0.2, 0.1], [0.25, 0.25, 0.5]]), [-0.7, -0.5])


def test_entropy_score_hand_and_zero_probabilities():
    h = entropy_score([[0.5, 0.5], [1.0, 0.0], [0.25, 0.75]])
    # ln 2; 0 (0 log 0 = 0, no NaN); -(0.25 ln 0.25 + 0.75 ln 0.75) = 0.5623351446188083
    assert h[0] == pytest.approx(math.log(2), abs=1e-15)
    assert h[1] == 0.0
    assert h[2] == pytest.approx(-(0.25 * math.log(0.25) + 0.75 * math.log(0.75)), abs=1e-15)
    assert entropy_score([[0.25] * 4])[0] == pytest.approx(math.log(4), abs=1e-15)


def test_member_probs_softmax_is_stable():
    # softmax([0, ln 3]) = [1/4, 3/4]; a shift by 1000 changes nothing and does not overflow
    logits = np.array([[[0.0, LOG3], [1000.0, 1000.0 + LOG3]]])
    p = member_probs(logits)
    assert p.shape == (1, 2, 2)
    np.testing.assert_allclose(p[0], [[0.25, 0.75], [0.25, 0.75]], atol=1e-15)
    np.testing.assert_allclose(ensemble_probs(logits), [[0.25, 0.75]], atol=1e-15)


def test_mutual_information_identical_members_is_zero_and_never_negative():
    rng = np.random.default_rng(0)
    one = rng.normal(size=(500, 1, 7)) * 3
    mi = mutual_information(np.repeat(one, 5, axis=1))
    assert mi.shape == (500,)
    assert (mi >= 0.0).all()
    assert mi.max() <= 1e-12


def test_mutual_information_disagreeing_members_hand_value():
    # member 1: softmax([0, ln 3]) = [1/4, 3/4]; member 2: softmax([ln 3, 0]) = [3/4, 1/4]
    # H(mean) = H([1/2, 1/2]) = ln 2
    # mean member entropy = -(1/4 ln 1/4 + 3/4 ln 3/4) = 0.5623351446188083
    # MI = ln 2 + 1/4 ln 1/4 + 3/4 ln 3/4 = 0.130812035941137
    logits = np.array([[[0.0, LOG3], [LOG3, 0.0]]])
    h_member = -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))
    assert expected_entropy(logits)[0] == pytest.approx(h_member, abs=1e-15)
    assert mutual_information(logits)[0] == pytest.approx(math.log(2) - h_member, abs=1e-15)
    assert mutual_information(logits)[0] == pytest.approx(0.130812035941137, abs=1e-14)


def test_mutual_information_confident_opposite_members_is_log2():
    # members one-hot on different classes: H(mean) = ln 2, member entropies ~ 0 -> MI = ln 2
    logits = np.array([[[50.0, -50.0], [-50.0, 50.0]]])
    assert mutual_information(logits)[0] == pytest.approx(math.log(2), abs=1e-12)


def test_entropy_of_mean_is_mi_plus_expected_entropy():
    rng = np.random.default_rng(1)
    logits = rng.normal(size=(20, 4, 5))
    total = entropy_score(ensemble_probs(logits))
    np.testing.assert_allclose(total, mutual_information(logits) + expected_entropy(logits), atol=1e-12)


def test_disagreement_hand_cases():
    logits = np.array(
        [
            # members' argmax 0, 0, 1; ensemble mean = [0.527, 0.400, 0.073] -> class 0; 1 of 3 differs
            [[2.0, 0.0, 0.0], [2.0, 0.0, 0.0], [0.0, 5.0, 0.0]],
            # all agree on class 2 -> 0
            [[0.0, 0.0, 1.0], [0.0, 0.0, 3.0], [1.0, 0.0, 2.0]],
            # argmax 0, 1, 2, each member one-hot in float64 (e^-100 is negligible next to 1), so the
            # ensemble mean is exactly uniform -> tie -> class 0; 2 of 3 differ
            [[100.0, 0.0, 0.0], [0.0, 100.0, 0.0], [0.0, 0.0, 100.0]],
            # uniform -> argmax 0; softmax([-1,0,0]) = [0.155, 0.422, 0.422] -> 1;
            # softmax([1,0,1]) = [0.422, 0.155, 0.422] -> 0 (tie). Mean, times 3:
            # [1/3 + 0.155 + 0.422, 1/3 + 0.422 + 0.155, 1/3 + 0.422 + 0.422] -> class 2: all 3 differ
            [[0.0, 0.0, 0.0], [-1.0, 0.0, 0.0], [1.0, 0.0, 1.0]],
        ]
    )
    np.testing.assert_allclose(disagreement(logits), [1 / 3, 0.0, 2 / 3, 1.0], atol=1e-15)


def test_single_member_has_no_epistemic_uncertainty():
    logits = np.array([[[0.0, LOG3]], [[5.0, -1.0]]])
    np.testing.assert_array_equal(disagreement(logits), [0.0, 0.0])
    assert (mutual_information(logits) <= 1e-15).all()
