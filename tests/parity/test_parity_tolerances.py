"""The pass rule: per output with a "" default, atol AND rtol, each statistic, NaN/Inf, UQ deltas."""

from __future__ import annotations

import math

import numpy as np
import pytest

from toolchain.errors import ToolchainError
from toolchain.parity.numeric import compare_output, polygraphy_cross_check
from toolchain.parity.tolerances import (
    DEFAULT_UQ_TOLERANCES,
    MetricTolerance,
    Tolerance,
    ToleranceError,
    default_tolerances,
    evaluate_metric,
    evaluate_rule,
    first_nonfinite,
    normalised_error,
    parse_tolerances,
    parse_uq_tolerances,
    resolve_metric_tolerance,
    resolve_tolerance,
)


class TestResolve:
    def test_output_key_wins_over_default(self):
        tols = {"": Tolerance(1e-3, 0.0), "probs": Tolerance(1e-6, 0.0)}
        assert resolve_tolerance(tols, "probs").atol == 1e-6
        assert resolve_tolerance(tols, "member_logits").atol == 1e-3

    def test_no_default_key_names_the_output(self):
        with pytest.raises(ToleranceError, match="'hidden'") as info:
            resolve_tolerance({"probs": Tolerance(1e-3, 0.0)}, "hidden")
        assert info.value.exit_code == 2

    def test_uq_metric_family_then_default(self):
        tols = {"": MetricTolerance(0.1), "auroc": MetricTolerance(0.01), "auroc_mi": MetricTolerance(0.02)}
        assert resolve_metric_tolerance(tols, "auroc_mi").atol == 0.02
        assert resolve_metric_tolerance(tols, "auroc_msp").atol == 0.01
        assert resolve_metric_tolerance(tols, "ece").atol == 0.1
        assert resolve_metric_tolerance(DEFAULT_UQ_TOLERANCES, "failure_auroc").atol == 0.005

    def test_parse_merges_over_precision_defaults(self):
        tols = parse_tolerances({"probs": {"atol": 1e-3, "rtol": 0.0, "stat": "mean"}}, "fp16")
        # what the mapping leaves out (the quantile, max_limit) is the FP16 default's
        assert tols["probs"] == Tolerance(1e-3, 0.0, "mean", quantile=0.999, max_limit=4.0, feed_quantile=0.99)
        assert tols["logits"] == default_tolerances("fp16")["logits"]
        # an atol/rtol override keeps the precision's statistic; FP32's is the plain max
        bf16 = parse_tolerances({"logits": {"atol": 0.2, "rtol": 0.05}}, "bf16")["logits"]
        assert (bf16.atol, bf16.stat, bf16.quantile, bf16.max_limit, bf16.feed_quantile) == (
            0.2, "quantile", 0.999, 4.0, 0.99)
        fp32 = parse_tolerances({"logits": {"atol": 0.2, "rtol": 0.05}}, "fp32")["logits"]
        assert (fp32.stat, fp32.max_limit) == ("max", None)
        # a Tolerance object replaces the default whole
        assert parse_tolerances({"probs": Tolerance(1e-3, 0.0)}, "bf16")["probs"] == Tolerance(1e-3, 0.0)
        uq = parse_uq_tolerances({"auroc": 0.01, "nll": {"atol": 0.0, "rtol": 0.05}})
        assert uq["auroc"].atol == 0.01 and uq["nll"].rtol == 0.05 and uq["ece"].atol == 0.005

    @pytest.mark.parametrize("bad", [
        {"atol": -1.0, "rtol": 0.0}, {"atol": math.nan, "rtol": 0.0}, {"atol": 0.1, "rtol": 0.0, "stat": "p99"},
        {"atol": 0.1, "rtol": 0.0, "stat": "quantile", "quantile": 0.0}, {"atol": 0.1},
        {"atol": 0.1, "rtol": 0, "x": 1}, {"atol": 0.1, "rtol": 0, "max_limit": 0},
        {"atol": 0.1, "rtol": 0, "max_limit": -2.0}, {"atol": 0.1, "rtol": 0, "max_limit": math.inf},
    ])
    def test_bad_tolerances_raise_with_exit_2(self, bad):
        with pytest.raises(ToleranceError) as info:
            parse_tolerances({"probs": bad})
        assert info.value.exit_code == 2

    def test_defaults_are_ordered_by_precision(self):
        for out in ("logits", "probs", ""):
            fp32, fp16, bf16, int8 = (default_tolerances(p)[out] for p in ("fp32", "fp16", "bf16", "int8"))
            assert fp32.atol < fp16.atol < bf16.atol < int8.atol and bf16.rtol < int8.rtol
        assert default_tolerances("fp32")["logits"].atol == 1e-4
        assert default_tolerances("fp32")["probs"].atol == 1e-5
        with pytest.raises(ToleranceError):
            default_tolerances("int4")


class TestElementwiseRule:
    def test_atol_only(self):
        ref = np.array([0.0, 100.0])
        assert evaluate_rule(ref + 0.1, ref, Tolerance(0.1, 0.0)).passed
        assert not evaluate_rule(ref + 0.1001, ref, Tolerance(0.1, 0.0)).passed

    def test_rtol_only_scales_with_the_reference(self):
        ref = np.array([2.0, -8.0])
        cand = np.array([3.0, -12.0])  # 50% of each |reference| (exact in binary)
        assert evaluate_rule(cand, ref, Tolerance(0.0, 0.5)).passed
        assert not evaluate_rule(cand + np.array([0.0, -0.01]), ref, Tolerance(0.0, 0.5)).passed

    def test_bound_is_atol_plus_rtol_times_ref(self):
        ref = np.array([2.0])
        tol = Tolerance(0.25, 0.125)  # bound 0.25 + 0.125 * 2 = 0.5 (exact in binary)
        assert evaluate_rule(ref + 0.5, ref, tol).passed
        assert not evaluate_rule(ref + 0.5001, ref, tol).passed
        assert evaluate_rule(ref + 0.5, ref, tol).value == 1.0
        assert not evaluate_rule(ref + 0.3, ref, Tolerance(0.25, 0.0)).passed  # atol alone is not enough
        assert not evaluate_rule(ref + 0.3, ref, Tolerance(0.0, 0.125)).passed  # nor rtol alone

    def test_zero_tolerance_and_zero_reference(self):
        assert normalised_error(np.array([0.0]), np.array([0.0]), 0.0, 0.0)[0] == 0.0
        assert normalised_error(np.array([1e-9]), np.array([0.0]), 0.0, 0.0)[0] == math.inf

    def test_more_lenient_than_polygraphy_by_at_most_2x(self):
        # |c-r| = 0.15 with atol = rtol*|r| = 0.1: Polygraphy fails (both exceeded), we pass (<= 0.2).
        ref, cand = [{"y": np.array([1.0], np.float32)}], [{"y": np.array([1.15], np.float32)}]
        tol = {"": Tolerance(0.1, 0.1)}
        assert evaluate_rule(cand[0]["y"], ref[0]["y"], tol[""]).passed
        assert polygraphy_cross_check(ref, cand, tol, ["y"])["y"]["passed"] is False
        # ... and Polygraphy passes with doubled tolerances whatever we pass
        assert polygraphy_cross_check(ref, cand, {"": Tolerance(0.2, 0.2)}, ["y"])["y"]["passed"] is True


class TestStatistics:
    # 10 elements: nine errors of 0.05, one outlier of 1.0; atol 0.1 -> normalised 0.5 x9, 10 x1
    REF = np.zeros(10)
    CAND = np.array([0.05] * 9 + [1.0])

    @pytest.mark.parametrize(("stat", "quantile", "passed", "value"), [
        ("max", 0.99, False, 10.0),
        ("mean", 0.99, False, (9 * 0.5 + 10) / 10),
        ("median", 0.99, True, 0.5),
        ("quantile", 0.9, True, 0.5),
        ("quantile", 0.95, False, 10.0),
    ])
    def test_each_statistic(self, stat, quantile, passed, value):
        result = evaluate_rule(self.CAND, self.REF, Tolerance(0.1, 0.0, stat, quantile))
        assert result.passed is passed
        assert result.value == pytest.approx(value)

    def test_mean_passes_when_average_is_small(self):
        cand = np.array([0.05] * 19 + [1.0])
        assert evaluate_rule(cand, np.zeros(20), Tolerance(0.1, 0.0, "mean")).passed

    def test_max_limit_bounds_the_element_a_quantile_leaves_out(self):
        # the outlier (normalised 10) is above the 0.9 quantile: the statistic alone passes ...
        tol = Tolerance(0.1, 0.0, "quantile", 0.9, max_limit=12.0)
        result = evaluate_rule(self.CAND, self.REF, tol)
        assert result.passed and result.value == pytest.approx(0.5) and result.max_value == pytest.approx(10.0)
        # ... max_limit 4 fails it, and says so (not the statistic)
        result = evaluate_rule(self.CAND, self.REF, Tolerance(0.1, 0.0, "quantile", 0.9, max_limit=4.0))
        assert not result.passed and result.failed == "max_limit" and result.value == pytest.approx(0.5)
        comp = compare_output("logits", [self.REF], [self.CAND], ["id[0]"],
                              Tolerance(0.1, 0.0, "quantile", 0.9, max_limit=4.0))
        assert not comp.passed and comp.max_normalised_error == pytest.approx(10.0)
        assert "max normalised error 10 > max_limit 4" in comp.message()
        assert ", max <= 4" in comp.tolerance.describe()
        # the statistic failing is reported as the statistic
        comp = compare_output("logits", [self.REF], [self.CAND], ["id[0]"],
                              Tolerance(0.1, 0.0, "quantile", 0.95, max_limit=40.0))
        assert not comp.passed and "q0.95 normalised error 10 > 1" in comp.message()


class TestReducedPrecisionDefaults:
    """FP16/BF16: 99.9% of the elements within the rule, none beyond 4x it (measured: tolerances.py)."""

    @pytest.mark.parametrize("precision", ["fp16", "bf16"])
    def test_a_rounding_tail_passes_and_a_broken_part_fails(self, precision):
        tol = default_tolerances(precision)["logits"]
        unit = tol.atol  # reference 0: normalised error = |c| / atol
        rng = np.random.default_rng(0)
        ref = np.zeros(24_088)
        cand = rng.uniform(-0.4, 0.4, ref.size) * unit  # correct rounding: well inside the rule
        cand[:10] = 1.03 * unit  # a rounding tail: ten elements just over 1 (the ViT recipe had one)
        assert evaluate_rule(cand, ref, tol).passed
        assert not evaluate_rule(cand, ref, Tolerance(tol.atol, tol.rtol)).passed  # the plain max cried wolf
        broad = cand.copy()
        broad[: ref.size // 100] = 1.5 * unit  # 1% of the elements out: a wrong weight, layout or op
        assert not evaluate_rule(broad, ref, tol).passed
        one_shape = cand.copy()
        one_shape[-8:] = 5.0 * unit  # one row of one shape badly wrong, far under 0.1% of the elements
        result = evaluate_rule(one_shape, ref, tol)
        assert not result.passed and result.failed == "max_limit"

    @pytest.mark.parametrize("precision", ["fp16", "bf16"])
    def test_a_fault_confined_to_one_small_feed_fails_the_per_feed_clause(self, precision):
        tol = default_tolerances(precision)["logits"]
        rng = np.random.default_rng(1)
        refs = [np.zeros((1, 8)), np.zeros((8, 8)), np.zeros((2, 8))] + [np.zeros((64, 8)) for _ in range(47)]
        cands = [rng.uniform(-0.4, 0.4, r.shape) * tol.atol for r in refs]
        labels = ["generated[0]", "generated[1]", "generated[2]"] + [f"id[{i}]" for i in range(47)]
        cands[30][7, 2] = 1.03 * tol.atol  # a rounding tail in a data feed: passes
        assert compare_output("logits", refs, cands, labels, tol).passed
        broken = [c.copy() for c in cands]
        broken[0][:] = 2.0 * tol.atol  # batch-1 shape off by 2x everywhere: 8 of 24,152 elements
        assert evaluate_rule(np.concatenate([c.ravel() for c in broken]),
                             np.concatenate([r.ravel() for r in refs]),
                             Tolerance(tol.atol, tol.rtol, "quantile", 0.999, max_limit=4.0)).passed  # pooled alone
        comp = compare_output("logits", refs, broken, labels, tol)
        assert not comp.passed and "feed generated[0]: q0.99 normalised error 2 > 1" in comp.message()
        half = [c.copy() for c in cands]
        half[40][:2] = 1.5 * tol.atol  # 16 of one 64-row feed's 512 elements (3%): fails too
        assert "feed id[37]" in compare_output("logits", refs, half, labels, tol).message()

    def test_nan_reference_and_candidate_name_their_clause(self):
        tol = default_tolerances("bf16")["logits"]
        ref, cand = np.zeros(4), np.zeros(4)
        ref[1] = np.nan
        res = evaluate_rule(cand, ref, tol)
        assert not res.passed and res.failed == "stat"
        res = evaluate_rule(np.array([0.0, np.inf, 0, 0]), np.zeros(4), tol)
        assert not res.passed and res.failed == "nonfinite"
        with pytest.raises(ToleranceError, match="do not add up"):
            evaluate_rule(np.zeros(4), np.zeros(4), tol, feed_sizes=[1, 2])

    def test_star_sets_every_output_and_an_own_key_wins(self):
        tols = parse_tolerances({"": {"atol": 0.5, "rtol": 0.1}, "probs": {"atol": 0.01, "rtol": 0.0}}, "bf16")
        assert tols["logits"].atol == tols["member_logits"].atol == tols[""].atol == 0.5
        assert tols["logits"].stat == "quantile" and tols["logits"].feed_quantile == 0.99  # kept from BF16
        assert tols["probs"].atol == 0.01

    def test_fp32_stays_the_elementwise_max(self):
        for tol in default_tolerances("fp32").values():
            assert tol.stat == "max" and tol.max_limit is None and tol.feed_quantile is None


class TestNonFinite:
    @pytest.mark.parametrize("stat", ["max", "mean", "median", "quantile"])
    @pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
    def test_nan_and_inf_always_fail_with_the_first_index(self, stat, bad):
        ref = np.zeros((4, 3), np.float32)
        cand = ref.copy()
        cand[1, 2] = bad
        cand[3, 0] = math.nan
        result = evaluate_rule(cand, ref, Tolerance(1e9, 1e9, stat))
        assert not result.passed
        assert result.nonfinite[0] == (1, 2)

    def test_first_nonfinite_is_row_major(self):
        arr = np.zeros((2, 2, 2))
        arr[1, 0, 1] = math.inf
        arr[0, 1, 1] = math.nan
        index, value = first_nonfinite(arr)
        assert index == (0, 1, 1) and math.isnan(value)
        assert first_nonfinite(np.arange(3)) is None

    def test_message_names_output_feed_and_index(self):
        refs = [np.zeros((2, 3), np.float32), np.zeros((4, 3), np.float32)]
        cands = [refs[0].copy(), refs[1].copy()]
        cands[1][2, 1] = math.nan
        comp = compare_output("probs", refs, cands, ["generated[0]", "id[0]"], Tolerance(1.0, 1.0, "mean"))
        assert not comp.passed
        assert comp.nonfinite == {"feed": "id[0]", "index": [2, 1], "value": "nan"}
        assert "output 'probs'" in comp.message() and "id[0] index (2, 1)" in comp.message()


class TestMetricDelta:
    def test_absolute_and_relative(self):
        assert evaluate_metric(0.80, 0.804, MetricTolerance(0.005)) == (True, pytest.approx(0.004), 0.005)
        assert not evaluate_metric(0.80, 0.806, MetricTolerance(0.005))[0]
        passed, _delta, limit = evaluate_metric(2.0, 2.03, MetricTolerance(0.0, 0.02))
        assert passed and limit == pytest.approx(0.04)

    def test_nan_metrics(self):
        assert evaluate_metric(math.nan, math.nan, MetricTolerance(0.005))[0]
        assert not evaluate_metric(0.5, math.nan, MetricTolerance(0.005))[0]
        assert not evaluate_metric(math.nan, 0.5, MetricTolerance(0.005))[0]


def test_tolerance_error_is_a_toolchain_error():
    assert issubclass(ToleranceError, ToolchainError)
