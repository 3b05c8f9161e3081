"""The cost-aware selection rule of the cost-lever benchmark (issue 45), fixed before any run.

Applied to validation data only: the ``val`` rows and the ``ood_val`` rows that no scoring saw
(``selection.json`` of each row's ``evaluate`` stage; the baselines from the recipe's own). A row is
worth deploying only where it beats what a user would deploy instead on the quality it is for:

1. **Eligible** (all three, each against the baseline it must clear):

   * ``accuracy``: validation accuracy >= the single model's - :data:`SLACK` (half a point);
   * ``nll``: validation NLL <= the deep ensemble's;
   * ``auroc_msp``: far-OOD validation AUROC (MSP) >= the deep ensemble's.

   Equal (within 1e-9, float rounding) clears. A missing or NaN metric fails its condition.
2. **Selected**: the eligible row with the smallest analytic FLOPs ratio to the single model
   (``toolchain.hydra.cost``); ties (within 1e-9): the lower NLL, then the first name in sorted order.
3. When no row is eligible nothing is selected (deploy the single model) and the verdict names, per row,
   the conditions it fails and by how much; :func:`frontier` (the rows no other row beats on cost and
   on all three metrics at once) says what binds where it matters: at the cheapest rows.

:data:`TARGET` (1.3x the single model's FLOPs, issue 45's budget) is drawn and reported; it is not a
condition: the rule picks the cheapest row that clears the baselines, whatever it costs.
"""

from __future__ import annotations

import math
from typing import Any

#: accuracy slack below the single model's validation accuracy (a fraction: 0.005 = half a point)
SLACK = 0.005
#: issue 45's compute budget, FLOPs relative to the single model (drawn and reported, not a condition)
TARGET = 1.3
#: float rounding: a margin of -EPS still clears
EPS = 1e-9

#: the conditions in the order they are reported: name -> (metric, baseline, direction)
CONDITIONS: dict[str, tuple[str, str, str]] = {
    "accuracy": ("accuracy", "single", ">="),
    "nll": ("nll", "deep-ensemble", "<="),
    "auroc_msp": ("auroc_msp", "deep-ensemble", ">="),
}

#: the rule, as written into the results header
RULE = (f"eligible: validation accuracy >= single model's - {SLACK:.3f}, validation NLL <= the deep ensemble's, "
        "far-OOD validation AUROC (MSP) >= the deep ensemble's; selected: the eligible row with the smallest "
        "analytic FLOPs ratio to the single model (ties: lower NLL, then name); none eligible: nothing is "
        f"selected and each row's failing conditions are named; {TARGET}x FLOPs is drawn, not a condition")


def _value(metrics: dict[str, Any], key: str) -> float:
    v = metrics.get(key)
    return float("nan") if v is None else float(v)


def thresholds(baselines: dict[str, dict[str, float]], slack: float = SLACK) -> dict[str, float]:
    """The bound of each condition: ``{"accuracy": floor, "nll": ceiling, "auroc_msp": floor}``.

    Raises:
        ValueError: a baseline, or the metric a condition takes from it, is missing or NaN.
    """
    out = {}
    for cond, (metric, base, _) in CONDITIONS.items():
        if base not in baselines:
            raise ValueError(f"select_by_cost: baselines['{base}'] is required (condition '{cond}'); "
                             f"given: {sorted(baselines)}")
        v = _value(baselines[base], metric)
        if math.isnan(v):
            raise ValueError(f"select_by_cost: baselines['{base}'] has no validation '{metric}' "
                             f"(value {baselines[base].get(metric)!r}; condition '{cond}')")
        out[cond] = v - slack if cond == "accuracy" else v
    return out


def margins_of(metrics: dict[str, Any], bounds: dict[str, float]) -> dict[str, float]:
    """Per condition, how far a row clears it (positive or zero within :data:`EPS`: clears; NaN: missing)."""
    out = {}
    for cond, (metric, _, direction) in CONDITIONS.items():
        v = _value(metrics, metric)
        out[cond] = v - bounds[cond] if direction == ">=" else bounds[cond] - v
    return out


def frontier(candidates: dict[str, dict[str, float]]) -> list[str]:
    """Rows not dominated: no other row is at most as costly and at least as good on accuracy, NLL and AUROC
    (one of the four strictly). Sorted by FLOPs ratio, then name. Rows with a NaN metric are left out."""
    keys = ("flops_ratio", "accuracy", "nll", "auroc_msp")
    sign = {"flops_ratio": 1.0, "accuracy": -1.0, "nll": 1.0, "auroc_msp": -1.0}  # lower is better after sign
    pts = {n: [sign[k] * _value(m, k) for k in keys] for n, m in candidates.items()}
    pts = {n: p for n, p in pts.items() if not any(math.isnan(x) for x in p)}

    def dominates(a: list[float], b: list[float]) -> bool:
        return all(x <= y for x, y in zip(a, b, strict=True)) and any(x < y for x, y in zip(a, b, strict=True))

    front = [n for n, p in pts.items() if not any(dominates(q, p) for o, q in pts.items() if o != n)]
    return sorted(front, key=lambda n: (pts[n][0], n))


def _fails_text(name: str, ratio: float, fails: dict[str, float]) -> str:
    parts = ", ".join(f"{c} ({'missing' if math.isnan(m) else f'{m:+.4f}'})" for c, m in fails.items())
    return f"{name} ({ratio:.2f}x): {parts}"


def select_by_cost(candidates: dict[str, dict[str, float]], baselines: dict[str, dict[str, float]],
                   slack: float = SLACK) -> dict[str, Any]:
    """Apply the rule (module doc).

    Args:
        candidates: row name -> validation ``accuracy``, ``nll``, ``auroc_msp`` and ``flops_ratio`` (analytic
            FLOPs relative to the single model).
        baselines: ``"single"`` (its ``accuracy``) and ``"deep-ensemble"`` (its ``nll`` and ``auroc_msp``) ->
            their validation metrics on the same rows.
        slack: accuracy slack below the single model.

    Returns:
        ``{"selected": name or None, "eligible": [names, cheapest first], "failing": {name: {condition:
        margin}} (only the conditions it fails; margin < 0, NaN when the metric is missing), "margins": {name:
        {condition: margin}} (every condition; >= 0 clears), "thresholds": {condition: bound}, "binding":
        {condition: [names failing it]}, "frontier": [names, cheapest first], "within_target": bool or None
        (the selected row's FLOPs ratio <= TARGET), "why": str}``.

    Raises:
        ValueError: a missing baseline (or its metric), or a candidate without a finite positive ``flops_ratio``.
    """
    bounds = thresholds(baselines, slack)
    for name, m in candidates.items():
        r = _value(m, "flops_ratio")
        if not (math.isfinite(r) and r > 0):
            raise ValueError(f"select_by_cost: candidate '{name}' has flops_ratio {m.get('flops_ratio')!r}; "
                             "a finite ratio > 0 is required")
    margins = {n: margins_of(m, bounds) for n, m in candidates.items()}
    failing = {n: {c: v for c, v in mg.items() if math.isnan(v) or v < -EPS} for n, mg in margins.items()}
    ratio = {n: float(m["flops_ratio"]) for n, m in candidates.items()}
    nll = {n: _value(m, "nll") for n, m in candidates.items()}
    eligible = sorted((n for n in candidates if not failing[n]), key=lambda n: (ratio[n], nll[n], n))
    chosen = None
    for n in eligible:  # the smallest ratio; within EPS of it, the lower NLL, then the first name
        if chosen is None or ratio[n] < ratio[chosen] - EPS or (
                abs(ratio[n] - ratio[chosen]) <= EPS and (nll[n] < nll[chosen] or (nll[n] == nll[chosen]
                                                                                   and n < chosen))):
            chosen = n
    binding = {c: sorted((n for n, f in failing.items() if c in f), key=lambda n: (ratio[n], n)) for c in CONDITIONS}
    front = frontier(candidates)
    by_cost = sorted(candidates, key=lambda n: (ratio[n], n))
    bound_text = (f"accuracy >= {bounds['accuracy']:.4f} (single - {slack:.3f}), NLL <= {bounds['nll']:.4f} and "
                  f"AUROC (MSP) >= {bounds['auroc_msp']:.4f} (deep ensemble)")
    within = None
    if chosen is not None:
        within = ratio[chosen] <= TARGET + EPS
        mg = margins[chosen]
        why = (f"eligible ({bound_text}): " + ", ".join(f"{n} ({ratio[n]:.2f}x)" for n in eligible)
               + f"; the cheapest: {chosen} at {ratio[chosen]:.2f}x the single model's FLOPs "
               f"({'within' if within else 'over'} the {TARGET}x target), margins accuracy {mg['accuracy']:+.4f}, "
               f"NLL {mg['nll']:+.4f}, AUROC {mg['auroc_msp']:+.4f}")
    elif not candidates:
        why = "no candidate rows: deploy the single model"
    else:
        counts = ", ".join(f"{c} fails {len(binding[c])} of {len(candidates)}" for c in CONDITIONS)
        shown = [n for n in by_cost if n in front] or by_cost
        why = (f"no row clears both baselines ({bound_text}): deploy the single model; {counts}; what binds "
               "on the cost frontier (margin below the bound): "
               + "; ".join(_fails_text(n, ratio[n], failing[n]) for n in shown))
    return {"selected": chosen, "eligible": eligible, "failing": failing, "margins": margins, "thresholds": bounds,
            "binding": binding, "frontier": front, "within_target": within, "why": why}
