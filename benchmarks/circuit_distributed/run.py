"""Circuit search on the real all-MiniLM-L6-v2 with 1 process vs 2 torch.distributed processes (gloo, CPU).

The search's candidate masks of each layer step are split over the ranks (whole forwards, the same
forwards a single process runs, so the selection is identical: checked here). Three jobs are
started once and kept (idle processes block on a pipe and use no CPU): one process with all
cores' threads (``torch.set_num_threads(cores)``, the fair single-process baseline: it uses the
whole machine, as the 2 ranks together do), one process with ``cores // 2`` threads (the same
threads as one rank: isolates the effect of distributing from the effect of thread count), and
2 ranks (torchrun's environment variables, gloo) with ``cores // 2`` threads each. Each
measurement is one full search, timed alone (the slowest rank ends it); the order of the jobs
rotates every repeat so load drift hits all of them.

    python benchmarks/circuit_distributed/run.py                 # ~4-6 min on 2 cores
    python benchmarks/circuit_distributed/run.py --repeats 1 --samples 8 --max-length 16   # quick
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--samples", type=int, default=16)
    p.add_argument("--max-length", type=int, default=32)
    p.add_argument("--n-heads", type=int, default=6)
    p.add_argument("--objective", default="loss")
    p.add_argument("--variants", default="batched@128,looped",
                   help="search modes: batched@N (at most N rows per forward; the default batched@128) or looped")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=HERE)
    p.add_argument("--render", type=Path, default=None,
                   help="only rewrite results.md from this results.json (e.g. after editing its 'notes')")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--threads", type=int, default=0, help=argparse.SUPPRESS)
    return p.parse_args(argv)


# ---------------------------------------------------------------------------- a job's rank
def worker(args: argparse.Namespace) -> None:
    """Load once, then run one search per ``run VARIANT`` line on stdin; rank 0 prints a JSON line each."""
    import torch

    torch.set_num_threads(args.threads)
    from toolchain import distributed as dist
    from toolchain.data import load_tweets, make_splits, tokenize
    from toolchain.models import load_model
    from toolchain.scoring import circuit_scores

    dist.init_from_env()
    loaded = load_model("packaged:all-MiniLM-L6-v2", num_labels=3, seed=args.seed)
    split = make_splits(load_tweets(), {"calib": args.samples}, seed=args.seed)["calib"]
    calib = [(tokenize(split.texts, loaded.tokenizer, args.max_length, "max_length"), torch.from_numpy(split.labels))]
    with torch.no_grad():  # warm-up: one forward
        loaded.adapter.gated_logits(calib[0][0], torch.ones(args.samples, loaded.adapter.num_layers,
                                                             loaded.adapter.max_heads))
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        cmd, _, variant = line.strip().partition(" ")
        if cmd != "run":
            break
        mode, _, mbs = variant.partition("@")
        dist.barrier()
        t0, c0 = time.perf_counter(), time.process_time()
        res = circuit_scores(loaded.adapter, calib, n_heads=args.n_heads, objective=args.objective, mode=mode,
                             max_batch_size=int(mbs or 128))
        seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
        every = dist.all_gather_objects({"seconds": seconds, "cpu": cpu, "threads": torch.get_num_threads()})
        if dist.is_main():
            print(json.dumps({
                "seconds": max(e["seconds"] for e in every), "cpu_seconds": sum(e["cpu"] for e in every),
                "threads": [e["threads"] for e in every], "world": dist.world_size(),
                "circuit": res.extras["circuit"], "mask_evaluations": res.extras["mask_evaluations"],
            }), flush=True)


# ---------------------------------------------------------------------------- the benchmark
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Job:
    """``world`` processes of ``threads`` threads each, loaded and waiting for ``run VARIANT`` commands."""

    def __init__(self, args: argparse.Namespace, world: int, threads: int) -> None:
        self.name = f"{world}x{threads}"
        cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", "--threads", str(threads),
               "--samples", str(args.samples), "--max-length", str(args.max_length), "--n-heads", str(args.n_heads),
               "--objective", args.objective, "--seed", str(args.seed)]
        base = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")}
        base.update({"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": str(threads)})
        port = _free_port()
        envs = [base] if world == 1 else [
            {**base, "RANK": str(r), "LOCAL_RANK": str(r), "WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1",
             "MASTER_PORT": str(port)} for r in range(world)
        ]
        self.procs = [subprocess.Popen(cmd, env=env, cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                       text=True) for env in envs]

    def _read(self) -> dict:
        line = self.procs[0].stdout.readline()
        if not line:
            raise RuntimeError(f"job {self.name} ended early (see its stderr above)")
        return json.loads(line)

    def wait_ready(self) -> None:
        assert self._read()["ready"]

    def run(self, variant: str) -> dict:
        for p in self.procs:
            p.stdin.write(f"run {variant}\n")
            p.stdin.flush()
        return self._read()

    def close(self) -> None:
        for p in self.procs:
            with contextlib.suppress(OSError):
                p.stdin.write("quit\n")
                p.stdin.close()
        for p in self.procs:
            p.wait(timeout=120)


def _ideal(chunks: list[int], ranks: int) -> float:
    """Speed-up if only the mask evaluations counted: 13 / the most masks one rank evaluates per step."""
    per_rank = [sum(chunks[r::ranks]) for r in range(ranks)]
    return sum(chunks) / max(per_rank)


def _spread(values: list[float]) -> str:
    return f"{statistics.median(values):.2f}x [{min(values):.2f}, {max(values):.2f}]"


def markdown(r: dict) -> str:
    c, j = r["config"], r["jobs"]
    one, half, two = j["single_all_cores"], j["single_rank_threads"], j["distributed"]
    lines = [
        "# Circuit search: 1 process vs 2 torch.distributed processes (all-MiniLM-L6-v2, CPU, gloo)",
        "",
        f"Full layer-conditioned search ({r['mask_evaluations']} mask evaluations: 6 layers x (12 candidates + 1 "
        f"reference)) on {c['samples']} tweets x {c['max_length']} tokens, objective `{c['objective']}`, n_heads "
        f"{c['n_heads']}; torch {c['torch']}, {c['cpu_count']} CPUs; load average {r['loadavg_before'][0]:.2f} "
        f"before / {r['loadavg_after'][0]:.2f} after. Jobs (processes x torch threads each): `{one}` = one process "
        f"on all cores (the fair baseline: the same cores as the 2 ranks), `{half}` = one process with one rank's "
        f"threads, `{two}` = 2 ranks (gloo). Jobs are started once; each measurement is one full search (the "
        f"slowest rank ends it), {c['repeats']} repeats in rotating order. Speed-up = baseline seconds / `{two}` "
        "seconds: of the medians, and per repeat (paired: median [min, max]).",
        "",
        f"| variant | forwards per layer step (masks each) | ideal 2-rank speed-up | `{one}` median s "
        f"| `{half}` median s | `{two}` median s | speed-up vs `{one}` (medians) | per repeat "
        f"| speed-up vs `{half}` (medians) | per repeat | CPU s `{one}` / `{half}` / `{two}` (median, all ranks) "
        "| same circuit |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, v in r["variants"].items():
        sec, cpu = v["seconds"], v["cpu_seconds"]
        lines.append(
            f"| {name} | {v['forwards_per_step']} | {v['ideal_speedup']:.2f}x | {statistics.median(sec[one]):.2f} | "
            f"{statistics.median(sec[half]):.2f} | {statistics.median(sec[two]):.2f} | "
            f"**{v[f'speedup_vs_{one}_median']:.2f}x** | {_spread(v[f'speedup_vs_{one}_per_repeat'])} | "
            f"**{v[f'speedup_vs_{half}_median']:.2f}x** | {_spread(v[f'speedup_vs_{half}_per_repeat'])} | "
            f"{' / '.join(f'{statistics.median(cpu[n]):.1f}' for n in (one, half, two))} | {v['identical_circuit']} |"
        )
    lines += ["", "Seconds per repeat:", ""]
    for name, v in r["variants"].items():
        lines.append(f"- {name}: " + "; ".join(f"`{n}` {', '.join(f'{x:.2f}' for x in xs)}"
                                               for n, xs in v["seconds"].items()))
    lines += [
        "",
        "How to read it: the forwards of a layer step are the single process's own forwards (so the selection is "
        "bit-identical), dealt round-robin to the ranks; the ideal speed-up is 13 masks / the most masks one rank "
        "evaluates per step (coarse chunks cap it). The CPU column shows the work: when the 2 ranks' CPU seconds "
        f"add up to the `{half}` job's, distributing adds no work (the per-step exchange of logits is tiny) and the "
        "wall-time speed-up is whatever free cores allow. "
        f"`{one}` vs `{half}` is the thread effect alone: on a busy machine 2 OpenMP threads spin at barriers "
        "against other jobs and lose (see benchmarks/circuit_speed).",
    ]
    if r.get("notes"):
        lines += ["", r["notes"]]
    lines += ["", f"Command: `{c['command']}`", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    if args.worker:
        worker(args)
        return {}
    if args.render is not None:
        results = json.loads(args.render.read_text())
        for v in results["variants"].values():
            chunks = [int(x) for x in v["forwards_per_step"].split("(")[1].rstrip(")").split("+")]
            v["ideal_speedup"] = _ideal(chunks, 2)
        (args.out / "results.md").write_text(markdown(results))
        print(markdown(results))
        return results
    import torch

    cores = os.cpu_count() or 1
    half = max(1, cores // 2)
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    names = {f"1x{cores}": (1, cores), f"1x{half}": (1, half), f"2x{half}": (2, half)}
    jobs = {name: Job(args, w, t) for name, (w, t) in names.items()}
    try:
        for job in jobs.values():
            job.wait_ready()
        load_before = os.getloadavg()
        res: dict = {v: {"seconds": {n: [] for n in jobs}, "cpu_seconds": {n: [] for n in jobs}, "circuits": {}}
                     for v in variants}
        mask_evals = None
        configs = [(v, n) for v in variants for n in jobs]
        for rep in range(args.repeats):
            shift = rep % len(configs)
            for variant, name in configs[shift:] + configs[:shift]:
                out = jobs[name].run(variant)
                res[variant]["seconds"][name].append(out["seconds"])
                res[variant]["cpu_seconds"][name].append(out["cpu_seconds"])
                if res[variant]["circuits"].setdefault(name, out["circuit"]) != out["circuit"]:
                    raise RuntimeError(f"{variant} {name}: the circuit changed between repeats")
                mask_evals = out["mask_evaluations"]
                print(f"repeat {rep} {variant:12s} {name:5s}: {out['seconds']:7.2f} s wall, {out['cpu_seconds']:7.2f} "
                      f"s cpu (load {os.getloadavg()[0]:.2f})", flush=True)
        load_after = os.getloadavg()
    finally:
        for job in jobs.values():
            job.close()
    two, base1, base2 = f"2x{half}", f"1x{cores}", f"1x{half}"
    for variant, v in res.items():
        sec = v["seconds"]
        for ref in (base1, base2):
            v[f"speedup_vs_{ref}_per_repeat"] = [a / b for a, b in zip(sec[ref], sec[two])]
            v[f"speedup_vs_{ref}_median"] = statistics.median(sec[ref]) / statistics.median(sec[two])
        v["identical_circuit"] = len({json.dumps(c) for c in v["circuits"].values()}) == 1
        mode, _, mbs = variant.partition("@")
        per = 1 if mode == "looped" else max(1, int(mbs) // args.samples)
        chunks = [min(per, 13 - s) for s in range(0, 13, per)]
        v["forwards_per_step"] = f"{len(chunks)} ({'+'.join(map(str, chunks))})"
        v["ideal_speedup"] = _ideal(chunks, 2)
        v["circuit"] = v["circuits"][base1]
        v.pop("circuits")
    command = " ".join(["python benchmarks/circuit_distributed/run.py", *(sys.argv[1:] if argv is None else argv)])
    results = {
        "config": {**{k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()
                      if k not in ("worker", "threads")},
                   "torch": torch.__version__, "python": platform.python_version(), "command": command,
                   "cpu_count": cores},
        "jobs": {"single_all_cores": base1, "single_rank_threads": base2, "distributed": two},
        "mask_evaluations": mask_evals, "variants": res,
        "loadavg_before": list(load_before), "loadavg_after": list(load_after),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(results, indent=1))
    (args.out / "results.md").write_text(markdown(results))
    print(markdown(results))
    return results


if __name__ == "__main__":
    main()
