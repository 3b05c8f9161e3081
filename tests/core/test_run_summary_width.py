"""What a log shows: the run summary table whole in a file or pipe, the export stage's line true to the recipe."""

from __future__ import annotations

import io
import json
from pathlib import Path
from types import SimpleNamespace

from rich.console import Console
from rich.table import Table

from toolchain.metrics.registry import view_keys
from toolchain.pipeline import Context, stages
from toolchain.recipe import load_recipe
from toolchain.report import print_run_summary, print_table
from toolchain.stages.export import export_summary

ROOT = Path(__file__).resolve().parents[2]
VARIANTS = ["single", "deep-ensemble", "hydra", "hydra-members-mean"]


def _fake_run(tmp_path: Path) -> SimpleNamespace:
    """The files ``print_run_summary`` reads (evaluate, parity, compare), with distinct numbers per cell."""
    keys = view_keys("summary")
    metrics = {v: {k: 0.1 * i + 0.001 * j for j, k in enumerate(keys)} for i, v in enumerate(VARIANTS)}
    files = {"evaluate/metrics.json": metrics,
             "parity/verdict.json": {"groups": {"hydra": {"status": "pass"}, "single": {"status": "pass"}}},
             "compare/compare.json": {"taylor-circuit": {"metrics": {"hydra": metrics["hydra"]}}}}
    for rel, data in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(json.dumps(data))
    return SimpleNamespace(recipe=SimpleNamespace(name="minilm-tweets-quick"), stage_dir=lambda n: tmp_path / n)


def test_run_summary_written_to_a_non_terminal_keeps_every_name_whole(tmp_path):
    ctx = _fake_run(tmp_path)
    out = io.StringIO()
    console = Console(file=out, width=80, soft_wrap=True)  # a CI log: not a terminal, 80 columns
    assert not console.is_terminal
    print_run_summary(ctx, console)
    text = out.getvalue()
    assert "…" not in text, text
    cells = [c.strip() for line in text.splitlines() for c in line.split("│")[1:-1]]
    assert [c for c in cells if c and not c[0].isdigit()] == [*VARIANTS, "hydra-taylor-circuit"]
    header = next(line for line in text.splitlines() if "variant" in line)
    assert [h.strip() for h in header.split("┃")[1:-1]] == ["variant", *view_keys("summary")]
    assert "0.1000" in text and f"{0.3 + 0.001 * (len(view_keys('summary')) - 1):.4f}" in text
    assert "parity: hydra: pass, single: pass; report: " in text
    assert all(line == line.rstrip() for line in text.splitlines())  # no padding to the width


def test_a_table_too_wide_for_80_columns_is_cut_by_rich_but_not_by_print_table():
    table = Table(title="t")
    table.add_column("variant")
    for k in view_keys("summary"):
        table.add_column(k, justify="right")
    table.add_row("hydra-members-mean", *["0.1234"] * len(view_keys("summary")))
    plain, ours = io.StringIO(), io.StringIO()
    Console(file=plain, width=80).print(table)
    assert "…" in plain.getvalue()  # what the summary looked like before
    print_table(Console(file=ours, width=80), table)
    assert "…" not in ours.getvalue() and "hydra-members-mean" in ours.getvalue()
    assert "auroc_msp" in ours.getvalue() and max(map(len, ours.getvalue().splitlines())) > 80
    term = io.StringIO()  # a terminal keeps rich's fit-to-the-window table
    print_table(Console(file=term, width=200, force_terminal=True, color_system=None), table)
    assert "hydra-members-mean" in term.getvalue() and "…" not in term.getvalue()


def _ctx(recipe: str, **export) -> Context:
    r = load_recipe(ROOT / "recipes" / recipe)
    if export:
        r = r.model_copy(update={"export": r.export.model_copy(update=export)})
    return Context(recipe=r)


def test_export_stage_line_names_the_recipes_lowerings_and_precisions():
    one = export_summary(_ctx("minilm-tweets.yaml", lowerings=["conv"], precisions=["fp32", "fp16", "bf16"]))
    assert "Hydra (conv lowering)," in one and "matmul" not in one and "both" not in one
    assert "FP32 and FP16/BF16 variants" in one
    both = export_summary(_ctx("minilm-tweets.yaml", lowerings=["conv", "matmul"]))
    assert "Hydra (conv and matmul lowerings)," in both
    assert "Hydra (matmul lowering)," in export_summary(_ctx("minilm-tweets.yaml", lowerings=["matmul"]))
    assert export_summary(_ctx("minilm-tweets.yaml", precisions=["fp32"])).endswith("; FP32 only")
    assert "FP32 and FP16 variants" in export_summary(_ctx("minilm-tweets.yaml", precisions=["fp32", "fp16"]))
    for recipe in ("minilm-tweets.yaml", "own-checkpoint.yaml", "vit-fashion-mnist.yaml"):  # as each recipe says
        ctx = _ctx(recipe)
        line = export_summary(ctx)
        assert all(low in line for low in ctx.recipe.export.lowerings), (recipe, line)
        assert all(low not in line for low in {"conv", "matmul"} - set(ctx.recipe.export.lowerings)), (recipe, line)
    assert stages()["export"].summary is export_summary  # the line the pipeline prints
