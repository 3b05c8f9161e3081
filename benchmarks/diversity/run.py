"""Member diversity strategies at M = 3, and head budgets, on a recipe's data (default: the default recipe's).

Tweets in distribution, BBC News as OOD; the base classifier and the equal-budget deep ensemble are
the recipe's own stages (``artifacts/<recipe>/{finetune,ensemble}``: every deep-ensemble member is
trained exactly as the single model, only the seed differs). Each strategy is a ``compare`` variant of
the recipe (see ``toolchain/recipe.py``): its prune, fuse and evaluate stages are cached under
``artifacts/<recipe>/variants/<name>/`` and shared with the recipe's run.

Selection (``rule.py``, fixed before the run and written into the results header) compares every
candidate with what a user would deploy instead, the single model and the equal-budget deep ensemble,
on validation data only: ``val`` rows and the ``ood_val`` rows that no scoring saw
(``toolchain.stages.common.selection_ood_rows``), all disjoint from the test splits and from the
near-OOD rows. Eligible: validation accuracy at most half a point below the single model's; selected: the
highest ``U = AUROC(MSP) - NLL``. The ensemble gain over a strategy's own members is reported as a
diagnostic only. The tables report the test splits (far OOD, near OOD) beside the validation numbers.

    python benchmarks/diversity/run.py                                         # text (hours on 2 cores, see below)
    python benchmarks/diversity/run.py --recipe recipes/vit-fashion-mnist.yaml --out benchmarks/diversity/vit
    python benchmarks/diversity/run.py --profile quick                         # smoke run on the quick profile

Time on 2 idle cores (text, commits 987574f and e521320): 4,559 s for its 19 rows after the default run had
trained the base stages (1,770 s of that run), so 1 h 45 min from an empty cache; ``SKIP`` lists the rows the
text recipe leaves out. ``--carry results.json`` keeps rows whose stage keys did not change.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent

#: the scoring every non-circuit strategy uses, spelled out so the table does not move with the
#: default recipe's own choice (HIES on 128 calibration tweets)
HIES = {"criterion": "hies", "objective": "loss", "calib_samples": 128}
#: the circuit search with the OOD-AUROC objective (calibration tweets + the first ood_val rows)
CIRCUIT = {"criterion": "circuit", "objective": "ood_auroc"}

#: no recovery fine-tune, spelled out so the table does not move with the default recipe's own choice
NO_RECOVERY = {"recovery": {"steps": 0, "distill": 0.0}}
#: recovery: 100 fine-tuning steps per pruned member (its own seed, data order and bootstrap of the training
#: split) before fusion; 3 x 100 steps, half of what the deep ensemble's two extra members train
RECOVERY = {"recovery": {"steps": 100, "bootstrap": True, "distill": 0.0}}

#: the fusion every row uses unless its name says otherwise (the paper's: averaged MLP, per-member LayerNorm, no
#: end-to-end recovery, no temperature), spelled out so the table does not move with the recipe's own fusion
FUSION = {"mlp": "average", "layernorm": "grouped", "temperature": False, "recovery_steps": 0}

#: the strategies compared (name -> recipe overrides); every one keeps the default recipe's budget
STRATEGIES: dict[str, dict] = {
    "bootstrap-hies": {"scoring": HIES, "pruning": {"strategy": "bootstrap", **NO_RECOVERY}},
    "seeds-random": {"scoring": {**HIES, "criterion": "random"}, "pruning": {"strategy": "seeds", **NO_RECOVERY}},
    "partition-core0": {"scoring": HIES, "pruning": {"strategy": "partition", "core": 0, **NO_RECOVERY}},
    "partition-core2": {"scoring": HIES, "pruning": {"strategy": "partition", "core": 2, **NO_RECOVERY}},
    "partition-core4": {"scoring": HIES, "pruning": {"strategy": "partition", "core": 4, **NO_RECOVERY}},
    "sampled-t0.5": {"scoring": HIES, "pruning": {"strategy": "sampled", "temperature": 0.5, **NO_RECOVERY}},
    "sampled-t1": {"scoring": HIES, "pruning": {"strategy": "sampled", "temperature": 1.0, **NO_RECOVERY}},
    "sampled-t2": {"scoring": HIES, "pruning": {"strategy": "sampled", "temperature": 2.0, **NO_RECOVERY}},
    "mixed-his-taylor-hies": {"scoring": HIES,
                              "pruning": {"strategy": "mixed-criteria", "criteria": ["his", "taylor", "hies"],
                                          **NO_RECOVERY}},
    "circuit-samples": {"scoring": {**CIRCUIT, "calib_samples": 64},
                        "pruning": {"strategy": "circuit-samples", **NO_RECOVERY}},
    "circuit-samples-32": {"scoring": {**CIRCUIT, "calib_samples": 32},
                           "pruning": {"strategy": "circuit-samples", **NO_RECOVERY}},
    "partition-core0-recovery": {"scoring": HIES, "pruning": {"strategy": "partition", "core": 0, **RECOVERY}},
    "circuit-samples-recovery": {"scoring": {**CIRCUIT, "calib_samples": 64},
                                 "pruning": {"strategy": "circuit-samples", **RECOVERY}},
}

#: recovery distilled from the fine-tuned model's soft predictions (a teacher term beside the labels)
DISTILL = {"recovery": {"steps": 100, "bootstrap": True, "distill": 0.5, "temperature": 2.0}}
STRATEGIES["partition-core0-distill"] = {"scoring": HIES, "pruning": {"strategy": "partition", "core": 0, **DISTILL}}
STRATEGIES["circuit-samples-distill"] = {"scoring": {**CIRCUIT, "calib_samples": 64},
                                         "pruning": {"strategy": "circuit-samples", **DISTILL}}

#: accuracy levers (issue 33), each one change to ``circuit-samples-distill`` (the previous selection), so a row's
#: difference from it is that lever's cost or gain: fusion (grouped MLP: each member keeps its own MLP, the
#: exact ensemble of the pruned members), head budget, recovery data, circuit objective, calibration
BASE_LEVER = {"scoring": {**CIRCUIT, "calib_samples": 64}, "pruning": {"strategy": "circuit-samples", **DISTILL}}


def _lever(scoring: dict | None = None, recovery: dict | None = None, fusion: dict | None = None,
           **pruning) -> dict:
    """``circuit-samples-distill`` with one lever moved (partial sections merged over it)."""
    return {"scoring": {**BASE_LEVER["scoring"], **(scoring or {})},
            "pruning": {**BASE_LEVER["pruning"], **pruning,
                        "recovery": {**BASE_LEVER["pruning"]["recovery"], **(recovery or {})}},
            "fusion": {**FUSION, **(fusion or {})}}


LEVERS: dict[str, dict] = {
    # what costs accuracy: the averaged MLP (grouped: each member keeps its own), the head budget, the bootstrap
    # resample, the circuit objective (AUROC only; task1 weighs the task NLL in; partition-core0-distill: HIES);
    # the short recovery: fused300 below (longer per-member recovery, steps: 300, was not measured: 20 min a row)
    "circuit-samples-distill-mlp-grouped": _lever(fusion={"mlp": "grouped"}),
    "circuit-samples-distill-prune25": _lever(ratio=0.25),
    "circuit-samples-distill-fulldata": _lever(recovery={"bootstrap": False}),
    "circuit-samples-distill-task1": _lever(scoring={"task_weight": 1.0}),
    # after pruning: post-hoc temperature scaling on validation (folded into the heads), and 300 steps of
    # end-to-end recovery of the fused model (3 x 100 + 300 = 600 steps: what the deep ensemble's two extra
    # members train), also at the smaller head budget
    "circuit-samples-distill-ts": _lever(fusion={"temperature": True}),
    "circuit-samples-distill-fused300": _lever(fusion={"recovery_steps": 300}),
    "circuit-samples-distill-prune25-fused300": _lever(ratio=0.25, fusion={"recovery_steps": 300}),
    # what the members' own recovery adds once the fused model recovers end to end (300 steps, distilled alike):
    # without it the prune stage is the searches alone (about 200 s less of the default run)
    "circuit-samples-distill-fused300-e2e-only": _lever(recovery={"steps": 0}, fusion={"recovery_steps": 300}),
}
STRATEGIES.update(LEVERS)
for _over in STRATEGIES.values():
    _over.setdefault("fusion", dict(FUSION))

#: the member strategies as measured: every member runs the whole MLP, no fork (the cost levers of issue 45, which
#: the default recipe now sets, are benchmarks/cost_levers' rows); at these values every stage key is unchanged
UNSLICED = {"fork": 0, "mlp_share": None, "mlp_core": 0.0}


def _unsliced(over: dict) -> dict:
    """``over`` with :data:`UNSLICED` in its pruning section (a row that sets a lever keeps its own)."""
    return {**over, "pruning": {**UNSLICED, **over.get("pruning", {})}}

#: rows a recipe's run leaves out (``--only NAME`` still runs one): the text recipe's strategies that the selection
#: benchmark of commit c51cd0f measured 7-11 points of validation accuracy below its floor (0.7425) and that no lever
#: row varies (``git show c51cd0f:benchmarks/diversity/results.md``); left out so that the run fits its 2 hours
SKIP: dict[str, dict[str, str]] = {"minilm-tweets": {
    "seeds-random": "validation accuracy 0.6637", "partition-core2": "0.6725", "partition-core4": "0.6725",
    "sampled-t0.5": "0.6538", "sampled-t1": "0.6375", "sampled-t2": "0.6312"}}

#: the head budgets tried beside the recipe's own (fraction of heads each member prunes)
BUDGETS = (0.25, 0.5, 0.75)


def budget_strategies(own_ratio: float | None) -> dict[str, dict]:
    """``partition-core0-recovery`` at the two budgets of :data:`BUDGETS` that are not the recipe's own."""
    return {f"partition-core0-recovery-prune{round(100 * r)}": {
        "scoring": HIES, "pruning": {"strategy": "partition", "core": 0, "ratio": r, **RECOVERY}, "fusion": FUSION}
        for r in BUDGETS if own_ratio is None or abs(r - own_ratio) > 1e-9}


def candidates(own_ratio: float | None) -> dict[str, dict]:
    """Every selectable strategy: :data:`STRATEGIES` and the budget rows (all three when ``own_ratio`` is None)."""
    return {name: _unsliced(over) for name, over in {**STRATEGIES, **budget_strategies(own_ratio)}.items()}


#: shown beside the strategies but not selectable (none at present)
EXTRAS: dict[str, dict] = {}


METRICS = [("accuracy", "acc"), ("nll", "NLL"), ("ece", "ECE"), ("brier", "Brier"), ("auroc_msp", "AUROC MSP"),
           ("aupr_msp", "AUPR MSP"), ("fpr95_msp", "FPR95 MSP"), ("auroc_entropy", "AUROC ent"),
           ("auroc_mi", "AUROC MI")]
GAINS = [("nll", "gain NLL"), ("auroc_msp", "gain AUROC MSP"), ("auroc_entropy", "gain AUROC ent"),
         ("auroc_mi", "gain AUROC MI"), ("ece", "gain ECE")]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--recipe", default=str(ROOT / "recipes" / "minilm-tweets.yaml"))
    p.add_argument("--profile", default=None, help="recipe profile, e.g. quick (smoke run)")
    p.add_argument("--only", default=None, help="comma-separated strategy names (default: all)")
    p.add_argument("--acc-slack", type=float, default=None,
                   help="selection rule: validation accuracy at most this far below the single model's "
                   "(default: rule.SLACK, 0.005)")
    p.add_argument("--out", default=str(HERE), help="where results.{md,json} and gain_vs_jaccard.png go")
    p.add_argument("--carry", default=None, metavar="RESULTS_JSON",
                   help="a previous run's results.json: its rows whose stage cache keys (recorded since the keys "
                        "field exists) equal today's are carried into this run's tables, marked as such, instead "
                        "of being rerun")
    return p.parse_args(argv)


def _cell(v: float | None, fmt: str = ".4f") -> str:
    return "-" if v is None or v != v else format(v, fmt)


def _args_text(args: argparse.Namespace) -> str:
    """The command-line options that differ from the defaults, as typed."""
    parts = []
    if Path(args.recipe).resolve() != (ROOT / "recipes" / "minilm-tweets.yaml").resolve():
        parts.append(f"--recipe {os.path.relpath(Path(args.recipe).resolve(), ROOT)}")
    if args.profile:
        parts.append(f"--profile {args.profile}")
    if Path(args.out).resolve() != HERE:
        parts.append(f"--out {os.path.relpath(Path(args.out).resolve(), ROOT)}")
    if args.only:
        parts.append(f"--only {args.only}")
    if args.carry:
        parts.append(f"--carry {os.path.relpath(Path(args.carry).resolve(), ROOT)}")
    return "".join(" " + p for p in parts)


def _source_of(path: Path) -> str:
    """How a carried results file is cited: its command, else its path at the commit that last wrote it."""
    import subprocess

    try:
        commit = subprocess.run(["git", "log", "-1", "--format=%h", "--", str(path)], cwd=ROOT, capture_output=True,
                                text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit = ""
    rel = os.path.relpath(path.resolve(), ROOT)
    return f"{rel} at commit {commit}" if commit else rel


def reuse_stages(ctx, sub, console) -> dict[str, str]:
    """Give a strategy the stages of the recipe or of another strategy whose cache key is the same.

    Rows that differ from another only after pruning (fusion, temperature, end-to-end recovery) would
    otherwise repeat the same circuit searches and recovery fine-tunes (~6 minutes each on 2 cores), and a
    row equal to the recipe's own Hydra would repeat its fused recovery (~8 minutes). The key covers every
    input of a stage, so equal keys mean equal outputs (the recipe's evaluate folder holds the baselines
    too, a superset of a variant's); files are hard-linked (stages never write into a published folder)
    into a temporary folder, then renamed into place. Returns ``{stage: source folder}`` of what it reused.
    """
    import os
    import shutil

    from toolchain.artifacts import read_json, record_stage
    from toolchain.stages import VARIANT_STAGES

    def key_of(folder: Path) -> str | None:
        try:
            return read_json(folder / "manifest.json").get("key")
        except (OSError, ValueError):
            return None

    reused: dict[str, str] = {}
    for stage in VARIANT_STAGES:  # in pipeline order: a stage's key covers its upstream's
        target, want = sub.stage_dir(stage), sub.key(stage)
        if key_of(target) == want:
            continue
        for source in [ctx.stage_dir(stage), *sorted(target.parent.parent.glob(f"*/{stage}"))]:
            if source != target and key_of(source) == want:
                tmp = target.with_name(f".{target.name}.reuse")
                shutil.rmtree(tmp, ignore_errors=True)
                shutil.copytree(source, tmp, copy_function=os.link)
                shutil.rmtree(target, ignore_errors=True)
                tmp.rename(target)
                record_stage(target.parent, stage, want, target)  # the row's run index lists it: verify checks it
                reused[stage] = os.path.relpath(source, ctx.root)
                console.print(f"  {stage}: the same key as {reused[stage]}: reused")
                break
    return reused


def plot(rows: dict[str, dict], path: Path) -> None:
    """Ensemble gain (NLL and OOD AUROC, with intervals) against mean pairwise Jaccard of kept heads."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, 4))
    axes = fig.subplots(1, 2)
    for ax, (key, label) in zip(axes, [("nll", "NLL gain"), ("auroc_msp", "OOD AUROC (MSP) gain")], strict=True):
        for name, r in rows.items():
            jac = r.get("jaccard")
            g = r["gain"].get(key) if r.get("gain") else None
            if jac is None or not g:
                continue
            ax.errorbar([jac], [g["gain"]], yerr=[[g["gain"] - g["ci"][0]], [g["ci"][1] - g["gain"]]], fmt="o",
                        capsize=3)
            ax.annotate(name, (jac, g["gain"]), fontsize=7, xytext=(3, 3), textcoords="offset points")
        ax.axhline(0, color="grey", lw=0.8)
        ax.set_xlabel("mean pairwise Jaccard of kept heads")
        ax.set_ylabel(label + " (ensemble - mean member)")
    fig.suptitle("Hydra members: ensemble gain vs head overlap (95% paired-bootstrap intervals)", fontsize=10)
    fig.tight_layout()
    tmp = path.with_name(f".{path.name}.tmp.png")
    fig.savefig(tmp, dpi=110)
    tmp.replace(path)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(HERE))
    from rich.console import Console

    from toolchain.artifacts import atomic_write_json, atomic_write_text, read_json
    from toolchain.pipeline import Context, run_pipeline
    from toolchain.recipe import CompareEntry, load_recipe
    from toolchain.report import gain_cell
    from toolchain.stages import VARIANT_STAGES, VariantContext

    console = Console(stderr=True)
    recipe = load_recipe(args.recipe, profile=args.profile)
    if not recipe.data.ood:
        console.print(f"error: recipe {args.recipe} has no data.ood: the selection rule needs validation OOD "
                      "AUROC (an ood_val split)")
        return 2
    ctx = Context(recipe=recipe, console=console)
    t0 = time.time()
    # the default recipe's own stages (cached when `hydra-toolchain run` has run): base, deep ensemble, its Hydra
    run_pipeline(ctx, only=["load", "finetune", "ensemble", "score", "prune", "fuse", "evaluate"])
    base = read_json(ctx.stage_dir("evaluate") / "metrics.json")
    base_div = read_json(ctx.stage_dir("evaluate") / "diversity.json")
    strategies = candidates(recipe.pruning.ratio)
    every = {**strategies, **EXTRAS}
    base_sel = read_json(ctx.stage_dir("evaluate") / "selection.json")
    base_ood = read_json(ctx.stage_dir("evaluate") / "ood.json") if (ctx.stage_dir("evaluate") / "ood.json").exists() \
        else {}
    skipped = {} if args.only else {n: why for n, why in SKIP.get(recipe.name, {}).items() if n in every}
    names = [n for n in every if n not in skipped] if args.only is None else args.only.split(",")
    unknown = [n for n in names if n not in every]
    if unknown:
        console.print(f"error: --only: unknown strategies {unknown}; known: {sorted(every)}")
        return 2
    rows: dict[str, dict] = {}
    carried_from, previous_rows = None, {}
    if args.carry:  # rows of a previous run whose stage keys are today's: the same inputs, so the same numbers
        previous = read_json(Path(args.carry))
        carried_from = previous.get("command") or _source_of(Path(args.carry))
        previous_rows = previous.get("strategies", {})
    for name in names:
        entry = CompareEntry(name=name, **every[name])
        sub = VariantContext(ctx, recipe.variant(entry))
        keys = {st: sub.key(st) for st in VARIANT_STAGES}
        prev = previous_rows.get(name)
        if prev and prev.get("keys") == keys:
            rows[name] = {**prev, "carried": prev.get("carried") or carried_from, "selectable": name in strategies}
            continue
        console.print(f"[bold]strategy {name}[/bold]")
        reuse_stages(ctx, sub, console)
        run_pipeline(sub, only=VARIANT_STAGES)
        ev = sub.stage_dir("evaluate")
        members = read_json(sub.stage_dir("prune") / "diversity.json")
        div = read_json(ev / "diversity.json").get("hydra", {})
        rows[name] = {
            "overrides": every[name],
            "keys": keys,
            "selectable": name in strategies,
            "ood": read_json(ev / "ood.json") if (ev / "ood.json").exists() else {},
            "metrics": read_json(ev / "metrics.json")["hydra"],
            "members_mean": read_json(ev / "metrics.json")["hydra-members-mean"],
            "selection": read_json(ev / "selection.json"),
            "jaccard": members.get("jaccard", {}).get("overall"),
            "kept_heads": members.get("kept_heads"),
            "disagreement": div.get("disagreement", {}).get("mean"),
            "kl": div.get("kl", {}).get("mean"),
            "gain": div.get("gain", {}),
            "size": read_json(sub.stage_dir("fuse") / "summary.json"),
        }
    from rule import RULE, SLACK, select

    if args.acc_slack is None:
        args.acc_slack = SLACK

    baselines = {b: base_sel[b] for b in ("single", "deep-ensemble") if b in base_sel}
    # a temperature-scaled Hydra against the temperature-scaled baselines (evaluate's selection.json)
    scaled = {b: m for b, m in (base_sel.get("temperature-scaled") or {}).items() if b in baselines}
    calibrated = {n for n, r in rows.items() if (r["overrides"].get("fusion") or {}).get("temperature")}
    if calibrated and set(scaled) != set(baselines):
        console.print("error: temperature-scaled rows need the temperature-scaled baselines in the recipe's "
                      "evaluate/selection.json (rerun the recipe's evaluate stage)")
        return 2
    verdict = select({n: r["selection"]["hydra"] for n, r in rows.items() if r["selectable"] and r.get("selection")},
                     baselines, args.acc_slack, baselines_for={n: scaled for n in calibrated})
    chosen, why = verdict["selected"], verdict["why"]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    def near(ood: dict, variant: str) -> str:
        return _cell((ood.get("near", {}).get("metrics", {}).get(variant) or {}).get("auroc_msp"))

    head = ("| strategy | Jaccard | disagree | KL | " + " | ".join(c for _, c in METRICS) + " | near AUROC MSP | "
            + " | ".join(c for _, c in GAINS) + " | weights MB |")
    lines = [head, "|---|" + "---:|" * (3 + len(METRICS) + 1 + len(GAINS) + 1)]
    fuse = read_json(ctx.stage_dir("fuse") / "summary.json")
    single_mb = fuse["weight_bytes"]["single"] / 1e6
    de_gain = base_div.get("deep-ensemble", {})
    lines.append("| single model | - | - | - | " + " | ".join(_cell(base["single"].get(k)) for k, _ in METRICS)
                 + f" | {near(base_ood, 'single')} | " + " | ".join("-" for _ in GAINS) + f" | {single_mb:.1f} |")
    lines.append("| deep ensemble (equal budget) | - | " + _cell(de_gain.get("disagreement", {}).get("mean"), ".3f")
                 + " | " + _cell(de_gain.get("kl", {}).get("mean")) + " | "
                 + " | ".join(_cell(base["deep-ensemble"].get(k)) for k, _ in METRICS)
                 + f" | {near(base_ood, 'deep-ensemble')} | "
                 + " | ".join(gain_cell(de_gain.get("gain", {}).get(k)) for k, _ in GAINS)
                 + f" | {fuse['weight_bytes']['deep_ensemble'] / 1e6:.1f} |")
    for name, r in rows.items():
        mark = " (selected)" if name == chosen else "" if r["selectable"] else " (extra training, not selectable)"
        mark += " (carried)" if r.get("carried") else ""
        lines.append(f"| {name}{mark} | {_cell(r['jaccard'], '.3f')} | {_cell(r['disagreement'], '.3f')} | "
                     f"{_cell(r['kl'])} | " + " | ".join(_cell(r["metrics"].get(k)) for k, _ in METRICS)
                     + f" | {near(r['ood'], 'hydra')} | " + " | ".join(gain_cell(r["gain"].get(k)) for k, _ in GAINS)
                     + f" | {r['size']['weight_bytes']['hydra'] / 1e6:.1f} |")
    vlines = ["| strategy | val acc | val NLL | val AUROC MSP | U | U - single | U - deep ensemble | eligible | "
              "members' own: val acc | val NLL | diagnostic: gain over members NLL | gain AUROC MSP |",
              "|---|" + "---:|" * 6 + "---|" + "---:|" * 4]
    for b, m in baselines.items():
        vlines.append(f"| {b} (baseline) | {_cell(m.get('accuracy'))} | {_cell(m.get('nll'))} | "
                      f"{_cell(m.get('auroc_msp'))} | {_cell(verdict['baseline_utility'][b])} | - | - | - | - | - "
                      "| - | - |")
    for b, m in scaled.items():
        vlines.append(f"| {b}, temperature-scaled (baseline of -ts rows; T {m['temperature']:.3f}) | "
                      f"{_cell(m.get('accuracy'))} | {_cell(m.get('nll'))} | {_cell(m.get('auroc_msp'))} | "
                      f"{_cell(m.get('auroc_msp', 0) - m.get('nll', 0))} | - | - | - | - | - | - | - |")
    for name, r in rows.items():
        sel = r.get("selection") or {}
        h, g = sel.get("hydra") or {}, sel.get("gain") or {}
        mg = verdict["margins"].get(name, {})
        ok = "yes" if name in verdict["eligible"] else "no" if r["selectable"] else "(not selectable)"
        mm = sel.get("hydra-members-mean") or {}
        vlines.append(f"| {name}{' (carried)' if r.get('carried') else ''} | {_cell(h.get('accuracy'))} | "
                      f"{_cell(h.get('nll'))} | {_cell(h.get('auroc_msp'))} | "
                      f"{_cell(verdict['utility'].get(name))} | {_cell(mg.get('single'), '+.4f')} | "
                      f"{_cell(mg.get('deep-ensemble'), '+.4f')} | {ok} | {_cell(mm.get('accuracy'))} | "
                      f"{_cell(mm.get('nll'))} | {gain_cell(g.get('nll'))} | {gain_cell(g.get('auroc_msp'))} |")
    rows_seen = {n: r["selection"].get("ood_val_rows_seen_by_scoring", 0) for n, r in rows.items()
                 if r.get("selection")}
    ood_rows = next((r["selection"].get("ood_val_rows") for r in rows.values() if r.get("selection")), None)
    plot(rows, out / "gain_vs_jaccard.png")
    bench = ctx.stage_dir("bench") / "latency.json"
    latency_note = ""
    if bench.exists():
        from toolchain.report import bench_latency

        lat, label = bench_latency(read_json(bench), fuse.get("lowering", "conv"))
        latency_note = ("Latency of the recipe's own graphs (bench stage, " + label + "; its Hydra: "
                        + (f"MLP share {recipe.pruning.mlp_share}, fork {recipe.pruning.fork}"
                           if recipe.pruning.mlp_share or recipe.pruning.fork else "these rows' averaged MLP")
                        + "): "
                        + ", ".join(f"{k} {v:.2f} ms" for k, v in lat.items())
                        + ". The fused size differs by head budget (prune25/75 rows) and by the zero-head padding "
                        "of layers where members keep unequal counts (weights MB column).")
    md = "\n".join([
        f"# Member diversity strategies ({recipe.name}, M = {recipe.pruning.members}, "
        f"{recipe.pruning.keep_rule()} unless a row's name says prune25/50/75, scope {recipe.pruning.scope}; "
        "recovery fine-tuning only in -recovery and -distill rows)",
        "",
        f"**Selection rule** (fixed before the run; validation data only): {RULE.format(slack=args.acc_slack)}. "
        "Inputs: validation accuracy, NLL and OOD AUROC (MSP) of every candidate and of both baselines, below.",
        "",
        f"Test splits: {recipe.data.id} (ID test), {recipe.data.ood} (far-OOD test, disjoint from the OOD "
        "validation set) and, where the recipe has one, the near-OOD rows held out of the ID data "
        "(`data.near_ood`; no stage but evaluate sees them). Gain = ensemble "
        "minus its mean member (positive = better), 95% paired-bootstrap interval, `*` where it excludes 0; the MI "
        "gain compares the ensemble's MI AUROC with the members' mean MSP AUROC. Jaccard: mean pairwise overlap "
        "of kept heads; disagree: mean fraction of test samples where a member's prediction differs from the "
        "ensemble's; KL: mean pairwise KL between members' predictive distributions.",
        "",
        *lines,
        "",
        f"Validation numbers the selection uses ({recipe.data.id} `val`; {recipe.data.ood} `ood_val` rows "
        + (f"{ood_rows[0]}-{ood_rows[1] - 1}" if ood_rows else "-") + ", which no scoring saw"
        + ("" if not any(rows_seen.values()) else
           " except " + ", ".join(f"{n}: {k} rows" for n, k in rows_seen.items() if k)) + "):",
        "",
        *vlines,
        "",
        f"Selected on validation data: **{chosen or 'none (deploy the single model)'}**: {why}.",
        "",
        ("Rows marked (carried) were not rerun: their stages' cache keys are those of "
         + ", ".join(sorted({r["carried"] for r in rows.values() if r.get("carried")}))
         + ", so their inputs and numbers are the same." if any(r.get("carried") for r in rows.values()) else ""),
        "",
        ("Not run for this recipe (`--only NAME` runs one): " + ", ".join(f"{n} ({why})" for n, why in skipped.items())
         + ", measured by the run of commit c51cd0f (`git show c51cd0f:benchmarks/diversity/results.md`) well "
         "below its accuracy floor (0.7425), varied by no lever row." if skipped else ""),
        "",
        latency_note,
        "",
        f"Command: `python benchmarks/diversity/run.py{_args_text(args)}` "
        f"({time.time() - t0:.0f} s on {platform.node() or 'this machine'}, {os.cpu_count()} CPUs; cached "
        "stages are reused).",
        "",
        "![gain vs Jaccard](gain_vs_jaccard.png)",
        "",
    ])
    atomic_write_text(out / "results.md", md)
    command = f"python benchmarks/diversity/run.py{_args_text(args)} ({time.strftime('%Y-%m-%d')})"
    atomic_write_json(out / "results.json", {"recipe": recipe.name, "selected": chosen, "why": why,
                                              "command": command,
                                              "rule": RULE.format(slack=args.acc_slack), "verdict": verdict,
                                              "baselines_validation": baselines,
                                              "single": base["single"], "deep_ensemble": base["deep-ensemble"],
                                              "deep_ensemble_diversity": de_gain, "strategies": rows})
    print(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
