"""Uncertainty metrics: classification/calibration, OOD and failure detection, UQ scores.

Pure functions over numpy arrays (and scikit-learn where it computes the metric). Conventions
are documented in each module: :mod:`.classification` (NLL clip 1e-12, Brier summed over classes,
ECE bin rule [lo, hi)), :mod:`.ood` (OOD positive, FPR at the first ROC point with TPR >= 0.95),
:mod:`.scores` (entropy of the mean vs mean entropy, MI, argmax disagreement rate), :mod:`.gain`
(ensemble minus mean member, paired-bootstrap confidence intervals).

The plotting helpers (:func:`plot_reliability`, :func:`plot_ood_histograms`) live in
:mod:`toolchain.metrics.plots`; they are re-exported here lazily so importing the metrics does
not import matplotlib.
"""

from __future__ import annotations

from typing import Any

from toolchain.metrics._validation import MetricInputError
from toolchain.metrics.classification import (
    DEFAULT_N_BINS,
    NLL_EPS,
    ReliabilityBins,
    accuracy,
    bin_edges,
    brier,
    ece,
    nll,
    reliability_bins,
)
from toolchain.metrics.gain import GAIN_METRICS, bootstrap_auroc, ensemble_gain
from toolchain.metrics.ood import (
    TPR_TARGET,
    aupr,
    auroc,
    failure_auroc,
    fpr_at_95_tpr,
    ood_labels_and_scores,
    ood_metrics,
)
from toolchain.metrics.report import report_keys, uq_report
from toolchain.metrics.scores import (
    disagreement,
    ensemble_probs,
    entropy_score,
    expected_entropy,
    member_probs,
    msp_score,
    mutual_information,
)

_LAZY_PLOTS = ("plot_ood_histograms", "plot_reliability")

__all__ = [
    "DEFAULT_N_BINS",
    "GAIN_METRICS",
    "NLL_EPS",
    "TPR_TARGET",
    "MetricInputError",
    "ReliabilityBins",
    "accuracy",
    "aupr",
    "auroc",
    "bin_edges",
    "bootstrap_auroc",
    "brier",
    "disagreement",
    "ece",
    "ensemble_gain",
    "ensemble_probs",
    "entropy_score",
    "expected_entropy",
    "failure_auroc",
    "fpr_at_95_tpr",
    "member_probs",
    "msp_score",
    "mutual_information",
    "nll",
    "ood_labels_and_scores",
    "ood_metrics",
    "plot_ood_histograms",  # lazy, see __getattr__
    "plot_reliability",  # lazy, see __getattr__
    "reliability_bins",
    "report_keys",
    "uq_report",
]


def __getattr__(name: str) -> Any:
    """Import the plotting helpers (and matplotlib) only on first use."""
    if name in _LAZY_PLOTS:
        from toolchain.metrics import plots

        return getattr(plots, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
