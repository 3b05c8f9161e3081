"""Numeric parity of one candidate's outputs against the reference's, output by output.

For every output the reference produced, over every feed (flattened and pooled; feeds may have
different shapes), :func:`compare_outputs` reports: max / mean / median / quantile absolute
error, max relative error (``|c - r| / max(|r|, 1e-12)``, reported only: probabilities near 0
make it huge), cosine similarity of the flattened outputs, argmax agreement over the last axis
(``[B, C]`` -> B rows, ``[B, M, C]`` -> B*M rows; None for other outputs), the value of the
pass rule of :mod:`toolchain.parity.tolerances` and the worst element (feed, index, both values).
A NaN/Inf in the candidate fails the output with the feed and the first offending index; a
missing output or a shape that differs from the reference's fails too, naming both shapes.

Why the gate is computed here and Polygraphy is a cross-check
-------------------------------------------------------------
Polygraphy's comparator works on any runner's outputs once wrapped in ``RunResults`` /
``IterationResult``, and :func:`polygraphy_cross_check` does exactly that: it calls
``Comparator.compare_accuracy`` with ``SimpleCompareFunc(atol=..., rtol=..., check_error_stat=...,
error_quantile=...)`` (per-output dicts, ``""`` default) and records its verdict and statistics
per output in the report. The gate itself is computed here because (1) our rule is
``|c - r| <= atol + rtol * |r|`` on one per-element normalised error (Polygraphy passes an
element if either tolerance holds, and takes abs and rel statistics from different elements);
(2) Polygraphy compares feed by feed, so a statistic over all feeds (pooled errors, the
argmax agreement over the eval set) is not available; (3) CI messages must name the first
NaN/Inf index and the worst element, which Polygraphy logs but does not return; (4) cosine and
argmax agreement are not part of ``SimpleCompareFunc``. Where the two disagree (with the FP32
``max`` rule ours is the more lenient by at most 2x; the FP16/BF16 rule pools its quantile over
the feeds and adds bounds Polygraphy lacks, see tolerances), the report says so in ``polygraphy``.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from toolchain.parity.tolerances import Tolerance, evaluate_rule, first_nonfinite, resolve_tolerance

__all__ = [
    "OutputComparison",
    "argmax_agreement",
    "compare_output",
    "compare_outputs",
    "cosine_similarity",
    "polygraphy_cross_check",
]

log = logging.getLogger(__name__)

_REL_FLOOR = 1e-12


def cosine_similarity(a: np.ndarray, b: np.ndarray) -> float:
    """Cosine of the flattened arrays in float64; 1.0 when both are all zeros, 0.0 when one is."""
    x = np.asarray(a, dtype=np.float64).reshape(-1)
    y = np.asarray(b, dtype=np.float64).reshape(-1)
    nx, ny = float(np.linalg.norm(x)), float(np.linalg.norm(y))
    if nx == 0.0 and ny == 0.0:
        return 1.0
    if nx == 0.0 or ny == 0.0:
        return 0.0
    return float(np.dot(x, y) / (nx * ny))


def argmax_agreement(reference: np.ndarray, candidate: np.ndarray) -> tuple[int, int] | None:
    """``(agreeing rows, rows)`` of the argmax over the last axis; None unless rank >= 2 with >= 2 classes."""
    r, c = np.asarray(reference), np.asarray(candidate)
    if r.ndim < 2 or r.shape[-1] < 2 or r.dtype.kind not in "fc":
        return None
    rows_r = r.reshape(-1, r.shape[-1])
    rows_c = c.reshape(-1, c.shape[-1])
    return int(np.count_nonzero(rows_r.argmax(axis=1) == rows_c.argmax(axis=1))), int(rows_r.shape[0])


@dataclass
class OutputComparison:
    """Every number of one output's comparison, its tolerance and verdict."""

    output: str
    tolerance: Tolerance
    passed: bool
    reasons: list[str] = field(default_factory=list)
    elements: int = 0
    max_abs_err: float = math.nan
    mean_abs_err: float = math.nan
    median_abs_err: float = math.nan
    quantile_abs_err: float = math.nan
    max_rel_err: float = math.nan
    cosine: float = math.nan
    argmax_agreement: float | None = None
    argmax_rows: int = 0
    rule_value: float = math.nan
    max_normalised_error: float = math.nan
    worst: dict[str, Any] | None = None
    nonfinite: dict[str, Any] | None = None
    per_feed: list[dict[str, Any]] = field(default_factory=list)
    polygraphy: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: every number, the tolerance and the reasons."""
        out = asdict(self)
        out["tolerance"] = self.tolerance.to_dict()
        return out

    def message(self) -> str:
        """One paragraph for CI: the verdict, the failed clauses, then the numbers."""
        head = f"output '{self.output}': " + ("PASS" if self.passed else "FAIL: " + "; ".join(self.reasons))
        if self.elements == 0:
            return head
        agree = "n/a" if self.argmax_agreement is None else f"{self.argmax_agreement:.4f} of {self.argmax_rows} rows"
        return (f"{head}. max|c-r| {self.max_abs_err:.3g}, mean|c-r| {self.mean_abs_err:.3g}, "
                f"max rel {self.max_rel_err:.3g}, cosine {self.cosine:.6f}, argmax agreement {agree}, "
                f"rule {self.tolerance.describe()} -> {self.rule_value:.3g}"
                + ("" if self.tolerance.stat == "max" else f" (max {self.max_normalised_error:.3g})"))


def _fmt_index(index: Sequence[int]) -> str:
    return "(" + ", ".join(str(i) for i in index) + ")"


def compare_output(
    name: str,
    references: Sequence[np.ndarray],
    candidates: Sequence[np.ndarray | None],
    feed_labels: Sequence[str],
    tol: Tolerance,
) -> OutputComparison:
    """Compare one output over every feed (lists in feed order, same length).

    Args:
        name: output name (for messages).
        references: the reference's array per feed.
        candidates: the candidate's array per feed (None where the candidate lacks the output).
        feed_labels: a label per feed for messages, e.g. ``"generated[1] [3, 9]"``.
        tol: the output's tolerance.

    Returns:
        :class:`OutputComparison` with every statistic; ``passed`` False with reasons otherwise.
    """
    result = OutputComparison(output=name, tolerance=tol, passed=False)
    missing = [lbl for lbl, c in zip(feed_labels, candidates) if c is None]
    if missing:
        result.reasons.append(f"missing from the candidate's outputs (feeds {', '.join(missing[:3])}"
                              f"{' ...' if len(missing) > 3 else ''})")
        return result
    shapes = [(lbl, np.shape(r), np.shape(c)) for lbl, r, c in zip(feed_labels, references, candidates)]
    bad_shapes = [s for s in shapes if s[1] != s[2]]
    if bad_shapes:
        lbl, rs, cs = bad_shapes[0]
        result.reasons.append(f"shape {list(cs)} differs from the reference's {list(rs)} at feed {lbl}"
                              f" ({len(bad_shapes)} feed(s) affected)")
        return result

    refs = [np.asarray(r, dtype=np.float64) for r in references]
    cands = [np.asarray(c) for c in candidates]
    for lbl, c in zip(feed_labels, cands):  # first NaN/Inf, feed by feed in order: never averaged away
        bad = first_nonfinite(c)
        if bad is not None:
            index, value = bad
            result.nonfinite = {"feed": lbl, "index": list(index), "value": repr(value)}
            result.reasons.append(f"candidate has {value!r} at feed {lbl} index {_fmt_index(index)} "
                                  "(NaN/Inf always fails)")
            break
    cands64 = [c.astype(np.float64) for c in cands]
    ref_flat = np.concatenate([r.reshape(-1) for r in refs]) if refs else np.zeros(0)
    cand_flat = np.concatenate([c.reshape(-1) for c in cands64]) if cands64 else np.zeros(0)
    result.elements = int(ref_flat.size)
    rule = evaluate_rule(cand_flat, ref_flat, tol, feed_sizes=[r.size for r in refs])
    result.rule_value = rule.value
    result.max_normalised_error = rule.max_value
    with np.errstate(invalid="ignore"):
        abs_err = np.abs(cand_flat - ref_flat)
        finite_err = abs_err[np.isfinite(abs_err)]
    if abs_err.size:
        result.max_abs_err = float(abs_err.max()) if result.nonfinite is None else math.inf
        src = finite_err if finite_err.size else np.zeros(1)
        result.mean_abs_err = float(src.mean())
        result.median_abs_err = float(np.median(src))
        result.quantile_abs_err = float(np.quantile(src, tol.quantile, method="inverted_cdf"))
        with np.errstate(invalid="ignore", divide="ignore"):
            rel = abs_err / np.maximum(np.abs(ref_flat), _REL_FLOOR)
        result.max_rel_err = float(np.nanmax(rel)) if np.isfinite(rel).any() else math.inf
        result.cosine = cosine_similarity(np.nan_to_num(cand_flat, posinf=0.0, neginf=0.0), ref_flat)
    agree = [argmax_agreement(r, c) for r, c in zip(refs, cands64)]
    if agree and all(a is not None for a in agree):
        hits, rows = sum(a[0] for a in agree), sum(a[1] for a in agree)  # type: ignore[index]
        result.argmax_agreement, result.argmax_rows = (hits / rows if rows else 1.0), rows
    if rule.worst_flat_index >= 0 and result.nonfinite is None:
        result.worst = _locate(rule.worst_flat_index, refs, cands64, feed_labels)
    for lbl, r, c in zip(feed_labels, refs, cands64):
        with np.errstate(invalid="ignore"):
            err = np.abs(c - r)
        result.per_feed.append({"feed": lbl, "shape": list(r.shape),
                                "max_abs_err": float(np.nanmax(err)) if err.size and np.isfinite(err).any() else 0.0})

    if result.nonfinite is None and not rule.passed:
        where = ""
        if result.worst is not None:
            w = result.worst
            where = (f"; worst at feed {w['feed']} index {_fmt_index(w['index'])}: ref {w['reference']:.6g}, "
                     f"cand {w['candidate']:.6g}")
        rule_text = f"|c-r| <= {tol.atol:g} + {tol.rtol:g}*|r|"
        overall = f"{tol.stat_name} over {result.elements} elements"
        tail = f"max|c-r| {result.max_abs_err:.3g}{where}"
        if rule.failed == "feed":
            result.reasons.append(f"feed {feed_labels[rule.worst_feed]}: q{tol.feed_quantile:g} normalised error "
                                  f"{rule.feed_value:.3g} > 1 (at least {100 * tol.feed_quantile:g}% of every feed's "
                                  f"elements must meet the rule {rule_text}; its {overall} is {rule.value:.3g}; "
                                  f"{tail})")
        elif rule.failed == "max_limit":
            result.reasons.append(f"max normalised error {rule.max_value:.3g} > max_limit {tol.max_limit:g} (no "
                                  f"element may be further than {tol.max_limit:g}x the rule {rule_text}, whose "
                                  f"{overall} is {rule.value:.3g}; {tail})")
        else:
            result.reasons.append(f"{tol.stat_name} normalised error {rule.value:.3g} > 1 (rule {rule_text}, "
                                  f"{overall}; {tail})")
    if tol.min_argmax_agreement is not None and result.argmax_agreement is not None \
            and result.argmax_agreement < tol.min_argmax_agreement:
        result.reasons.append(f"argmax agreement {result.argmax_agreement:.4f} < {tol.min_argmax_agreement:g} "
                              f"({result.argmax_rows - round(result.argmax_agreement * result.argmax_rows)} of "
                              f"{result.argmax_rows} rows differ)")
    if tol.min_cosine is not None and not result.cosine >= tol.min_cosine:
        result.reasons.append(f"cosine similarity {result.cosine:.6f} < {tol.min_cosine:g}")
    result.passed = not result.reasons
    return result


def _locate(
    flat: int, refs: Sequence[np.ndarray], cands: Sequence[np.ndarray], labels: Sequence[str]
) -> dict[str, Any]:
    """Feed, index and both values of a flat index into the pooled elements."""
    for lbl, r, c in zip(labels, refs, cands):
        if flat < r.size:
            index = tuple(int(i) for i in np.unravel_index(flat, r.shape)) if r.ndim else ()
            return {"feed": lbl, "index": list(index), "reference": float(r.reshape(-1)[flat]),
                    "candidate": float(c.reshape(-1)[flat])}
        flat -= r.size
    raise IndexError("flat index beyond the pooled outputs")


def compare_outputs(
    references: Sequence[Mapping[str, np.ndarray]],
    candidates: Sequence[Mapping[str, np.ndarray]],
    feed_labels: Sequence[str],
    tolerances: Mapping[str, Tolerance],
    *,
    outputs: Sequence[str] | None = None,
) -> dict[str, OutputComparison]:
    """Compare every output of the reference (or ``outputs``) over all feeds.

    Args:
        references: per feed, the reference's ``{output: array}``.
        candidates: per feed, the candidate's ``{output: array}`` (extra outputs are ignored).
        feed_labels: a label per feed for messages.
        tolerances: per-output :class:`Tolerance` with a ``""`` default.
        outputs: output names to compare; None = every output of the first reference feed.

    Returns:
        Output name -> :class:`OutputComparison`, in the reference's output order.
    """
    if not (len(references) == len(candidates) == len(feed_labels)):
        raise ValueError("compare_outputs: references, candidates and feed_labels must have one entry per feed.")
    names = list(outputs) if outputs is not None else (list(references[0]) if references else [])
    return {
        name: compare_output(
            name, [r[name] for r in references], [c.get(name) for c in candidates], feed_labels,
            resolve_tolerance(tolerances, name),
        )
        for name in names
    }


def polygraphy_cross_check(
    references: Sequence[Mapping[str, np.ndarray]],
    candidates: Sequence[Mapping[str, np.ndarray]],
    tolerances: Mapping[str, Tolerance],
    outputs: Sequence[str],
) -> dict[str, dict[str, Any]]:
    """Polygraphy's verdict with the same atol/rtol/statistic, per output (recorded, not gating).

    Wraps each feed's outputs in ``IterationResult`` (one iteration per feed), both runs in a
    ``RunResults`` and calls ``Comparator.compare_accuracy(..., compare_func=SimpleCompareFunc(...))``.
    Outputs whose shapes differ are skipped. An output passes if it passed in every iteration.

    Returns:
        Output -> ``{"passed", "iterations", "max_absdiff", "max_reldiff", "mean_absdiff"}``
        (max over iterations); empty when Polygraphy is not installed.
    """
    try:
        from polygraphy.comparator import Comparator, IterationResult, RunResults, SimpleCompareFunc
        from polygraphy.logger import G_LOGGER
    except ImportError:  # polygraphy is a declared dependency; tolerate its absence in minimal installs
        log.warning("polygraphy is not importable: skipping the cross-check")
        return {}
    names = [n for n in outputs if all(n in c and np.shape(c[n]) == np.shape(r[n])
                                       for r, c in zip(references, candidates))]
    if not names or not references:
        return {}

    def outs(run: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {n: np.asarray(run[n], dtype=np.float32) for n in names}

    tols = {n: resolve_tolerance(tolerances, n) for n in names}
    compare = SimpleCompareFunc(
        atol={n: t.atol for n, t in tols.items()}, rtol={n: t.rtol for n, t in tols.items()},
        check_error_stat={n: t.stat for n, t in tols.items()},
        error_quantile={n: t.quantile for n, t in tols.items()},
    )
    # Polygraphy's relative error divides by the SECOND run's values: candidate first, reference second.
    results = RunResults([
        ("candidate", [IterationResult(outputs=outs(c), runner_name="candidate") for c in candidates]),
        ("reference", [IterationResult(outputs=outs(r), runner_name="reference") for r in references]),
    ])
    with G_LOGGER.verbosity(G_LOGGER.CRITICAL):
        accuracy = Comparator.compare_accuracy(results, comparisons=[(0, 1)], compare_func=compare)
    iterations = accuracy[0][("candidate", "reference")]
    out: dict[str, dict[str, Any]] = {}
    for name in names:
        per_iter = [it[name] for it in iterations if name in it]
        out[name] = {
            "passed": all(bool(r) for r in per_iter),
            "iterations": len(per_iter),
            "max_absdiff": _nanmax([getattr(r, "max_absdiff", math.nan) for r in per_iter]),
            "max_reldiff": _nanmax([getattr(r, "max_reldiff", math.nan) for r in per_iter]),
            "mean_absdiff": _nanmax([getattr(r, "mean_absdiff", math.nan) for r in per_iter]),
        }
    return out


def _nanmax(values: Sequence[float | None]) -> float:
    vals = [float(v) for v in values if v is not None]
    if not vals:
        return math.nan
    if any(math.isnan(v) for v in vals):
        return math.nan
    return max(vals)
