"""Rank-metric gates that must not fail correct engines: a delta at its limit, unresolvable rank
metrics on flat scores (the only ones left not resolvable); a broken engine with a real spread still
fails; deterministic reports. The calibrated bound itself: tests/parity/test_rank_gate.py."""

from __future__ import annotations

import json

import numpy as np
from junitparser import JUnitXml, Skipped

from toolchain.engines import make_runner
from toolchain.metrics import fpr_at_95_tpr
from toolchain.parity import DEFAULT_UQ_TOLERANCES, MetricTolerance, run_parity, uq_parity
from toolchain.parity.resolution import is_rank_metric
from toolchain.parity.tolerances import evaluate_metric
from toolchain.parity.verdict import Check, Verdict


def test_fpr95_delta_exactly_at_the_limit_passes():
    # the reported reproduction: FPR95 13/20 -> 12/20 is a delta of -0.050000000000000044 in float64
    assert 0.6 - 0.65 == -0.050000000000000044
    passed, delta, limit = evaluate_metric(0.65, 0.6, MetricTolerance(atol=0.05))
    assert passed and limit == 0.05 and delta == -0.050000000000000044
    # the same through the metric itself: 20 ID samples, 13 then 12 of them above the 95%-TPR threshold
    ood = np.linspace(1.0, 2.0, 20)
    ref = fpr_at_95_tpr(np.r_[np.zeros(7), np.full(13, 1.5)], ood)
    cand = fpr_at_95_tpr(np.r_[np.zeros(8), np.full(12, 1.5)], ood)
    assert (ref, cand) == (0.65, 0.6)
    assert evaluate_metric(ref, cand, MetricTolerance(atol=0.05))[0]
    # one count more is a real change and still fails, and so does a limit just below the step
    assert not evaluate_metric(0.65, 0.55, MetricTolerance(atol=0.05))[0]
    assert not evaluate_metric(0.65, 0.6, MetricTolerance(atol=0.0499))[0]


def _flat_case(rng, n_id=64, n_ood=64, members=2):
    """Near-untrained ensemble: member logits ~1e-4 apart, mean confidences within 0.33648-0.33657."""
    base = np.array([0.01425, 0.0, 0.0])
    logits = base + rng.uniform(0, 1.5e-4, (n_id + n_ood, members, 3))
    probs = (np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)).mean(1)
    labels = probs[:n_id].argmax(1).copy()
    labels[::3] = (labels[::3] + 1) % 3
    return logits, probs, labels


def _outputs(probs, logits):
    return [{"probs": probs, "member_logits": logits}]


def test_flat_scores_below_fp16_resolution_are_not_resolvable_and_not_failures():
    rng = np.random.default_rng(0)
    logits, probs, labels = _flat_case(rng)
    conf = probs.max(1)
    assert 0.3364 < conf.min() and conf.max() < 0.3366 and np.ptp(conf) < 2.4e-4  # below FP16's spacing at 0.34
    # a correct FP16 engine: the reference's logits rounded to FP16 and back (every value within rounding)
    cand_logits = logits.astype(np.float16).astype(np.float64)
    cand_probs = (np.exp(cand_logits) / np.exp(cand_logits).sum(-1, keepdims=True)).mean(1)
    n = 64
    args = (_outputs(probs[:n], logits[:n]), _outputs(cand_probs[:n], cand_logits[:n]), labels,
            _outputs(probs[n:], logits[n:]), _outputs(cand_probs[n:], cand_logits[n:]), DEFAULT_UQ_TOLERANCES)
    _, checks = uq_parity(*args, precision="fp16")
    assert [c.metric for c in checks if is_rank_metric(c.metric)
            and not evaluate_metric(c.reference, c.candidate, c.tolerance)[0]], \
        "without the resolution rule the rank metrics of this correct engine fail (the reported false alarm)"
    by = {c.metric: c for c in checks}
    assert not [c.message() for c in checks if c.status == "fail"]
    unresolved = [c for c in checks if c.status == "unresolved"]
    assert {"fpr95_mi", "auroc_msp", "fpr95_msp"} <= {c.metric for c in unresolved}
    assert all(is_rank_metric(c.metric) for c in unresolved)  # accuracy, NLL, ECE ... are still gated
    assert by["accuracy"].status == "pass" and by["nll"].status == "pass"
    msg = by["fpr95_mi"].message()
    assert "NOT RESOLVABLE" in msg and "fp16 rounding" in msg and "64 pos/64 neg" in msg
    res = by["fpr95_mi"].to_dict()
    assert res["status"] == "unresolved" and res["resolution"]["flat"]
    assert res["resolution"]["worst_case"] > res["limit"]
    assert "flat reference scores" in msg

    # the verdict: exit 0, the reason in report.json, JUnit (skipped) and the summary
    verdict = Verdict("ref", ["ort-fp16"], [Check("ort-fp16", f"uq/{c.metric}", c.status, c.message(), c.to_dict())
                                            for c in checks], {"precisions": {"ort-fp16": "fp16"}})
    assert verdict.exit_code == 0 and verdict.passed and not verdict.problems()
    assert len(verdict.notes()) == len(unresolved)
    report = verdict.to_dict()
    assert report["summary"]["unresolved"] == len(unresolved) and "not resolvable" in report["unresolved"][0]
    assert "not resolvable" in verdict.to_markdown() and "not resolvable" in verdict.headline()
    path = verdict.write(__import__("pathlib").Path(__import__("tempfile").mkdtemp()))["junit"]
    cases = [case for suite in JUnitXml.fromfile(str(path)) for case in suite]
    skipped = [c for c in cases if c.result and isinstance(c.result[0], Skipped)]
    assert len(skipped) == len(unresolved) and "NOT RESOLVABLE" in skipped[0].result[0].message


def test_broken_engine_with_a_real_spread_still_fails():
    rng = np.random.default_rng(1)
    n = 200
    logits = rng.normal(0, 2.5, (2 * n, 3, 3))
    logits[n:] *= 0.3  # OOD: less confident, a real spread of scores
    probs = (np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)).mean(1)
    labels = probs[:n].argmax(1)
    labels[::4] = (labels[::4] + 1) % 3
    perm = rng.permutation(2 * n)  # broken: every sample gets another sample's outputs
    out = _outputs(probs[:n], logits[:n]), _outputs(probs[n:], logits[n:])
    bad = _outputs(probs[perm][:n], logits[perm][:n]), _outputs(probs[perm][n:], logits[perm][n:])
    for precision in ("fp16", "bf16"):
        _, checks = uq_parity(out[0], bad[0], labels, out[1], bad[1], DEFAULT_UQ_TOLERANCES, precision=precision)
        failed = {c.metric for c in checks if c.status == "fail"}
        assert {"auroc_msp", "fpr95_msp", "auroc_mi", "fpr95_mi", "failure_auroc"} <= failed, precision
        assert not [c for c in checks if c.status == "unresolved" and c.metric.endswith("_msp")]
        # the same outputs unbroken pass, every check decided (the calibrated bound, even at BF16 on 200 samples)
        _, same = uq_parity(out[0], out[0], labels, out[1], out[1], DEFAULT_UQ_TOLERANCES, precision=precision)
        assert all(c.status == "pass" for c in same)


def test_two_parity_runs_write_byte_identical_report_and_junit(vit_case, tmp_path):
    def run(folder):
        return run_parity(vit_case.reference(), {"ort": make_runner("onnxrt-cpu", path=vit_case.onnx_path,
                                                                    intra_op_threads=1)},
                          vit_case.generated, vit_case.id_feeds, vit_case.ood_feeds, out_dir=tmp_path / folder)

    first, second = run("a"), run("b")
    assert first.checks[0].seconds > 0  # timings are still measured, in memory and in the log
    for name in ("report.json", "junit.xml", "summary.md"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
    report = json.loads((tmp_path / "a" / "report.json").read_text())
    assert "created" not in report and "seconds" not in json.dumps(report)
    assert "timestamp" not in (tmp_path / "a" / "junit.xml").read_text()
    assert second.exit_code == 0
