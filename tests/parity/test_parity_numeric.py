"""Per-output statistics: errors, cosine, argmax agreement, worst element, missing/reshaped outputs."""

from __future__ import annotations

import numpy as np
import pytest

from toolchain.parity.numeric import (
    argmax_agreement,
    compare_output,
    compare_outputs,
    cosine_similarity,
    polygraphy_cross_check,
)
from toolchain.parity.tolerances import Tolerance

LOOSE = Tolerance(10.0, 0.0)


class TestArgmaxAgreement:
    def test_batch_by_classes(self):
        ref = np.array([[0.1, 0.9], [0.8, 0.2], [0.3, 0.7]])
        cand = np.array([[0.2, 0.8], [0.6, 0.4], [0.6, 0.4]])  # the last row flips
        assert argmax_agreement(ref, cand) == (2, 3)

    def test_members_count_each_member_row(self):
        ref = np.zeros((2, 3, 4))
        ref[..., 1] = 1.0
        cand = ref.copy()
        cand[1, 2] = [0, 0, 0, 5.0]  # sample 1, member 2 flips
        assert argmax_agreement(ref, cand) == (5, 6)

    def test_not_applicable(self):
        assert argmax_agreement(np.zeros(5), np.zeros(5)) is None
        assert argmax_agreement(np.zeros((5, 1)), np.zeros((5, 1))) is None


def test_cosine_similarity():
    a = np.array([1.0, 2.0, 3.0])
    assert cosine_similarity(a, a) == pytest.approx(1.0)
    assert cosine_similarity(a, -a) == pytest.approx(-1.0)
    assert cosine_similarity(np.zeros(3), np.zeros(3)) == 1.0
    assert cosine_similarity(np.zeros(3), a) == 0.0


class TestCompareOutput:
    def test_statistics_pooled_over_feeds_and_worst_located(self):
        refs = [np.full((2, 3), 0.5), np.ones((3, 3))]
        cands = [refs[0] + 0.01, refs[1].copy()]
        cands[1][2, 0] = 1.5
        comp = compare_output("logits", refs, cands, ["generated[0]", "id[0]"], Tolerance(0.1, 0.0))
        assert not comp.passed
        assert comp.elements == 15
        assert comp.max_abs_err == pytest.approx(0.5)
        assert comp.mean_abs_err == pytest.approx((6 * 0.01 + 0.5) / 15)
        assert comp.worst == {"feed": "id[0]", "index": [2, 0], "reference": 1.0, "candidate": 1.5}
        assert comp.max_rel_err == pytest.approx(0.5)
        assert [f["max_abs_err"] for f in comp.per_feed] == pytest.approx([0.01, 0.5])
        msg = comp.message()
        assert "output 'logits'" in msg and "id[0] index (2, 0)" in msg and "max|c-r| 0.5" in msg

    def test_missing_output(self):
        comp = compare_output("member_logits", [np.zeros((1, 2))], [None], ["generated[0]"], LOOSE)
        assert not comp.passed and "missing from the candidate" in comp.reasons[0]

    def test_shape_mismatch_names_both_shapes(self):
        comp = compare_output("probs", [np.zeros((2, 3))], [np.zeros((3, 2))], ["generated[1]"], LOOSE)
        assert not comp.passed
        assert "[3, 2] differs from the reference's [2, 3] at feed generated[1]" in comp.reasons[0]

    def test_argmax_and_cosine_gates(self):
        ref = np.array([[0.0, 1.0], [1.0, 0.0], [0.0, 1.0], [1.0, 0.0]])
        cand = ref.copy()
        cand[0] = [1.0, 0.0]
        comp = compare_output("probs", [ref], [cand], ["id[0]"], Tolerance(10.0, 0.0, min_argmax_agreement=0.9))
        assert not comp.passed and "argmax agreement 0.7500 < 0.9 (1 of 4 rows differ)" in comp.reasons[0]
        comp = compare_output("probs", [ref], [cand], ["id[0]"], Tolerance(10.0, 0.0, min_cosine=0.99))
        assert not comp.passed and "cosine similarity" in comp.reasons[0]
        assert compare_output("probs", [ref], [cand], ["id[0]"], LOOSE).passed  # reported, not gated

    def test_compare_outputs_follows_the_reference(self):
        refs = [{"logits": np.zeros((1, 2)), "probs": np.full((1, 2), 0.5)}]
        cands = [{"logits": np.zeros((1, 2)), "probs": np.full((1, 2), 0.5), "extra": np.zeros(3)}]
        out = compare_outputs(refs, cands, ["generated[0]"], {"": Tolerance(1e-6, 0.0)})
        assert list(out) == ["logits", "probs"] and all(c.passed for c in out.values())
        assert out["probs"].to_dict()["tolerance"]["atol"] == 1e-6


def test_polygraphy_relative_error_is_relative_to_the_reference():
    refs = [{"y": np.array([[1.0, 4.0]], np.float32)}]
    cands = [{"y": np.array([[2.0, 4.0]], np.float32)}]
    result = polygraphy_cross_check(refs, cands, {"": Tolerance(1e-3, 1e-3)}, ["y"])["y"]
    assert result["max_absdiff"] == pytest.approx(1.0)
    assert result["max_reldiff"] == pytest.approx(1.0)  # |2 - 1| / |1|, not / |2|
    assert result["passed"] is False and result["iterations"] == 1
