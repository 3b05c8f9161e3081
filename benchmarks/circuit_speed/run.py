"""Circuit search speed on the real all-MiniLM-L6-v2: batched (many masks per forward) vs looped.

Both modes run the full layer-conditioned search (6 layers x (12 + 1) masks = 78 mask
evaluations of the calibration set, objective = cross-entropy) and must select the same heads.
Repeats are interleaved with a rotating order so machine-load drift hits every variant; the
speed-up is median(looped) / median(variant), in wall time and in process CPU time. Batched
variants differ in ``max_batch_size`` (rows per forward). A randomly initialised 3-class head
is enough for timing. Each thread count in ``--threads`` gets a full section: 2 threads is the
target machine; 1 thread is robust to other jobs on the machine (no OpenMP barrier spinning).
A second, overhead-bound configuration (short sequences, few samples) and a forward-pass
micro-benchmark (cost per calibration copy at growing batch sizes) explain the numbers.

    python benchmarks/circuit_speed/run.py                 # ~10-20 min on 2 cores
    python benchmarks/circuit_speed/run.py --repeats 1 --samples 8 --max-length 16 --threads 2   # quick
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

import torch

from toolchain.data import load_tweets, make_splits, tokenize
from toolchain.models import load_model
from toolchain.scoring import circuit_scores
from toolchain.scoring.scores import atomic_write_bytes

HERE = Path(__file__).resolve().parent


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--samples", type=int, default=32)
    p.add_argument("--max-length", type=int, default=64)
    p.add_argument("--padding", choices=("max_length", "longest"), default="max_length")
    p.add_argument("--n-heads", type=int, default=6)
    p.add_argument("--objective", default="loss")
    p.add_argument("--max-batch-sizes", default="128,416",
                   help="batched variants (rows per forward); 32 = one mask per forward through the batched code, "
                        "416 = all 13 masks of a step in one forward")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--small-samples", type=int, default=8, help="overhead-bound configuration: samples")
    p.add_argument("--small-length", type=int, default=16, help="overhead-bound configuration: max length")
    p.add_argument("--small-repeats", type=int, default=5)
    p.add_argument("--threads", default="2,1",
                   help="torch thread counts to measure, one full section each; 1 thread is the contention-robust "
                        "measure (no OpenMP barriers spinning against other jobs)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=HERE)
    return p.parse_args(argv)


def calibration(tokenizer, tweets, n: int, max_length: int, padding: str, seed: int):
    split = make_splits(tweets, {"calib": n}, seed=seed)["calib"]
    return [(tokenize(split.texts, tokenizer, max_length, padding), torch.from_numpy(split.labels))]


def time_modes(adapter, calib, args, repeats: int, batch_sizes: list[int]) -> dict:
    """Interleaved repeats of the full search, looped and batched (one variant per max_batch_size).

    The order of the variants rotates every repeat, so load drift spreads over all of them.
    """
    variants = [("looped", 0)] + [("batched", b) for b in batch_sizes]
    names = ["looped"] + [f"batched@{b}" for b in batch_sizes]
    times: dict[str, list[float]] = {n: [] for n in names}
    cpu: dict[str, list[float]] = {n: [] for n in names}
    circuits: dict[str, list] = {}
    res = None
    for rep in range(repeats):
        shift = rep % len(variants)
        for (mode, mbs), name in list(zip(variants, names))[shift:] + list(zip(variants, names))[:shift]:
            t0, c0 = time.perf_counter(), time.process_time()
            res = circuit_scores(adapter, calib, n_heads=args.n_heads, objective=args.objective, mode=mode,
                                 max_batch_size=mbs or 1)
            times[name].append(time.perf_counter() - t0)
            cpu[name].append(time.process_time() - c0)
            circuits.setdefault(name, res.extras["circuit"])
            if res.extras["circuit"] != circuits[name]:
                raise RuntimeError(f"{name} selection changed between repeats")
            print(f"  repeat {rep} {name:12s} {times[name][-1]:7.2f} s wall {cpu[name][-1]:7.2f} s cpu "
                  f"(load {os.getloadavg()[0]:.2f})", flush=True)
    med = {n: statistics.median(v) for n, v in times.items()}
    med_cpu = {n: statistics.median(v) for n, v in cpu.items()}
    return {
        "seconds": times,
        "cpu_seconds": cpu,
        "median_seconds": med,
        "median_cpu_seconds": med_cpu,
        "cpu_speedup_median": {n: med_cpu["looped"] / med_cpu[n] for n in names[1:]},
        "speedup_median": {n: med["looped"] / med[n] for n in names[1:]},
        "speedup_per_repeat": {n: [lo / b for lo, b in zip(times["looped"], times[n])] for n in names[1:]},
        "identical_selection": {n: circuits[n] == circuits["looped"] for n in names[1:]},
        "circuit": circuits["looped"],
        "mask_evaluations": res.extras["mask_evaluations"],
        "masks_per_forward": {f"batched@{b}": max(1, b // int(calib[0][1].shape[0])) for b in batch_sizes},
    }


def forward_costs(adapter, calib, copies: list[int]) -> list[dict]:
    """Seconds per calibration-set copy for one forward on k stacked copies (per-sample gates)."""
    batch, labels = calib[0]
    n = int(labels.shape[0])
    out = []
    with torch.no_grad():
        for k in copies:
            rep = {key: v.repeat(k, *([1] * (v.dim() - 1))) for key, v in batch.items()}
            gates = torch.ones(k * n, adapter.num_layers, adapter.max_heads)
            adapter.gated_logits(rep, gates)  # warm-up
            t0 = time.perf_counter()
            for _ in range(2):
                adapter.gated_logits(rep, gates)
            dt = (time.perf_counter() - t0) / 2
            out.append({"rows": k * n, "seconds": dt, "seconds_per_copy": dt / k})
            print(f"  forward {k * n:4d} rows: {dt:.3f} s ({dt / k:.3f} s per {n}-sample copy)", flush=True)
    return out


def markdown(r: dict) -> str:
    c = r["config"]

    def rows(title, res, data):
        out = [f"| {title} | {data} | looped (1 mask per forward) | - | {res['median_seconds']['looped']:.2f} | 1.00x "
               f"| - | {res['median_cpu_seconds']['looped']:.2f} | 1.00x | - |"]
        for name, sp in res["speedup_median"].items():
            per = ", ".join(f"{x:.2f}" for x in res["speedup_per_repeat"][name])
            same = res["identical_selection"][name]
            out.append(f"| {title} | {data} | {name} | {res['masks_per_forward'][name]} | "
                       f"{res['median_seconds'][name]:.2f} | **{sp:.2f}x** | {per} | "
                       f"{res['median_cpu_seconds'][name]:.2f} | {res['cpu_speedup_median'][name]:.2f}x | {same} |")
        return out

    first = next(iter(r["sections"].values()))["main"]
    lines = [
        "# Circuit search speed: batched vs looped (all-MiniLM-L6-v2, CPU)",
        "",
        f"Full layer-conditioned search: {first['mask_evaluations']} mask evaluations of the calibration set "
        f"(6 layers x (12 candidates + 1 reference)), objective `{c['objective']}`, n_heads {c['n_heads']} per layer, "
        f"torch {c['torch']}, {c['cpu_count']} CPUs. Repeats interleaved (rotating order), median seconds; "
        "speed-up = median(looped) / median(variant). `batched@N` = at most N rows per forward. "
        "CPU s = process CPU time (all threads). Other jobs shared the 2 cores during the run: with 2 threads, "
        "OpenMP barriers spin against them and inflate both wall and CPU time of many small forwards; "
        "the 1-thread section is the contention-robust comparison of the work done.",
        "",
    ]
    for threads, sec in r["sections"].items():
        main, small = sec["main"], sec["small"]
        lines += [
            f"## {threads} thread(s) (load average before/after: {sec['loadavg_before'][0]:.2f} / "
            f"{sec['loadavg_after'][0]:.2f})",
            "",
            "| configuration | data | variant | masks per forward | median wall s | speed-up (wall) "
            "| per repeat (wall) | median CPU s | speed-up (CPU) | same heads |",
            "|---|---|---|---|---|---|---|---|---|---|",
            *rows("spec (target >= 5x)", main, f"{c['samples']} tweets x {c['max_length']} tokens"),
            *rows("overhead-bound", small, f"{c['small_samples']} tweets x {c['small_length']} tokens"),
            "",
            f"One forward of k stacked copies of the {c['samples']}-sample calibration set "
            "(per-sample gates): seconds per copy. A flat per-copy cost means compute-bound: stacking masks into "
            "one forward saves no arithmetic.",
            "",
            "| rows | seconds | seconds per copy |",
            "|---|---|---|",
            *[f"| {f['rows']} | {f['seconds']:.3f} | {f['seconds_per_copy']:.3f} |" for f in sec["forward_costs"]],
            "",
        ]
    lines += [f"Command: `{c['command']}`", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    loaded = load_model("packaged:all-MiniLM-L6-v2", num_labels=3, seed=args.seed)
    adapter = loaded.adapter
    tweets = load_tweets()
    calib = calibration(loaded.tokenizer, tweets, args.samples, args.max_length, args.padding, args.seed)
    small = calibration(loaded.tokenizer, tweets, args.small_samples, args.small_length, args.padding, args.seed)
    sizes = [int(x) for x in args.max_batch_sizes.split(",")]

    sections = {}
    for threads in [int(x) for x in args.threads.split(",")]:
        torch.set_num_threads(threads)
        load_before = os.getloadavg()
        print(f"== {threads} thread(s); forward cost per calibration copy:", flush=True)
        costs = forward_costs(adapter, calib, [1, 2, 4, 8])
        print(f"spec configuration ({args.samples} x {args.max_length}):", flush=True)
        main_res = time_modes(adapter, calib, args, args.repeats, sizes)
        print(f"overhead-bound configuration ({args.small_samples} x {args.small_length}):", flush=True)
        small_res = time_modes(adapter, small, args, args.small_repeats, [args.small_samples * 13])
        sections[str(threads)] = {"main": main_res, "small": small_res, "forward_costs": costs,
                                  "loadavg_before": list(load_before), "loadavg_after": list(os.getloadavg())}

    command = " ".join(["python benchmarks/circuit_speed/run.py", *(sys.argv[1:] if argv is None else argv)])
    results = {
        "config": {**{k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
                   "torch": torch.__version__, "python": platform.python_version(), "command": command,
                   "cpu_count": os.cpu_count()},
        "sections": sections,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(args.out / "results.json", json.dumps(results, indent=1).encode())
    atomic_write_bytes(args.out / "results.md", markdown(results).encode())
    print(markdown(results))
    return results


if __name__ == "__main__":
    main()
