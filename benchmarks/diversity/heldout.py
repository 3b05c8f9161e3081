"""A recipe's Hydra, deep ensemble and single model, measured again on held-out rows.

The recipes' test splits (1,000 tweets and 500 BBC News articles; 2,000 Fashion-MNIST and 1,000
digits images) resolve an OOD-AUROC difference to about +-0.01, about the size of the differences
being measured. This script evaluates a recipe's own models - the cached stages of
``hydra-toolchain run``: the fine-tuned model (= deep-ensemble member 0), the deep ensemble and
the fused Hydra - on rows that no split of the recipe uses, for every shift kind the recipe has:

* in distribution: up to ``--id-rows`` rows of the ID data set after the recipe's splits;
* far OOD: every row of the OOD data set after the recipe's OOD splits;
* near OOD (recipes with ``data.near_ood``): up to ``--near-rows`` of the held-out classes' or
  matched rows that the recipe's ``near_ood_test`` rows leave, in a seeded order.

Every held-out row whose text (whitespace-normalised) or image bytes also appear in a recipe split
of its data set or earlier in its held-out part is dropped (the data sets hold duplicates;
:func:`toolchain.data.overlap.row_keys`). The ID and far-OOD rows are carved by the recipe's own
seeded splitter as one more split after the recipe's, so the recipe's splits come out unchanged
(checked). Reported: each model's metrics, Hydra minus single and minus deep ensemble with 95%
paired-bootstrap intervals (ID accuracy, NLL, ECE, Brier; far and near OOD AUROC on MSP, entropy
and MI; the evaluate stage's functions), and each ensemble's gain over its own members.

Nothing here selects or tunes anything: the member strategy was chosen on validation data by
``run.py`` (``run.py --recipe recipes/vit-fashion-mnist.yaml`` for images) before this ran, and
the stages' cache keys are checked against the recipe.

    hydra-toolchain run recipes/minilm-tweets.yaml      # first (or reuse its artifacts)
    python benchmarks/diversity/heldout.py               # -> results-heldout.{md,json} here
    python benchmarks/diversity/heldout.py --recipe recipes/vit-fashion-mnist.yaml --out benchmarks/diversity/vit
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(ROOT))

ID_SPLITS = ("train", "val", "calib", "test")
OOD_SPLITS = ("ood_val", "ood_test")
GAIN_KEYS = [("nll", "NLL"), ("auroc_msp", "AUROC MSP"), ("auroc_entropy", "AUROC ent"), ("auroc_mi", "AUROC MI"),
             ("ece", "ECE")]
METRIC_KEYS = [("accuracy", "acc"), ("nll", "NLL"), ("ece", "ECE"), ("brier", "Brier"), ("auroc_msp", "AUROC MSP"),
               ("aupr_msp", "AUPR MSP"), ("fpr95_msp", "FPR95 MSP"), ("auroc_mi", "AUROC MI")]
ID_DIFF_KEYS = [("accuracy", "acc"), ("nll", "NLL"), ("ece", "ECE"), ("brier", "Brier")]
OOD_DIFF_KEYS = [("auroc_msp", "AUROC MSP"), ("auroc_entropy", "AUROC entropy"), ("auroc_mi", "AUROC MI")]
#: held-out part -> the evaluate stage's split name (so :func:`toolchain.stages.evaluate.ood_report` reads it)
AS_SPLIT = {"heldout": "test", "ood_heldout": "ood_test", "near_ood_heldout": "near_ood_test"}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--recipe", default=str(ROOT / "recipes" / "minilm-tweets.yaml"))
    p.add_argument("--profile", default=None, help="recipe profile, e.g. quick (smoke run)")
    p.add_argument("--id-rows", type=int, default=10_000, help="held-out in-distribution rows (at most)")
    p.add_argument("--near-rows", type=int, default=10_000, help="held-out near-OOD rows (at most)")
    p.add_argument("--out", default=str(HERE), help="where results-heldout.{md,json} go")
    return p.parse_args(argv)


def _fresh_rows(keys: list[Any], taken: set[Any], order: Any = None,
                limit: int | None = None) -> tuple[list[int], int]:
    """Indices of the rows whose key is not in ``taken`` nor earlier; and how many were dropped.

    ``keys``: one per row, :func:`toolchain.data.overlap.row_keys` (normalised text, image hash).
    ``order``: the order to visit rows in (default: as stored); ``limit``: stop after this many
    kept rows (the dropped count covers the rows visited). The kept indices come back sorted.
    """
    keep, seen, visited = [], set(taken), 0
    for i in (range(len(keys)) if order is None else order):
        if limit is not None and len(keep) >= limit:
            break
        visited += 1
        if keys[i] not in seen:
            keep.append(int(i))
            seen.add(keys[i])
    return sorted(keep), visited - len(keep)


def heldout_splits(ctx: Any, id_rows: int, near_rows: int | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """``({"heldout": id, "ood_heldout": far[, "near_ood_heldout": near]}, info)``: rows no recipe split uses.

    ID and far-OOD rows are the recipe splitter's next split (:func:`toolchain.data.batching.carve`),
    so the recipe's splits are reproduced exactly (a mismatch raises ``RuntimeError``); near-OOD rows
    are those of :func:`toolchain.data.batching.near_ood_rows` that ``near_ood_test`` left. ID rows
    are deduplicated against the ID splits, far-OOD rows against the OOD splits, near-OOD rows against
    every recipe split and ``near_ood_test`` (rows repeating a ``near_ood_test`` row are left out
    before counting duplicates); each part against itself.
    """
    import numpy as np

    from toolchain.data.batching import carve, near_ood_rows
    from toolchain.data.overlap import row_keys

    r = ctx.recipe
    if not r.data.ood:
        raise SystemExit(f"recipe {r.name}: no data.ood, so there is no OOD gain to measure")
    parts, info = {}, {}
    taken: set[Any] = set()
    for which, splits, extra, limit in [("id", ID_SPLITS, "heldout", id_rows),
                                        ("ood", OOD_SPLITS, "ood_heldout", None)]:
        data, again = carve(r.data, r.seed, which, {extra: limit})
        own = [s for s in splits if s in ctx.data]
        for s in own:
            if list(row_keys(again[s])) != list(row_keys(ctx.data[s])):
                raise RuntimeError(f"split '{s}' of '{data.name}' did not come out as the recipe's")
        mine = {k for s in own for k in row_keys(ctx.data[s])}
        taken |= mine
        keep, dropped = _fresh_rows(list(row_keys(again[extra])), mine)
        parts[extra] = again[extra].subset(keep)
        info[extra] = {"data": data.name, "rows": len(keep), "dropped_duplicates": dropped,
                       "left_after_splits": len(data) - sum(len(ctx.data[s]) for s in own)}
    if r.data.near_ood is not None and "near_ood_test" in ctx.data:
        held = near_ood_rows(r.data)
        used = set(row_keys(ctx.data["near_ood_test"]))
        taken |= used
        keys = list(row_keys(held))  # the rows near_ood_test took are neither held-out rows nor duplicates
        order = [int(i) for i in np.random.default_rng(r.seed + 3).permutation(len(held)) if keys[i] not in used]
        keep, dropped = _fresh_rows(keys, taken, order=order, limit=near_rows)
        if keep:
            parts["near_ood_heldout"] = held.subset(keep)
            info["near_ood_heldout"] = {"data": held.name, "rows": len(keep), "dropped_duplicates": dropped,
                                        "left_after_splits": len(order)}
    return parts, info


def stage_folder(ctx: Any, name: str) -> Path:
    """The folder holding stage ``name`` for this recipe: its own, or a compare variant's with the same key."""
    from toolchain.artifacts import read_json

    want = ctx.key(name)
    for cand in [ctx.stage_dir(name), *sorted((ctx.root / "variants").glob(f"*/{name}"))]:
        man = cand / "manifest.json"
        if man.is_file() and read_json(man).get("key") == want:
            return cand
    raise SystemExit(f"no '{name}' stage with key {want} under {ctx.root}: run `hydra-toolchain run` "
                     "on this recipe first (or benchmarks/diversity/run.py, whose variants it also finds)")


def _cell(v: float | None) -> str:
    return "-" if v is None or v != v else f"{v:.4f}"


def _rows_line(info: dict[str, Any]) -> str:
    names = {"heldout": "in distribution", "ood_heldout": "far OOD", "near_ood_heldout": "near OOD"}
    return "; ".join(f"{names[k]}: {v['rows']:,} rows of `{v['data']}` ({v['dropped_duplicates']} dropped as "
                     "duplicates of a recipe split's row or of an earlier held-out row)" for k, v in info.items())


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import numpy as np
    from rich.console import Console

    from toolchain.artifacts import atomic_write_json, atomic_write_text, read_json
    from toolchain.hydra.fuse import load_hydra
    from toolchain.inference import module_outputs
    from toolchain.metrics import ensemble_probs, uq_report
    from toolchain.metrics.gain import paired_difference
    from toolchain.models.wrappers import SingleModel
    from toolchain.pipeline import Context
    from toolchain.pruning.diversity import ensemble_diversity
    from toolchain.recipe import load_recipe
    from toolchain.report import diff_cell, gain_cell
    from toolchain.stages import load_stage_model
    from toolchain.stages.evaluate import OOD_SETS, ood_report

    console = Console(stderr=True)
    recipe = load_recipe(args.recipe, profile=args.profile)
    ctx = Context(recipe=recipe, console=console)
    t0 = time.time()
    folders = {n: stage_folder(ctx, n) for n in ("finetune", "ensemble", "fuse", "evaluate")}
    parts, info = heldout_splits(ctx, args.id_rows, args.near_rows)
    console.print(f"held-out rows: {info}")
    labels = np.asarray(parts["heldout"].labels)
    _m, base, tok = load_stage_model(ctx, folders["finetune"] / "model")
    names = list(base.input_names)

    def run(model: Any, what: str) -> dict[str, dict[str, np.ndarray]]:
        t = time.time()
        out = {AS_SPLIT[k]: module_outputs(ctx, model, part, tok, names) for k, part in parts.items()}
        console.print(f"  {what}: {sum(len(p) for p in parts.values())} rows in {time.time() - t:.0f} s")
        return out

    de = []
    for i in range(recipe.pruning.members):
        _m, member, _t = load_stage_model(ctx, folders["ensemble"] / f"member{i}")
        de.append(run(SingleModel(member), f"deep-ensemble member {i}"))
    hyd = run(load_hydra(folders["fuse"] / "hydra"), "hydra")
    splits = list(hyd)
    de_logits = {s: np.stack([m[s]["logits"] for m in de], 1) for s in splits}
    outs = {  # variant -> split -> outputs, as the evaluate stage holds them
        "single": de[0],  # member 0 is the fine-tuned single model (the ensemble stage's convention)
        "deep-ensemble": {s: {"probs": ensemble_probs(de_logits[s]), "member_logits": de_logits[s]} for s in splits},
        "hydra": hyd,
    }
    metrics = {
        n: uq_report(o["test"]["probs"], labels, probs_ood=o["ood_test"]["probs"],
                     **({"member_logits_id": o["test"]["member_logits"],
                         "member_logits_ood": o["ood_test"]["member_logits"]} if "member_logits" in o["test"] else {}))
        for n, o in outs.items()
    }
    ood = ood_report(outs, labels, recipe.seed, several=True)
    id_diff = {f"hydra-minus-{b}": paired_difference(hyd["test"]["probs"], outs[b]["test"]["probs"], labels,
                                                     seed=recipe.seed)
               for b in ("single", "deep-ensemble")}
    diversity = {n: ensemble_diversity(outs[n]["test"]["member_logits"], labels, outs[n]["ood_test"]["member_logits"],
                                       seed=recipe.seed)
                 for n in ("deep-ensemble", "hydra")}
    on_test = read_json(folders["evaluate"] / "diversity.json")
    seconds = time.time() - t0
    result = {"recipe": recipe.name, "rows": info, "metrics": metrics, "ood": ood, "id_differences": id_diff,
              "gain": {k: v["gain"] for k, v in diversity.items()},
              "disagreement": {k: v["disagreement"]["mean"] for k, v in diversity.items()},
              "gain_on_test_split": {k: v["gain"] for k, v in on_test.items()},
              "stages": {k: str(v.relative_to(ctx.root)) for k, v in folders.items()}, "seconds": seconds}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out / "results-heldout.json", result)

    lines = [f"# {recipe.name}: single model, deep ensemble and Hydra on held-out rows no recipe split uses", "",
             _rows_line(info) + ". Models: the recipe's cached stages ("
             + ", ".join(f"`{v}`" for v in result["stages"].values()) + ").", "",
             "In distribution and far OOD:", "",
             "| model | " + " | ".join(c for _, c in METRIC_KEYS) + " |",
             "|---|" + "---:|" * len(METRIC_KEYS)]
    lines += [f"| {n} | " + " | ".join(_cell(m.get(k)) for k, _ in METRIC_KEYS) + " |" for n, m in metrics.items()]
    lines += ["", "Hydra minus each baseline on the same rows, 95% paired-bootstrap interval (`*` excludes 0; "
              "accuracy and AUROC: positive = Hydra better; NLL, ECE, Brier: negative = Hydra better).", "",
              "| shift | difference | " + " | ".join(c for _, c in ID_DIFF_KEYS) + " |",
              "|---|---|" + "---:|" * len(ID_DIFF_KEYS)]
    lines += [f"| in distribution | {k} | " + " | ".join(diff_cell(d.get(m)) for m, _ in ID_DIFF_KEYS) + " |"
              for k, d in id_diff.items()]
    lines += ["", "| shift | rows | difference | " + " | ".join(c for _, c in OOD_DIFF_KEYS) + " |",
              "|---|---:|---|" + "---:|" * len(OOD_DIFF_KEYS)]
    for kind in OOD_SETS:
        if kind not in ood:
            continue
        for k, d in ood[kind]["differences"].items():
            lines.append(f"| {kind} OOD | {ood[kind]['rows']:,} | {k} | "
                         + " | ".join(diff_cell(d.get(m)) for m, _ in OOD_DIFF_KEYS) + " |")
    lines += ["", "| shift | " + " | ".join(f"{n} AUROC MSP" for n in outs) + " |", "|---|" + "---:|" * len(outs)]
    for kind in OOD_SETS:
        if kind in ood:
            lines.append(f"| {kind} OOD | " + " | ".join(_cell(ood[kind]["metrics"][n].get("auroc_msp"))
                                                        for n in outs) + " |")
    lines += ["", "Ensemble gain (ensemble minus its mean member, positive = better; 95% paired-bootstrap interval, "
              "`*` excludes 0; far OOD). The MI gain compares the ensemble's MI AUROC with the members' mean MSP "
              "AUROC.", "",
              "| ensemble | rows | disagree | " + " | ".join(c for _, c in GAIN_KEYS) + " |",
              "|---|---|---:|" + "---:|" * len(GAIN_KEYS)]
    for n in diversity:
        lines.append(f"| {n} | held-out | {result['disagreement'][n]:.3f} | "
                     + " | ".join(gain_cell(result["gain"][n].get(k)) for k, _ in GAIN_KEYS) + " |")
        if n in on_test:
            lines.append(f"| {n} | recipe test split | {on_test[n]['disagreement']['mean']:.3f} | "
                         + " | ".join(gain_cell(on_test[n]["gain"].get(k)) for k, _ in GAIN_KEYS) + " |")
    command = " ".join(["python benchmarks/diversity/heldout.py", *(argv if argv is not None else sys.argv[1:])])
    lines += ["", f"Command: `{command}` ({seconds:.0f} s on {platform.node() or 'this'} machine, "
              f"{os.cpu_count()} CPUs).", ""]
    atomic_write_text(out / "results-heldout.md", "\n".join(lines))
    console.print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
