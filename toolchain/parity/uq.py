"""UQ-metric parity: the reference's and the candidate's uncertainty metrics on the same data.

:func:`uq_parity` computes :func:`toolchain.metrics.uq_report` twice, from the reference's and from
the candidate's outputs on the same ID test samples (with labels) and OOD test samples, and
checks every metric's delta against its :class:`~toolchain.parity.tolerances.MetricTolerance`
(``|cand - ref| <= atol + rtol * |ref|``; both NaN passes, e.g. failure AUROC when every
prediction is right; one NaN fails). Each metric is one check.

Which outputs feed the report (:class:`UQOutputs`): ``probs [N, C]`` if the model has it (for a
Hydra model the mean of the members' softmax), else ``softmax(logits)``; ``member_logits
[N, M, C]`` when present adds the mutual-information and disagreement OOD scores. When the
candidate's outputs are not valid probabilities (NaN, rows not summing to 1), every metric fails
with that reason (the metrics cannot be computed), so nothing is silently skipped.

Rank metrics (``failure_auroc``, ``auroc_*``, ``aupr_*``, ``fpr95_*``) are judged against how far
rounding at the candidate's precision moves them on these samples, computed from the reference's
outputs alone (:mod:`toolchain.parity.resolution`): ``|delta| <= max(limit, bound)`` passes, where
``bound`` is the calibrated rounding bound (the largest change of the metric over 1,000 seeded
random moves of every reference score within its reach, draws where rounding leaves the metric
undefined left out and counted); a larger change fails. A check is reported as ``unresolved`` (not
resolvable: neither pass nor fail, with the reason; the numeric checks still gate the engine) only
when the reference's scores are flat (every score within rounding of every other: the
near-untrained case) and the worst case of rounding exceeds the tolerance (a change beyond that
worst case still fails), or when rounding alone leaves the metric undefined in all but a few
draws (too few failures, or OOD rows, to rank).

Flip-sensitive metrics (accuracy, ECE; failure AUROC when one side is undefined) are judged by which
of the reference's predictions rounding at the candidate's precision can flip
(:mod:`toolchain.parity.flips`): near-ties may flip, clear-margin predictions may not (beyond the
tolerance read as a number of samples), so a tolerance smaller than one sample neither fails a
correct engine nor lets a broken one pass.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from toolchain.errors import ToolchainError
from toolchain.metrics import report_keys, uq_report
from toolchain.metrics._validation import MetricInputError
from toolchain.metrics.classification import paired_ece
from toolchain.parity.flips import FlipResolution, flip_resolution
from toolchain.parity.resolution import RankResolution, rank_resolutions
from toolchain.parity.tolerances import MetricTolerance, evaluate_metric, resolve_metric_tolerance, within_limit

__all__ = ["MetricCheck", "UQOutputs", "gather_uq_inputs", "uq_parity"]


@dataclass(frozen=True)
class UQOutputs:
    """Output names that feed the UQ report.

    Args:
        probs: probabilities ``[N, C]`` (used when the model returns it).
        logits: logits ``[N, C]``, softmaxed when ``probs`` is absent; None to forbid.
        member_logits: per-member logits ``[N, M, C]`` (used when present); None to ignore.
    """

    probs: str = "probs"
    logits: str | None = "logits"
    member_logits: str | None = "member_logits"


@dataclass(frozen=True)
class MetricCheck:
    """One UQ metric: both values, the delta, its limit and the verdict."""

    metric: str
    reference: float
    candidate: float
    delta: float
    limit: float
    tolerance: MetricTolerance
    passed: bool
    reason: str = ""
    resolvable: bool = True  # False: a rank metric on flat reference scores (not pass, not fail)
    resolution: RankResolution | None = None
    flips: FlipResolution | None = None  # accuracy, ECE, failure AUROC: which predictions rounding can flip

    @property
    def status(self) -> str:
        """``pass``, ``fail`` or ``unresolved`` (a rank metric on scores flat at the candidate's precision)."""
        if not self.resolvable:
            return "unresolved"
        return "pass" if self.passed else "fail"

    def message(self) -> str:
        """One line for CI, e.g. ``auroc_msp: 0.8123 -> 0.7990 (delta -0.0133, allowed +-0.005)``."""
        verdict = {"pass": "PASS", "fail": "FAIL", "unresolved": "NOT RESOLVABLE"}[self.status]
        if self.reason and math.isnan(self.delta):
            return f"{self.metric}: {verdict}: {self.reason}"
        text = (f"{self.metric}: {verdict}: reference {self.reference:.6g} -> candidate {self.candidate:.6g} "
                f"(delta {self.delta:+.4g}, allowed +-{self.limit:.4g} = {self.tolerance.atol:g} + "
                f"{self.tolerance.rtol:g}*|ref|)")
        return f"{text}: {self.reason}" if self.reason else text

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields."""
        out = asdict(self)
        out["tolerance"] = self.tolerance.to_dict()
        out["status"] = self.status
        out["resolution"] = None if self.resolution is None else self.resolution.to_dict()
        out["flips"] = None if self.flips is None else self.flips.to_dict()
        return out


def _softmax(logits: np.ndarray) -> np.ndarray:
    z = logits - logits.max(axis=-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=-1, keepdims=True)


def gather_uq_inputs(
    outputs: Sequence[Mapping[str, np.ndarray]], names: UQOutputs, who: str
) -> tuple[np.ndarray, np.ndarray | None]:
    """Concatenate the batches' ``probs [N, C]`` (or softmax of logits) and ``member_logits [N, M, C]``.

    Raises:
        ToolchainError: when neither probabilities nor logits are among the outputs.
    """
    if not outputs:
        raise ToolchainError(f"UQ parity: no {who} outputs (no eval batches).")
    first = outputs[0]
    if names.probs in first:
        probs = np.concatenate([np.asarray(o[names.probs], dtype=np.float64) for o in outputs])
    elif names.logits is not None and names.logits in first:
        probs = _softmax(np.concatenate([np.asarray(o[names.logits], dtype=np.float64) for o in outputs]))
    else:
        wanted = [names.probs] + ([names.logits] if names.logits else [])
        raise ToolchainError(f"UQ parity: the {who} returns {sorted(first)}, none of {wanted}; "
                             "set uq_outputs=UQOutputs(probs=..., logits=...).")
    members = None
    if names.member_logits is not None and names.member_logits in first:
        members = np.concatenate([np.asarray(o[names.member_logits], dtype=np.float64) for o in outputs])
    return probs, members


def _report(probs_id: np.ndarray, labels: np.ndarray, probs_ood: np.ndarray | None,
            members_id: np.ndarray | None, members_ood: np.ndarray | None, n_bins: int) -> dict[str, float]:
    if members_id is None or members_ood is None:
        members_id = members_ood = None
    return uq_report(probs_id, labels, probs_ood, members_id, members_ood, n_bins=n_bins)


def uq_parity(
    reference_id: Sequence[Mapping[str, np.ndarray]],
    candidate_id: Sequence[Mapping[str, np.ndarray]],
    labels_id: np.ndarray,
    reference_ood: Sequence[Mapping[str, np.ndarray]],
    candidate_ood: Sequence[Mapping[str, np.ndarray]],
    tolerances: Mapping[str, MetricTolerance],
    *,
    names: UQOutputs | None = None,
    n_bins: int = 15,
    precision: str = "fp32",
) -> tuple[dict[str, float], list[MetricCheck]]:
    """Compare every UQ metric of the candidate with the reference's.

    Args:
        reference_id: per ID batch, the reference's ``{output: array}``.
        candidate_id: per ID batch (same batches, same order), the candidate's outputs.
        labels_id: ``[N]`` integer labels of the ID samples (all batches, in order).
        reference_ood: per OOD batch, the reference's outputs (may be empty: no OOD metrics).
        candidate_ood: per OOD batch, the candidate's outputs.
        tolerances: metric (or family, or ``""``) -> :class:`MetricTolerance`.
        names: which outputs hold probabilities/logits/member logits.
        n_bins: ECE bins.
        precision: the candidate's precision (``fp32`` | ``fp16`` | ``bf16``): how far rounding can
            move each rank metric (:mod:`toolchain.parity.resolution`).

    Returns:
        ``(reference report, checks)``: one :class:`MetricCheck` per metric of the reference report.

    Raises:
        ToolchainError: the reference's own outputs cannot make a report (bad data: exit code 2).
    """
    names = names or UQOutputs()
    labels = np.asarray(labels_id)
    ref_id, ref_mid = gather_uq_inputs(reference_id, names, "reference")
    ref_ood, ref_mood = gather_uq_inputs(reference_ood, names, "reference") if reference_ood else (None, None)
    try:
        ref_report = _report(ref_id, labels, ref_ood, ref_mid, ref_mood, n_bins)
    except MetricInputError as exc:
        raise ToolchainError(f"UQ parity: the reference's outputs cannot be scored: {exc}") from exc
    keys = list(ref_report)
    limits = {k: resolve_metric_tolerance(tolerances, k).limit(float(ref_report[k])) for k in keys}
    resolutions = rank_resolutions(ref_id, labels, ref_ood, ref_mid if ref_mood is not None else None, ref_mood,
                                   precision, limits=limits)
    try:
        cand_id, cand_mid = gather_uq_inputs(candidate_id, names, "candidate")
        cand_ood, cand_mood = gather_uq_inputs(candidate_ood, names, "candidate") if candidate_ood else (None, None)
        cand_report = _report(cand_id, labels, cand_ood, cand_mid, cand_mood, n_bins)
        if "ece" in cand_report:  # on the reference's bins: no jumps at bin edges (metrics.paired_ece)
            cand_report["ece"] = paired_ece(cand_id, labels, ref_id, n_bins)
        problem = ""
    except (MetricInputError, ToolchainError, ValueError) as exc:
        cand_report, problem = {}, f"candidate outputs cannot be scored: {exc}"
    missing = [k for k in keys if k not in cand_report]
    lacks = ""
    if missing and not problem:  # e.g. the candidate lost member_logits: the MI/disagreement metrics are gone
        expected = report_keys(ref_ood is not None, ref_mid is not None)
        lacks = (f"candidate report lacks {missing} (the reference's has {list(expected)}): an output it needs "
                 f"is missing ({names.member_logits!r}?)")
    flips = flip_resolution(ref_id, labels, None if problem else cand_id, precision)
    checks = []
    for key in keys:
        tol = resolve_metric_tolerance(tolerances, key)
        ref_val = float(ref_report[key])
        if problem or key not in cand_report:
            checks.append(MetricCheck(key, ref_val, math.nan, math.nan, tol.limit(ref_val), tol, False,
                                      problem or lacks))
            continue
        cand_val = float(cand_report[key])
        passed, delta, limit = evaluate_metric(ref_val, cand_val, tol)
        reason, resolvable, res = "", True, resolutions.get(key)
        flip = flips if key in ("accuracy", "ece", "failure_auroc") else None
        if math.isnan(ref_val) or math.isnan(cand_val):
            if passed:
                reason = "undefined (NaN) for both"
            elif key == "failure_auroc" and flips.changed and not flips.clear_flips:
                # rounding flipped a near-tie and so made (or left) no error to rank on one side
                resolvable, reason = False, ("not resolvable: too few failures to rank (undefined on one side "
                                             "after flips within rounding): " + flips.describe())
            else:
                reason = f"reference {ref_val!r} vs candidate {cand_val!r}: one is undefined (NaN)"
                if key == "failure_auroc":
                    reason += f"; {flips.describe()}"
        elif key == "accuracy":
            passed, reason = _judge_accuracy(delta, limit, ref_val, cand_val, flips)
        elif key == "ece" and flips.near_tie_flips:  # each flip within rounding moves a paired ECE by <= 1/N
            allowed = flips.ece_allowed(limit)
            passed = within_limit(delta, allowed, ref_val, cand_val)
            reason = (f"allowed +-{allowed:.4g} = tolerance + {flips.near_tie_flips}/{flips.n} near-tie flips: "
                      f"{flips.describe()}")
        elif res is not None and res.too_few:  # rounding alone empties a class in most draws: no bound
            if within_limit(delta, max(limit, res.worst_case), ref_val, cand_val):
                resolvable, reason = False, "not resolvable: " + res.reason(limit)
            else:  # more than the worst case of rounding: a broken engine, however few failures
                passed, reason = False, (f"the change exceeds even the worst case of rounding at {precision} "
                                         f"({res.worst_case:.4g}; {res.reason(limit)})")
        elif res is not None and not res.resolvable(limit):  # flat scores: only beyond the worst case fails
            if within_limit(delta, res.worst_case, ref_val, cand_val):
                resolvable, reason = False, "not resolvable: " + res.reason(limit)
            else:
                passed = False
                reason = (f"the change exceeds even the worst case of rounding at {precision} on these scores "
                          f"({res.worst_case:.4g}; {res.reason(limit)})")
        elif res is not None and res.bound > limit:  # rounding moves it further than the tolerance
            passed = within_limit(delta, res.bound, ref_val, cand_val)
            reason = (f"{'within' if passed else 'beyond'} what rounding at {precision} causes on these scores: "
                      f"allowed +-{res.bound:.4g} > tolerance: {res.reason(limit)}")
        checks.append(MetricCheck(key, ref_val, cand_val, delta, limit, tol, passed, reason, resolvable, res, flip))
    return ref_report, checks


def _judge_accuracy(delta: float, limit: float, ref_val: float, cand_val: float,
                    flips: FlipResolution) -> tuple[bool, str]:
    """Accuracy judged by flips (:mod:`toolchain.parity.flips`): ``(passed, reason)``."""
    low, high = flips.accuracy_window(limit)
    in_window = within_limit(delta, -low if delta < 0 else high, ref_val, cand_val)
    clear_ok = flips.clear_flips <= flips.clear_allowed(limit)
    if in_window and clear_ok:
        if not flips.changed:
            return True, ""
        return True, f"within rounding: {flips.describe()}"
    if not clear_ok:
        rows = ", ".join(map(str, flips.clear_rows))
        return False, (f"{flips.clear_flips} prediction(s) changed that rounding at {flips.precision} cannot flip "
                       f"(more than the {flips.clear_allowed(limit)} the tolerance admits; rows {rows}): "
                       f"{flips.describe()}")
    return False, (f"beyond what rounding explains (allowed {low:+.4g} .. {high:+.4g}): {flips.describe()}")
