"""Bring your own checkpoint, timed: a fine-tuned MiniLM folder + the tweets as CSV -> Hydra graph -> CI gate.

1. Makes the inputs ``recipes/own-checkpoint.yaml`` names (``artifacts/own-checkpoint-inputs/``): a
   classifier folder (all-MiniLM-L6-v2 fine-tuned on 9,600 tweets by the toolchain's own
   ``finetune`` command; ``id2label`` names the classes) and ``tweets.csv`` (6,000 other tweets,
   ``text,label``): rows the checkpoint never saw.
2. Runs ``hydra-toolchain run recipes/own-checkpoint.yaml`` (no deep ensemble, no compare; the
   checkpoint already classifies into the CSV's labels, so it is not fine-tuned again) and
   reports the wall time and each stage's time from the stage manifests.
3. Runs the CI gate on the exported files, timed, as a CI job on a clean checkout would (nothing
   trained, no recipe): ``parity`` of the Hydra FP32 and FP16 graphs against the Hydra folder on
   600 CSV rows (a seeded sample; ``--save-inputs`` keeps them), the same check replayed from the
   saved inputs, and ``bench`` of the two graphs at batch 1 and 8. ``--gate-only`` reruns just
   this on the artifacts of an earlier run.

Writes ``benchmarks/own_checkpoint/results.json`` and ``results.md``.

    python benchmarks/own_checkpoint/run.py
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parents[2]
INPUTS = ROOT / "artifacts" / "own-checkpoint-inputs"
RECIPE = ROOT / "recipes" / "own-checkpoint.yaml"
OUT = Path(__file__).resolve().parent


def _cli(*args: str) -> tuple[float, subprocess.CompletedProcess]:
    start = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "toolchain", *args], capture_output=True, text=True, cwd=ROOT,
                         env=dict(os.environ, HF_HUB_OFFLINE="1"))
    if out.returncode not in (0, 1):
        sys.stderr.write(out.stderr[-4000:])
        raise SystemExit(f"hydra-toolchain {' '.join(args)} exited {out.returncode}")
    return time.perf_counter() - start, out


def _write_csv(path: Path, texts: list[str], labels: list[str]) -> None:
    with path.open("w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["text", "label"])
        w.writerows(zip(texts, labels, strict=True))


def make_inputs(rows_ckpt: int = 10000, rows_csv: int = 6000) -> None:
    """The checkpoint folder (fine-tuned by the toolchain) and the CSV of rows it never saw."""
    from toolchain.data import load_tweets

    tweets = load_tweets()
    order = np.random.default_rng(0).permutation(len(tweets.texts))
    names = [tweets.class_names[int(i)] for i in tweets.labels]
    work = INPUTS / "make"
    work.mkdir(parents=True, exist_ok=True)
    ckpt_rows, csv_rows = order[:rows_ckpt], order[rows_ckpt:rows_ckpt + rows_csv]
    _write_csv(work / "train.csv", [tweets.texts[i] for i in ckpt_rows], [names[i] for i in ckpt_rows])
    _write_csv(INPUTS / "tweets.csv", [tweets.texts[i] for i in csv_rows], [names[i] for i in csv_rows])
    recipe = {"name": "make-checkpoint", "seed": 0, "artifacts_dir": str(work / "artifacts"),
              "model": {"source": "packaged:all-MiniLM-L6-v2", "max_length": 64},
              "data": {"id": "csv:train.csv", "splits": {"train": 9600, "val": 200, "calib": 16, "test": 184}},
              "finetune": {"steps": 300, "lr": 5.0e-5, "batch_size": 32}, "engines": ["torch"]}
    (work / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    seconds, _ = _cli("finetune", str(work / "recipe.yaml"))
    model = INPUTS / "model"
    if model.exists():
        shutil.rmtree(model)
    shutil.copytree(work / "artifacts" / "make-checkpoint" / "finetune" / "model", model)
    print(f"checkpoint fine-tuned in {seconds:.0f} s: {model}")


def stage_times(root: Path) -> dict[str, float]:
    """Seconds per stage from the stage manifests."""
    out = {}
    for manifest in sorted(root.glob("*/manifest.json")):
        data = json.loads(manifest.read_text())
        seconds = data.get("seconds", data.get("timings", {}).get("seconds"))
        if seconds is not None:
            out[manifest.parent.name] = float(seconds)
    return out


def ci_gate(root: Path) -> dict:
    """The file-command gate on the run's graphs (see the module docstring), each step timed."""
    gate = ROOT / "artifacts" / "own-checkpoint-gate"
    if gate.exists():
        shutil.rmtree(gate)
    graphs = [str(root / "export" / "hydra-conv.onnx"), str(root / "export" / "hydra-conv.fp16.onnx")]
    hydra = str(root / "fuse" / "hydra")
    steps = {}
    steps["parity_csv"] = _cli("parity", *graphs, "--reference", hydra, "--data", str(INPUTS / "tweets.csv"),
                               "--max-rows", "600", "--max-length", "64", "--save-inputs", str(gate / "inputs.npz"),
                               "--junit", str(gate / "parity.xml"), "-o", str(gate / "parity"))
    steps["parity_replay"] = _cli("parity", *graphs, "--reference", hydra, "--inputs", str(gate / "inputs.npz"),
                                  "-o", str(gate / "replay"))
    steps["bench"] = _cli("bench", *graphs, "--batch", "1,8", "--seq", "64", "-o", str(gate / "bench"))
    out: dict = {name: {"seconds": t, "exit": r.returncode} for name, (t, r) in steps.items()}
    report = json.loads((gate / "parity" / "report.json").read_text())
    replay = json.loads((gate / "replay" / "report.json").read_text())
    out["parity_status"] = report["status"]
    out["replay_identical"] = report["engines"] == replay["engines"]
    out["parity_checks"] = {e: {"checks": len(v["checks"]), "status": v["status"]}
                            for e, v in report["engines"].items()}
    bench = json.loads((gate / "bench" / "bench.json").read_text())
    out["bench_p50_ms"] = {f"{c['batch']}/{n}": 1e3 * v["median"]
                           for c in bench["cases"] for n, v in c["variants"].items()}
    out["ci_seconds"] = out["parity_replay"]["seconds"] + out["bench"]["seconds"]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reuse-inputs", action="store_true", help="keep an existing checkpoint folder and CSV")
    ap.add_argument("--gate-only", action="store_true", help="only the file-command gate, on an earlier run's files")
    args = ap.parse_args()
    root = ROOT / "artifacts" / "own-checkpoint"
    if args.gate_only:
        results = json.loads((OUT / "results.json").read_text())
    else:
        if not (args.reuse_inputs and (INPUTS / "model" / "config.json").is_file()):
            make_inputs()
        if root.exists():
            shutil.rmtree(root)  # a cold run: nothing cached
        seconds, run = _cli("run", str(RECIPE))
        results = {"run_seconds": seconds, "run_exit": run.returncode, "stages": stage_times(root),
                   "finetune_skipped": "not fine-tuned" in run.stderr,
                   "cpus": os.cpu_count(), "torch_threads": 2}
        metrics = json.loads((root / "evaluate" / "metrics.json").read_text())
        results["metrics"] = {k: {m: metrics[k][m] for m in ("accuracy", "nll", "ece")} for k in ("single", "hydra")}
    results["gate"] = ci_gate(root)
    (OUT / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    lines = ["| stage | seconds |", "|---|---:|"] + [f"| {k} | {v:.1f} |" for k, v in results["stages"].items()]
    g = results["gate"]
    gate = ["| gate step | seconds | exit |", "|---|---:|---:|"] + [
        f"| {k} | {g[k]['seconds']:.1f} | {g[k]['exit']} |" for k in ("parity_csv", "parity_replay", "bench")]
    (OUT / "results.md").write_text(
        f"`hydra-toolchain run recipes/own-checkpoint.yaml`, cold: {results['run_seconds']:.0f} s wall "
        f"(exit {results['run_exit']}); fine-tuning skipped: {results['finetune_skipped']}\n\n" + "\n".join(lines)
        + f"\n\nFile-command gate on its graphs: parity {g['parity_status']}, replay identical: "
        f"{g['replay_identical']}; CI gate (replay + bench) {g['ci_seconds']:.0f} s\n\n" + "\n".join(gate) + "\n")
    print((OUT / "results.md").read_text())


if __name__ == "__main__":
    main()
