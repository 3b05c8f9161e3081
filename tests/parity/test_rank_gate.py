"""The calibrated rank gate (toolchain/parity/resolution.py): the vectorised rank metrics equal the
library's, the bound depends on the reference alone and is deterministic, correct FP16/BF16
candidates pass with no check left undecided, broken ones fail, flat scores stay not resolvable.

The synthetic outputs come from benchmarks/rank_gate/synthetic.py, the generator behind the
benchmark's false-alarm and catch rates (benchmarks/rank_gate/results.md)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
from sklearn.metrics import roc_auc_score

from toolchain.metrics.ood import ood_metrics
from toolchain.parity import DEFAULT_UQ_TOLERANCES, resolution, uq_parity
from toolchain.parity.resolution import is_rank_metric, rank_metrics, rank_resolutions

_SPEC = importlib.util.spec_from_file_location(
    "rank_gate_synthetic", Path(__file__).resolve().parents[2] / "benchmarks" / "rank_gate" / "synthetic.py")
synthetic = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(synthetic)


def _scores(rng: np.random.Generator, kind: int, n: int) -> np.ndarray:
    if kind == 0:
        return rng.integers(0, 5, n).astype(float)  # heavy ties
    if kind == 1:
        return np.round(rng.normal(size=n), 1)  # some ties
    return rng.normal(size=n)  # none


def test_rank_metrics_equal_the_library_ones_ties_included():
    rng = np.random.default_rng(0)
    worst = 0.0
    for trial in range(45):
        n_neg, n_pos = (int(x) for x in rng.integers(1, 80, 2))
        rows = np.stack([_scores(rng, (trial + k) % 3, n_neg + n_pos) for k in range(3)])
        pos = rng.permutation(np.r_[np.zeros(n_neg, bool), np.ones(n_pos, bool)])
        got = rank_metrics(rows, pos)
        per_row_labels = np.stack([rng.permutation(pos) for _ in rows])  # [D, n] labels: one set per row
        got_2d = rank_metrics(rows, per_row_labels)
        for i, s in enumerate(rows):
            want = ood_metrics(s[~pos], s[pos])
            want_2d = ood_metrics(s[~per_row_labels[i]], s[per_row_labels[i]])
            for m in ("auroc", "aupr", "fpr95"):
                worst = max(worst, abs(got[m][i] - want[m]), abs(got_2d[m][i] - want_2d[m]))
    assert worst <= 1e-12
    # failure AUROC is the same AUROC with the errors positive (scikit-learn directly)
    s, wrong = rng.normal(size=300).round(1), rng.random(300) < 0.3
    assert abs(rank_metrics(s, wrong)["auroc"][0] - roc_auc_score(wrong, s)) <= 1e-12


def test_rank_metrics_edge_cases():
    pos = np.r_[np.zeros(6, bool), np.ones(4, bool)]
    flat = rank_metrics(np.zeros(10), pos)
    assert (flat["auroc"][0], flat["aupr"][0], flat["fpr95"][0]) == (0.5, 0.4, 1.0)  # chance, prevalence, all
    perfect = rank_metrics(pos.astype(float), pos)
    assert (perfect["auroc"][0], perfect["aupr"][0], perfect["fpr95"][0]) == (1.0, 1.0, 0.0)
    one_class = rank_metrics(np.arange(10.0)[None].repeat(2, 0), np.stack([pos, np.zeros(10, bool)]))
    assert np.isfinite(one_class["auroc"][0]) and np.isnan(one_class["auroc"][1])
    with pytest.raises(ValueError):
        rank_metrics(np.zeros((2, 10)), np.zeros(9, bool))


def _case(n_id=1000, n_ood=500, spread=2.5):
    ref, labels = synthetic.reference(n_id, n_ood, spread, seed=0)
    return ref, labels, ref.feeds()


def _judge(ref_feeds, cand, labels, precision):
    (r_id, r_ood), (c_id, c_ood) = ref_feeds, cand.feeds()
    _, checks = uq_parity(r_id, c_id, labels, r_ood, c_ood, DEFAULT_UQ_TOLERANCES, precision=precision)
    return [c for c in checks if is_rank_metric(c.metric)]


def test_the_bound_is_deterministic_and_depends_on_the_reference_alone():
    ref, labels, feeds = _case(400, 200)
    args = (ref.probs_id, labels, ref.probs_ood, ref.logits_id, ref.logits_ood, "bf16")
    resolution._CACHE.clear()
    first = {k: v.to_dict() for k, v in rank_resolutions(*args).items()}
    resolution._CACHE.clear()  # computed again, not remembered
    again = {k: v.to_dict() for k, v in rank_resolutions(*(np.copy(a) if isinstance(a, np.ndarray) else a
                                                           for a in args)).items()}
    assert first == again and len(first) == 13
    assert all(r["draws"] == resolution.DRAWS and 0 < r["bound"] <= r["worst_case"] for k, r in first.items()
               if k != "fpr95_disagreement")
    # a correct and a broken candidate are judged against the same bounds: the candidate cannot move them
    good = {c.metric: c.resolution for c in _judge(feeds, synthetic.correct(ref, "bf16", 1.0, 1), labels, "bf16")}
    bad = {c.metric: c.resolution for c in _judge(feeds, synthetic.broken(ref, "bf16", "swap", 0.3, 1), labels,
                                                    "bf16")}
    assert good == bad


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
@pytest.mark.parametrize(("n_id", "n_ood", "spread"), [(200, 200, 1.0), (1000, 500, 2.5), (1000, 500, 5.0)])
def test_correct_candidates_pass_and_every_check_decides(precision, n_id, n_ood, spread):
    ref, labels, feeds = _case(n_id, n_ood, spread)
    checks = [c for upstream in (0.0, 1.0, 2.0) for seed in range(4)
              for c in _judge(feeds, synthetic.correct(ref, precision, upstream, seed), labels, precision)]
    assert len(checks) == 12 * 13
    assert not [c.message() for c in checks if c.status != "pass"]  # no false alarm, nothing undecided
    if precision == "bf16":  # ... where the worst-case rule could not decide many of them
        assert sum(c.resolution.worst_case > c.limit for c in checks) > len(checks) // 3


@pytest.mark.parametrize(("fault", "size"), [("swap", 0.05), ("bias", 0.2), ("noise", 10.0)])
def test_broken_candidates_fail(fault, size):
    ref, labels, feeds = _case()
    for seed in range(3):
        checks = _judge(feeds, synthetic.broken(ref, "bf16", fault, size, seed), labels, "bf16")
        failed = [c for c in checks if c.status == "fail"]
        assert failed, (fault, size, seed)
        assert all("beyond" in c.reason or c.resolution.bound <= c.limit for c in failed)
        assert not [c for c in checks if c.status == "unresolved"]


def test_flat_scores_are_flat_and_spread_scores_are_not():
    rng = np.random.default_rng(0)
    logits = np.array([0.01425, 0.0, 0.0]) + rng.uniform(0, 1.5e-4, (128, 2, 3))  # near-untrained members
    probs = (np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)).mean(1)
    labels = probs[:64].argmax(1)
    labels[::3] = (labels[::3] + 1) % 3
    flat = rank_resolutions(probs[:64], labels, probs[64:], logits[:64], logits[64:], "fp16")
    assert flat["auroc_msp"].flat and flat["fpr95_mi"].flat
    assert not flat["auroc_msp"].resolvable(0.005) and flat["auroc_msp"].worst_case > 0.005
    ref, labels, _ = _case(200, 200, 1.0)
    spread = rank_resolutions(ref.probs_id, labels, ref.probs_ood, ref.logits_id, ref.logits_ood, "bf16")
    assert not any(r.flat for r in spread.values()) and all(r.resolvable(0.0) for r in spread.values())
