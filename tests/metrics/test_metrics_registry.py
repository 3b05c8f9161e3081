"""The UQ-metric registry: every table, gate and gain reads it, in the orders the outputs always had."""

from __future__ import annotations

import numpy as np

from toolchain.metrics import ensemble_gain, uq_report
from toolchain.metrics.gain import GAIN_METRICS, LOWER_IS_BETTER
from toolchain.metrics.registry import UQ_METRICS, metrics_in, uq_metric, view_columns, view_keys
from toolchain.parity.resolution import is_rank_metric
from toolchain.parity.tolerances import DEFAULT_UQ_TOLERANCES, resolve_metric_tolerance


def test_views_keep_the_published_orders():
    assert view_columns("table") == [
        ("accuracy", "acc"), ("nll", "NLL"), ("ece", "ECE"), ("brier", "Brier"), ("auroc_msp", "AUROC (MSP)"),
        ("aupr_msp", "AUPR (MSP)"), ("fpr95_msp", "FPR95 (MSP)"), ("auroc_mi", "AUROC (MI)")]
    assert view_columns("gain_table") == [
        ("nll", "NLL"), ("ece", "ECE"), ("brier", "Brier"), ("accuracy", "acc"), ("auroc_msp", "AUROC (MSP)"),
        ("auroc_mi", "AUROC (MI) vs member MSP")]
    assert view_keys("summary") == ["accuracy", "nll", "ece", "brier", "auroc_msp", "fpr95_msp", "auroc_mi"]
    assert GAIN_METRICS == ("nll", "ece", "brier", "accuracy", "auroc_msp", "auroc_entropy", "auroc_mi")
    assert LOWER_IS_BETTER == ("nll", "ece", "brier")


def test_uq_report_and_gain_keys_come_from_the_registry():
    rng = np.random.default_rng(0)
    logits, logits_ood = rng.normal(size=(40, 3, 4)), rng.normal(size=(30, 3, 4))
    probs = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    probs_ood = np.exp(logits_ood) / np.exp(logits_ood).sum(-1, keepdims=True)
    labels = rng.integers(0, 4, 40)
    report = uq_report(probs.mean(1), labels, probs_ood.mean(1), logits, logits_ood)
    assert list(report) == list(UQ_METRICS)
    gain = ensemble_gain(logits, labels, logits_ood, n_boot=20)
    assert list(gain) == [m.key for m in metrics_in("gain")]
    for key, entry in gain.items():  # the direction decides the sign of the gain
        higher = UQ_METRICS[key].higher_is_better
        if key != "auroc_mi":
            assert np.isclose(entry["gain"], (entry["ensemble"] - entry["members_mean"]) * (1 if higher else -1))


def test_parity_reads_rank_and_family_from_the_registry():
    assert [k for k in UQ_METRICS if is_rank_metric(k)] == [k for k, m in UQ_METRICS.items() if m.rank]
    assert not any(is_rank_metric(k) for k in ("accuracy", "nll", "brier", "ece"))
    for key, metric in UQ_METRICS.items():
        assert resolve_metric_tolerance(DEFAULT_UQ_TOLERANCES, key) == DEFAULT_UQ_TOLERANCES[
            key if key in DEFAULT_UQ_TOLERANCES else metric.family]
    assert uq_metric("nope") is None
