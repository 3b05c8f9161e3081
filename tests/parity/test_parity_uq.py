"""UQ parity on hand-made outputs: identical passes, a calibration shift fails its metric, missing outputs fail."""

from __future__ import annotations

import numpy as np
import pytest

from toolchain.errors import ToolchainError
from toolchain.parity.tolerances import DEFAULT_UQ_TOLERANCES
from toolchain.parity.uq import UQOutputs, uq_parity


def _softmax(z):
    e = np.exp(z - z.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


@pytest.fixture
def ensemble():
    rng = np.random.default_rng(0)
    members_id = rng.normal(0, 2, (120, 3, 4))
    members_id[np.arange(120), :, np.arange(120) % 4] += 3.0  # mostly right
    members_ood = rng.normal(0, 1, (60, 3, 4))
    labels = np.arange(120) % 4
    labels[::7] = (labels[::7] + 1) % 4

    def outputs(members, scale=1.0):
        return [{"probs": _softmax(members * scale).mean(1), "member_logits": members * scale}]

    return outputs, members_id, members_ood, labels


def test_identical_outputs_pass_every_metric(ensemble):
    outputs, m_id, m_ood, labels = ensemble
    report, checks = uq_parity(outputs(m_id), outputs(m_id), labels, outputs(m_ood), outputs(m_ood),
                               DEFAULT_UQ_TOLERANCES)
    assert [c.metric for c in checks] == list(report)
    assert "auroc_mi" in report and "fpr95_disagreement" in report
    assert all(c.passed and c.delta == 0 for c in checks)


def test_temperature_shift_fails_calibration_metrics_by_name(ensemble):
    outputs, m_id, m_ood, labels = ensemble
    _, checks = uq_parity(outputs(m_id), outputs(m_id, 1.5), labels, outputs(m_ood), outputs(m_ood, 1.5),
                          DEFAULT_UQ_TOLERANCES)
    failed = {c.metric: c.message() for c in checks if not c.passed}
    assert {"nll", "ece"} <= set(failed)
    assert failed["ece"].startswith("ece: FAIL: reference") and "allowed +-0.005" in failed["ece"]
    # a temperature on the members moves the MIXTURE's argmax where members disagree: the accuracy is
    # the same, yet a prediction changed that no FP32 rounding can flip, and the accuracy check says so
    ref_pred, cand_pred = outputs(m_id)[0]["probs"].argmax(1), outputs(m_id, 1.5)[0]["probs"].argmax(1)
    changed = int((ref_pred != cand_pred).sum())
    accuracy = next(c for c in checks if c.metric == "accuracy")
    assert changed >= 1 and accuracy.delta == 0 and accuracy.flips.clear_flips == changed
    assert "that rounding at fp32 cannot flip" in failed["accuracy"]


def test_logits_only_model_is_softmaxed():
    logits = np.array([[2.0, 0.0], [0.0, 1.0], [3.0, 0.0]])
    report, checks = uq_parity([{"logits": logits}], [{"logits": logits}], np.array([0, 1, 1]), [], [],
                               DEFAULT_UQ_TOLERANCES)
    assert report["accuracy"] == pytest.approx(2 / 3) and all(c.passed for c in checks)
    with pytest.raises(ToolchainError, match="none of"):
        uq_parity([{"logits": logits}], [{"logits": logits}], np.array([0, 1, 1]), [], [], DEFAULT_UQ_TOLERANCES,
                  names=UQOutputs(logits=None))


def test_candidate_without_member_logits_fails_the_member_metrics(ensemble):
    outputs, m_id, m_ood, labels = ensemble
    cand_id = [{"probs": o["probs"]} for o in outputs(m_id)]
    cand_ood = [{"probs": o["probs"]} for o in outputs(m_ood)]
    _, checks = uq_parity(outputs(m_id), cand_id, labels, outputs(m_ood), cand_ood, DEFAULT_UQ_TOLERANCES)
    failed = {c.metric: c.reason for c in checks if not c.passed}
    assert set(failed) == {f"{m}_{s}" for s in ("mi", "disagreement") for m in ("auroc", "aupr", "fpr95")}
    assert "lacks ['auroc_mi'" in failed["auroc_mi"] and "'member_logits'" in failed["auroc_mi"]


def test_invalid_reference_outputs_are_a_run_error(ensemble):
    outputs, m_id, _, labels = ensemble
    bad = [{"probs": np.full((120, 4), np.nan)}]
    with pytest.raises(ToolchainError, match="reference's outputs cannot be scored") as info:
        uq_parity(bad, outputs(m_id), labels, [], [], DEFAULT_UQ_TOLERANCES)
    assert info.value.exit_code == 2
