"""``hydra-toolchain``: argument parsing only; the work is in :mod:`toolchain.pipeline`.

Exit codes: 0 success; 1 a check failed (parity, lint, verify); 2 bad input (recipe, files,
shapes); 3 a needed optional component is missing (TensorRT, CUDA, a data package); 4 an
internal error (a bug: rerun with ``--debug`` and report the traceback); 130 interrupted.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Annotated

import click
import typer
from rich.console import Console

from toolchain.errors import ToolchainError

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Turn a Hugging Face transformer into a pruned, fused Hydra ensemble, ONNX / TensorRT engines, "
    "a parity verdict and a latency report, from one recipe file.",
)
console = Console(stderr=True, soft_wrap=True)
_STATE = {"debug": False}

RecipeArg = Annotated[Path, typer.Argument(help="recipe YAML file", show_default=False)]
ProfileOpt = Annotated[str | None, typer.Option("--profile", "-p", help="recipe profile to apply, e.g. quick")]
ForceOpt = Annotated[list[str] | None, typer.Option("--force", help="rerun this stage even if up to date (repeatable)")]


@app.callback()
def _main(debug: Annotated[bool, typer.Option("--debug", help="show tracebacks")] = False) -> None:
    _STATE["debug"] = debug


def _context(recipe: Path, profile: str | None, force: list[str] | None = None):
    from toolchain.pipeline import STAGES, Context
    from toolchain.recipe import load_recipe

    forced = frozenset(force or [])
    unknown = forced - set(STAGES)
    if unknown:
        raise ToolchainError(f"--force: unknown stage(s) {', '.join(sorted(unknown))} (stages: {', '.join(STAGES)}).")
    return Context(recipe=load_recipe(recipe, profile=profile), console=console, force=forced)


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
    ran = [k for k, v in status.items() if v == "ran"]
    _print_summary(ctx)
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
    ("score", "Score every attention head (runs load and fine-tuning first when needed)."),
    ("prune", "Make the M pruned members and their diversity report."),
    ("fuse", "Fuse the members into one Hydra model (safetensors + JSON config) and print its summary."),
    ("export", "Export ONNX graphs (Hydra with both lowerings, single model, members; FP16/BF16 variants)."),
    ("build", "Build TensorRT engines where tensorrt and a CUDA GPU are available."),
    ("bench", "Latency and size: single model vs deep ensemble vs Hydra, interleaved rounds (JSON, Markdown, PNG)."),
    ("report", "Write the results report (Markdown + HTML)."),
]:
    _stage_command(_name, _doc)


@app.command()
def parity(
    recipe: RecipeArg,
    profile: ProfileOpt = None,
    force: ForceOpt = None,
    rescue: Annotated[bool, typer.Option("--rescue", help="for failing FP16/BF16 graphs, find the smallest set "
                                         "of nodes to keep in FP32 and write the passing graph")] = False,
) -> None:
    """Numerical and UQ-metric parity of every engine vs the PyTorch reference (exit 1 on failure)."""
    from toolchain.pipeline import run_pipeline
    from toolchain.stages import parity_outcome, rescue_failing_graphs

    ctx = _context(recipe, profile, force)
    run_pipeline(ctx, until="parity")
    if rescue:
        results = rescue_failing_graphs(ctx)
        if results and all(r["passed"] for r in results):
            console.print(f"[green]rescued[/green]: {len(results)} graph(s) in {ctx.root / 'rescue'}")
            return
    parity_outcome(ctx)


@app.command()
def lint(
    onnx_file: Annotated[Path, typer.Argument(help="ONNX file to check")],
    target: Annotated[str, typer.Option("--target", help="tensorrt (the parser to check against)")] = "tensorrt",
    trt_version: Annotated[str, typer.Option("--trt-version", help="TensorRT version, e.g. 10, 10.15, 11")] = "10",
) -> None:
    """Check an ONNX graph against the TensorRT ONNX parser on CPU (exit 1 on any error)."""
    from toolchain.export.lint import lint_tensorrt

    if target != "tensorrt":
        raise ToolchainError(f"--target {target!r} is not supported; use --target tensorrt.")
    report = lint_tensorrt(onnx_file, trt_version=trt_version)
    for finding in report.findings:
        console.print(f"{finding}")
    report.raise_if_failed()
    console.print(f"[green]ok[/green]: {onnx_file} passes the TensorRT {trt_version} lint")


@app.command()
def verify(artifacts_dir: Annotated[Path, typer.Argument(help="artifacts folder (or one recipe's folder)")]) -> None:
    """Recompute every file's hash against the stage manifests; exit 1 on any difference."""
    from toolchain.artifacts import verify_tree
    from toolchain.errors import CheckFailed

    problems = verify_tree(artifacts_dir)
    if problems:
        for p in problems:
            console.print(f"[red]x[/red] {p}")
        raise CheckFailed(f"{len(problems)} problem(s) in '{artifacts_dir}'.")
    console.print(f"[green]ok[/green]: every file under '{artifacts_dir}' matches its manifest")


def _print_summary(ctx) -> None:
    """One screen at the end of ``run``: UQ metrics per variant, parity status, where the report is."""
    import json

    from rich.table import Table

    try:
        metrics = json.loads((ctx.stage_dir("evaluate") / "metrics.json").read_text())
        verdict = json.loads((ctx.stage_dir("parity") / "verdict.json").read_text())
    except (OSError, ValueError):
        return
    table = Table(title=f"{ctx.recipe.name}: test split (ID) and OOD test split")
    keys = ["accuracy", "nll", "ece", "brier", "auroc_msp", "fpr95_msp", "auroc_mi"]
    table.add_column("variant")
    for k in keys:
        table.add_column(k, justify="right")
    for name in ("single", "deep-ensemble", "hydra", "hydra-members-mean"):
        if name in metrics:
            table.add_row(name, *[f"{metrics[name][k]:.4f}" if k in metrics[name] else "-" for k in keys])
    console.print(table)
    groups = ", ".join(f"{g}: {r['status']}" for g, r in verdict["groups"].items())
    console.print(f"parity: {groups}; report: {ctx.stage_dir('report') / 'report.html'}")


def _on_sigterm(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> None:
    """Console-script entry: run the app, map errors to one-paragraph messages and exit codes."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    signal.signal(signal.SIGTERM, _on_sigterm)
    args = sys.argv[1:] if argv is None else argv
    debug = "--debug" in args
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
        console.print(f"[red]error[/red]: {exc}", highlight=False, soft_wrap=True)
        sys.exit(exc.exit_code)
    except click.exceptions.Abort:
        console.print("interrupted", highlight=False)
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(2)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        console.print("interrupted: completed stages are kept; the next run resumes", highlight=False)
        sys.exit(130)
    except Exception as exc:
        if debug:
            raise
        console.print(f"[red]internal error[/red]: {type(exc).__name__}: {exc}. Rerun with --debug for the "
                      "traceback and report it.", highlight=False, soft_wrap=True)
        sys.exit(4)
    sys.exit(0)
