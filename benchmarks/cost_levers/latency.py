"""Measured latency of the cost-lever rows (issue 45): each row's fused Hydra against the single model.

:func:`measure` is the reusable part (``benchmarks/cost_levers/run.py`` calls it on trained models):
it exports every model and the single model to ONNX as the pipeline's export stage does
(:func:`toolchain.verbs.export.export_module`: TorchScript exporter, opset 17, dynamic batch and
sequence, checked against PyTorch at other shapes), builds the engines of kinds that compile
(OpenVINO: :func:`toolchain.verbs.build.build_engines`, ``engines.json``, the precision its layers
really ran in read back), and times them with :func:`toolchain.bench.run_bench`: per engine kind and batch
size one interleaved run over every model (``A B C A B C ...``), the ratio to the single model per round.

:func:`main` builds the structure of every row of ``rows.py`` on the packaged all-MiniLM-L6-v2
(3-class head, random head weights: latency does not depend on which heads or neurons are kept):
member ``m`` keeps ``k = 12 - floor(ratio * 12)`` heads ``m k .. m k + k - 1`` (mod 12) in every
layer from the fork on (every head before it); sliced rows keep ``n = round(share * 1536)``
neurons per member and layer, the first ``round(core * 1536)`` shared, the rest a window starting
at ``core + m (n - core)`` (wrapping, so shares above a third overlap), ``mlp: grouped``; unsliced
rows ``mlp: average``; grouped LayerNorm, grouped-Conv lowering (the recipe's). The deep ensemble
(3 full models) is a reference row. Writes ``latency.{md,json,png}`` next to this file; graphs and
engines go to ``.cache/latency`` (git-ignored).

    python benchmarks/cost_levers/latency.py                       # every row, ~12 min on 2 cores
    python benchmarks/cost_levers/latency.py --rows averaged,fork-3 --rounds 1:10,8:4   # quick look
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np
import torch
from torch import nn

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
MODEL = "packaged:all-MiniLM-L6-v2"
MEMBERS = 3
TARGET = 1.3  #: issue 45's latency target (Hydra / single at batch 1)
#: (engine kind, precision) pairs :func:`measure` times by default
ENGINES: tuple[tuple[str, str], ...] = (("onnxrt-cpu", "fp32"), ("openvino-cpu", "bf16"))
FeedMaker = Callable[[int, int, int], dict[str, torch.Tensor]]
_CAPABILITY_FLAGS = ("avx512f", "avx512_bf16", "avx512_fp16", "avx512_vnni", "avx_vnni", "amx_tile", "amx_bf16",
                     "amx_int8", "amx_fp16")


# ------------------------------------------------------------------------------------ measure
def feed_maker(example: Mapping[str, torch.Tensor]) -> FeedMaker:
    """A ``make(batch, sequence, seed)`` from example inputs: integer ``[B, T]`` inputs get ids drawn from the
    example's value range (``attention_mask`` all ones), float inputs standard normal with the example's
    trailing dims (images: no sequence axis)."""
    spec = {k: (v.dtype, tuple(v.shape[1:]), int(v.min()), int(v.max())) if not v.is_floating_point()
            else (v.dtype, tuple(v.shape[1:]), 0, 0) for k, v in example.items()}

    def make(batch: int, sequence: int, seed: int) -> dict[str, torch.Tensor]:
        g = torch.Generator().manual_seed(seed)
        out = {}
        for name, (dtype, rest, lo, hi) in spec.items():
            if dtype.is_floating_point:
                out[name] = torch.randn(batch, *rest, generator=g).to(dtype)
            elif name == "attention_mask":
                out[name] = torch.ones(batch, sequence, dtype=dtype)
            else:
                out[name] = torch.randint(lo, hi + 1, (batch, sequence), generator=g).to(dtype)
        return out

    return make


def _digest(module: nn.Module, extra: str) -> str:
    """What decides a graph: the module's class, weights and the export code (re-export when one changes)."""
    h = hashlib.sha256(f"{type(module).__name__}|{extra}|{torch.__version__}".encode())
    for folder in ("toolchain/hydra", "toolchain/export", "toolchain/models"):
        for path in sorted((ROOT / folder).glob("*.py")):
            h.update(path.read_bytes())
    for key, value in module.state_dict().items():
        h.update(key.encode())
        h.update(value.detach().cpu().contiguous().numpy().tobytes())
    config = getattr(module, "config", None)
    h.update(repr(getattr(config, "to_dict", lambda: config)()).encode())
    return h.hexdigest()[:20]


def _export(name: str, module: nn.Module, make: FeedMaker, export: Path, seq: int) -> dict[str, Any]:
    """``export/<name>.onnx`` by the pipeline's export path (reused when its stamp matches); its graphs.json entry."""
    from toolchain.verbs.export import Range, export_module

    module.eval()
    probe = make(1, min(seq, 8), 0)
    names = [n for n in getattr(module, "input_names", ()) or list(probe) if n in probe]
    with torch.no_grad():
        outputs = list(module(**{n: probe[n] for n in names}).keys())
    kind = "hydra" if "member_logits" in outputs else "single"
    stamp_path = export / f"{name}.stamp.json"
    stamp = {"digest": _digest(module, f"{names}|{outputs}|{seq}"), "opset": 17}
    if stamp_path.is_file() and (export / f"{name}.onnx").is_file() and json.loads(stamp_path.read_text()) == stamp:
        facts = json.loads((export / f"{name}.facts.json").read_text())
    else:
        axes = {n: ({0: "batch", 1: "sequence"} if not probe[n].is_floating_point() and probe[n].dim() == 2
                    else {0: "batch"}) for n in names}
        facts = export_module(module, outputs, export / f"{name}.onnx", make_feed=make, names=names, axes=axes,
                              profile=None, opset=17, sequence=Range(min(8, seq), seq, max(seq, 128)))
        (export / f"{name}.facts.json").write_text(json.dumps(facts))
        stamp_path.write_text(json.dumps(stamp))
    return {"path": f"{name}.onnx", "precision": "fp32", "kind": kind, "inputs": facts["inputs"],
            "outputs": facts["outputs"], "summary": facts["summary"]}


def capabilities(machine: Mapping[str, Any]) -> dict[str, Any]:
    """The CPU's BF16/VNNI/AMX flags (from :func:`toolchain.bench.machine_info`'s flags) and OpenVINO's view."""
    from toolchain.bench.report import vector_isa

    flags = set(machine.get("cpu_flags") or [])
    out: dict[str, Any] = {"processor": machine.get("processor"), "cpu_id": machine.get("cpu_id"),
                           "vector_isa": vector_isa(sorted(flags)),
                           "flags": {f: f in flags for f in _CAPABILITY_FLAGS}}
    try:
        from toolchain.engines.openvino._deps import current_identity

        ident = current_identity()
        out["openvino"] = {"device": ident.device_name, "version": ident.openvino_version,
                           "capabilities": list(ident.capabilities)}
    except Exception as exc:
        out["openvino"] = {"error": str(exc)}
    return out


def measure(
    models: Mapping[str, nn.Module | Sequence[nn.Module]],
    single: nn.Module,
    feed: FeedMaker | Mapping[str, torch.Tensor],
    *,
    seq: int,
    batches: Sequence[int] = (1, 8),
    engines: Sequence[tuple[str, str]] = ENGINES,
    warmup: int = 3,
    rounds: int | Mapping[int, int] = 20,
    work: Path,
    threads: int = 2,
    progress: bool = True,
) -> dict[str, Any]:
    """Latency of every model against ``single`` on every engine, precision and batch size, interleaved.

    Args:
        models: name -> a module with dict outputs (a :class:`~toolchain.hydra.model.HydraModel`, a
            :class:`~toolchain.models.wrappers.SingleModel`) or a list of them run one after another (a deep
            ensemble: one graph and session each). Names are free text ("single" is reserved).
        single: the denominator (``SingleModel(adapter)``).
        feed: ``make(batch, sequence, seed) -> inputs`` or example inputs (see :func:`feed_maker`); the
            input names are the modules' ``input_names`` found in it. Timed feeds are the bench's own
            (:func:`toolchain.bench.make_feed`: real token ids, full attention mask).
        seq: tokens per sample timed (the recipe's ``model.max_length``).
        batches: batch sizes timed.
        engines: ``(kind, precision)`` pairs. Kinds that compile (``openvino-cpu``) build each FP32 graph at the
            precision, where this CPU runs it for real (else ``unavailable`` with the reason, never emulated);
            graph kinds (``onnxrt-cpu``) run FP32 graphs, or precision variants of them at a precision they
            run natively (not BF16: ONNX Runtime's CPU BF16 is an emulator).
        warmup: untimed passes per batch size.
        rounds: interleaved rounds, or batch size -> rounds.
        work: folder for the graphs (``export/``, reused when a model's weights and the export code are
            unchanged) and engines (``build/``).
        threads: intra-op threads of every session.
        progress: a bar over rounds.

    Each engine kind is timed in its own interleaved run (every model of that kind per round): an OpenVINO
    model timed right after an ONNX Runtime session ran up to 2x faster here than after another OpenVINO
    model, so mixing kinds in one round skews the ratios.

    Returns:
        ``{"settings", "machine" (bench's machine_info), "capabilities" (BF16/VNNI/AMX flags, OpenVINO's
        capabilities), "engines": {"<kind>:<precision>": {"status": "ok" | "unavailable" | "skipped",
        "reason", "ran_precision": {model: precision read back}}}, "models": {name: {"<kind>:<precision>":
        {"<batch>": {"median_ms", "p25_ms", "p75_ms", "ratio": {"median", "p25", "p75", "p10", "p90", "min",
        "max", "per_round"}}}}}, "single": {... the same without "ratio"}, "bench" (run_bench's settings,
        duration, engines)}``. A ratio is the median over rounds of this model's time / the single model's
        time in the same round.
    """
    from toolchain.bench import run_bench
    from toolchain.engines import engine_kind
    from toolchain.export.precision import write_precision_variant
    from toolchain.verbs.build import build_engines

    if not models or "single" in models:
        raise ValueError(f"measure: models must be non-empty and not use the name 'single' (the denominator's); "
                         f"got {list(models)}")
    make = feed if callable(feed) else feed_maker(feed)
    work = Path(work)
    export, build = work / "export", work / "build"
    export.mkdir(parents=True, exist_ok=True)
    build.mkdir(parents=True, exist_ok=True)
    ids = {name: f"m{i}" for i, name in enumerate(models)}  # file-safe graph names (row names hold dots)
    graphs: dict[str, dict[str, Any]] = {"single": _export("single", single, make, export, seq)}
    fp32_plan: dict[str, list[str]] = {"single": ["single"]}
    for name, gid in ids.items():
        parts = models[name]
        if isinstance(parts, nn.Module):
            graphs[gid] = _export(gid, parts, make, export, seq)
            fp32_plan[gid] = [gid]
        else:
            fp32_plan[gid] = []
            for j, part in enumerate(parts):
                graphs[f"{gid}-{j}"] = _export(f"{gid}-{j}", part, make, export, seq)
                fp32_plan[gid].append(f"{gid}-{j}")

    engines_out: dict[str, dict[str, Any]] = {}
    plans: dict[str, dict[str, list[str]]] = {}
    pairs: list[tuple[str, str]] = []
    compiled: dict[str, list[str]] = {}
    for kind, precision in engines:
        key, spec = f"{kind}:{precision}", engine_kind(kind)
        sfx = "" if precision == "fp32" else f".{precision}"
        if spec.needs_build:
            reason = spec.unavailable(precision) if spec.available is not None else None
            if reason is None:
                compiled.setdefault(kind, []).append(precision)
        elif precision == "fp32":
            reason = None
        elif precision in spec.precisions:
            reason = None
            for g in [g for gl in fp32_plan.values() for g in gl]:
                dst = export / f"{g}{sfx}.onnx"
                if not dst.is_file() or dst.stat().st_mtime < (export / f"{g}.onnx").stat().st_mtime:
                    write_precision_variant(export / f"{g}.onnx", dst, precision)
                graphs[f"{g}{sfx}"] = {**graphs[g], "path": dst.name, "precision": precision}
        else:
            reason = spec.unsupported.get(precision) or (
                f"{kind} has no {precision} kernels (its {spec.substitutes[precision]} substitute emulates them: "
                "not measured)" if precision in spec.substitutes else f"{kind} does not run {precision}")
        if reason is not None:
            engines_out[key] = {"status": "unavailable", "reason": reason}
            continue
        engines_out[key] = {"status": "ok"}
        plan = plans.setdefault(kind, {})
        for v, gl in fp32_plan.items():
            plan[f"{v}{sfx}"] = [f"{g}{sfx}" for g in gl]
            if v != "single":
                pairs.append((f"{v}{sfx}", f"single{sfx}"))
    if compiled:
        fp32_graphs = {n: g for n, g in graphs.items() if g["precision"] == "fp32"}
        hi = max(max(batches), 32)

        def profile(names: Sequence[str]) -> dict[str, tuple]:
            probe = make(1, seq, 0)
            return {n: tuple((b, *((s,) if probe[n].dim() == 2 and not probe[n].is_floating_point() else
                                   tuple(probe[n].shape[1:])))
                             for b, s in ((1, min(8, seq)), (max(batches), seq), (hi, max(seq, 128)))) for n in names}

        records = build_engines(list(compiled), fp32_graphs, export, build, precisions=sorted(
            {p for ps in compiled.values() for p in ps}), profile=profile)
        (build / "engines.json").write_text(json.dumps(records, indent=1))
        for kind, precisions in compiled.items():
            built = records.get(kind, {})
            for precision in precisions:
                key, sfx = f"{kind}:{precision}", "" if precision == "fp32" else f".{precision}"
                if "skipped" in built:
                    engines_out[key] = {"status": "skipped", "reason": built["skipped"]}
                    continue
                mine = {n: e for n, e in built.get("engines", {}).items() if e.get("precision") == precision}
                graphs.update({n: {**graphs[e["graph"]], "precision": precision} for n, e in mine.items()})
                ran = {n.removesuffix(sfx): e.get("ran_precision") for n, e in mine.items()}
                engines_out[key]["ran_precision"] = _rename(ran, ids)
                lower = {m: r for m, r in engines_out[key]["ran_precision"].items() if r != precision}
                if lower:
                    engines_out[key]["note"] = f"asked {precision}, ran {lower}"
        for kind in list(plans):
            if kind in compiled and "skipped" in records.get(kind, {}):
                del plans[kind]
    if not plans:
        raise RuntimeError(f"measure: no engine of {list(engines)} runs here: {engines_out}")
    # one interleaved run per engine kind: measured here, an OpenVINO model timed right after an ONNX Runtime
    # session ran up to 2x faster than after another OpenVINO model, which skews ratios across kinds
    runs = {kind: run_bench(export, graphs=graphs, plans={kind: plan}, pairs=pairs, cross_pairs=[], engines=[kind],
                            precisions=sorted({p for k, p in engines if k == kind}), batch_sizes=list(batches),
                            sequence_length=seq, threads=threads, warmup=warmup, rounds=rounds, engines_dir=build,
                            out_dir=None, progress=progress, hydra_dir=work / ".no-cost-model")
            for kind, plan in plans.items()}
    first, last = next(iter(runs.values())), list(runs.values())[-1]
    result = {**first, "cases": [c for r in runs.values() for c in r["cases"]],
              "engines": {k: v for r in runs.values() for k, v in r["engines"].items()},
              "duration_s": sum(r["duration_s"] for r in runs.values()),
              "machine": {**first["machine"], "loadavg_end": last["machine"].get("loadavg_end")}}
    out_models: dict[str, dict[str, Any]] = {name: {} for name in models}
    out_single: dict[str, Any] = {}
    for case in result["cases"]:
        kind, batch = case["engine"], str(case["batch"])
        for precision in [p for k, p in engines if k == kind and engines_out[f"{k}:{p}"]["status"] == "ok"]:
            key, sfx = f"{kind}:{precision}", "" if precision == "fp32" else f".{precision}"
            out_single.setdefault(key, {})[batch] = _latency(case["variants"][f"single{sfx}"])
            for name, gid in ids.items():
                cell = _latency(case["variants"][f"{gid}{sfx}"])
                r = case["ratios"][f"{gid}{sfx}/single{sfx}"]
                cell["ratio"] = {k: r[k] for k in ("median", "p25", "p75", "p10", "p90", "min", "max", "per_round")}
                out_models[name].setdefault(key, {})[batch] = cell
    for key, info in result.get("engines", {}).items():
        for p in [p for k, p in engines if k == key]:
            if info.get("status") != "ok":
                engines_out[f"{key}:{p}"] = {"status": info.get("status"), "reason": info.get("reason")}
    return {"settings": {"seq": seq, "batches": list(batches), "engines": [list(e) for e in engines],
                         "warmup": warmup, "rounds": result["settings"]["rounds"], "threads": threads,
                         "work": str(work), "graph_of": ids},
            "machine": result["machine"], "capabilities": capabilities(result["machine"]), "engines": engines_out,
            "models": out_models, "single": out_single,
            "bench": {k: result[k] for k in ("created", "duration_s", "settings", "engines")}}


def _latency(stats: Mapping[str, Any]) -> dict[str, Any]:
    return {"median_ms": 1e3 * stats["median"], "p25_ms": 1e3 * stats["p25"], "p75_ms": 1e3 * stats["p75"],
            "min_ms": 1e3 * stats["min"], "max_ms": 1e3 * stats["max"], "n": stats["n"]}


def _rename(by_graph: Mapping[str, Any], ids: Mapping[str, str]) -> dict[str, Any]:
    """Graph-id keys (``m3``, ``m3-1``) back to model names (``deep-ensemble``, ``deep-ensemble[1]``)."""
    back, out = {gid: name for name, gid in ids.items()}, {}
    for g, value in by_graph.items():
        base, _, part = g.partition("-")
        out[back.get(base, g) + (f"[{part}]" if part else "")] = value
    return out


# ------------------------------------------------------------------------------------ rows
def row_structure(overrides: Mapping[str, Any], *, members: int = MEMBERS, layers: int = 6, heads: int = 12,
                  width: int = 1536) -> dict[str, Any]:
    """A row's structure-only levers: ``fork``, ``mlp``, ``keep_masks [M, L, H]``, ``neurons [M][L]`` (or None).

    Defaults: ``pruning.ratio`` 0.5 (the recipe's), no fork, ``fusion.mlp`` average unless sliced. Heads per
    member in a forked layer: ``heads - floor(ratio * heads)`` (the plan's rounding), member ``m`` the window
    starting at ``m * k`` (mod ``heads``); neurons: ``max(1, round(share * width))`` (``split_neurons``'s
    count), the first ``round(core * width)`` shared, the rest a window starting at ``core + m * (n - core)``,
    wrapping inside ``[core, width)``.
    """
    pruning = dict(overrides.get("pruning") or {})
    fusion = dict(overrides.get("fusion") or {})
    fork, ratio = int(pruning.get("fork", 0)), float(pruning.get("ratio", 0.5))
    share, core = pruning.get("mlp_share"), float(pruning.get("mlp_core", 0.0))
    mlp = fusion.get("mlp", "grouped" if share is not None else "average")
    if share is not None and mlp != "grouped":
        raise ValueError(f"fusion.mlp must be 'grouped' for pruning.mlp_share={share}; got {mlp!r}")
    if not 0 <= fork < layers:
        raise ValueError(f"pruning.fork must be in [0, {layers - 1}]; got {fork}")
    keep = heads - math.floor(ratio * heads + 1e-9)
    if not 1 <= keep <= heads:
        raise ValueError(f"pruning.ratio={ratio} leaves {keep} of {heads} heads; keep at least one")
    masks = torch.zeros(members, layers, heads, dtype=torch.bool)
    masks[:, :fork] = True
    for m in range(members):
        for j in range(keep):
            masks[m, fork:, (m * keep + j) % heads] = True
    neurons = None
    if share is not None:
        n = max(1, round(float(share) * width))
        c = min(round(core * width), n)
        pool, r = width - c, n - c
        neurons = [[list(range(width)) if idx < fork else
                    sorted(list(range(c)) + [c + (m * r + j) % pool for j in range(r)]) for idx in range(layers)]
                   for m in range(members)]
    return {"fork": fork, "mlp": mlp, "heads_per_member": keep, "keep_masks": masks, "neurons": neurons,
            "neurons_per_member": None if neurons is None else len(neurons[0][-1])}


def build_row(adapter: Any, overrides: Mapping[str, Any], members: int = MEMBERS) -> nn.Module:
    """The fused Hydra of one row on ``adapter`` (grouped LayerNorm, grouped-Conv lowering: the recipe's)."""
    from toolchain.hydra.fuse import fuse

    views = adapter.layers()
    s = row_structure(overrides, members=members, layers=len(views), heads=views[0].num_heads,
                      width=views[0].fc1.out_features)
    return fuse(adapter, s["keep_masks"], mlp=s["mlp"], layernorm="grouped", lowering="conv", fork=s["fork"],
                neurons=s["neurons"])


# ------------------------------------------------------------------------------------ main
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", default=None, help="comma-separated row names of rows.py (default: all)")
    p.add_argument("--rounds", default="1:80,8:24",
                   help="interleaved rounds: one count, or batch:rounds pairs (default 1:80,8:24)")
    p.add_argument("--seq", type=int, default=64, help="tokens per sample (the default recipe's max_length)")
    p.add_argument("--batches", default="1,8")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--no-deep-ensemble", action="store_true", help="leave out the deep-ensemble reference row")
    p.add_argument("--work", type=Path, default=HERE / ".cache" / "latency")
    p.add_argument("--out", type=Path, default=HERE)
    p.add_argument("--no-progress", action="store_true")
    return p.parse_args(argv)


def _rows() -> dict[str, dict]:
    sys.path.insert(0, str(HERE))
    try:
        from rows import ROWS
    finally:
        sys.path.remove(str(HERE))
    return ROWS


def analytic(model: nn.Module, feed: Mapping[str, torch.Tensor], seq: int) -> dict[str, Any]:
    """:func:`toolchain.hydra.cost.compare_of` at batch 1: FLOPs and params ratios to the single model."""
    from toolchain.hydra.cost import compare_of

    c = compare_of(model, batch=1, seq=seq, example_inputs=dict(feed))
    return {"flops": c["ratios_vs_single"]["hydra"]["flops"],
            "params": c["hydra"]["params"] / c["single"]["params"],
            "deep_ensemble_flops": c["ratios_vs_single"]["deep_ensemble"]["flops"],
            "deep_ensemble_params": c["deep_ensemble"]["params"] / c["single"]["params"]}


def _cell(cell: Mapping[str, Any] | None) -> str:
    if cell is None:
        return "-"
    r = cell["ratio"]
    return f"{r['median']:.2f} [{r['p25']:.2f}, {r['p75']:.2f}]"


def markdown(out: Mapping[str, Any]) -> str:
    """The report: command, machine, the table and the rows at or under the target on every engine at batch 1."""
    from toolchain.bench.report import machine_line

    m = out["measure"]
    keys = [f"{k}:{p}" for k, p in m["settings"]["engines"] if m["engines"][f"{k}:{p}"]["status"] == "ok"]
    batches = [str(b) for b in m["settings"]["batches"]]
    caps = m["capabilities"]
    lines = ["# Cost levers: measured latency of each row / the single model (issue 45)", "",
             f"Command: `{out['command']}` ({out['duration_s'] / 60:.1f} min)", "",
             f"Machine: {machine_line(m['machine'])}", "",
             "CPU capabilities: " + ", ".join(f"{f} {'yes' if v else 'no'}" for f, v in caps["flags"].items())
             + f"; OpenVINO {caps.get('openvino', {}).get('capabilities', caps.get('openvino'))}", ""]
    for key, info in m["engines"].items():
        if info["status"] != "ok":
            lines.append(f"- {key}: **{info['status']}**: {info.get('reason')}")
        elif "ran_precision" in info:
            ran = sorted(set(info["ran_precision"].values()), key=str)
            lines.append(f"- {key}: OpenVINO read back: every compiled model ran in {', '.join(map(str, ran))}"
                         + (f" ({info['note']})" if info.get("note") else ""))
    lines += ["", f"all-MiniLM-L6-v2 (3 classes), M = {MEMBERS}, sequence {m['settings']['seq']}, "
              f"{m['settings']['threads']} threads, rounds per batch {m['settings']['rounds']} (warm-up "
              f"{m['settings']['warmup']}), every model interleaved in one run per engine and batch size. "
              "Cells: median over rounds of (row's time / single model's time in the same round) [quartiles]. "
              "Structure only (random classifier heads; which heads/neurons are kept does not change latency): "
              "heads per member uniform over the forked layers (a real global-scope plan may keep uneven counts; "
              "the fused model pads each layer to its widest member).", ""]
    head = "| row | fork | heads/member | MLP neurons/member | FLOPs ratio | params ratio | " + " | ".join(
        f"{k} b{b}" for k in keys for b in batches) + " |"
    lines += [head, "|" + "---|" * 6 + "---:|" * (len(keys) * len(batches))]
    single = m["single"]
    lines.append("| single (ms) | | 12 | 1536 | 1 | 1 | " + " | ".join(
        f"{single[k][b]['median_ms']:.2f} ms" for k in keys for b in batches) + " |")
    for name, row in out["rows"].items():
        cells = [_cell(m["models"][name].get(k, {}).get(b)) for k in keys for b in batches]
        lines.append(f"| {name} | {row.get('fork', '-')} | {row.get('heads_per_member', '-')} | "
                     f"{row.get('neurons_per_member') or 'all'} | {row['flops']:.2f} | {row['params']:.2f} | "
                     + " | ".join(cells) + " |")
    met = out["meets_target"]
    lines += ["", f"**Rows at or under {TARGET}x on every engine at batch 1** (median per-round ratio): "
              + (", ".join(met) if met else "none"), ""]
    spread, busy, mach = out["largest_spread"], out["busy"], m["machine"]
    lines.append(f"Load average at start {mach.get('loadavg_start')}, at end {mach.get('loadavg_end')}; largest "
                 f"interquartile range of a batch-1 ratio {spread['iqr']:.3f} ({spread['where']}). "
                 + ("The machine was busy with other jobs during the run (load average >= 0.5 on "
                    f"{m['machine'].get('usable_cores')} cores): read the per-round ratios, not the milliseconds."
                    if busy else "The machine was otherwise idle."))
    work = Path(m["settings"]["work"])
    shown = work.relative_to(ROOT) if work.is_relative_to(ROOT) else work
    lines.append(f"\nGraphs and engines in `{shown}` (git-ignored); `latency.json` has every per-round ratio and "
                 "OpenVINO's precision per compiled model.")
    return "\n".join(lines) + "\n"


def plot(out: Mapping[str, Any], path: Path) -> None:
    """FLOPs ratio (x) against the measured batch-1 latency ratio (y) per engine, with y = x and the target."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    m = out["measure"]
    keys = [f"{k}:{p}" for k, p in m["settings"]["engines"] if m["engines"][f"{k}:{p}"]["status"] == "ok"]
    fig, ax = plt.subplots(figsize=(8, 6))
    top = 1.0
    for key, marker in zip(keys, "os^D"):
        xs, ys, names = [], [], []
        for name, row in out["rows"].items():
            cell = m["models"][name].get(key, {}).get("1")
            if cell is not None:
                xs.append(row["flops"])
                ys.append(cell["ratio"]["median"])
                names.append(name)
        ax.scatter(xs, ys, marker=marker, label=key)
        for x, y, n in zip(xs, ys, names):
            ax.annotate(n, (x, y), fontsize=6, xytext=(3, 2), textcoords="offset points")
        top = max([top, *xs, *ys])
    ax.plot([0.8, top * 1.05], [0.8, top * 1.05], "k--", lw=0.8, label="y = x")
    ax.axhline(TARGET, color="r", lw=0.8, label=f"{TARGET}x target")
    ax.set_xlabel("analytic FLOPs ratio to the single model (cost.compare_of)")
    ax.set_ylabel("measured latency ratio to the single model, batch 1 (median per round)")
    ax.set_title(f"Cost levers: all-MiniLM-L6-v2, M = {MEMBERS}, sequence {m['settings']['seq']}")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)


def summarise(rows: Mapping[str, dict[str, Any]], measured: Mapping[str, Any]) -> dict[str, Any]:
    """Rows meeting the target on every engine at batch 1, the widest batch-1 IQR, and whether the machine was busy."""
    keys = [f"{k}:{p}" for k, p in measured["settings"]["engines"] if measured["engines"][f"{k}:{p}"]["status"] == "ok"]
    met = [n for n in rows if n != "deep-ensemble" and keys and all(
        measured["models"][n][k]["1"]["ratio"]["median"] <= TARGET for k in keys if "1" in measured["models"][n][k])]
    iqr = max(((c["ratio"]["p75"] - c["ratio"]["p25"], f"{n} {k} b{b}") for n, by in measured["models"].items()
               for k, bb in by.items() for b, c in bb.items() if b == "1"), default=(0.0, "-"))
    loads = [x for x in (measured["machine"].get("loadavg_start") or [])[:1] + (
        measured["machine"].get("loadavg_end") or [])[:1]]
    return {"meets_target": met, "largest_spread": {"iqr": iqr[0], "where": iqr[1]},
            "busy": bool(loads and max(loads) >= 0.5)}


def main(argv: list[str] | None = None) -> int:
    from toolchain.artifacts import atomic_write_json, atomic_write_text
    from toolchain.models import load_model
    from toolchain.models.loading import resolve_source
    from toolchain.models.wrappers import SingleModel

    args = parse_args(argv)
    started = time.time()
    command = ("python benchmarks/cost_levers/latency.py " + " ".join(sys.argv[1:] if argv is None else argv)).strip()
    torch.set_num_threads(args.threads)
    all_rows = _rows()
    names = list(all_rows) if args.rows is None else [r.strip() for r in args.rows.split(",") if r.strip()]
    unknown = [n for n in names if n not in all_rows]
    if unknown:
        raise SystemExit(f"--rows: unknown row(s) {unknown}; rows.py has {list(all_rows)}")
    spec = args.rounds
    rounds: int | dict[int, int] = ({int(b): int(n) for b, n in (p.split(":") for p in spec.split(","))}
                                    if ":" in spec else int(spec))
    source = resolve_source(MODEL)
    base = load_model(source, num_labels=3, seed=0, tokenizer=False).adapter
    feed = feed_maker({k: torch.from_numpy(v) for k, v in _bench_feed(base.input_names, args.seq).items()})
    example = feed(1, args.seq, 0)
    models: dict[str, Any] = {}
    rows: dict[str, dict[str, Any]] = {}
    for name in names:
        overrides = all_rows[name]
        hydra = build_row(base, overrides)
        s = row_structure(overrides)
        models[name] = hydra
        rows[name] = {"overrides": overrides, "fork": s["fork"], "mlp": s["mlp"],
                      "heads_per_member": s["heads_per_member"], "neurons_per_member": s["neurons_per_member"],
                      **analytic(hydra, example, args.seq)}
        print(f"{name}: FLOPs {rows[name]['flops']:.2f}x, params {rows[name]['params']:.2f}x")
    if not args.no_deep_ensemble:
        others = [load_model(source, num_labels=3, seed=1000 * i, tokenizer=False).adapter for i in range(1, MEMBERS)]
        models["deep-ensemble"] = [SingleModel(a) for a in [base, *others]]
        ref = rows[names[0]] if names else analytic(build_row(base, {}), example, args.seq)
        rows["deep-ensemble"] = {"fork": "-", "mlp": "-", "heads_per_member": 12, "neurons_per_member": 1536,
                                 "flops": ref["deep_ensemble_flops"], "params": ref["deep_ensemble_params"]}
    measured = measure(models, SingleModel(base), feed, seq=args.seq,
                       batches=[int(b) for b in args.batches.split(",")], warmup=args.warmup, rounds=rounds,
                       work=args.work, threads=args.threads, progress=not args.no_progress)
    out = {"schema": "hydra-toolchain.cost-levers-latency/1", "command": command, "rows": rows, "measure": measured,
           **summarise(rows, measured), "duration_s": round(time.time() - started, 1)}
    args.out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(args.out / "latency.json", _jsonable(out))
    md = markdown(out)
    atomic_write_text(args.out / "latency.md", md)
    plot(out, args.out / "latency.png")
    print(md)
    return 0


def _bench_feed(input_names: Sequence[str], seq: int) -> dict[str, np.ndarray]:
    """The bench's generated text feed (real token ids, full mask) for the export's example inputs."""
    from toolchain.bench import make_feed

    spec = [{"name": n, "dtype": "int64", "dims": ["batch", "sequence"]} for n in input_names]
    return make_feed(spec, 2, seq)


def _jsonable(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.tolist()
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    return value


if __name__ == "__main__":
    raise SystemExit(main())
