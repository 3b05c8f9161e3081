"""benchmarks/cost_levers/run.py on fake row data: the rule's verdict, the table, the picture, the latency cells.

No training and no engines: rows are the dicts ``main`` builds from the stage folders, ``latency.measure``
is a stub shaped as its docstring says."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from bench_scripts import load_script

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def cl_run():
    return load_script("benchmarks/cost_levers/run.py", "cost_levers_run")


def _gain(g):
    return {"gain": g, "ci": [g - 0.01, g + 0.01], "excludes_zero": g > 0.01, "ensemble": 0.5, "members_mean": 0.5}


def _row(ratio, acc, nll, auroc, params=None):
    return {"overrides": {}, "flops_ratio": ratio, "params_ratio": params or ratio, "seconds": 12.0,
            "validation": {"accuracy": acc, "nll": nll, "ece": 0.03, "auroc_msp": auroc, "auroc_mi": auroc - 0.02},
            "gain": {"nll": _gain(0.02), "auroc_msp": _gain(0.005)}}


def _result(cl_run, rows):
    baselines = {"single": {"flops_ratio": 1.0, "params_ratio": 1.0,
                            "validation": {"accuracy": 0.80, "nll": 0.60, "ece": 0.05, "auroc_msp": 0.70}},
                 "deep-ensemble": {"flops_ratio": 3.0, "params_ratio": 3.0,
                                   "validation": {"accuracy": 0.81, "nll": 0.50, "ece": 0.02, "auroc_msp": 0.80,
                                                  "auroc_mi": 0.82}}}
    result = {"recipe": "minilm-tweets", "profile": None, "command": "python benchmarks/cost_levers/run.py",
              "commit": "abc1234", "machine": "Fake CPU (AVX-512 BF16), 2 usable cores", "seq": 64, "wall_s": 5.0,
              "validation_rows": "tweets `val`, bbc `ood_val` rows 64-699 that no scoring saw",
              "rows": rows, "baselines": baselines, "latency": {"measured": False}}
    result["verdict"] = cl_run.summarize(rows, baselines)
    return result


def test_the_cheapest_row_clearing_both_baselines_is_selected_and_written(cl_run, tmp_path):
    rows = {"averaged": _row(2.47, 0.81, 0.45, 0.85), "mlp-0.33": _row(1.18, 0.80, 0.48, 0.82),
            "fork-4": _row(1.49, 0.80, 0.49, 0.81), "prune67-mlp-0.33": _row(1.00, 0.78, 0.55, 0.75)}
    result = _result(cl_run, rows)
    assert result["verdict"]["selected"] == "mlp-0.33"
    assert result["verdict"]["eligible"] == ["mlp-0.33", "fork-4", "averaged"]
    md = cl_run.write(result, tmp_path)
    for name in ("results.md", "results.json", "frontier.png"):
        assert (tmp_path / name).stat().st_size > 0, name
    assert (tmp_path / "frontier.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    back = json.loads((tmp_path / "results.json").read_text())
    assert back["verdict"]["selected"] == "mlp-0.33" and set(back["rows"]) == set(rows)
    # header: command, commit, machine, rule, wall time
    for words in ("python benchmarks/cost_levers/run.py", "abc1234", "Fake CPU (AVX-512 BF16)", "smallest analytic "
                  "FLOPs ratio", "wall time 5 s"):
        assert words in md, words
    table = [ln for ln in md.splitlines() if ln.startswith("| ")]
    names = [ln.split(" | ")[0].removeprefix("| ") for ln in table[1:]]
    # baselines first, then the rows cheapest first
    assert names[0].startswith("single model") and names[1].startswith("deep ensemble")
    assert [n.split(" ")[0] for n in names[2:]] == ["prune67-mlp-0.33", "mlp-0.33", "fork-4", "averaged"]
    selected = next(ln for ln in table if ln.startswith("| mlp-0.33"))
    assert "**(selected)**" in selected and "| 1.18 |" in selected and "+0.0200" in selected
    cheap = next(ln for ln in table if ln.startswith("| prune67-mlp-0.33"))
    assert "accuracy -0.0150, nll -0.0500, auroc_msp -0.0500" in cheap
    assert "Selected: **mlp-0.33**" in md and "Latency: not measured" in md


def test_when_nothing_clears_the_verdict_names_what_binds(cl_run, tmp_path):
    rows = {"mlp-0.33": _row(1.18, 0.79, 0.48, 0.82), "fork-4": _row(1.49, 0.80, 0.52, 0.81),
            "averaged": _row(2.47, 0.81, 0.49, 0.79)}
    result = _result(cl_run, rows)
    assert result["verdict"]["selected"] is None
    md = cl_run.write(result, tmp_path)
    assert "Selected: **none (deploy the single model)**" in md
    assert "accuracy: mlp-0.33; nll: fork-4; auroc_msp: averaged" in md
    assert "mlp-0.33 (1.18x): accuracy (-0.0050)" in md


def test_latency_cells_read_measures_answer_and_fill_the_columns(cl_run, tmp_path):
    def cell(median):
        return {"median_ms": 3.0, "ratio": {"median": median, "p25": median - 0.01, "p75": median + 0.01,
                                            "p10": median - 0.02, "p90": median + 0.03, "min": 0, "max": 9,
                                            "per_round": [median]}}

    measured = {"models": {"mlp-0.33": {"onnxrt-cpu:fp32": {"1": cell(1.25), "8": cell(1.4)},
                                        "openvino-cpu:bf16": {"1": cell(1.1)}}},
                "engines": {"onnxrt-cpu:fp32": {"status": "ok"}}}
    cells = cl_run.latency_cells(measured, "mlp-0.33")
    assert set(cells) == {"onnxrt-cpu fp32 b1", "onnxrt-cpu fp32 b8", "openvino-cpu bf16 b1"}
    assert cells["onnxrt-cpu fp32 b8"]["ratio"] == 1.4
    assert cells["onnxrt-cpu fp32 b8"]["spread"] == pytest.approx([1.38, 1.43])
    assert cl_run.latency_cells(measured, "absent") == {}
    rows = {"mlp-0.33": {**_row(1.18, 0.80, 0.48, 0.82), "latency": cells}}
    result = _result(cl_run, rows)
    result["latency"] = {"measured": True, "note": "15 rounds"}
    md = cl_run.markdown(result)
    line = next(ln for ln in md.splitlines() if ln.startswith("| mlp-0.33"))
    assert "| 1.25 [1.23, 1.28] | 1.40 [1.38, 1.43] | 1.10 [1.08, 1.13] | - |" in line  # OV BF16 b8 not measured
    assert "Latency: median ratio to the single model [spread], 15 rounds." in md


def test_measure_latency_passes_the_rows_and_the_deep_ensemble(cl_run, tmp_path, monkeypatch):
    """measure gets every row's model, the deep ensemble as a list of members, the recipe's bench settings."""
    import torch

    from toolchain.stages import common

    calls = {}

    def stub(models, single, feed, **kw):
        calls.update(models=models, single=single, feed=feed, **kw)
        return {"models": {n: {"onnxrt-cpu:fp32": {"1": {"ratio": {"median": 2.0, "p10": 1.9, "p90": 2.1}}}}
                           for n in models},
                "engines": {"onnxrt-cpu:fp32": {"status": "ok"},
                            "openvino-cpu:bf16": {"status": "unavailable", "reason": "no AVX-512 BF16"}}}

    class Adapter:
        input_names = ("input_ids", "attention_mask")
        model = torch.nn.Linear(2, 2)

    monkeypatch.setitem(sys.modules, "cost_levers_latency", SimpleNamespace(measure=stub))
    monkeypatch.setattr(common, "baseline_models", lambda ctx: (Adapter(), [Adapter(), Adapter()], None, {}))
    monkeypatch.setattr(common, "example_feed", lambda ctx, b, s: {"input_ids": torch.zeros(b, s, dtype=torch.long)})
    bench = SimpleNamespace(warmup=3, rounds=15, threads=2)
    ctx = SimpleNamespace(recipe=SimpleNamespace(bench=bench), root=tmp_path)
    out = cl_run.measure_latency(ctx, {"mlp-0.33": torch.nn.Identity()}, 64)
    assert list(calls["models"]) == ["mlp-0.33", "deep-ensemble"] and len(calls["models"]["deep-ensemble"]) == 2
    assert calls["seq"] == 64 and tuple(calls["batches"]) == (1, 8) and calls["rounds"] == 15
    assert calls["threads"] == 2 and calls["work"] == tmp_path / "cost_levers"
    assert calls["feed"]["input_ids"].shape == (2, 64)
    assert out["cells"]["deep-ensemble"]["onnxrt-cpu fp32 b1"]["ratio"] == 2.0
    assert "openvino-cpu:bf16: unavailable (no AVX-512 BF16)" in out["note"]


def test_every_row_is_a_valid_variant_of_the_recipe_and_its_quick_profile(cl_run):
    from toolchain.recipe import CompareEntry, load_recipe

    rows = cl_run.sibling("rows").ROWS
    for profile in (None, "quick"):
        recipe = load_recipe(ROOT / "recipes" / "minilm-tweets.yaml", profile=profile)
        for name, over in rows.items():
            variant = recipe.variant(CompareEntry(name=name, **over))
            assert variant.pruning.fork == over["pruning"]["fork"], name
            assert variant.pruning.mlp_core == over["pruning"]["mlp_core"], name
            assert variant.pruning.ratio == over["pruning"].get("ratio", recipe.pruning.ratio), name
            assert variant.pruning.mlp_share == over["pruning"]["mlp_share"], name  # whatever the recipe's own is
            assert (variant.fusion.mlp == "grouped") == (over["pruning"]["mlp_share"] is not None), name
    # and as the recipe's own compare entries, where the recipe-level checks (slices need the grouped MLP) run
    import yaml

    from toolchain.recipe import parse_recipe

    data = yaml.safe_load((ROOT / "recipes" / "minilm-tweets.yaml").read_text())
    data["compare"] = [{"name": name, **over} for name, over in rows.items()]
    assert [e.name for e in parse_recipe(data, "minilm-tweets.yaml").compare] == list(rows)


def test_an_unknown_row_is_refused_before_any_stage_runs(cl_run, tmp_path, capsys):
    code = cl_run.main(["--only", "averaged,nope", "--artifacts", str(tmp_path / "a"), "--out", str(tmp_path / "o")])
    assert code == 2
    assert "nope" in capsys.readouterr().err
    assert not (tmp_path / "a").exists() and not (tmp_path / "o").exists()


def test_the_command_line_is_written_as_typed(cl_run):
    args = cl_run.parse_args(["--profile", "quick", "--only", "averaged,fork-2", "--no-latency"])
    assert cl_run.args_text(args) == ("python benchmarks/cost_levers/run.py --profile quick --only averaged,fork-2 "
                                      "--no-latency")


def test_the_default_recipe_is_the_row_the_committed_selection_picked(cl_run):
    """Issue 45: the default recipe follows the cost rule's pick (``results.json``'s verdict): its prune, fuse
    and evaluate stages have the selected row's cache keys, so it *is* that row, not a look-alike."""
    from toolchain.pipeline import Context
    from toolchain.recipe import CompareEntry, load_recipe
    from toolchain.stages import VARIANT_STAGES, VariantContext

    result = json.loads((ROOT / "benchmarks" / "cost_levers" / "results.json").read_text())
    selected = result["verdict"]["selected"]
    assert selected in cl_run.sibling("rows").ROWS and result["profile"] is None
    recipe = load_recipe(ROOT / "recipes" / "minilm-tweets.yaml")
    ctx = Context(recipe=recipe)
    row = VariantContext(ctx, recipe.variant(CompareEntry(name=selected, **cl_run.sibling("rows").ROWS[selected])))
    assert {st: row.key(st) for st in VARIANT_STAGES} == {st: ctx.key(st) for st in VARIANT_STAGES}, selected
    # the committed validation numbers are this recipe's: the row's recorded keys are today's
    assert result["rows"][selected]["keys"] == {st: ctx.key(st) for st in VARIANT_STAGES}
    rows = cl_run.sibling("rows").ROWS
    for other in rows:  # and no other row is the recipe
        if other != selected:
            alt = VariantContext(ctx, recipe.variant(CompareEntry(name=other, **rows[other])))
            assert {st: alt.key(st) for st in VARIANT_STAGES} != {st: ctx.key(st) for st in VARIANT_STAGES}, other
