"""``hydra-toolchain``: argument parsing only; the work is in :mod:`toolchain.pipeline`.

Exit codes: 0 success; 1 a check failed (parity, lint, verify); 2 bad input (recipe, files,
data, input names/dtypes/shapes, an engine from another TensorRT version or GPU); 3 a needed
optional component is missing (TensorRT, CUDA, a data package); 4 an internal error (a bug:
rerun with ``--debug`` and report the traceback); 130 interrupted (completed stages are kept).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape

from toolchain import interrupts
from toolchain.errors import ToolchainError, environment_error
from toolchain.usage import CLICK_ERRORS, show_usage_error

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Turn a Hugging Face transformer into a pruned, fused Hydra ensemble, ONNX / TensorRT engines, "
    "a parity verdict and a latency report, from one recipe file.",
    epilog="Exit codes: 0 success; 1 a check failed (parity, lint, verify); 2 bad input (recipe, files, data, "
    "inference inputs, an engine from another TensorRT version or GPU); 3 a missing optional component (TensorRT, "
    "CUDA, a data package); 4 internal error (rerun with --debug); 130 interrupted (completed stages are kept).",
)
console = Console(stderr=True, soft_wrap=True)
_STATE = {"debug": False, "quiet": False}
#: paths given to this run (arguments, the recipe's folders): ENOTDIR / EISDIR / ENOENT there exit 2
_USER_PATHS: list[str] = []


def _no_placeholder_for_flags(original):
    """Typer 0.29 shows every option's type (``--debug <bool>``, ``--help <bool>``); a flag takes no value."""

    def display_type_rich(self, ctx):
        return None if getattr(self, "is_flag", False) else original(self, ctx)

    return display_type_rich


typer.core.TyperOption.display_type_rich = _no_placeholder_for_flags(typer.core.TyperOption.display_type_rich)

RecipeArg = Annotated[Path, typer.Argument(help="recipe YAML file", show_default=False)]
ProfileOpt = Annotated[str | None, typer.Option("--profile", "-p", metavar="NAME",
                                                help="recipe profile to apply, e.g. quick")]
ForceOpt = Annotated[list[str] | None, typer.Option("--force", metavar="STAGE",
                                                    help="rerun this stage and every stage downstream of "
                                                         "it, even if up to date (repeatable)")]


@app.callback()
def _main(debug: Annotated[bool, typer.Option("--debug", help="show tracebacks")] = False,
          quiet: Annotated[bool, typer.Option("--quiet", "-q", help="no progress and no per-stage detail: "
                                              "errors, warnings and the final result only")] = False) -> None:
    from toolchain.progress import set_quiet

    _STATE["debug"] = debug
    _STATE["quiet"] = quiet
    set_quiet(quiet)


def _context(recipe: Path, profile: str | None, force: list[str] | None = None):
    from toolchain.pipeline import Context, stages
    from toolchain.recipe import load_recipe

    forced = frozenset(force or [])
    unknown = forced - set(stages())
    if unknown:
        raise ToolchainError(f"--force: unknown stage(s) {', '.join(sorted(unknown))} (stages: {', '.join(stages())}).")
    loaded = load_recipe(recipe, profile=profile)  # relative paths resolved against the recipe's folder
    _USER_PATHS.extend(str(v).removeprefix("csv:") for v in (loaded.artifacts_dir, loaded.model.source,
                                                             loaded.data.id, loaded.data.ood) if v)
    stage_console = Console(stderr=True, soft_wrap=True, quiet=True) if _STATE["quiet"] else console
    return Context(recipe=loaded, console=stage_console, force=forced, progress=not _STATE["quiet"])


def _run(recipe: Path, profile: str | None, force: list[str] | None, until: str | None = None,
         only: list[str] | None = None) -> dict[str, str]:
    from toolchain.pipeline import run_pipeline

    ctx = _context(recipe, profile, force)
    return run_pipeline(ctx, until=until, only=only)


@app.command()
def run(recipe: RecipeArg, profile: ProfileOpt = None, force: ForceOpt = None) -> None:
    """Run every stage of the recipe (stages whose inputs did not change are skipped)."""
    ctx = _context(recipe, profile, force)
    from toolchain.pipeline import run_pipeline
    from toolchain.stages import parity_outcome

    status = run_pipeline(ctx)
    from toolchain import distributed as dist

    if not dist.is_main():  # under torchrun: rank 0 reports
        return
    ran = [k for k, v in status.items() if v == "ran"]
    from toolchain.report import print_run_summary

    print_run_summary(ctx, console)
    parity_outcome(ctx)
    console.print(f"[green]done[/green]: {len(status)} stages ({len(ran)} ran, {len(status) - len(ran)} up to date)")


@app.command()
def load(recipe: RecipeArg, profile: ProfileOpt = None, force: ForceOpt = None) -> None:
    """Load the model and data sets and print a summary."""
    _run(recipe, profile, force, until="load")


def _stage_command(stage: str, doc: str):
    def command(recipe: RecipeArg, profile: ProfileOpt = None, force: ForceOpt = None) -> None:
        ctx = _context(recipe, profile, force)
        from toolchain.pipeline import run_pipeline

        run_pipeline(ctx, until=stage)
        if stage == "parity":
            from toolchain.stages import parity_outcome

            parity_outcome(ctx)

    command.__doc__ = doc
    app.command(name=stage)(command)


for _name, _doc in [
    ("finetune", "Fine-tune the base classifier on the training split (runs load first when needed)."),
    ("score", "Score every attention head (runs load and fine-tuning first when needed)."),
    ("prune", "Make the M pruned members and their diversity report."),
    ("fuse", "Fuse the members into one Hydra model (safetensors + JSON config) and print its summary."),
    ("report", "Write the results report (Markdown + HTML)."),
]:
    _stage_command(_name, _doc)


def _is_recipe(path: Path) -> bool:
    return path.suffix.lower() in (".yaml", ".yml")


@app.command(name="export")
def export_command(
    src: Annotated[Path, typer.Argument(help="a Hugging Face checkpoint folder, a Hydra folder (hydra_config.json), "
                                        "or a recipe YAML file (runs the recipe up to its export stage)",
                                        show_default=False)],
    out: Annotated[Path | None, typer.Option("--out", "-o", metavar="DIR", help="output folder (folder sources)",
                                             show_default=False)] = None,
    lowering: Annotated[str, typer.Option("--lowering", metavar="LIST",
                                          help="Hydra GFC lowerings, comma-separated: conv, matmul")] = "conv,matmul",
    precision: Annotated[str, typer.Option("--precision", metavar="LIST",
                                           help="precisions: fp32, fp16, bf16, int8 (needs --data)")] = "fp32,fp16",
    batch: Annotated[str, typer.Option("--batch", metavar="MIN:OPT:MAX", help="batch sizes of the TensorRT "
                                       "profile and the checks")] = "1:8:32",
    seq: Annotated[str, typer.Option("--seq", metavar="MIN:OPT:MAX",
                                     help="sequence lengths (text models)")] = "8:64:128",
    opset: Annotated[int, typer.Option("--opset", metavar="N", help="ONNX opset")] = 17,
    trt_version: Annotated[str, typer.Option("--trt-version", metavar="V",
                                             help="TensorRT version the lint checks against")] = "10",
    engine: Annotated[str | None, typer.Option("--engine", metavar="LIST", help="also build engine files of these "
                                               "kinds (openvino-cpu: each FP32 graph at each --precision; tensorrt), "
                                               "engines.json", show_default=False)] = None,
    data: Annotated[Path | None, typer.Option("--data", metavar="FILE", show_default=False, help="INT8 calibration "
                                              "rows: a labelled CSV (text,label) or an .npz of the inputs")] = None,
    tokenizer: Annotated[Path | None, typer.Option("--tokenizer", metavar="DIR", show_default=False)] = None,
    calib_rows: Annotated[int, typer.Option("--calib-rows", metavar="N", min=1, help="INT8 calibration rows")] = 256,
    profile: ProfileOpt = None,
    force: ForceOpt = None,
) -> None:
    """Export ONNX graphs; every graph is checked against PyTorch and linted for TensorRT (exit 1 on a failure).

    A checkpoint folder gives single.onnx, a Hydra folder hydra-<lowering>.onnx per lowering, each
    with its --precision variants and graphs.json. A recipe runs its pipeline up to export.
    """
    if _is_recipe(src):
        from toolchain.pipeline import run_pipeline

        run_pipeline(_context(src, profile, force), until="export")
        return
    from toolchain.verbs import ExportOptions, Range, export_graphs

    if out is None:
        raise ToolchainError(f"export {src}: give the output folder with -o/--out.")
    options = ExportOptions(lowerings=_csv_choice(lowering, "--lowering", ("conv", "matmul")),
                            precisions=_csv_choice(precision, "--precision", ("fp32", "fp16", "bf16", "int8")),
                            batch=Range.parse(batch, "--batch"), sequence=Range.parse(seq, "--seq"), opset=opset,
                            trt_version=trt_version, engines=_built_kinds_option(engine), data=data,
                            tokenizer=tokenizer, calibration_rows=calib_rows)
    say = (lambda line: None) if _STATE["quiet"] else (lambda line: console.print(f"  {escape(line)}", highlight=False))
    result = export_graphs(src, out, options, say=say)
    if not result["ok"]:
        console.print(f"[red]FAILED[/red]: a graph in {escape(str(out))} does not match PyTorch or fails the lint "
                      "(graphs.json has the details)")
        raise typer.Exit(1)
    console.print(f"[green]ok[/green]: {len(result['graphs'])} graph(s) in {escape(str(out))} match PyTorch")
    _say_engines(result.get("engines", {}), out)


def _built_kinds_option(text: str | None) -> list[str]:
    """``--engine LIST`` of a command that builds engine files: kinds that need a build, checked."""
    from toolchain.engines import engine_kinds

    allowed = [s.name for s in engine_kinds(selectable=True) if s.needs_build]
    return _csv_choice(text, "--engine", tuple(allowed)) if text is not None else []


def _say_engines(records: dict[str, Any], out: Path) -> None:
    """One line per kind of ``engines.json``: built, unavailable here (why), skipped (why)."""
    for kind, record in records.items():
        if "skipped" in record:
            console.print(f"[yellow]{kind} skipped[/yellow]: {escape(record['skipped'])}", highlight=False)
            continue
        built = ", ".join(record["engines"]) or "none"
        console.print(f"[green]{kind}[/green]: built {escape(built)} in {escape(str(out))}", highlight=False)
        for name, why in record.get("unavailable", {}).items():
            console.print(f"  [yellow]{kind} {escape(name)} unavailable here[/yellow]: {escape(why)}", highlight=False)


def _csv_choice(text: str, option: str, allowed: tuple[str, ...]) -> list[str]:
    values = [v.strip().lower() for v in text.split(",") if v.strip()]
    bad = [v for v in values if v not in allowed]
    if bad or not values:
        raise ToolchainError(f"{option} '{text}': use a comma-separated list of {', '.join(allowed)}.")
    return values


@app.command(name="bench")
def bench_command(
    graphs: Annotated[list[Path], typer.Argument(help="ONNX graphs or engine files (the first is the reference of the "
                                                 "ratios), or one recipe YAML file (runs the recipe up to its bench "
                                                 "stage)", show_default=False)],
    engine: Annotated[str | None, typer.Option("--engine", metavar="LIST", help="engine kinds, comma-separated "
                                               "(default: the CPU kind every recipe has); every (file, kind, "
                                               "precision) is one variant of one interleaved run")] = None,
    precision: Annotated[str | None, typer.Option("--precision", metavar="LIST", help="precisions, comma-separated: "
                                                  "a compiling kind (openvino-cpu) builds each FP32 graph at each "
                                                  "(default: each file's own)", show_default=False)] = None,
    batch: Annotated[str, typer.Option("--batch", metavar="LIST", help="batch sizes, comma-separated")] = "1,8",
    seq: Annotated[int, typer.Option("--seq", metavar="N", help="tokens per sample (text graphs)")] = 128,
    threads: Annotated[int, typer.Option("--threads", metavar="N", help="intra-op threads per session")] = 2,
    warmup: Annotated[int, typer.Option("--warmup", metavar="N", help="untimed passes per case")] = 3,
    rounds: Annotated[int, typer.Option("--rounds", metavar="N", help="timed interleaved rounds per case")] = 15,
    out: Annotated[Path | None, typer.Option("--out", "-o", metavar="DIR", help="write bench.json, bench.md and "
                                             "bench.png here", show_default=False)] = None,
    profile: ProfileOpt = None,
    force: ForceOpt = None,
) -> None:
    """Latency of graphs side by side: interleaved rounds, p50/p90/p99, per-round ratios to the first graph.

    With a recipe: single model vs deep ensemble vs Hydra of its export stage (JSON, Markdown, PNG).
    """
    if len(graphs) == 1 and _is_recipe(graphs[0]):
        from toolchain.pipeline import run_pipeline

        run_pipeline(_context(graphs[0], profile, force), until="bench")
        return
    from toolchain.verbs import bench_graphs, bench_table

    try:
        sizes = [int(b) for b in batch.split(",") if b.strip()]
    except ValueError:
        raise ToolchainError(f"--batch '{batch}': use comma-separated integers, e.g. 1,8.") from None
    result = bench_graphs(graphs, engine=engine, precision=precision, batch_sizes=sizes, sequence_length=seq,
                          threads=threads, warmup=warmup, rounds=rounds, out=out, progress=not _STATE["quiet"])
    ran = [k for k, v in result["engines"].items() if v.get("status") == "ok"]
    if not ran:
        reasons = "; ".join(f"{k}: {v.get('reason', 'unknown reason')}" for k, v in result["engines"].items())
        raise ToolchainError(f"bench: no engine ran: {reasons}.")
    for label, reason in {**result.get("skipped", {}), **{k: v.get("reason", "") for k, v in
                                                            result["engines"].items() if k not in ran}}.items():
        console.print(f"  [yellow]skipped[/yellow] {escape(label)}: {escape(reason)}", highlight=False)
    print(bench_table(result, result["first"]))
    if out is not None:
        console.print(f"[green]ok[/green]: {escape(str(out))}/bench.json, bench.md, bench.png")


@app.command(name="build")
def build_command(
    targets: Annotated[list[Path], typer.Argument(help="ONNX graphs, or one recipe YAML file (runs the recipe up to "
                                                  "its build stage)", show_default=False)],
    engine: Annotated[str | None, typer.Option("--engine", metavar="LIST", help="kinds to build, comma-separated: "
                                               "openvino-cpu (each FP32 graph at each --precision), tensorrt "
                                               "(default: the kinds that build without a GPU)",
                                               show_default=False)] = None,
    precision: Annotated[str, typer.Option("--precision", metavar="LIST", help="precisions, comma-separated: fp32, "
                                           "fp16, bf16, int8 (a precision this machine lacks is reported, not built)")]
    = "fp32,bf16",
    out: Annotated[Path | None, typer.Option("--out", "-o", metavar="DIR", help="output folder (graph files): engine "
                                             "files, their sidecars and engines.json", show_default=False)] = None,
    batch: Annotated[str, typer.Option("--batch", metavar="MIN:OPT:MAX", help="batch sizes the engines "
                                       "take")] = "1:8:32",
    seq: Annotated[str, typer.Option("--seq", metavar="MIN:OPT:MAX", help="sequence lengths (text "
                                     "graphs)")] = "8:64:128",
    profile: ProfileOpt = None,
    force: ForceOpt = None,
) -> None:
    """Build engine files (OpenVINO compiled models, TensorRT engines) from ONNX graphs, each with its sidecar.

    With a recipe: its build stage (every engine kind of the recipe that needs a build).
    """
    if len(targets) == 1 and _is_recipe(targets[0]):
        from toolchain.pipeline import run_pipeline

        run_pipeline(_context(targets[0], profile, force), until="build")
        return
    from toolchain.verbs import Range
    from toolchain.verbs.build import build_files

    if out is None:
        raise ToolchainError("build GRAPH...: give the output folder with -o/--out.")
    say = (lambda line: None) if _STATE["quiet"] else (lambda line: console.print(f"  {escape(line)}", highlight=False))
    from toolchain.engines import engine_kinds

    kinds = (_built_kinds_option(engine) if engine is not None else
             [k.name for k in engine_kinds(selectable=True) if k.needs_build and not k.gpu])
    records = build_files(targets, out, engines=kinds,
                          precisions=_csv_choice(precision, "--precision", ("fp32", "fp16", "bf16", "int8")),
                          batch=Range.parse(batch, "--batch"), sequence=Range.parse(seq, "--seq"), say=say)
    _say_engines(records, out)
    if not any(r.get("engines") for r in records.values()):
        from toolchain.errors import MissingDependencyError

        raise MissingDependencyError(f"build: nothing was built in {out} (engines.json says why).")


@app.command(name="inspect")
def inspect_command(
    path: Annotated[Path, typer.Argument(help="an .onnx graph, an engine file (TensorRT, OpenVINO) or a Hydra folder",
                                         show_default=False)],
    as_json: Annotated[bool, typer.Option("--json", help="print the description as JSON on stdout")] = False,
) -> None:
    """Inputs, outputs and dynamic dims, opset, operators, FP32 islands, weight bytes; a Hydra folder's members."""
    import json as _json

    from toolchain.verbs import format_inspection, inspect_path

    info = inspect_path(path)
    if as_json:
        print(_json.dumps(info, indent=2, default=str))
    else:
        print(format_inspection(info))


@app.command()
def parity(
    graphs: Annotated[list[Path], typer.Argument(help="ONNX graphs or engine files to check (or one recipe YAML file: "
                                                 "runs the recipe up to its parity stage)", show_default=False)],
    reference: Annotated[Path | None, typer.Option("--reference", "-r", metavar="SRC", help="the PyTorch source: "
                                                   "the checkpoint folder or Hydra folder the graphs came from",
                                                   show_default=False)] = None,
    data: Annotated[Path | None, typer.Option("--data", metavar="CSV", help="labelled rows (text,label) for the "
                                              "ID metrics", show_default=False)] = None,
    ood: Annotated[Path | None, typer.Option("--ood", metavar="CSV", help="out-of-distribution rows (text,label; "
                                             "labels unused) for the OOD metrics", show_default=False)] = None,
    inputs: Annotated[Path | None, typer.Option("--inputs", metavar="NPZ", help="feeds from --save-inputs, or named "
                                                "arrays per graph input (+ labels)", show_default=False)] = None,
    save_inputs: Annotated[Path | None, typer.Option("--save-inputs", metavar="NPZ", help="write every feed of this "
                                                     "run (replay it in CI with --inputs)", show_default=False)] = None,
    tol: Annotated[list[str] | None, typer.Option("--tol", metavar="OUTPUT:ATOL:RTOL", help="numeric atol/rtol of "
                                                  "an output ('*': every output); the precision's statistic and "
                                                  "bounds stay; default: the precision's measured tolerances",
                                                  show_default=False)] = None,
    uq_tol: Annotated[list[str] | None, typer.Option("--uq-tol", metavar="METRIC:DELTA", help="allowed UQ-metric "
                                                     "difference ('*': every metric)", show_default=False)] = None,
    engine: Annotated[str | None, typer.Option("--engine", metavar="LIST", help="engine kinds that run the graphs, "
                                               "comma-separated (default: the CPU kind every recipe has); a kind that "
                                               "compiles (openvino-cpu) builds each FP32 graph at each --precision",
                                               show_default=False)] = None,
    precision: Annotated[str | None, typer.Option("--precision", metavar="LIST", help="precisions, comma-separated: "
                                                  "fp32, fp16, bf16, int8 (default: each graph's own; engine files: "
                                                  "their sidecar's)", show_default=False)] = None,
    tokenizer: Annotated[Path | None, typer.Option("--tokenizer", metavar="DIR", help="tokenizer folder for --data "
                                                   "(default: the reference folder)", show_default=False)] = None,
    max_length: Annotated[int, typer.Option("--max-length", metavar="N", help="tokens per text")] = 128,
    batch_size: Annotated[int, typer.Option("--batch-size", metavar="N", help="rows per batch")] = 32,
    max_rows: Annotated[int | None, typer.Option("--max-rows", metavar="N", help="at most N rows per CSV (a seeded "
                                                 "sample; default: all)", show_default=False)] = None,
    out: Annotated[Path | None, typer.Option("--out", "-o", metavar="DIR", help="write report.json, junit.xml and "
                                             "summary.md here", show_default=False)] = None,
    json_file: Annotated[Path | None, typer.Option("--json", metavar="FILE", help="write the JSON report here",
                                                   show_default=False)] = None,
    junit: Annotated[Path | None, typer.Option("--junit", metavar="FILE", help="write the JUnit XML here",
                                               show_default=False)] = None,
    rescue: Annotated[bool, typer.Option("--rescue", help="for failing FP16/BF16/INT8 graphs, the fewest nodes "
                                         "(INT8: quantized layers) to keep in float; writes the passing one")] = False,
    localize: Annotated[bool, typer.Option("--localize", help="for failing graphs, name where they first diverge "
                                           "(vs PyTorch; node by node vs --baseline or, FP16/BF16, the FP32 "
                                           "graph)")] = False,
    baseline: Annotated[Path | None, typer.Option("--baseline", metavar="GRAPH", help="with --localize: a reference "
                                                  "ONNX graph to compare every failing graph with node by node (no "
                                                  "module-scoped node names needed)", show_default=False)] = None,
    profile: ProfileOpt = None,
    force: ForceOpt = None,
) -> None:
    """Numeric and UQ-metric parity of graphs or engines against their PyTorch source (exit 1 on a failure).

    Exit codes: 0 every check passed, 1 a check failed, 2 a file could not run, 3 an optional component
    (TensorRT, CUDA) is missing. With a recipe: every engine of its pipeline.
    """
    if len(graphs) == 1 and _is_recipe(graphs[0]):
        if localize:
            raise ToolchainError("--localize works on files: parity GRAPH... --reference SRC --localize.")
        _recipe_parity(graphs[0], profile, force, rescue)
        return
    from toolchain.verbs.parity import ParityOptions, check_parity, parse_tolerance_options, rescue_graphs

    if reference is None:
        raise ToolchainError("parity GRAPH...: give the PyTorch source with --reference (the checkpoint or Hydra "
                             "folder the graphs were exported from).")
    for option, value in (("--max-length", max_length), ("--batch-size", batch_size), ("--max-rows", max_rows)):
        if value is not None and value < (2 if option == "--max-length" else 1):
            raise ToolchainError(f"{option} {value}: use a positive number.")
    if baseline is not None and not localize:
        raise ToolchainError("--baseline GRAPH is the reference of --localize: add --localize.")
    if baseline is not None and (not baseline.is_file() or baseline.suffix != ".onnx"):
        raise ToolchainError(f"--baseline '{baseline}' is not an ONNX file (give the .onnx graph to compare with).")
    tolerances, uq_tolerances = parse_tolerance_options(tol or (), uq_tol or ())
    for flag, path in (("--out", out), ("--json", json_file), ("--junit", junit), ("--save-inputs", save_inputs)):
        if path is not None and any(path.resolve() == g.resolve() for g in graphs):
            raise ToolchainError(f"{flag} '{path}' would overwrite a graph; choose another path.")
    options = ParityOptions(data=data, ood=ood, inputs=inputs, tokenizer=tokenizer, max_length=max_length,
                            batch_size=batch_size, max_rows=max_rows, tolerances=tolerances,
                            uq_tolerances=uq_tolerances, engine=engine, precision=precision, save_inputs=save_inputs,
                            localize=localize, baseline=baseline)
    say = (lambda line: None) if _STATE["quiet"] else (lambda line: console.print(f"  {escape(line)}", highlight=False))
    verdict = check_parity(graphs, reference, options, out=out, say=say)
    _write_reports(verdict, json_file, junit)
    for problem in verdict.problems():
        console.print(f"    [red]x[/red] {escape(problem)}", highlight=False)
    for note in verdict.notes():
        console.print(f"    [yellow]?[/yellow] {escape(note)}", highlight=False)
    for label, item in ((label, item) for label, items in verdict.localization.items() for item in items):
        console.print(f"    [yellow]>[/yellow] {escape(label)}: {escape(item['summary'])}", highlight=False)
    code = verdict.exit_code
    if rescue and code == 1:
        where = out or graphs[0].parent
        results = rescue_graphs(verdict, reference, options, where, say=say)
        if results and all(r["passed"] for r in results) and len(results) == len({c.engine for c in verdict.failures}):
            console.print(f"[green]rescued[/green]: {len(results)} graph(s) in {escape(str(where))}/rescued")
            return
    colour = "green" if code == 0 else "red"
    console.print(f"[{colour}]{escape(verdict.headline())}[/{colour}]", highlight=False)
    if code:
        raise typer.Exit(code)


def _write_reports(verdict: Any, json_file: Path | None, junit: Path | None) -> None:
    import json as _json

    from toolchain.artifacts import atomic_write_bytes

    if json_file is not None:
        text = _json.dumps(verdict.to_dict(), indent=2, sort_keys=True, allow_nan=False) + "\n"
        atomic_write_bytes(json_file, text.encode("utf-8"))
    if junit is not None:
        atomic_write_bytes(junit, verdict.to_junit_xml().encode("utf-8"))


def _recipe_parity(recipe: Path, profile: str | None, force: list[str] | None, rescue: bool) -> None:
    """``parity RECIPE``: the recipe's pipeline up to its parity stage, its verdict, ``--rescue``."""
    from toolchain.pipeline import run_pipeline
    from toolchain.stages import parity_outcome, rescue_failing_graphs

    ctx = _context(recipe, profile, force)
    run_pipeline(ctx, until="parity")
    from toolchain import distributed as dist

    if not dist.is_main():  # under torchrun: rank 0 reports (and rescues)
        return
    if rescue:
        results = rescue_failing_graphs(ctx)
        if results and all(r["passed"] for r in results):
            console.print(f"[green]rescued[/green]: {len(results)} graph(s) in {ctx.root / 'rescue'}")
            return
    parity_outcome(ctx)


@app.command()
def lint(
    onnx_file: Annotated[Path, typer.Argument(help="ONNX file to check")],
    target: Annotated[str | None, typer.Option("--target", help="the engine kind whose ONNX parser to check against "
                                               "(default and only one: the kind the build stage builds, TensorRT)",
                                               show_default=False)] = None,
    trt_version: Annotated[str | None, typer.Option(
        "--trt-version", help="target TensorRT version, e.g. 10.3, 10.15, 11.5 (a major only, e.g. 10: rules added "
        "within it are warnings); default: the installed TensorRT's, else the newest rules the lint knows",
        show_default=False)] = None,
) -> None:
    """Check an ONNX graph against the TensorRT ONNX parser on CPU (exit 1 on any error)."""
    from toolchain.engines import engine_kinds
    from toolchain.export.lint import lint_tensorrt

    targets = [s.name for s in engine_kinds() if s.needs_build]
    if (target or targets[0]) not in targets[:1]:
        raise ToolchainError(f"--target {target!r} is not supported; use --target {targets[0]}.")
    report = lint_tensorrt(onnx_file, trt_version=trt_version)
    for finding in report.findings:
        console.print(escape(str(finding)), highlight=False)
    report.raise_if_failed()
    console.print(f"[green]ok[/green]: {escape(str(onnx_file))} passes the TensorRT {report.trt_version} lint")


@app.command()
def infer(
    graph: Annotated[Path, typer.Argument(help="an ONNX file (.onnx) or an engine file (TensorRT .engine / .plan, "
                                          "OpenVINO .blob)", show_default=False)],
    inputs: Annotated[Path, typer.Option("--inputs", "-i", help=".npz file: one array per graph input, keyed "
                                         "by input name", show_default=False)],
    out: Annotated[Path, typer.Option("--out", "-o", help=".npz file to write the outputs to (atomically)",
                                      show_default=False)],
    engine: Annotated[str | None, typer.Option("--engine", "-e", help="an engine kind that runs files (default: "
                                               "the first kind for the file's suffix: onnxrt-cpu for .onnx, "
                                               "tensorrt for .engine/.plan, openvino-cpu for .blob)")] = None,
) -> None:
    """Run an ONNX graph or an engine file on named arrays (.npz) and write its outputs (.npz).

    Inputs are checked first (names, dtypes, ranks, static dims, the engine profile's min/max, empty inputs, token
    ids against the vocabulary, the sequence length against the position table) and --out must be writable: exit 2
    otherwise. Nothing is written unless inference succeeds. Example: infer model.onnx --inputs in.npz --out out.npz
    """
    import numpy as np

    from toolchain.verbs.infer import infer_file

    kind, outputs = infer_file(graph, inputs, out, engine)
    for name, value in outputs.items():
        note = ""
        if value.dtype.kind in "fc" and not np.isfinite(value).all():
            flat = int(np.argmax(~np.isfinite(value).reshape(-1)))
            index = tuple(int(i) for i in np.unravel_index(flat, value.shape))
            note = (f"  [yellow]warning: {float(value.reshape(-1)[flat])!r} at index {index} "
                    "(first NaN/Inf)[/yellow]")
        console.print(f"  {escape(name)}: {value.dtype} {escape(str(list(value.shape)))}{note}", highlight=False)
    console.print(f"[green]ok[/green]: {len(outputs)} output(s) of {escape(graph.name)} ({kind}) written to "
                  f"{escape(str(out))}", highlight=False)


@app.command()
def verify(artifacts_dir: Annotated[Path, typer.Argument(help="artifacts folder (or one recipe's folder)")]) -> None:
    """Recompute every file's hash against the stage manifests; exit 1 on any difference."""
    from toolchain.artifacts import verify_tree
    from toolchain.errors import CheckFailed

    problems = verify_tree(artifacts_dir)
    if problems:
        for p in problems:
            console.print(f"[red]x[/red] {escape(str(p))}", highlight=False)
        raise CheckFailed(f"{len(problems)} problem(s) in '{artifacts_dir}'.")
    console.print(f"[green]ok[/green]: every file under '{artifacts_dir}' matches its manifest")


def main(argv: list[str] | None = None) -> None:
    """Console-script entry: run the app; usage mistakes, the user's machine or paths 2, bugs 4 (docs/commands.md)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    interrupts.install()  # SIGTERM: stop at the next safe point (toolchain/interrupts.py)
    args = sys.argv[1:] if argv is None else argv
    debug = "--debug" in args
    _USER_PATHS[:] = [a.split("=", 1)[-1] for a in args if a and a != "-"]  # options' values too (--out=DIR)
    try:
        # typer turns KeyboardInterrupt (and our SIGTERM) into a returned exit code 130 here
        rv = app(args=args, standalone_mode=False, prog_name="hydra-toolchain")
        if rv == 130:
            raise KeyboardInterrupt
        if isinstance(rv, int) and rv != 0:
            sys.exit(rv)
    except ToolchainError as exc:
        if debug:
            raise
        console.print(f"[red]error[/red]: {escape(str(exc))}", highlight=False, soft_wrap=True)
        sys.exit(exc.exit_code)
    except CLICK_ERRORS as exc:  # a usage mistake: the usage line and the problem
        sys.exit(show_usage_error(exc))
    except typer.Abort:
        console.print("interrupted", highlight=False)
        sys.exit(130)
    except typer.Exit as exc:
        sys.exit(getattr(exc, "exit_code", 0))
    except KeyboardInterrupt:
        console.print("interrupted: completed stages are kept; the next run resumes", highlight=False)
        sys.exit(130)
    except Exception as exc:
        if debug:
            raise
        env = environment_error(exc, user_paths=_USER_PATHS)
        if env is not None:  # the user's machine or paths (disk full, read-only, not a folder), not a bug
            console.print(f"[red]error[/red]: cannot use {escape(env)}.", highlight=False, soft_wrap=True)
            sys.exit(2)
        console.print(f"[red]internal error[/red]: {type(exc).__name__}: {escape(str(exc))}. Rerun with --debug "
                      "for the traceback and report it.", highlight=False, soft_wrap=True)
        sys.exit(4)
    sys.exit(0)
