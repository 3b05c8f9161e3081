"""Plots for uncertainty reports: reliability diagram, ID-vs-OOD score histograms, metrics under corruption.

Figures are drawn with matplotlib's Agg canvas directly (``Figure`` + ``FigureCanvasAgg``), so
nothing touches pyplot's global state or the process-wide backend, and no display is needed.
PNGs are written atomically: first to ``path.with_suffix(".tmp.png")``, then ``os.replace``-d
onto ``path``, so a reader never sees a half-written file.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from numpy.typing import ArrayLike

from toolchain.metrics._validation import as_scores
from toolchain.metrics.classification import ReliabilityBins


def _save_atomic(fig: Figure, path: str | os.PathLike[str]) -> Path:
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp.png")
    FigureCanvasAgg(fig)
    try:
        fig.savefig(tmp, format="png", dpi=120)
        os.replace(tmp, out)
    finally:
        if tmp.exists():
            tmp.unlink()
    return out


def plot_reliability(bins: ReliabilityBins, path: str | os.PathLike[str], title: str = "Reliability") -> Path:
    """Reliability diagram: per-bin accuracy bars, the gap to mean confidence, the diagonal.

    Args:
        bins: output of :func:`toolchain.metrics.reliability_bins` (empty bins are not drawn).
        path: destination PNG; parent folders are created.
        title: figure title (the ECE is appended).

    Returns:
        The written path.
    """
    edges = np.asarray(bins.edges, dtype=np.float64)
    width = np.diff(edges)
    left = edges[:-1]
    filled = bins.count > 0
    fig = Figure(figsize=(5.0, 6.0))
    ax, ax_count = fig.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [3, 1]})
    ax.plot([0.0, 1.0], [0.0, 1.0], linestyle="--", color="gray", linewidth=1, label="perfect calibration")
    ax.bar(
        left[filled],
        bins.accuracy[filled],
        width=width[filled],
        align="edge",
        edgecolor="black",
        color="tab:blue",
        alpha=0.8,
        label="accuracy",
    )
    gap = bins.confidence[filled] - bins.accuracy[filled]
    ax.bar(
        left[filled],
        gap,
        bottom=bins.accuracy[filled],
        width=width[filled],
        align="edge",
        facecolor="none",
        edgecolor="tab:red",
        hatch="//",
        label="gap to confidence",
    )
    ax.set_xlim(0.0, 1.0)
    ax.set_ylim(0.0, 1.0)
    ax.set_ylabel("accuracy")
    ax.set_title(f"{title} (ECE = {bins.ece:.4f})")
    ax.legend(loc="upper left", fontsize="small")
    ax_count.bar(left, bins.count, width=width, align="edge", edgecolor="black", color="tab:gray")
    ax_count.set_xlabel("confidence (top-label)")
    ax_count.set_ylabel("count")
    fig.tight_layout()
    return _save_atomic(fig, path)


def plot_ood_histograms(
    id_scores: ArrayLike,
    ood_scores: ArrayLike,
    path: str | os.PathLike[str],
    title: str,
    n_bins: int = 50,
) -> Path:
    """Overlaid, density-normalised histograms of ID and OOD scores on shared bins.

    Args:
        id_scores: ``[N_id]`` scores of in-distribution samples (higher = more OOD).
        ood_scores: ``[N_ood]`` scores of OOD samples.
        path: destination PNG; parent folders are created.
        title: figure title.
        n_bins: number of shared histogram bins.

    Returns:
        The written path.
    """
    s_id = as_scores("id_scores", id_scores)
    s_ood = as_scores("ood_scores", ood_scores)
    edges = np.histogram_bin_edges(np.concatenate([s_id, s_ood]), bins=n_bins)
    fig = Figure(figsize=(6.0, 4.0))
    ax = fig.subplots()
    ax.hist(s_id, bins=edges, density=True, alpha=0.5, color="tab:blue", label=f"ID (n={s_id.size})")
    ax.hist(s_ood, bins=edges, density=True, alpha=0.5, color="tab:orange", label=f"OOD (n={s_ood.size})")
    ax.set_xlabel("score (higher = more OOD)")
    ax.set_ylabel("density")
    ax.set_title(title)
    ax.legend(fontsize="small")
    fig.tight_layout()
    return _save_atomic(fig, path)


def plot_shift(shift: dict, path: str | os.PathLike[str], title: str) -> Path:
    """NLL, accuracy and ECE against corruption severity (0 = clean), one line per variant, mean over kinds.

    ``shift`` is the ``evaluate`` stage's ``shift.json`` (its ``mean`` entry).
    """
    levels = ["0", *map(str, shift["severities"])]
    variants = list(shift["mean"]["0"])
    fig = Figure(figsize=(11.0, 3.6))
    axes = fig.subplots(1, 3)
    for ax, key, label in zip(axes, ("nll", "accuracy", "ece"), ("NLL (lower is better)", "accuracy", "ECE"),
                              strict=True):
        for variant in variants:
            ax.plot([int(lv) for lv in levels], [shift["mean"][lv][variant][key] for lv in levels], marker="o",
                    label=variant)
        ax.set_xlabel("severity (0 = clean)")
        ax.set_title(label, fontsize="medium")
        ax.set_xticks([int(lv) for lv in levels])
    axes[0].legend(fontsize="small")
    fig.suptitle(f"{title} ({len(shift['kinds'])} corruptions: {', '.join(shift['kinds'])}; {shift['rows']} rows)",
                 fontsize="medium")
    fig.tight_layout()
    return _save_atomic(fig, path)
