"""Statistics, numeric parity and the results.md of the GPU benchmark (stdlib + torch only)."""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from typing import Any

import torch

#: the paper's seed numbers (latency relative to the single model, BF16)
PAPER = {"hydra/single": 1.07, "deep-ensemble/single": 2.99}


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (as ``numpy.percentile``), ``q`` in 0..100."""
    xs = sorted(values)
    if not xs:
        raise ValueError("percentile of no values")
    pos = (len(xs) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def summarize(values: Sequence[float]) -> dict[str, float]:
    """``n, median, p10, p90, min, max`` of samples."""
    return {"n": len(values), "median": percentile(values, 50), "p10": percentile(values, 10),
            "p90": percentile(values, 90), "min": min(values), "max": max(values)}


def ratio_stats(num: Sequence[float], den: Sequence[float], *, resamples: int = 1000, seed: int = 0) -> dict[str, Any]:
    """Per-round ratios ``num[r] / den[r]``: median, p10-p90 and a bootstrap 95 % interval of the median."""
    if len(num) != len(den) or not num:
        raise ValueError(f"ratio_stats needs two equally long, non-empty sample lists; got {len(num)}, {len(den)}")
    per_round = [a / b for a, b in zip(num, den, strict=True)]
    rng = random.Random(seed)
    medians = [percentile(rng.choices(per_round, k=len(per_round)), 50) for _ in range(resamples)]
    return {**summarize(per_round), "ci95": [percentile(medians, 2.5), percentile(medians, 97.5)],
            "per_round": per_round}


def parity(out: tuple[torch.Tensor, torch.Tensor], ref: tuple[torch.Tensor, torch.Tensor]) -> dict[str, float]:
    """Differences of ``(logits, probs)`` from the FP32 reference.

    ``*_max_abs``: max |out - ref|; ``*_rel``: max |out - ref| / max |ref|; ``argmax_agree``: the
    fraction of rows whose predicted class (from probs) is the reference's.
    """
    res: dict[str, float] = {}
    for name, a, b in (("logits", out[0], ref[0]), ("probs", out[1], ref[1])):
        a, b = a.detach().float().cpu(), b.detach().float().cpu()
        diff = float((a - b).abs().max())
        res[f"{name}_max_abs"] = diff
        res[f"{name}_rel"] = diff / max(float(b.abs().max()), 1e-30)
    res["argmax_agree"] = float((out[1].float().argmax(-1).cpu() == ref[1].float().argmax(-1).cpu()).float().mean())
    res["finite"] = float(bool(torch.isfinite(out[0]).all() and torch.isfinite(out[1]).all()))
    return res


# ------------------------------------------------------------------------------------ markdown
def _r(stats: dict[str, Any] | None) -> str:
    if not stats:
        return "-"
    return f"{stats['median']:.2f} [{stats['p10']:.2f}-{stats['p90']:.2f}]"


def _key(g: dict[str, Any]) -> str:
    return f"| {g['shape']} | {g['batch']} | {g['precision']} | {g['mode']} |"


def markdown(result: dict[str, Any]) -> str:
    """The report: ratios, latencies, paper comparison, parity and what was skipped."""
    meta, groups = result["meta"], result["groups"]
    done = [g for g in groups if g["status"] == "measured"]
    hydras = meta["hydra_variants"]
    variants = meta["variants"]
    lines = [f"# GPU latency: single vs deep ensemble (M = {meta['members']}) vs Hydra", "",
             f"Device: {meta['device']}; torch {meta['torch']}; implementation `{meta['impl']}`"
             f"{' (' + meta['impl_note'] + ')' if meta.get('impl_note') else ''}; sequence {meta['sequence']}; "
             f"{meta['rounds']} interleaved rounds per group (order rotated each round), {meta['warmup']} warm-up "
             f"calls; clock: {meta['clock']}; FP32 without TF32. {len(done)} of {len(groups)} groups measured in "
             f"{meta['elapsed_s']:.0f} s (budget {meta['budget_s']:.0f} s)."
             + (" **Dry run: toy sizes on CPU, numbers are meaningless.**" if meta["dry_run"] else ""), "",
             "Ratios are medians of per-round ratios [p10-p90]; below 1 means the Hydra is faster.", ""]
    lines += [*_paper(done, hydras), ""]
    for den in ("single", "deep-ensemble"):
        lines += [f"## Hydra / {den}", "", "| shape | batch | precision | mode | " + " | ".join(hydras) + " |",
                  "|---|---:|---|---|" + "---:|" * len(hydras)]
        lines += [_key(g) + " " + " | ".join(_r(g["ratios"].get(f"{h}/{den}")) for h in hydras) + " |" for g in done]
        lines.append("")
    lines += ["## Other ratios", "", "| shape | batch | precision | mode | deep-ensemble/single | single-sdpa/single |",
              "|---|---:|---|---|---:|---:|"]
    lines += [_key(g) + " " + " | ".join(_r(g["ratios"].get(k)) for k in ("deep-ensemble/single", "single-sdpa/single"))
              + " |" for g in done]
    lines += ["", "## Latency, ms (median)", "", "| shape | batch | precision | mode | " + " | ".join(variants)
              + " | first call, s |", "|---|---:|---|---|" + "---:|" * (len(variants) + 1)]
    for g in done:
        cells = [f"{g['latency'][v]['median'] * 1e3:.3f}" if v in g["latency"] else "-" for v in variants]
        lines.append(_key(g) + " " + " | ".join(cells) + f" | {max(g['first_call_s'].values()):.1f} |")
    lines += ["", "## Numeric parity vs FP32 eager (same model, same inputs)", "",
              "max |difference| of probabilities and of logits, and the logits' difference relative to their "
              "largest magnitude; worst over the variants of each kind. CUDA-graph modes replay the same kernels "
              "as their source mode and are not repeated here.", "",
              "| shape | batch | precision | mode | variant | probs max abs | logits max abs | logits rel | "
              "argmax agree |", "|---|---:|---|---|---|---:|---:|---:|---:|"]
    for g in done:
        if g["mode"] in ("eager", "compile") and not (g["precision"] == "fp32" and g["mode"] == "eager"):
            for v, p in g["parity"].items():
                lines.append(_key(g) + f" {v} | {p['probs_max_abs']:.2e} | {p['logits_max_abs']:.2e} | "
                             f"{p['logits_rel']:.2e} | {p['argmax_agree']:.2f} |")
    other = [g for g in groups if g["status"] not in ("measured", "not-planned")]
    planned_out = sum(g["status"] == "not-planned" for g in groups)
    failed = [(g, v, why) for g in done for v, why in g.get("failed_variants", {}).items()]
    if failed:
        lines += ["", "## Failed variants (the rest of their group was measured)", ""]
        lines += [f"- {g['shape']} b{g['batch']} {g['precision']} {g['mode']} {v}: {why}" for g, v, why in failed]
    if other:
        lines += ["", "## Not measured", "", "| shape | batch | precision | mode | status | reason |",
                  "|---|---:|---|---|---|---|"]
        lines += [_key(g) + f" {g['status']} | {g.get('reason', '')} |" for g in other]
    lines += ["", "Plan: " + " ".join(meta["plan_notes"]) + f" {planned_out} groups not planned (compile at other "
              "precisions).", "", f"Command: `{meta['command']}`", ""]
    return "\n".join(lines)


def _paper(done: list[dict[str, Any]], hydras: list[str]) -> list[str]:
    """The line comparing with the paper's seed numbers, and the BF16 (weights) ratios beside it."""
    line = (f"**Paper (seed numbers, BF16): Hydra {PAPER['hydra/single']:.2f}x the single model's latency, deep "
            f"ensemble {PAPER['deep-ensemble/single']:.2f}x.**")
    bf16 = [g for g in done if g["precision"] == "bf16"]
    if not bf16:
        return [line + " Here: no BF16 group was measured."]
    out = [line + " Here, BF16 weights (latency / single model's, median of per-round ratios):", "",
           "| shape | batch | mode | " + " | ".join(hydras) + " | deep-ensemble |",
           "|---|---:|---|" + "---:|" * (len(hydras) + 1)]
    for g in bf16:
        cells = [f"{g['ratios'][k]['median']:.2f}" if k in g["ratios"] else "-"
                 for k in [f"{h}/single" for h in hydras] + ["deep-ensemble/single"]]
        out.append(f"| {g['shape']} | {g['batch']} | {g['mode']} | " + " | ".join(cells) + " |")
    return out
