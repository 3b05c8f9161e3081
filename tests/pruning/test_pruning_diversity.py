"""Jaccard overlap and prediction disagreement against hand-computed values."""

from __future__ import annotations

import pytest
import torch

from toolchain.pruning import jaccard, pairwise_jaccard, prediction_disagreement

A = torch.tensor([[1, 1, 0, 0], [1, 0, 1, 0]], dtype=torch.bool)
B = torch.tensor([[1, 0, 1, 0], [1, 0, 1, 0]], dtype=torch.bool)
C = torch.tensor([[0, 0, 1, 1], [0, 1, 0, 1]], dtype=torch.bool)


def test_jaccard_by_hand():
    assert jaccard(A, B) == pytest.approx(3 / 5)  # shared {(0,0),(1,0),(1,2)}; union 5
    assert jaccard(A, C) == 0.0
    assert jaccard(A, A) == 1.0
    assert jaccard(torch.zeros(2, 2, dtype=torch.bool), torch.zeros(2, 2, dtype=torch.bool)) == 1.0


def test_pairwise_jaccard_by_hand():
    out = pairwise_jaccard([A, B, C])
    # pairs (A,B) 3/5, (A,C) 0, (B,C): B={(0,0),(0,2),(1,0),(1,2)}, C={(0,2),(0,3),(1,1),(1,3)} -> 1/7
    assert out["overall"] == pytest.approx((3 / 5 + 0 + 1 / 7) / 3)
    # layer 0: (A,B) 1/3, (A,C) 0, (B,C) 1/3; layer 1: 1, 0, 0
    assert out["per_layer"] == pytest.approx([2 / 9, 1 / 3])
    assert out["matrix"][0][1] == pytest.approx(3 / 5) and out["matrix"][2][2] == 1.0


def test_pairwise_jaccard_needs_two_members():
    with pytest.raises(ValueError, match="masks"):
        pairwise_jaccard([A])


def test_prediction_disagreement_by_hand():
    # 3 members, 4 samples, 2 classes; argmaxes: m0 = [0,0,1,1], m1 = [0,1,1,1], m2 = [1,1,1,0]
    logits = torch.tensor(
        [
            [[2.0, 0.0], [1.0, 0.0], [0.0, 1.0], [0.0, 3.0]],
            [[3.0, 0.0], [0.0, 1.0], [0.0, 2.0], [0.0, 1.0]],
            [[0.0, 0.5], [0.0, 2.0], [0.0, 1.0], [1.0, 0.0]],
        ]
    )
    out = prediction_disagreement(logits)
    assert out["ensemble_pred"] == [0, 1, 1, 1]
    assert out["per_member"] == pytest.approx([0.25, 0.0, 0.5])
    assert out["mean"] == pytest.approx(0.25)
    # pairs: (m0,m1) 1/4, (m0,m2) 3/4, (m1,m2) 2/4
    assert out["pairwise_mean"] == pytest.approx(0.5)


def test_prediction_disagreement_shape_errors():
    with pytest.raises(ValueError, match="member_logits"):
        prediction_disagreement(torch.zeros(1, 3, 2))
