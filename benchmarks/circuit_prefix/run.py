"""Circuit search with and without the shared prefix (all-MiniLM-L6-v2, CPU): time and identical output.

At layer step ``l`` every candidate mask gates the layers below ``l`` alike (the circuit so far),
so ``evaluate_masks(share_prefix=True)`` (the default) runs them once per calibration batch and
each mask from layer ``l`` on. This measures the full search both ways in the score stage's
configuration (calibration batches of ``--batch-size`` tweets padded to the longest, at most 128
rows per forward, 6 heads kept per layer), on the packaged model with a randomly initialised
3-class head (timing does not need a trained one). Repeats are interleaved in ABBA order so load
drift hits both; the speed-up is median(unshared) / median(shared), with the per-repeat ratios'
spread. ``identical`` says whether the scores (every head's damage, the circuit) are bit for bit
the same.

    python benchmarks/circuit_prefix/run.py                     # ~5 min on 2 cores
    python benchmarks/circuit_prefix/run.py --repeats 1 --samples 16   # quick
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np
import torch

from toolchain.data import load_tweets, make_splits, tokenize
from toolchain.models import load_model
from toolchain.scoring import circuit_scores
from toolchain.scoring.scores import atomic_write_bytes

HERE = Path(__file__).resolve().parent


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--samples", type=int, default=64, help="calibration tweets")
    p.add_argument("--batch-size", type=int, default=16, help="tweets per calibration batch (scoring.batch_size)")
    p.add_argument("--max-length", type=int, default=64)
    p.add_argument("--n-heads", type=int, default=6)
    p.add_argument("--repeats", type=int, default=3, help="ABBA pairs")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=HERE)
    return p.parse_args(argv)


def search(adapter, calib, n_heads: int, share: bool):
    """One full search (loss objective), timed."""
    t0 = time.perf_counter()
    res = circuit_scores(adapter, calib, n_heads=n_heads, objective="loss", share_prefix=share)
    return time.perf_counter() - t0, res


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    loaded = load_model("packaged:all-MiniLM-L6-v2", num_labels=3, seed=args.seed)
    split = make_splits(load_tweets(), {"calib": args.samples}, seed=args.seed)["calib"]
    calib = [(tokenize(split.texts[i:i + args.batch_size], loaded.tokenizer, args.max_length, "longest"),
              torch.from_numpy(np.asarray(split.labels[i:i + args.batch_size])))
             for i in range(0, args.samples, args.batch_size)]
    times: dict[str, list[float]] = {"unshared": [], "shared": []}
    scores: dict[str, object] = {}
    for rep in range(args.repeats):
        for name in (("unshared", "shared", "shared", "unshared") if rep % 2 == 0 else
                     ("shared", "unshared", "unshared", "shared")):
            dt, res = search(loaded.adapter, calib, args.n_heads, name == "shared")
            times[name].append(dt)
            scores.setdefault(name, res)
            print(f"  repeat {rep} {name:9s} {dt:7.2f} s (load {os.getloadavg()[0]:.2f})", flush=True)
    ratios = [u / s for u, s in zip(times["unshared"], times["shared"], strict=True)]
    a, b = scores["unshared"], scores["shared"]
    identical = bool(torch.equal(a.scores, b.scores) and a.extras["circuit"] == b.extras["circuit"]
                     and a.extras["damage"] == b.extras["damage"])
    command = " ".join(["python benchmarks/circuit_prefix/run.py", *(sys.argv[1:] if argv is None else argv)])
    results = {
        "config": {**{k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
                   "torch": torch.__version__, "python": platform.python_version(), "command": command,
                   "cpu_count": os.cpu_count(), "mask_evaluations": b.extras["mask_evaluations"]},
        "seconds": times,
        "median_seconds": {k: statistics.median(v) for k, v in times.items()},
        "speedup_median": statistics.median(times["unshared"]) / statistics.median(times["shared"]),
        "speedup_per_pair": ratios,
        "identical": identical,
    }
    md = [
        "# Circuit search: shared prefix on and off (all-MiniLM-L6-v2, CPU)",
        "",
        f"Full layer-conditioned search ({results['config']['mask_evaluations']} mask evaluations), objective "
        f"`loss`, {args.samples} tweets in batches of {args.batch_size} padded to the longest (at most "
        f"{args.max_length} tokens), {args.n_heads} heads kept per layer, torch {torch.__version__}, "
        f"{args.threads} threads, {2 * args.repeats} searches each way in ABBA order.",
        "",
        "| variant | median s | all runs (s) |",
        "|---|---:|---|",
        *[f"| {k} | {statistics.median(v):.2f} | {', '.join(f'{x:.2f}' for x in v)} |" for k, v in times.items()],
        "",
        f"Speed-up (median unshared / median shared): **{results['speedup_median']:.2f}x**; per run pair "
        f"{min(ratios):.2f}x to {max(ratios):.2f}x. Scores and circuit bit for bit identical: **{identical}**.",
        "",
        f"Command: `{command}`",
        "",
    ]
    args.out.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(args.out / "results.json", json.dumps(results, indent=1).encode())
    atomic_write_bytes(args.out / "results.md", "\n".join(md).encode())
    print("\n".join(md))
    return results


if __name__ == "__main__":
    main()
