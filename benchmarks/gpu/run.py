"""GPU latency of single model vs deep ensemble vs Hydra in PyTorch (eager, CUDA graphs, torch.compile).

Runs on a bare CUDA machine: it needs only PyTorch with CUDA and this repository (the project's
``toolchain`` is put on ``sys.path``; nothing is installed, nothing is downloaded). numpy is not
used. With ``transformers`` present the models are the project's own (Hugging Face
``BertForSequenceClassification`` and :func:`toolchain.hydra.fuse`); without it the torch-only
copies in ``gpu_models.py`` (every ``toolchain.hydra`` module imports ``transformers`` through the
package ``__init__``); the tests check both give the same outputs. ``--impl`` forces one.

Models (random weights, seeded): MiniLM-shaped (hidden 384, 6 layers, 12 heads, MLP 1536) and
BERT-base-shaped (768, 12, 12, 3072), 3 classes. Variants: ``single``; ``single-sdpa`` (the same
model with fused scaled-dot-product attention, a reference: every other variant uses matmul +
softmax attention); ``deep-ensemble`` (M = 3 models run one after another; member 0 is the
single model); ``hydra-k{4,6}-{conv,matmul}``: M = 3 head subsets of the single model, 4 or 6 of
12 heads per member and layer, averaged MLP, both GFC lowerings.

Matrix: batch 1 and 8, sequence 128; precisions ``fp32`` (TF32 off for matmul *and* cuDNN, so
both lowerings run true FP32), ``fp16-autocast``, ``bf16-autocast``, ``fp16`` and ``bf16``
(weights cast); modes ``eager``, ``cudagraph`` (the eager call captured with
``torch.cuda.graph``), ``compile`` (``torch.compile``, inductor, static shapes) and
``compile-cudagraph`` (the compiled call captured the same way: what ``mode="reduce-overhead"``
does, without a second compilation). One *group* = (shape, batch, precision, mode): its variants
run in interleaved rounds (order rotated each round), each call timed with CUDA events;
ratios are per round, reported as median, p10-p90 and a bootstrap 95 % interval of the median.
Numeric parity: each variant's logits and probabilities against its own FP32 eager output.

Budget (the whole run must fit 8 minutes on an H200 including compilation; estimated, not yet
measured on a GPU). Eager and CUDA-graph groups: 40 groups x 7 variants x ~60 calls (first call,
capture, 5 warm-up, 50 rounds); the slowest, BERT-base batch 8 FP32, is ~55 ms a round (a single
model is 2 x 85 M weights x 1024 tokens = 0.17 TFLOP, ~3.5 ms at ~50 TFLOP/s true FP32; ensemble 3x,
Hydras 2.3-2.5x), batch-1 groups are launch-bound at a few ms a round: ~80 s, plus ~15 s of model
building per shape. Compilation is the cost: ~10-15 s of inductor per model and batch size (static
shapes; ensemble members reuse the single model's code), so ~50 s (MiniLM) to ~75 s (BERT-base) a
compile group, ~250 s for the four BF16 ones. So ``compile`` runs for ``bf16`` (the paper's
precision) and then ``fp32`` (it gets what time is left), not for the other precisions and not for
``single-sdpa`` (inductor may itself turn matmul + softmax attention into fused attention); those
combinations are recorded as ``not-planned``. Groups run cheapest first (all eager and CUDA-graph
groups, then compile BF16, then compile FP32), and a global guard skips a group (status
``skipped``, with the reason) when its estimate (the longest group of the same mode so far x1.3,
or a prior: 90 s for the first compile group) would end past ``--budget-s`` (default 420 s from
the start). results.json and results.md are rewritten after every group.

    bash scripts/gpu-check.sh gpu-results          # python3 benchmarks/gpu/run.py --out gpu-results
    python benchmarks/gpu/run.py --dry-run --out /tmp/gpu-dry   # every code path, toy sizes, CPU

``--dry-run`` (CI, ~30 s on 2 cores): toy shapes (12 heads, widths 24 and 36), sequence 16, batch
1 and 2, 2 rounds, one CPU thread, ``perf_counter`` instead of CUDA events, ``torch.compile`` with
the ``eager`` backend (dynamo tracing, no code generation) for BF16 only (FP32 compiles take the
same code path); CUDA-graph capture cannot run on a CPU, so those modes call the function that
would be captured (same static inputs and outputs). Everything else (both precision kinds, the
ensemble, the ratios, parity, the guard, the reports) runs as on the GPU. Without CUDA (and
without ``--dry-run``) it exits with code 3.
"""

from __future__ import annotations

import argparse
import copy
import os
import shlex
import sys
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

STARTED = time.monotonic()
HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
for _p in (str(HERE), str(ROOT)):
    if _p not in sys.path:
        sys.path.insert(0, _p)
os.environ.setdefault("HF_HUB_OFFLINE", "1")

EXIT_NO_CUDA = 3
PRECISIONS = ("fp32", "fp16-autocast", "bf16-autocast", "fp16", "bf16")
MODES = ("eager", "cudagraph", "compile", "compile-cudagraph")
#: seconds a group of each mode is assumed to take before one has been timed
PRIORS = {"eager": 8.0, "cudagraph": 8.0, "compile": 90.0, "compile-cudagraph": 15.0}
DRY_PRIORS = {"eager": 1.0, "cudagraph": 1.0, "compile": 3.0, "compile-cudagraph": 1.0}
NO_COMPILE = ("single-sdpa",)

Outputs = tuple[Any, Any]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=Path("gpu-results"), help="folder for results.json and results.md")
    p.add_argument("--dry-run", action="store_true", help="every code path at toy sizes on CPU (CI)")
    p.add_argument("--impl", choices=("auto", "project", "standalone"), default="auto",
                   help="project: transformers + toolchain.hydra.fuse; standalone: torch-only copies; auto: project "
                        "when it imports")
    p.add_argument("--budget-s", type=float, default=None, help="no group starts that would end later (default 420; "
                   "dry run 300)")
    p.add_argument("--shapes", default="minilm,bert-base")
    p.add_argument("--batches", default=None, help="default 1,8 (dry run 1,2)")
    p.add_argument("--sequence", type=int, default=None, help="default 128 (dry run 16)")
    p.add_argument("--precisions", default=",".join(PRECISIONS))
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--compile-precisions", default=None, help="default bf16,fp32 (dry run: bf16)")
    p.add_argument("--compile-backend", default=None, help="default inductor (dry run: eager)")
    p.add_argument("--rounds", type=int, default=None, help="default 50 (dry run 2)")
    p.add_argument("--warmup", type=int, default=None, help="default 5 (dry run 1)")
    p.add_argument("--members", type=int, default=3)
    p.add_argument("--kept", default="4,6", help="heads kept per member and layer, one Hydra each")
    p.add_argument("--lowerings", default="conv,matmul")
    args = p.parse_args(argv)
    dry = args.dry_run
    args.batches = [int(b) for b in (args.batches or ("1,2" if dry else "1,8")).split(",")]
    args.sequence = args.sequence or (16 if dry else 128)
    args.rounds = args.rounds or (2 if dry else 50)
    args.warmup = args.warmup if args.warmup is not None else (1 if dry else 5)
    args.budget_s = args.budget_s if args.budget_s is not None else (300.0 if dry else 420.0)
    args.compile_backend = args.compile_backend or ("eager" if dry else "inductor")
    args.shapes = args.shapes.split(",")
    args.precisions = [x for x in PRECISIONS if x in args.precisions.split(",")]
    args.modes = [x for x in MODES if x in args.modes.split(",")]
    cp = args.compile_precisions or ("bf16" if dry else "bf16,fp32")
    args.compile_precisions = [x for x in cp.split(",") if x in args.precisions]
    args.kept = tuple(int(k) for k in args.kept.split(","))
    args.lowerings = tuple(args.lowerings.split(","))
    return args


class Bench:
    """Builds the models once per shape, runs the groups under the time guard, keeps the results."""

    def __init__(self, args: argparse.Namespace, torch: Any, impl: str, impl_note: str) -> None:
        import gpu_models

        self.args, self.torch, self.gm = args, torch, gpu_models
        self.impl, self.impl_note = impl, impl_note
        self.cuda = not args.dry_run
        self.device = torch.device("cuda" if self.cuda else "cpu")
        self.shapes = {s: (gpu_models.TOY_SHAPES if args.dry_run else gpu_models.SHAPES)[s] for s in args.shapes}
        self.models: dict[tuple[str, str], dict[str, Any]] = {}
        self.compiled: dict[tuple[str, str], dict[str, Any]] = {}
        self.inputs: dict[tuple[str, int], tuple[Any, ...]] = {}
        self.refs: dict[tuple[str, int, str], Outputs] = {}
        self.groups: list[dict[str, Any]] = []
        self.took: dict[str, float] = {}
        self.priors = DRY_PRIORS if args.dry_run else PRIORS

    # ------------------------------------------------------------------------------ models
    def variants(self) -> list[str]:
        """Every variant name, in report order."""
        hydras = [f"hydra-k{k}-{low}" for k in self.args.kept for low in self.args.lowerings]
        return ["single", "single-sdpa", "deep-ensemble", *hydras]

    def models_for(self, shape: str, precision: str) -> dict[str, Any]:
        """The shape's models at ``precision`` (weights cast for ``fp16`` / ``bf16``), cached."""
        key = (shape, "fp32" if "autocast" in precision else precision)
        if key not in self.models:
            if key[1] == "fp32":
                self.models[key] = self.gm.build_models(
                    self.shapes[shape], impl=self.impl, members=self.args.members, kept=self.args.kept,
                    lowerings=self.args.lowerings, device=self.device)
            else:  # one deepcopy of the whole dict keeps the single model shared with ensemble member 0
                dtype = self.torch.float16 if precision == "fp16" else self.torch.bfloat16
                self.models[key] = {k: m.to(dtype) for k, m in copy.deepcopy(self.models_for(shape, "fp32")).items()}
        return self.models[key]

    def compiled_for(self, shape: str, precision: str) -> dict[str, Any]:
        """``torch.compile`` of every model (ensemble members compiled one by one), cached."""
        key = (shape, precision)
        if key not in self.compiled:
            if self.compiled:  # the previous shape's or precision's compiled code is done with
                self.compiled.clear()
                self.torch._dynamo.reset()
            memo: dict[int, Any] = {}

            def comp(module: Any) -> Any:
                if id(module) not in memo:
                    memo[id(module)] = self.torch.compile(module, backend=self.args.compile_backend, dynamic=False)
                return memo[id(module)]

            out = {}
            for name, model in self.models_for(shape, precision).items():
                if name in NO_COMPILE:
                    continue
                out[name] = (self.gm.Ensemble([comp(m) for m in model.members]) if name == "deep-ensemble"
                             else comp(model))
            self.compiled[key] = out
        return self.compiled[key]

    def inputs_for(self, shape: str, batch: int) -> tuple[Any, ...]:
        key = (shape, batch)
        if key not in self.inputs:
            self.inputs[key] = self.gm.make_inputs(self.shapes[shape], batch, self.args.sequence, self.device)
        return self.inputs[key]

    # ------------------------------------------------------------------------------ calls and clocks
    def context(self, precision: str) -> Callable[[], AbstractContextManager]:
        """A fresh autocast context (cache off, as CUDA-graph capture needs) or a null one."""
        if "autocast" not in precision:
            return nullcontext
        dtype = self.torch.float16 if precision.startswith("fp16") else self.torch.bfloat16
        return lambda: self.torch.autocast(self.device.type, dtype=dtype, cache_enabled=False)

    def call(self, model: Any, inputs: tuple[Any, ...], precision: str) -> Callable[[], Outputs]:
        ctx, torch = self.context(precision), self.torch

        def run() -> Outputs:
            with torch.no_grad(), ctx():
                return model(*inputs)

        return run

    def capture(self, fn: Callable[[], Outputs]) -> Callable[[], Outputs]:
        """Capture ``fn`` (static inputs already) in a CUDA graph; replaying returns the static outputs."""
        if not self.cuda:  # CPU dry run: no graphs; the call itself stands in for the replay
            return fn
        torch = self.torch
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                fn()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static = fn()

        def replay() -> Outputs:
            graph.replay()
            return static

        replay.graph = graph  # keep it alive with the function
        return replay

    def sync(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize()

    def timed(self, fn: Callable[[], Outputs]) -> float:
        """Seconds of one call: CUDA events on CUDA, ``perf_counter`` in the dry run."""
        if not self.cuda:
            start = time.perf_counter()
            fn()
            return time.perf_counter() - start
        torch = self.torch
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) * 1e-3

    # ------------------------------------------------------------------------------ groups
    def plan(self) -> list[dict[str, Any]]:
        """Every group, cheapest first; compile groups outside ``--compile-precisions`` are ``not-planned``."""
        a, out = self.args, []
        for shape in a.shapes:
            for batch in a.batches:
                for prec in a.precisions:
                    out += [{"shape": shape, "batch": batch, "precision": prec, "mode": m}
                            for m in ("eager", "cudagraph") if m in a.modes]
        for prec in a.compile_precisions:
            for shape in a.shapes:
                for batch in a.batches:
                    out += [{"shape": shape, "batch": batch, "precision": prec, "mode": m}
                            for m in ("compile", "compile-cudagraph") if m in a.modes]
        for shape in a.shapes:
            for batch in a.batches:
                for prec in a.precisions:
                    if prec not in a.compile_precisions:
                        out += [{"shape": shape, "batch": batch, "precision": prec, "mode": m, "status": "not-planned",
                                 "reason": "compile runs for --compile-precisions only (time budget)"}
                                for m in ("compile", "compile-cudagraph") if m in a.modes]
        for g in out:
            g.setdefault("status", "pending")
        return out

    def run_group(self, g: dict[str, Any]) -> None:
        """Measure one group in place (status, latency, ratios, parity, first-call times)."""
        shape, batch, prec, mode = g["shape"], g["batch"], g["precision"], g["mode"]
        inputs = self.inputs_for(shape, batch)
        models = self.compiled_for(shape, prec) if mode.startswith("compile") else self.models_for(shape, prec)
        fns = {n: self.call(m, inputs, prec) for n, m in models.items()}
        first: dict[str, float] = {}
        failed: dict[str, str] = {}
        for name in list(fns):  # first call (compiles), then capture when asked
            t0 = time.perf_counter()
            try:
                fns[name]()
                self.sync()
                if mode.endswith("cudagraph"):
                    fns[name] = self.capture(fns[name])
                    self.sync()
            except Exception as exc:  # one variant that cannot compile or be captured: measure the others
                failed[name] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}"
                del fns[name]
                print(f"FAIL  {_label(g)} {name}: {failed[name]}", flush=True)
                continue
            first[name] = time.perf_counter() - t0
        g["failed_variants"] = failed
        names = list(fns)
        if not names:
            raise RuntimeError(f"every variant failed: {failed}")
        for _ in range(self.args.warmup):
            for name in names:
                fns[name]()
        self.sync()
        samples: dict[str, list[float]] = {n: [] for n in names}
        for r in range(self.args.rounds):
            for i in range(len(names)):
                name = names[(r + i) % len(names)]
                samples[name].append(self.timed(fns[name]))
        outputs = {n: tuple(t.detach().clone() for t in fns[n]()) for n in names}
        self.sync()
        g["first_call_s"] = first
        g["latency"] = {n: self.report.summarize(s) for n, s in samples.items()}
        g["samples"] = samples
        ratios = {}
        pairs = [(h, den) for h in names if h.startswith("hydra") for den in ("single", "deep-ensemble")]
        for num, den in [*pairs, ("deep-ensemble", "single"), ("single-sdpa", "single")]:
            if num in samples and den in samples:
                ratios[f"{num}/{den}"] = self.report.ratio_stats(samples[num], samples[den])
        g["ratios"] = ratios
        if prec == "fp32" and mode == "eager":
            for n in names:
                self.refs[(shape, batch, n)] = outputs[n]
        g["parity"] = {n: self.report.parity(outputs[n], self.refs[(shape, batch, n)]) for n in names
                       if (shape, batch, n) in self.refs}
        g["status"] = "measured"

    def run(self, write: Callable[[], None]) -> None:
        """Run the plan under the time guard, calling ``write`` after every group."""
        import gpu_report

        self.report = gpu_report
        self.groups = self.plan()
        for g in self.groups:
            if g["status"] != "pending":
                continue
            mode = g["mode"]
            if mode == "compile-cudagraph" and not self._compiled_ok(g):
                g.update(status="skipped", reason="its compile group was not measured")
                continue
            estimate = 1.3 * self.took.get(mode, self.priors[mode])
            elapsed = time.monotonic() - STARTED
            if elapsed + estimate > self.args.budget_s:
                g.update(status="skipped", reason=f"time budget: {elapsed:.0f} s elapsed + ~{estimate:.0f} s "
                                                  f"estimated > {self.args.budget_s:.0f} s")
                print(f"skip  {_label(g)}: {g['reason']}", flush=True)
                continue
            t0 = time.monotonic()
            try:
                self.run_group(g)
            except Exception as exc:  # a failed capture or compile must not cost the rest of the run
                g.update(status="failed", reason=f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}")
                print(f"FAIL  {_label(g)}: {g['reason']}", flush=True)
            g["wall_s"] = time.monotonic() - t0
            self.took[mode] = max(self.took.get(mode, 0.0), g["wall_s"])
            if g["status"] == "measured":
                med = {n: f"{s['median'] * 1e3:.2f}" for n, s in g["latency"].items()}
                print(f"done  {_label(g)} in {g['wall_s']:.1f} s; ms: {med}", flush=True)
            write()

    def _compiled_ok(self, g: dict[str, Any]) -> bool:
        return any(o["mode"] == "compile" and o.get("status") == "measured" and
                   all(o[k] == g[k] for k in ("shape", "batch", "precision")) for o in self.groups)


def _label(g: dict[str, Any]) -> str:
    return f"{g['shape']} b{g['batch']} {g['precision']} {g['mode']}"


def rows(bench: Bench) -> list[dict[str, Any]]:
    """One row per group and variant (every kind x precision x mode x shape x batch)."""
    out = []
    for g in bench.groups:
        for v in bench.variants():
            row = {k: g[k] for k in ("shape", "batch", "precision", "mode")}
            row["variant"] = v
            if g.get("status") == "measured" and v in g.get("failed_variants", {}):
                row.update(status="failed", reason=g["failed_variants"][v])
            elif g.get("status") == "measured" and v not in g["latency"]:
                row.update(status="not-planned", reason="not compiled (see the plan)")
            elif g.get("status") != "measured":
                row.update(status=g["status"], reason=g.get("reason", ""))
            else:
                lat = g["latency"][v]
                row.update(status="measured", median_ms=lat["median"] * 1e3, p10_ms=lat["p10"] * 1e3,
                           p90_ms=lat["p90"] * 1e3, parity=g["parity"].get(v))
                for den in ("single", "deep-ensemble"):
                    r = g["ratios"].get(f"{v}/{den}")
                    if r:
                        row[f"ratio_vs_{den}"] = {k: r[k] for k in ("median", "p10", "p90", "ci95", "n")}
            out.append(row)
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        import torch
    except ImportError as exc:
        print(f"benchmarks/gpu/run.py needs PyTorch (with CUDA): {exc}", file=sys.stderr)
        return EXIT_NO_CUDA
    if not args.dry_run and not torch.cuda.is_available():
        print(f"benchmarks/gpu/run.py: no CUDA device (torch {torch.__version__}, torch.version.cuda="
              f"{torch.version.cuda}, CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r}); this benchmark "
              "measures on a GPU. Use --dry-run to exercise it on a CPU.", file=sys.stderr)
        return EXIT_NO_CUDA
    from gpu_models import project_available
    from gpu_report import markdown

    from toolchain.artifacts import atomic_write_json, atomic_write_text

    ok, why = project_available()
    if args.impl == "project" and not ok:
        print(f"--impl project needs transformers and toolchain.hydra: {why}", file=sys.stderr)
        return 2
    impl = "project" if args.impl == "project" or (args.impl == "auto" and ok) else "standalone"
    note = "" if impl == "project" else (f"project code unavailable: {why}" if not ok else "forced with --impl")
    torch.backends.cuda.matmul.allow_tf32 = False  # true FP32 for matmul ...
    torch.backends.cudnn.allow_tf32 = False  # ... and for the conv lowering (cuDNN defaults to TF32)
    dyn = torch._dynamo.config
    for name in ("recompile_limit", "cache_size_limit", "accumulated_recompile_limit", "accumulated_cache_size_limit"):
        if hasattr(dyn, name):
            setattr(dyn, name, max(getattr(dyn, name), 256))
    torch.manual_seed(0)
    if args.dry_run:  # toy tensors gain nothing from a second thread; on a busy 2-core CI box OpenMP stalls
        torch.set_num_threads(1)
    bench = Bench(args, torch, impl, note)
    args.out.mkdir(parents=True, exist_ok=True)
    device = (torch.cuda.get_device_name(0) if bench.cuda else "CPU (dry run)")
    command = "python benchmarks/gpu/run.py " + shlex.join(sys.argv[1:] if argv is None else argv)
    meta = {"device": device, "torch": torch.__version__, "cuda": torch.version.cuda, "impl": impl, "impl_note": note,
            "dry_run": args.dry_run, "members": args.members, "kept": list(args.kept), "sequence": args.sequence,
            "batches": args.batches, "rounds": args.rounds, "warmup": args.warmup, "budget_s": args.budget_s,
            "compile_backend": args.compile_backend, "compile_precisions": args.compile_precisions,
            "clock": "CUDA events" if bench.cuda else "perf_counter (CPU)", "variants": bench.variants(),
            "hydra_variants": [v for v in bench.variants() if v.startswith("hydra")], "command": command.strip(),
            "shapes": {k: vars(s) for k, s in bench.shapes.items()},
            "plan_notes": ["eager and cudagraph: every precision;",
                           f"compile and compile-cudagraph: {', '.join(args.compile_precisions) or 'none'} "
                           f"({args.compile_backend}), not single-sdpa;",
                           "groups run cheapest first under the time guard."]}

    def write() -> None:
        meta["elapsed_s"] = time.monotonic() - STARTED
        result = {"meta": meta, "groups": bench.groups, "rows": rows(bench)}
        atomic_write_json(args.out / "results.json", result)
        atomic_write_text(args.out / "results.md", markdown(result))

    print(f"GPU benchmark on {device}, torch {torch.__version__}, impl {impl}{' (' + note + ')' if note else ''}",
          flush=True)
    bench.run(write)
    write()
    measured = sum(g["status"] == "measured" for g in bench.groups)
    print(f"{measured} of {len(bench.groups)} groups measured in {time.monotonic() - STARTED:.0f} s; wrote "
          f"{args.out / 'results.json'} and {args.out / 'results.md'}", flush=True)
    return 0 if measured else 1


if __name__ == "__main__":
    raise SystemExit(main())
