"""uq_report keys/values, input validation errors, and the plotting helpers."""

import math

import numpy as np
import pytest

import toolchain.metrics as M
from toolchain.errors import ToolchainError
from toolchain.metrics import MetricInputError, report_keys, uq_report

BASE = ["accuracy", "nll", "brier", "ece", "failure_auroc"]


def _softmax(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


@pytest.fixture
def data():
    rng = np.random.default_rng(0)
    m_id = rng.normal(size=(40, 3, 4)) * 3
    m_ood = rng.normal(size=(30, 3, 4))
    return {
        "probs_id": _softmax(m_id).mean(axis=1),
        "labels_id": rng.integers(0, 4, size=40),
        "probs_ood": _softmax(m_ood).mean(axis=1),
        "member_logits_id": m_id,
        "member_logits_ood": m_ood,
    }


def test_report_base_keys_only(data):
    out = uq_report(data["probs_id"], data["labels_id"])
    assert list(out) == BASE == list(report_keys(False, False))
    assert out["accuracy"] == M.accuracy(data["probs_id"], data["labels_id"])
    assert out["nll"] == M.nll(data["probs_id"], data["labels_id"])
    assert out["brier"] == M.brier(data["probs_id"], data["labels_id"])
    assert out["ece"] == M.ece(data["probs_id"], data["labels_id"])
    assert out["failure_auroc"] == M.failure_auroc(data["probs_id"], data["labels_id"])


def test_report_all_keys_stable_order_and_values(data):
    out = uq_report(**data, n_bins=10)
    expected = BASE + [f"{m}_{s}" for s in ("msp", "entropy", "mi", "disagreement") for m in ("auroc", "aupr", "fpr95")]
    assert list(out) == expected == list(report_keys(True, True))
    for key, value in out.items():
        assert type(value) is float, key
        if key == "nll":
            assert value >= 0.0
        elif key == "brier":
            assert 0.0 <= value <= 2.0
        else:
            assert 0.0 <= value <= 1.0, key
    assert out["ece"] == M.ece(data["probs_id"], data["labels_id"], n_bins=10)
    msp_id, msp_ood = M.msp_score(data["probs_id"]), M.msp_score(data["probs_ood"])
    assert out["auroc_msp"] == M.auroc(msp_id, msp_ood)
    assert out["fpr95_msp"] == M.fpr_at_95_tpr(msp_id, msp_ood)
    mi_id = M.mutual_information(data["member_logits_id"])
    mi_ood = M.mutual_information(data["member_logits_ood"])
    assert out["aupr_mi"] == M.aupr(mi_id, mi_ood)
    h_id, h_ood = M.entropy_score(data["probs_id"]), M.entropy_score(data["probs_ood"])
    assert out["auroc_entropy"] == M.auroc(h_id, h_ood)


def test_report_members_without_probs_ood(data):
    out = uq_report(
        data["probs_id"],
        data["labels_id"],
        member_logits_id=data["member_logits_id"],
        member_logits_ood=data["member_logits_ood"],
    )
    assert list(out) == list(report_keys(False, True))
    assert "auroc_mi" in out and "auroc_msp" not in out


def test_report_failure_auroc_nan_when_all_correct():
    out = uq_report([[0.9, 0.1], [0.3, 0.7]], [0, 1])
    assert out["accuracy"] == 1.0 and math.isnan(out["failure_auroc"])


def test_report_validation(data):
    with pytest.raises(ValueError, match="give both"):
        uq_report(data["probs_id"], data["labels_id"], member_logits_id=data["member_logits_id"])
    with pytest.raises(ValueError, match="probs_ood: has 3 classes"):
        uq_report(data["probs_id"], data["labels_id"], probs_ood=np.full((5, 3), 1 / 3))
    with pytest.raises(ValueError, match="member_logits_id: has 39 samples"):
        uq_report(
            data["probs_id"],
            data["labels_id"],
            member_logits_id=data["member_logits_id"][1:],
            member_logits_ood=data["member_logits_ood"],
        )
    with pytest.raises(ValueError, match="member_logits_ood: has 2 members"):
        uq_report(
            data["probs_id"],
            data["labels_id"],
            member_logits_id=data["member_logits_id"],
            member_logits_ood=data["member_logits_ood"][:, :2],
        )
    bad = data["probs_ood"].copy()
    bad[7, 2] = np.nan
    with pytest.raises(ValueError, match=r"probs_ood: non-finite value nan at index \[7, 2\]"):
        uq_report(data["probs_id"], data["labels_id"], probs_ood=bad)


def test_errors_are_value_errors_and_toolchain_errors():
    with pytest.raises(MetricInputError) as info:
        M.accuracy([[0.5, 0.5]], [2])
    assert isinstance(info.value, ValueError) and isinstance(info.value, ToolchainError)
    assert info.value.exit_code == 2


@pytest.mark.parametrize(
    ("call", "pattern"),
    [
        (
            lambda: M.nll([[0.5, 0.5], [0.2, np.inf]], [0, 1]),
            r"probs: non-finite value inf at index \[1, 1\]",
        ),
        (
            lambda: M.nll([[0.5, 0.5], [np.nan, 1.0]], [0, 1]),
            r"probs: non-finite value nan at index \[1, 0\]",
        ),
        (
            lambda: M.accuracy([[0.5, 0.5], [0.5, 0.5], [1, 0]], [0, 1, 2]),
            r"labels: label 2 at index 2 is out of range \[0, 2\)",
        ),
        (lambda: M.accuracy([[0.5, 0.5]], [-1]), r"labels: label -1 at index 0 is out of range"),
        (
            lambda: M.accuracy([[0.5, 0.5]], [0.0]),
            r"labels: expected integer class indices, got dtype float64",
        ),
        (lambda: M.accuracy([[0.5, 0.5]], [0, 1]), r"labels: has 2 labels but the probabilities have 1 rows"),
        (lambda: M.accuracy([[0.5, 0.5]], [[0]]), r"labels: expected shape \[N\]"),
        (lambda: M.brier([0.5, 0.5], [0]), r"probs: expected shape \[N, C\], got shape \(2,\)"),
        (lambda: M.brier(np.zeros((0, 3)), np.zeros(0, int)), r"probs: empty array"),
        (lambda: M.brier(np.zeros((2, 0)), [0, 0]), r"probs: empty array"),
        (lambda: M.brier([[2.0, -1.0]], [0]), r"probs: probability 2.0 outside \[0, 1\] at index \[0, 0\]"),
        (lambda: M.brier([[3.0, 1.0]], [0]), r"probs: probability 3.0 outside"),
        (lambda: M.brier([[0.5, 0.6]], [0]), r"probs: row 0 sums to 1.1"),
        (lambda: M.brier([["a", "b"]], [0]), r"probs: expected a real-valued numeric array"),
        (lambda: M.ece([[0.5, 0.5]], [0], n_bins=0), r"n_bins: expected a positive integer, got 0"),
        (lambda: M.ece([[0.5, 0.5]], [0], n_bins=2.5), r"n_bins: expected a positive integer"),
        (lambda: M.ece([[0.5, 0.5]], [0], n_bins=True), r"n_bins: expected a positive integer"),
        (lambda: M.nll([[0.5, 0.5]], [0], eps=0.0), r"eps: expected a float in \(0, 1\)"),
        (lambda: M.auroc([], [1.0]), r"id_scores: empty array"),
        (lambda: M.aupr([0.1], []), r"ood_scores: empty array"),
        (
            lambda: M.fpr_at_95_tpr([0.1, 0.2], [0.3, 0.4, 0.5, np.inf]),
            r"ood_scores: non-finite value inf at index 3",
        ),
        (lambda: M.auroc([[0.1]], [0.3]), r"id_scores: expected shape \[N\]"),
        (lambda: M.failure_auroc([[0.5, 0.5]], [0], score="bogus"), r"score: unknown score name 'bogus'"),
        (lambda: M.failure_auroc([[0.5, 0.5]], [0], score=[1.0, 2.0]), r"score: has 2 values"),
        (
            lambda: M.failure_auroc([[0.5, 0.5]], [0], score=[np.nan]),
            r"score: non-finite value nan at index 0",
        ),
        (lambda: M.mutual_information(np.zeros((2, 3))), r"member_logits: expected shape \[N, M, C\]"),
        (lambda: M.disagreement(np.zeros((2, 0, 3))), r"member_logits: empty array"),
        (
            lambda: M.expected_entropy(np.array([[[0.0, 1.0], [0.0, np.nan]]])),
            r"member_logits: non-finite value nan at index \[0, 1, 1\]",
        ),
        (lambda: M.msp_score([[0.5, 0.5], [np.nan, 0.5]]), r"probs: non-finite value nan at index \[1, 0\]"),
    ],
)
def test_validation_errors(call, pattern):
    with pytest.raises(ValueError, match=pattern):
        call()


def test_accepts_lists_and_torch_tensors():
    torch = pytest.importorskip("torch")
    probs = torch.tensor([[0.9, 0.1], [0.2, 0.8]], requires_grad=True)
    assert M.accuracy(probs, torch.tensor([0, 0])) == 0.5
    assert M.accuracy([[0.9, 0.1], [0.2, 0.8]], [0, 1]) == 1.0


def _assert_png(path):
    assert path.exists() and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not path.with_suffix(".tmp.png").exists()


def test_plot_reliability_writes_png_atomically(tmp_path, data):
    from toolchain.metrics.plots import plot_reliability

    bins = M.reliability_bins(data["probs_id"], data["labels_id"])
    out = plot_reliability(bins, tmp_path / "sub" / "rel.png")
    assert out == tmp_path / "sub" / "rel.png"
    _assert_png(out)
    assert sorted(p.name for p in (tmp_path / "sub").iterdir()) == ["rel.png"]


def test_plot_ood_histograms_writes_png_and_overwrites(tmp_path, data):
    path = tmp_path / "hist.png"
    M.plot_ood_histograms(M.msp_score(data["probs_id"]), M.msp_score(data["probs_ood"]), path, "MSP")
    _assert_png(path)
    M.plot_ood_histograms([1.0, 1.0], [1.0], str(path), "constant scores")  # degenerate range
    _assert_png(path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hist.png"]
