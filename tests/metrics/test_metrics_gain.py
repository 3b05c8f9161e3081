"""Ensemble gain with paired-bootstrap CIs: hand-built cases, agreement with uq_report, the bootstrap."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.metrics import roc_auc_score

from toolchain.metrics import (
    GAIN_METRICS,
    MetricInputError,
    accuracy,
    auroc,
    bootstrap_auroc,
    brier,
    ece,
    ensemble_gain,
    ensemble_probs,
    entropy_score,
    member_probs,
    msp_score,
    mutual_information,
    nll,
    uq_report,
)


def _logits(seed: int, n: int, m: int, c: int, scale: float = 2.0) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(n, m, c)) * scale


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    n, k, m, c = 60, 40, 3, 4
    labels = rng.integers(0, c, n)
    lid = _logits(1, n, m, c)
    lid[np.arange(n), :, labels] += 1.5  # better than chance
    return lid, labels, _logits(2, k, m, c, scale=0.7)


def test_identical_members_gain_exactly_zero():
    one = _logits(3, 50, 1, 3)
    lid = np.repeat(one, 2, axis=1)  # two identical members: their mean probabilities are exact
    labels = np.random.default_rng(3).integers(0, 3, 50)
    lood = np.repeat(_logits(4, 30, 1, 3, scale=0.5), 2, axis=1)
    out = ensemble_gain(lid, labels, lood, n_boot=200, seed=1)
    assert tuple(out) == GAIN_METRICS
    for key in GAIN_METRICS[:-1]:
        assert out[key]["gain"] == 0.0, key
        assert out[key]["ci"] == [0.0, 0.0], key
        assert out[key]["excludes_zero"] is False
        assert out[key]["ensemble"] == out[key]["members_mean"]
    # MI is 0 everywhere: its AUROC is 0.5, compared with one member's MSP AUROC
    mi = out["auroc_mi"]
    assert mi["ensemble"] == 0.5
    assert mi["members_mean"] == out["auroc_msp"]["members_mean"]
    assert mi["gain"] == pytest.approx(0.5 - out["auroc_msp"]["members_mean"], abs=1e-15)


def test_complementary_errors_give_a_significant_nll_gain():
    # member 0 is confidently right on the first half and confidently wrong on the second, member 1
    # the other way round: the ensemble hedges and its NLL is far lower than each member's
    n, c = 40, 3
    labels = np.arange(n) % c
    wrong = (labels + 1) % c
    lid = np.zeros((n, 2, c))
    half = np.arange(n) < n // 2
    lid[half, 0, labels[half]] = 6.0
    lid[~half, 0, wrong[~half]] = 6.0
    lid[~half, 1, labels[~half]] = 6.0
    lid[half, 1, wrong[half]] = 6.0
    out = ensemble_gain(lid, labels, n_boot=300, seed=0)
    assert set(out) == {"nll", "ece", "brier", "accuracy"}
    g = out["nll"]
    assert g["gain"] > 2.0 and g["ci"][0] > 0 and g["excludes_zero"] is True
    assert g["ensemble"] < g["members_mean"]
    assert out["brier"]["gain"] > 0 and out["brier"]["excludes_zero"] is True


@pytest.mark.parametrize("seed", range(4))
def test_nll_gain_is_nonnegative_per_sample(seed):
    lid = _logits(10 + seed, 80, 3, 5, scale=3.0)
    labels = np.random.default_rng(seed).integers(0, 5, 80)
    pm = member_probs(lid)
    rows = np.arange(80)
    per_sample = -np.log(pm[rows, :, labels]).mean(axis=1) + np.log(pm.mean(axis=1)[rows, labels])
    assert (per_sample >= -1e-12).all()  # Jensen: -log of the mean <= mean of -log
    out = ensemble_gain(lid, labels, n_boot=300, level=0.999, seed=seed)["nll"]
    assert out["gain"] == pytest.approx(per_sample.mean(), rel=1e-10)
    assert out["ci"][0] >= 0.0  # so every resample's gain is >= 0


def test_point_values_agree_with_uq_report(data):
    lid, labels, lood = data
    out = ensemble_gain(lid, labels, lood, n_boot=50)
    report = uq_report(ensemble_probs(lid), labels, ensemble_probs(lood), lid, lood)
    for key in ("accuracy", "nll", "brier", "ece", "auroc_msp", "auroc_entropy", "auroc_mi"):
        assert out[key]["ensemble"] == report[key], key
    pm_id, pm_ood = member_probs(lid), member_probs(lood)
    member_reports = [uq_report(pm_id[:, i], labels, pm_ood[:, i]) for i in range(lid.shape[1])]
    for key in ("accuracy", "nll", "brier", "ece", "auroc_msp", "auroc_entropy"):
        mean = np.mean([r[key] for r in member_reports])
        assert out[key]["members_mean"] == pytest.approx(mean, rel=1e-12), key
    assert out["auroc_mi"]["members_mean"] == out["auroc_msp"]["members_mean"]
    assert out["nll"]["gain"] == pytest.approx(out["nll"]["members_mean"] - report["nll"], rel=1e-12)
    assert out["auroc_msp"]["gain"] == pytest.approx(report["auroc_msp"] - out["auroc_msp"]["members_mean"])


def test_one_resample_equals_the_reference_metrics_on_that_resample(data):
    # with n_boot = 1 the interval is the single resample's gain: recompute it with the plain metrics
    lid, labels, lood = data
    seed = 7
    out = ensemble_gain(lid, labels, lood, n_boot=1, seed=seed)
    rng = np.random.default_rng(seed)
    i_id = rng.integers(0, lid.shape[0], size=(1, lid.shape[0]))[0]
    i_ood = rng.integers(0, lood.shape[0], size=(1, lood.shape[0]))[0]
    rid, y, rood = lid[i_id], labels[i_id], lood[i_ood]
    pe, pm = ensemble_probs(rid), member_probs(rid)
    pe_o, pm_o = ensemble_probs(rood), member_probs(rood)
    m = lid.shape[1]
    expected = {}
    for key, fn in (("nll", nll), ("ece", ece), ("brier", brier)):
        expected[key] = np.mean([fn(pm[:, i], y) for i in range(m)]) - fn(pe, y)
    expected["accuracy"] = accuracy(pe, y) - np.mean([accuracy(pm[:, i], y) for i in range(m)])
    msp_members = np.mean([auroc(msp_score(pm[:, i]), msp_score(pm_o[:, i])) for i in range(m)])
    expected["auroc_msp"] = auroc(msp_score(pe), msp_score(pe_o)) - msp_members
    expected["auroc_entropy"] = auroc(entropy_score(pe), entropy_score(pe_o)) - np.mean(
        [auroc(entropy_score(pm[:, i]), entropy_score(pm_o[:, i])) for i in range(m)]
    )
    expected["auroc_mi"] = auroc(mutual_information(rid), mutual_information(rood)) - msp_members
    for key, value in expected.items():
        lo, hi = out[key]["ci"]
        assert lo == hi == pytest.approx(value, rel=1e-9, abs=1e-12), key


def test_bootstrap_auroc_equals_sklearn():
    rng = np.random.default_rng(5)
    s_id = rng.integers(0, 6, 70).astype(float)  # many ties
    s_ood = rng.integers(2, 8, 45).astype(float)
    y = np.r_[np.zeros(70), np.ones(45)]
    full = bootstrap_auroc(s_id, s_ood, np.arange(70)[None], np.arange(45)[None])
    assert full[0] == pytest.approx(roc_auc_score(y, np.r_[s_id, s_ood]), abs=1e-15)
    idx_id, idx_ood = rng.integers(0, 70, (5, 70)), rng.integers(0, 45, (5, 45))
    boot = bootstrap_auroc(s_id, s_ood, idx_id, idx_ood)
    for b in range(5):
        ref = roc_auc_score(y, np.r_[s_id[idx_id[b]], s_ood[idx_ood[b]]])
        assert boot[b] == pytest.approx(ref, abs=1e-15)
    assert bootstrap_auroc(np.zeros(3), np.zeros(2), np.arange(3)[None], np.arange(2)[None])[0] == 0.5


def test_reproducible_per_seed_and_level_widens(data):
    lid, labels, lood = data
    a = ensemble_gain(lid, labels, lood, n_boot=200, seed=3)
    b = ensemble_gain(lid, labels, lood, n_boot=200, seed=3)
    c = ensemble_gain(lid, labels, lood, n_boot=200, seed=4)
    assert a == b
    assert a["nll"]["ci"] != c["nll"]["ci"] and a["nll"]["gain"] == c["nll"]["gain"]
    wide = ensemble_gain(lid, labels, lood, n_boot=200, seed=3, level=0.99)
    for key in GAIN_METRICS:
        assert wide[key]["ci"][0] <= a[key]["ci"][0] and wide[key]["ci"][1] >= a[key]["ci"][1]


@pytest.mark.parametrize(
    ("args", "kwargs", "match"),
    [
        ((np.zeros((5, 1, 3)), np.zeros(5, int)), {}, "M >= 2"),
        ((np.zeros((5, 2)), np.zeros(5, int)), {}, "member_logits_id"),
        ((np.full((5, 2, 3), np.nan), np.zeros(5, int)), {}, "non-finite"),
        ((np.zeros((5, 2, 3)), np.zeros(4, int)), {}, "labels"),
        ((np.zeros((5, 2, 3)), np.full(5, 3)), {}, "out of range"),
        ((np.zeros((5, 2, 3)), np.zeros(5, int), np.zeros((4, 3, 3))), {}, "member_logits_ood"),
        ((np.zeros((5, 2, 3)), np.zeros(5, int), np.zeros((4, 2, 2))), {}, "member_logits_ood"),
        ((np.zeros((5, 2, 3)), np.zeros(5, int)), {"n_boot": 0}, "n_boot"),
        ((np.zeros((5, 2, 3)), np.zeros(5, int)), {"n_boot": 2.5}, "n_boot"),
        ((np.zeros((5, 2, 3)), np.zeros(5, int)), {"level": 1.0}, "level"),
        ((np.zeros((5, 2, 3)), np.zeros(5, int)), {"level": True}, "level"),
        ((np.zeros((5, 2, 3)), np.zeros(5, int)), {"seed": -1}, "seed"),
        ((np.zeros((5, 2, 3)), np.zeros(5, int)), {"n_bins": 0}, "n_bins"),
    ],
)
def test_input_errors(args, kwargs, match):
    with pytest.raises(MetricInputError, match=match):
        ensemble_gain(*args, **kwargs)


def test_paired_difference_of_a_model_with_itself_is_exactly_zero(data):
    from toolchain.metrics.gain import paired_difference

    logits, labels, _ood = data
    probs = ensemble_probs(logits)
    out = paired_difference(probs, probs, labels, n_boot=200)
    for key in ("accuracy", "nll", "ece", "brier"):
        assert out[key]["diff"] == 0.0 and out[key]["ci"] == [0.0, 0.0] and not out[key]["excludes_zero"]


def test_paired_difference_points_equal_the_metrics_and_see_a_real_improvement(data):
    from toolchain.metrics.gain import paired_difference

    logits, labels, _ood = data
    member = member_probs(logits)[:, 0]
    sharper = member ** 0.5 / (member ** 0.5).sum(axis=1, keepdims=True)  # a temperature: another calibration
    out = paired_difference(member, sharper, labels, seed=1)
    assert out["nll"]["diff"] == pytest.approx(nll(member, labels) - nll(sharper, labels))
    assert out["ece"]["diff"] == pytest.approx(ece(member, labels) - ece(sharper, labels))
    assert out["accuracy"]["diff"] == 0.0  # a temperature keeps every argmax
    lo, hi = out["nll"]["ci"]
    assert lo <= out["nll"]["diff"] <= hi and out["nll"]["excludes_zero"]


def test_paired_difference_resamples_examples_with_all_their_versions(data):
    from toolchain.metrics.gain import paired_difference

    logits, labels, _ood = data
    a, b = member_probs(logits)[:, 0], member_probs(logits)[:, 1]
    one = paired_difference(a, b, labels, seed=2)
    twice = paired_difference(np.concatenate([a, a]), np.concatenate([b, b]), np.concatenate([labels, labels]),
                              seed=2, blocks=2)
    for key in ("accuracy", "nll", "brier"):  # two identical versions of every row: the same evidence as one
        assert twice[key]["diff"] == pytest.approx(one[key]["diff"])
        assert twice[key]["ci"] == pytest.approx(one[key]["ci"])
    with pytest.raises(MetricInputError, match="not 7 blocks"):
        paired_difference(a, b, labels, blocks=7)


def test_paired_auroc_difference_matches_sklearn_and_its_interval_is_that_of_the_difference():
    from sklearn.metrics import roc_auc_score

    from toolchain.metrics.gain import paired_auroc_difference

    rng = np.random.default_rng(0)
    shared_id, shared_ood = rng.normal(0, 1, 400), rng.normal(0.6, 1, 300)
    a = (shared_id + rng.normal(0, 0.3, 400), shared_ood + 0.4 + rng.normal(0, 0.3, 300))  # a better detector
    b = (shared_id + rng.normal(0, 0.3, 400), shared_ood + rng.normal(0, 0.3, 300))
    out = paired_auroc_difference(a, b, seed=3)
    y = np.r_[np.zeros(400), np.ones(300)]
    assert out["a"] == pytest.approx(roc_auc_score(y, np.r_[a]))
    assert out["b"] == pytest.approx(roc_auc_score(y, np.r_[b]))
    assert out["diff"] == pytest.approx(out["a"] - out["b"]) and out["excludes_zero"] and out["ci"][0] > 0
    # paired: both detectors share most of their scores, so the difference is far tighter than either AUROC
    assert out["ci"][1] - out["ci"][0] < 0.06
    same = paired_auroc_difference(a, a, seed=3)
    assert same["diff"] == 0.0 and same["ci"] == [0.0, 0.0] and not same["excludes_zero"]
    assert paired_auroc_difference(a, b, seed=3) == out  # seeded
    with pytest.raises(MetricInputError, match="paired_auroc_difference"):
        paired_auroc_difference(a, (b[0][:10], b[1]))
