"""The UQ-metric registry: every metric of :func:`~toolchain.metrics.uq_report` declared once.

A :class:`UQMetric` says how the metric is computed (an ID metric's function, or an OOD
metric x OOD score pair), whether higher is better, its display name, its parity tolerance
family and whether it is a rank metric (parity's resolution rule), and in which views it
appears, at which position:

* ``table``: the report's results table; ``summary``: the table ``run`` prints at the end;
  ``console``: the evaluate stage's line per variant;
* ``gain``: :func:`~toolchain.metrics.ensemble_gain`'s metrics (the metric has an ensemble gain);
  ``gain_table``: the report's ensemble-gain table; ``gain_console``: the evaluate stage's gain line.

Adding an ID metric is one :class:`UQMetric` in :data:`_ID_METRICS` (plus, for an ensemble gain,
its bootstrap in :mod:`toolchain.metrics.gain`); adding an OOD score or an OOD metric is one entry
in :data:`OOD_SCORE_NEEDS` / :data:`OOD_METRIC_INFO`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from toolchain.metrics.classification import accuracy, brier, ece, nll
from toolchain.metrics.ood import failure_auroc

Needs = Literal["id", "probs_ood", "members"]
View = Literal["table", "summary", "console", "gain", "gain_table", "gain_console"]


@dataclass(frozen=True)
class UQMetric:
    """One UQ metric.

    Attributes:
        key: its key in ``metrics.json`` (``"nll"``, ``"auroc_msp"``).
        display: its column title (``"NLL"``, ``"AUROC (MSP)"``).
        higher_is_better: direction (the ensemble gain is ``ensemble - members_mean`` when True).
        family: the parity tolerance family (``"auroc"`` for ``auroc_msp``; else the key).
        rank: a rank metric (depends only on the order of scores: parity's resolution rule).
        needs: ``"id"`` (ID probabilities and labels), ``"probs_ood"`` or ``"members"`` (member logits).
        fn: ``(probs, labels, n_bins) -> float`` for an ID metric; None for an OOD metric
            (computed by :func:`~toolchain.metrics.ood_metrics` on its score).
        views: view -> position (see the module doc); absent: not shown there.
        gain_display: the title in the gain table when it differs from ``display``.
    """

    key: str
    display: str
    higher_is_better: bool
    family: str
    rank: bool
    needs: Needs = "id"
    fn: Callable[[np.ndarray, np.ndarray, int], float] | None = None
    views: Mapping[str, int] = field(default_factory=dict)
    gain_display: str | None = None


_ID_METRICS: tuple[UQMetric, ...] = (
    UQMetric("accuracy", "acc", True, "accuracy", False, fn=lambda p, y, b: accuracy(p, y),
             views={"table": 0, "summary": 0, "console": 0, "gain": 3, "gain_table": 3}),
    UQMetric("nll", "NLL", False, "nll", False, fn=lambda p, y, b: nll(p, y),
             views={"table": 1, "summary": 1, "console": 1, "gain": 0, "gain_table": 0, "gain_console": 0}),
    UQMetric("brier", "Brier", False, "brier", False, fn=lambda p, y, b: brier(p, y),
             views={"table": 3, "summary": 3, "console": 3, "gain": 2, "gain_table": 2}),
    UQMetric("ece", "ECE", False, "ece", False, fn=lambda p, y, b: ece(p, y, b),
             views={"table": 2, "summary": 2, "console": 2, "gain": 1, "gain_table": 1}),
    UQMetric("failure_auroc", "failure AUROC", True, "failure_auroc", True, fn=lambda p, y, b: failure_auroc(p, y)),
)

#: OOD scores in report order, with what each needs (``probs_ood``; ``members``: both member-logit arrays)
OOD_SCORE_NEEDS: dict[str, Needs] = {"msp": "probs_ood", "entropy": "probs_ood", "mi": "members",
                                     "disagreement": "members"}
#: OOD metrics in report order: display name, higher is better
OOD_METRIC_INFO: dict[str, tuple[str, bool]] = {"auroc": ("AUROC", True), "aupr": ("AUPR", True),
                                                "fpr95": ("FPR95", False)}
_SCORE_DISPLAY = {"msp": "MSP", "entropy": "entropy", "mi": "MI", "disagreement": "disagreement"}
#: views of the OOD metrics that appear in some
_OOD_VIEWS: dict[str, dict[str, int]] = {
    "auroc_msp": {"table": 4, "summary": 4, "console": 4, "gain": 4, "gain_table": 4, "gain_console": 1},
    "aupr_msp": {"table": 5},
    "fpr95_msp": {"table": 6, "summary": 5, "console": 5},
    "auroc_entropy": {"gain": 5},
    "auroc_mi": {"table": 7, "summary": 6, "gain": 6, "gain_table": 5, "gain_console": 2},
}
_GAIN_DISPLAY = {"auroc_mi": "AUROC (MI) vs member MSP"}


def _ood_metrics() -> tuple[UQMetric, ...]:
    return tuple(
        UQMetric(f"{m}_{s}", f"{name} ({_SCORE_DISPLAY[s]})", higher, m, True, needs=needs,
                 views=_OOD_VIEWS.get(f"{m}_{s}", {}), gain_display=_GAIN_DISPLAY.get(f"{m}_{s}"))
        for s, needs in OOD_SCORE_NEEDS.items() for m, (name, higher) in OOD_METRIC_INFO.items())


#: every UQ metric, in :func:`~toolchain.metrics.uq_report`'s key order
UQ_METRICS: dict[str, UQMetric] = {m.key: m for m in (*_ID_METRICS, *_ood_metrics())}


def uq_metric(key: str) -> UQMetric | None:
    """The registered metric of ``key`` (None when unknown)."""
    return UQ_METRICS.get(key)


def metrics_in(view: View) -> list[UQMetric]:
    """The metrics shown in ``view``, in its order."""
    return sorted((m for m in UQ_METRICS.values() if view in m.views), key=lambda m: m.views[view])


def view_columns(view: View) -> list[tuple[str, str]]:
    """``(key, title)`` pairs of ``view`` (a gain view uses ``gain_display`` where given)."""
    gain = view.startswith("gain")
    return [(m.key, (m.gain_display or m.display) if gain else m.display) for m in metrics_in(view)]


def view_keys(view: View) -> list[str]:
    """The metric keys of ``view``, in order."""
    return [m.key for m in metrics_in(view)]
