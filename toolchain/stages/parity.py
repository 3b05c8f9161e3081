"""Stage ``parity``: numeric and UQ-metric parity of every engine vs the PyTorch reference; ``--rescue``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from toolchain.artifacts import atomic_write_json, read_json
from toolchain.errors import RecipeError
from toolchain.pipeline import Context, stage
from toolchain.stages.common import baseline_models, example_feed, runner_input_specs, split_feeds


def exported_temperatures(ctx: Context) -> dict[str, Any] | None:
    """The temperatures the export stage folded into the baselines' graphs (``export/temperatures.json``)."""
    path = ctx.stage_dir("export") / "temperatures.json"
    return read_json(path) if path.is_file() else None


def parity_inputs(ctx: Context, names: list[str], tok: Any) -> tuple[list, list, list]:
    """Generated feeds at several shapes, the ID test split with labels, the OOD test split.

    Test rows come in token-length order, in batches no larger than the export profile's maximum
    (an engine built for the profile, OpenVINO's or TensorRT's, takes no larger batch).
    """
    e = ctx.recipe.export
    shapes = [(e.batch.min, e.sequence.min), (min(e.batch.opt, 8), min(e.sequence.opt, 64)),
              (2, min(e.sequence.max, 96))]
    generated = [{k: v.numpy() for k, v in example_feed(ctx, b, s, seed=11 + i).items() if k in names}
                 for i, (b, s) in enumerate(shapes)]
    size = min(64, e.batch.max)
    ident = split_feeds(ctx, "test", names, tok, size)
    ood = [f for f, _ in split_feeds(ctx, "ood_test", names, tok, size)] if "ood_test" in ctx.data else []
    return generated, ident, ood


def _input_specs(ctx: Context, names: list[str]) -> dict[str, tuple]:
    return runner_input_specs(ctx, names)


def _group_of(name: str) -> str:
    """The parity group of a graph or engine name: ``hydra``, ``single`` or ``member<i>`` (precision suffix dropped)."""
    base = name.split(".")[0]
    return "hydra" if base.startswith("hydra-") else base


@stage("parity", sections=("model", "data", "finetune", "scoring", "pruning", "fusion", "export", "engines",
                           "parity"),
       upstream=("build",), summary="numerical and UQ-metric parity of every engine vs the PyTorch reference",
       version=7)  # 3: ECE parity on the reference's bins; 4: FP16/BF16 rule q0.999 and max <= 4; 5: q0.99 per feed;
#                   6: engines built per kind (OpenVINO), judged at the precision they ran; deep-ensemble members;
#                   7: weight parity (every graph weight vs the reference's parameters)
def parity_stage(ctx: Context, work: Path) -> dict[str, Any]:
    """Verdicts for the Hydra engines (vs the fused PyTorch model), the single model's and each member's.

    BF16 graphs run as ``onnxrt-cpu-bf16emu`` (ONNX Runtime's CPU provider has no BF16 MatMul/Conv
    kernels; :mod:`toolchain.engines.onnxrt.bf16emu` runs FP32 kernels with every BF16 result
    rounded to BF16) on the same feeds as the others; engines the build stage compiled (OpenVINO's
    real BF16 on this CPU, TensorRT) are judged at the precision they report they ran. The
    deep-ensemble members (``member<i>``) are groups of their own, each against its PyTorch model.
    Every engine whose ONNX graph is known also gets a ``weights`` check: each graph weight against
    the reference's parameter at the graph's own rounding (:mod:`toolchain.parity.weights`; a stale
    graph fails it even where BF16 rounding hides it at the outputs).
    A precision this machine cannot run is listed under ``skipped``, not failed. With
    ``parity.deep_ensemble: false`` the members are not gated (``not_gated`` in ``verdict.json``).
    """
    from toolchain.engines import make_runner, ran_lower, reference_kind
    from toolchain.hydra.fuse import load_hydra
    from toolchain.models.wrappers import SingleModel
    from toolchain.parity import run_parity

    graphs = read_json(ctx.stage_dir("export") / "graphs.json")
    # the PyTorch references as exported: the export's own temperatures folded (no refit: the weights check is exact)
    base, de_members, tok, _t = baseline_models(ctx, exported_temperatures(ctx))
    names = list(graphs["single"]["inputs"])
    generated, ident, ood = parity_inputs(ctx, names, tok)
    groups: dict[str, Any] = {
        "hydra": (lambda: load_hydra(ctx.stage_dir("fuse") / "hydra"), ["probs", "member_logits"]),
        "single": (lambda: SingleModel(base), ["logits", "probs"])}
    members = sorted({_group_of(n) for n, g in graphs.items() if g.get("kind") == "member"})
    not_gated = {} if ctx.recipe.parity.deep_ensemble else {
        g: "parity.deep_ensemble is false: the deep-ensemble member's engines are not gated" for g in members}
    for gname in (g for g in members if g not in not_gated):
        groups[gname] = (lambda g=gname: SingleModel(de_members[int(g.removeprefix("member"))]),
                         ["logits", "probs"])
    results: dict[str, Any] = {}
    skipped: dict[str, str] = {}
    for group, (module, outputs) in groups.items():
        candidates, precisions, sources = _candidates(ctx, group, graphs, skipped)
        if not candidates:
            continue
        reference = make_runner(reference_kind(), module=module(), input_specs=_input_specs(ctx, names),
                                output_names=outputs, name=f"torch-{group}")
        verdict = run_parity(reference, candidates, generated, ident, ood, out_dir=work / group,
                             precisions=precisions, graphs=sources, **parity_tolerances(ctx))
        results[group] = {"exit_code": verdict.exit_code, "status": verdict.status, "problems": verdict.problems(),
                          "failing_engines": sorted({c.engine for c in verdict.failures}),
                          "rescuable_engines": verdict.rescuable_engines(),
                          "unresolved": verdict.notes(), "precisions": verdict.meta["precisions"]}
        ctx.console.print(f"  {group}: {verdict.status} ({len(candidates)} engines)")
        for engine, info in verdict.meta.get("engines", {}).items():
            asked, ran = info.get("precision_asked"), info.get("ran_precision")
            if asked not in (None, ran) and not ran_lower(asked, ran):  # lower: a failed check, listed below
                ctx.console.print(f"    [yellow]![/yellow] {engine}: asked for {asked}, ran {ran} (judged at {ran})")
        for p in verdict.problems():
            ctx.console.print(f"    [red]x[/red] {p}")
        for note in verdict.notes():
            ctx.console.print(f"    [yellow]?[/yellow] {note}")
    for label, reason in skipped.items():
        ctx.console.print(f"  skipped {label}: {reason}")
    if not_gated:
        ctx.console.print(f"  not gated (parity.deep_ensemble: false): {', '.join(not_gated)}")
    summary = {"groups": results, "skipped": skipped, "not_gated": not_gated,
               "exit_code": max([r["exit_code"] for r in results.values()] or [0])}
    atomic_write_json(work / "verdict.json", summary)
    md = ["| group | status | exit code |", "|---|---|---|"]
    md += [f"| {g} | {r['status']} | {r['exit_code']} |" for g, r in results.items()]
    md += ["", *[f"- skipped `{k}`: {v}" for k, v in skipped.items()],
           *[f"- not gated `{k}`: {v}" for k, v in not_gated.items()]]
    md += ["", *[(work / g / "summary.md").read_text() for g in results if (work / g / "summary.md").exists()]]
    (work / "summary.md").write_text("\n".join(md) + "\n")
    return {"exit_code": summary["exit_code"]}


def _candidates(ctx: Context, group: str, graphs: dict[str, Any],
                skipped: dict[str, str]) -> tuple[dict[str, Any], dict[str, str], dict[str, Path | None]]:
    """Label -> runner, label -> precision and label -> ONNX graph of every recipe engine on the group's graphs.

    The graph is the export's file the engine runs or was built from (its weights are checked
    against the reference: :mod:`toolchain.parity.weights`); None when the entry names none.

    Graphs the export wrote come first (graph by graph, kinds in registry order), then the files
    of kinds the build stage builds (OpenVINO's compiled models, TensorRT engines). A precision a
    kind cannot run goes to its substitute (BF16 on ``onnxrt-cpu``: ``onnxrt-cpu-bf16emu``) or is
    recorded in ``skipped``, as is an engine the build stage could not build here.
    """
    from toolchain.engines import (
        candidate_label,
        engine_kinds,
        entries_for,
        read_unavailable,
        resolve_kind,
        runner_for,
    )
    from toolchain.errors import MissingDependencyError

    chosen = [s for s in engine_kinds(selectable=True) if s.name in ctx.recipe.engines and s.runs_files]
    places = {"export_dir": ctx.stage_dir("export"), "build_dir": ctx.stage_dir("build"),
              "threads": ctx.recipe.bench.threads}
    candidates: dict[str, Any] = {}
    precisions: dict[str, str] = {}
    sources: dict[str, Path | None] = {}

    def add(kind: str, gname: str, entry: dict[str, Any]) -> None:
        actual = resolve_kind(kind, entry["precision"])
        if actual is None:
            reason = next(s.unsupported for s in chosen if s.name == kind).get(entry["precision"])
            skipped[candidate_label(kind, gname)] = reason or f"{kind} does not run {entry['precision']} graphs"
            return
        label = candidate_label(actual, gname)
        candidates[label] = runner_for(actual, entry, name=label, **places)
        precisions[label] = entry["precision"]
        graph = entry.get("onnx") or (entry.get("path") if str(entry.get("path", "")).endswith(".onnx") else None)
        sources[label] = ctx.stage_dir("export") / graph if graph else None

    for gname, g in graphs.items():
        for spec in chosen:
            if not spec.needs_build and _group_of(gname) == group:
                add(spec.name, gname, g)
    for spec in chosen:
        if spec.needs_build:
            try:
                built = entries_for(spec.name, graphs, build_dir=ctx.stage_dir("build"))
            except MissingDependencyError:  # the build stage recorded why (engines.json "skipped")
                continue
            for ename, info in built.items():
                if _group_of(ename) == group:
                    add(spec.name, ename, info)
            for ename, reason in read_unavailable(ctx.stage_dir("build"), spec.name).items():
                if _group_of(ename) == group:
                    skipped[candidate_label(spec.name, ename)] = reason
    return candidates, precisions, sources


def parity_tolerances(ctx: Context) -> dict[str, Any]:
    """The recipe's parity overrides, in :func:`toolchain.parity.run_parity`'s terms."""
    from toolchain.parity import DEFAULT_UQ_TOLERANCES, parse_uq_tolerances

    p = ctx.recipe.parity
    out: dict[str, Any] = {}
    if p.uq_tolerances:
        uq = dict(p.uq_tolerances)
        if "" in uq:
            every = uq.pop("")
            uq = {k: every for k in DEFAULT_UQ_TOLERANCES} | uq
        try:
            out["uq_tolerances"] = parse_uq_tolerances(uq)
        except (ValueError, TypeError) as exc:
            raise RecipeError(f"field 'parity.uq_tolerances': {exc}") from None
    if p.tolerances:
        out["tolerances"] = p.tolerances
    return out


def parity_outcome(ctx: Context) -> None:
    """Raise the parity verdict's error (exit 1/2/3) after the stage published it."""
    from toolchain.errors import CheckFailed, MissingDependencyError, ToolchainError

    verdict = read_json(ctx.stage_dir("parity") / "verdict.json")
    code = verdict["exit_code"]
    if code == 0:
        return
    problems = [p for g in verdict["groups"].values() for p in g["problems"]]
    text = f"parity failed (see {ctx.stage_dir('parity')}/summary.md): " + "; ".join(problems[:10])
    raise {1: CheckFailed, 3: MissingDependencyError}.get(code, ToolchainError)(text)


def rescue_failing_graphs(ctx: Context) -> list[dict[str, Any]]:
    """Run ``parity --rescue``: make failing FP16/BF16 ONNX Runtime graphs pass.

    For each, search the smallest set of nodes to keep in FP32 and write the passing graph to
    ``<artifacts>/rescue/`` (a folder with its own manifest).
    """
    from toolchain.artifacts import StageDir
    from toolchain.engines import engine_kinds, make_runner, reference_kind, split_label
    from toolchain.hydra.fuse import load_hydra
    from toolchain.models.wrappers import SingleModel
    from toolchain.parity import rescue_precision

    verdict = read_json(ctx.stage_dir("parity") / "verdict.json")
    graphs = read_json(ctx.stage_dir("export") / "graphs.json")
    engines = {e for g in verdict["groups"].values() for e in g.get("rescuable_engines", [])}
    rescuable = {s.name for s in engine_kinds() if s.rescuable}
    failing = sorted(split_label(e)[1] for e in engines if split_label(e)[0] in rescuable)
    failing = [f for f in failing if f in graphs and graphs[f]["precision"] in ("fp16", "bf16")]
    if not failing:
        ctx.console.print("  rescue: no failing FP16/BF16 graph to rescue")
        return []
    base, de_members, tok, _t = baseline_models(ctx, exported_temperatures(ctx))
    names = list(graphs["single"]["inputs"])
    generated, ident, ood = parity_inputs(ctx, names, tok)
    sd = StageDir(ctx.root, "rescue", key=ctx.key("parity"))
    work = sd.begin()
    results = []
    try:
        for name in failing:
            g = graphs[name]
            module = (load_hydra(ctx.stage_dir("fuse") / "hydra") if g["kind"] == "hydra" else
                      SingleModel(de_members[int(_group_of(name).removeprefix("member"))]) if g["kind"] == "member"
                      else SingleModel(base))
            outputs = ["probs", "member_logits"] if g["kind"] == "hydra" else ["logits", "probs"]
            reference = make_runner(reference_kind(), module=module, input_specs=_input_specs(ctx, names),
                                    output_names=outputs, name="torch-reference")
            fp32 = ctx.stage_dir("export") / g["path"].replace(f".{g['precision']}", "")
            res = rescue_precision(fp32, work / g["path"], g["precision"], reference, generated, ident, ood,
                                   uq_tolerances=parity_tolerances(ctx).get("uq_tolerances"))
            results.append({"graph": name, "passed": res.passed, "kept_fp32_nodes": list(res.kept_fp32_nodes),
                            "path": g["path"]})
            ctx.console.print(f"  rescue {name}: {'pass' if res.passed else 'FAIL'} keeping "
                              f"{len(res.kept_fp32_nodes)} node(s) in FP32: {', '.join(res.kept_fp32_nodes[:8])}")
        atomic_write_json(work / "rescue.json", results)
        sd.publish({"rescued": [r["graph"] for r in results if r["passed"]]})
    except BaseException:
        sd.abort()
        raise
    return results
