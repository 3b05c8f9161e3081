"""The selection rule of the diversity benchmarks: what a user gains over what they would deploy instead.

Fixed before any run, and applied to validation data only (``val`` rows and the ``ood_val`` rows that no
scoring saw, see ``toolchain.stages.common.selection_ood_rows``). The baselines are what a user would
deploy instead of Hydra: the single fine-tuned model and the equal-budget deep ensemble, scored on the
same validation rows (``selection.json`` of the recipe's ``evaluate`` stage).

1. **Eligible**: validation accuracy at most ``slack`` (:data:`SLACK`, half a point) below the single model's.
   (Half a point since issue 33; it was 1 point, which let a Hydra 1.4 points below the single model on test
   through: a user does not trade more accuracy than that for OOD detection.)
2. **Utility**: ``U = validation OOD AUROC (MSP) - validation NLL``; one number that rewards a better
   detector and a better-calibrated, more accurate predictive distribution in equal units of the two
   metrics (both move by hundredths between strategies here).
3. **Selected**: the eligible candidate with the highest ``U`` (ties within 1e-9: lower NLL, then the
   first name in sorted order). Its margins
   ``U(candidate) - U(baseline)`` say whether it beats the single model and the deep ensemble; when no
   candidate is eligible, nothing is selected and the verdict is to deploy the single model.

The ensemble gain over a candidate's own members is *not* part of the rule; the benchmark reports it as a
diagnostic.
"""

from __future__ import annotations

import math
from typing import Any

#: accuracy slack below the single model's validation accuracy (a fraction: 0.005 = half a point)
SLACK = 0.005

#: the rule, as written into every results header
RULE = ("eligible: validation accuracy >= single model's - {slack:.3f}; utility U = validation OOD AUROC (MSP) - "
        "validation NLL; selected: the eligible candidate with the highest U (ties: lower NLL); margins "
        "U(candidate) - U(baseline) against the single model and the equal-budget deep ensemble on the same rows")


def utility(metrics: dict[str, float]) -> float:
    """``AUROC(MSP) - NLL`` of one model's validation metrics (NaN when either is missing)."""
    a, n = metrics.get("auroc_msp"), metrics.get("nll")
    return float("nan") if a is None or n is None else float(a) - float(n)


def select(candidates: dict[str, dict[str, float]], baselines: dict[str, dict[str, float]],
           slack: float = SLACK, baselines_for: dict[str, dict[str, dict[str, float]]] | None = None) -> dict[str, Any]:
    """Apply the rule (module doc).

    Args:
        candidates: name -> validation metrics (``accuracy``, ``nll``, ``auroc_msp``) of each Hydra strategy.
        baselines: ``"single"`` (required) and optionally ``"deep-ensemble"`` -> their validation metrics.
        slack: accuracy slack below the single model.
        baselines_for: candidate name -> the baselines it is compared with, where they differ from
            ``baselines`` (a temperature-scaled Hydra against the temperature-scaled single model and
            deep ensemble: calibration is not credited to Hydra alone). The same names as ``baselines``.

    Returns:
        ``{"selected": name or None, "eligible": [names], "utility": {name: U}, "margins": {name: {baseline:
        U(name) - U(baseline)}}, "beats": {baseline: bool} for the selected one, "why": str}``.

    Raises:
        ValueError: no single-model baseline, or a candidate without accuracy, NLL or AUROC.
    """
    if "single" not in baselines:
        raise ValueError("select: the single model's validation metrics are required (baselines['single'])")
    for name, m in candidates.items():
        missing = [k for k in ("accuracy", "nll", "auroc_msp") if k not in m]
        if missing:
            raise ValueError(f"select: candidate '{name}' lacks validation {', '.join(missing)}")
    shown = float(baselines["single"]["accuracy"]) - slack
    floor = shown - 1e-9  # exactly `slack` below the single model is in, whatever the float rounding
    util = {n: utility(m) for n, m in candidates.items()}
    base_util = {b: utility(m) for b, m in baselines.items()}
    own = {n: {b: utility(m) for b, m in (baselines_for or {}).get(n, baselines).items()} for n in candidates}
    if any(set(u) != set(base_util) for u in own.values()):
        raise ValueError(f"select: baselines_for must name the same baselines as baselines ({', '.join(base_util)})")
    margins = {n: {b: util[n] - u for b, u in own[n].items()} for n in candidates}
    eligible = sorted(n for n, m in candidates.items() if float(m["accuracy"]) >= floor and not math.isnan(util[n]))
    chosen = None
    for n in eligible:  # the highest U; within 1e-9 of it (float noise), the lower NLL, then the first name
        if chosen is None or util[n] > util[chosen] + 1e-9 or (
                abs(util[n] - util[chosen]) <= 1e-9 and float(candidates[n]["nll"]) < float(candidates[chosen]["nll"])):
            chosen = n
    beats = {b: margins[chosen][b] > 0 for b in baselines} if chosen else {}
    if chosen is None:
        why = (f"no candidate reaches validation accuracy {shown:.4f} (single {baselines['single']['accuracy']:.4f} "
               f"- {slack:.3f}): deploy the single model")
    else:
        versus = ", ".join(f"{'beats' if beats[b] else 'does not beat'} {b} (U margin {margins[chosen][b]:+.4f})"
                           for b in baselines)
        why = (f"eligible (validation accuracy >= {shown:.4f}): {', '.join(eligible)}; highest U = AUROC(MSP) - NLL: "
               f"{chosen} ({util[chosen]:+.4f}); it {versus}")
    return {"selected": chosen, "eligible": eligible, "utility": util, "baseline_utility": base_util,
            "margins": margins, "beats": beats, "why": why}
