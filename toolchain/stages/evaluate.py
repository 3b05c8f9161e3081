"""Stage ``evaluate``: UQ metrics of the single model, the deep ensemble and Hydra (PyTorch)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from toolchain.artifacts import atomic_write_json, read_json
from toolchain.inference import module_outputs
from toolchain.metrics.registry import view_keys
from toolchain.pipeline import Context, stage
from toolchain.pruning.diversity import ensemble_diversity
from toolchain.recipe import EVALUATION_FIELDS
from toolchain.stages.common import (
    VariantContext,
    baseline_models,
    circuit_sees_ood,
    load_stage_model,
    selection_ood_rows,
)


def _outputs(ctx: Context, module: Any, splits: list[str], tok: Any, names: list[str]) -> dict[str, dict]:
    """A module's outputs on each split; of ``ood_val`` only the rows model selection uses (selection_ood_rows)."""
    out = {s: module_outputs(ctx, module, s, tok, names) for s in splits if s != "ood_val"}
    if "ood_val" in splits:
        part = ctx.data["ood_val"]
        out["ood_val"] = module_outputs(ctx, module, part.subset(list(range(*selection_ood_rows(len(part))))),
                                        tok, names)
    return out


#: OOD sets of ``ood.json``: far (``data.ood``) and near (``data.near_ood``, held out of the ID data)
OOD_SETS = {"far": "ood_test", "near": "near_ood_test"}


def ood_report(outs: dict[str, dict[str, dict[str, np.ndarray]]], labels: np.ndarray, seed: int,
                several: bool) -> dict[str, Any]:
    """Detection of each OOD set by every variant, and Hydra minus each baseline with paired-bootstrap intervals.

    ``outs``: variant -> split -> ``{"probs"[, "member_logits"]}``. Metrics: AUROC, AUPR and FPR95
    on MSP and entropy (and MI, disagreement for ensembles); differences: AUROC on MSP, entropy and
    (ensembles) MI, resampling ID test rows and OOD rows.
    """
    from toolchain.metrics import uq_report
    from toolchain.metrics.gain import paired_auroc_difference
    from toolchain.metrics.scores import entropy_score, msp_score, mutual_information

    report: dict[str, Any] = {}
    for kind, split in OOD_SETS.items():
        if split not in outs["hydra"]:
            continue
        metrics, scores = {}, {}
        for variant, o in outs.items():
            ident, ood = o["test"], o[split]
            kw: dict[str, Any] = {"probs_ood": ood["probs"]}
            sc = {k: (fn(ident["probs"]), fn(ood["probs"]))
                  for k, fn in (("msp", msp_score), ("entropy", entropy_score))}
            if several and "member_logits" in ident:
                kw |= {"member_logits_id": ident["member_logits"], "member_logits_ood": ood["member_logits"]}
                sc["mi"] = (mutual_information(ident["member_logits"]), mutual_information(ood["member_logits"]))
            rep = uq_report(ident["probs"], labels, **kw)
            metrics[variant] = {k: v for k, v in rep.items() if k.split("_")[0] in ("auroc", "aupr", "fpr95")}
            scores[variant] = sc
        differences = {f"hydra-minus-{base}": {f"auroc_{k}": paired_auroc_difference(scores["hydra"][k], sc[k],
                                                                                     seed=seed)
                                               for k in scores["hydra"] if k in sc}
                       for base, sc in scores.items() if base != "hydra"}
        report[kind] = {"split": split, "rows": len(outs["hydra"][split]["probs"]), "metrics": metrics,
                        "differences": differences}
    return report


def _member_metrics(member_logits_id: np.ndarray, labels: np.ndarray,
                    member_logits_ood: np.ndarray | None) -> list[dict[str, float]]:
    """``uq_report`` of every member on its own."""
    from toolchain.metrics import member_probs, uq_report

    pid = member_probs(member_logits_id)
    pood = None if member_logits_ood is None else member_probs(member_logits_ood)
    return [uq_report(pid[:, i], labels, probs_ood=None if pood is None else pood[:, i])
            for i in range(pid.shape[1])]


def _shift(ctx: Context, models: dict[str, list[Any]], tok: Any, names: list[str]) -> dict[str, Any]:
    """Accuracy, NLL, ECE, Brier of every variant on the corrupted test rows (recipe ``shift``), per kind and severity.

    ``models``: variant -> its modules (a deep ensemble lists its members; the variant's
    probabilities are their mean). Severity 0 is the same rows clean. ``mean`` averages over kinds;
    ``differences`` pools every kind's rows at a severity and gives Hydra minus each baseline with
    paired-bootstrap 95% intervals (resampling test rows, each with all its corrupted versions);
    ``gap`` is NLL(severity) - NLL(clean); ``differences_by_kind`` is the same per corruption kind.
    """
    from toolchain.data.shift import corrupt, corruptions_for
    from toolchain.errors import RecipeError
    from toolchain.metrics import ensemble_probs, uq_report
    from toolchain.metrics.gain import paired_difference

    sh, test = ctx.recipe.shift, ctx.data["test"]
    kinds = list(corruptions_for(test)) if sh.corruptions is None else list(sh.corruptions)
    wrong = [k for k in kinds if k not in corruptions_for(test)]
    if wrong:
        raise RecipeError(f"field 'shift.corruptions': {wrong} do not apply to the {type(test).__name__} of "
                          f"'{test.name}'; use {', '.join(corruptions_for(test))}.")
    if not kinds:
        return {}
    if sh.rows is not None and sh.rows < len(test):
        test = test.subset(np.sort(np.random.default_rng(ctx.recipe.seed).permutation(len(test))[: sh.rows]))
    labels = np.asarray(test.labels)

    def probs(part: Any) -> dict[str, np.ndarray]:
        out, seen = {}, {}  # a module in two variants (the single model is deep-ensemble member 0) runs once
        for variant, modules in models.items():
            for m in modules:
                if id(m) not in seen:
                    seen[id(m)] = module_outputs(ctx, m, part, tok, names)
            runs = [seen[id(m)] for m in modules]
            out[variant] = (runs[0]["probs"] if len(runs) == 1 else
                            ensemble_probs(np.stack([r["logits"] for r in runs], 1)))
        return out

    keys = ("accuracy", "nll", "ece", "brier")
    clean = probs(test)
    metrics: dict[str, dict[str, dict[str, dict[str, float]]]] = {}
    pooled: dict[int, dict[str, list[np.ndarray]]] = {}
    for kind in kinds:
        metrics[kind] = {"0": {v: {k: uq_report(p, labels)[k] for k in keys} for v, p in clean.items()}}
        for severity in ctx.recipe.shift.severities:
            got = probs(corrupt(test, kind, severity, seed=ctx.recipe.seed))
            metrics[kind][str(severity)] = {v: {k: uq_report(p, labels)[k] for k in keys} for v, p in got.items()}
            for v, p in got.items():
                pooled.setdefault(severity, {}).setdefault(v, []).append(p)
    levels = ["0", *map(str, ctx.recipe.shift.severities)]
    mean = {lv: {v: {k: float(np.mean([metrics[kd][lv][v][k] for kd in kinds])) for k in keys} for v in models}
            for lv in levels}
    gap = {v: {lv: mean[lv][v]["nll"] - mean["0"][v]["nll"] for lv in levels[1:]} for v in models}
    differences: dict[str, dict[str, Any]] = {}
    for severity, by_variant in pooled.items():
        rows = np.concatenate([labels] * len(kinds))
        hyd = np.concatenate(by_variant["hydra"])
        differences[str(severity)] = {
            f"hydra-minus-{base}": paired_difference(hyd, np.concatenate(by_variant[base]), rows, seed=ctx.recipe.seed,
                                                     blocks=len(kinds))
            for base in models if base != "hydra"}
    by_kind = {kind: {str(sev): {f"hydra-minus-{base}": paired_difference(by_variant["hydra"][i], by_variant[base][i],
                                                                        labels, seed=ctx.recipe.seed)
                                 for base in models if base != "hydra"}
                      for sev, by_variant in pooled.items()} for i, kind in enumerate(kinds)}
    return {"rows": len(test), "kinds": kinds, "severities": list(ctx.recipe.shift.severities),
            "metrics": metrics, "mean": mean, "gap": gap, "differences": differences,
            "differences_by_kind": by_kind}


def _scaled_baselines(single: dict[str, dict], members: list[dict[str, np.ndarray]],
                      labels: np.ndarray) -> dict[str, Any]:
    """Validation metrics of the single model and the deep ensemble temperature-scaled on those rows.

    What ``baselines.temperature`` would deploy (one T each, fitted on the validation NLL, as
    :func:`toolchain.stages.common.baseline_models` fits it): the selection rule compares a Hydra
    row with ``fusion.temperature`` against these, so calibration is not credited to Hydra alone.
    """
    from toolchain.metrics import ensemble_probs, uq_report
    from toolchain.models.temperature import fit_temperature

    has_ood = "ood_val" in single
    runs = {"single": {s: single[s]["logits"][:, None, :] for s in ("val", "ood_val") if s in single}}
    if members:
        runs["deep-ensemble"] = {s: np.stack([m[s] for m in members], 1) for s in ("val", "ood_val") if s in single}
    out: dict[str, Any] = {}
    for name, z in runs.items():
        t = fit_temperature(z["val"], labels)
        kw: dict[str, Any] = {}
        if has_ood:
            kw["probs_ood"] = ensemble_probs(z["ood_val"] / t)
            if name == "deep-ensemble" and z["val"].shape[1] >= 2:
                kw |= {"member_logits_id": z["val"] / t, "member_logits_ood": z["ood_val"] / t}
        out[name] = {**uq_report(ensemble_probs(z["val"] / t), labels, **kw), "temperature": t}
    return out


@stage("evaluate", sections=("model", "data", "finetune", "scoring", "pruning", "fusion", "shift", *EVALUATION_FIELDS),
       upstream=("fuse", "ensemble"), summary="uncertainty metrics: single model, deep ensemble, Hydra (PyTorch)",
       version=5)  # 3: shift.json (corruption suites); 4: ood.json (far and near OOD), baselines in selection.json;
                   # 5: temperature-scaled baselines and Hydra's members in selection.json, temperatures.json
def evaluate_stage(ctx: Context, work: Path) -> dict[str, Any]:
    """UQ metrics on the ID test split and the OOD test split, with plots and per-sample outputs.

    Also: the ensemble gain of Hydra and the deep ensemble (ensemble minus mean member, with
    paired-bootstrap 95% intervals), member diversity on the test split, and Hydra's metrics on the
    validation splits that model selection may use (``selection.json``: ``val`` and the ``ood_val``
    rows of :func:`selection_ood_rows`, which the circuit objective never sees; metrics and the
    ensemble gain with its intervals). In a compare variant (:class:`VariantContext`) only Hydra is
    evaluated.
    """
    from toolchain.metrics import ensemble_probs, reliability_bins, uq_report
    from toolchain.metrics.plots import plot_ood_histograms, plot_reliability
    from toolchain.models.wrappers import SingleModel

    has_ood = "ood_test" in ctx.data
    splits = ["test"] + (["ood_test"] if has_ood else [])
    variant_only = isinstance(ctx, VariantContext)
    if variant_only:  # Hydra only: the baselines are the recipe's own evaluate stage's
        _m, base, tok = load_stage_model(ctx, ctx.stage_dir("finetune") / "model")
        de_members: list[Any] = []
        temperatures: dict[str, Any] = {}
    else:  # as deployed: temperature-scaled where baselines.temperature says so
        base, de_members, tok, temperatures = baseline_models(ctx)
    names = list(base.input_names)
    labels = np.asarray(ctx.data["test"].labels)
    variants: dict[str, dict[str, np.ndarray | None]] = {}
    shift_models: dict[str, list[Any]] = {}
    near = ["near_ood_test"] if "near_ood_test" in ctx.data else []
    sel_splits = [s for s in ("val", "ood_val") if s in ctx.data]
    run_splits = splits + near + sel_splits
    members: list[dict[str, np.ndarray]] = []
    single: dict[str, dict[str, np.ndarray]] = {}
    if not variant_only:
        single = _outputs(ctx, SingleModel(base), run_splits, tok, names)
        shift_models["single"] = [SingleModel(base)]
        for a in de_members:
            if a is base:
                members.append({s: single[s]["logits"] for s in run_splits})  # member 0 is the single model
                shift_models.setdefault("deep-ensemble", []).append(shift_models["single"][0])
                continue
            shift_models.setdefault("deep-ensemble", []).append(SingleModel(a))
            members.append({s: o["logits"] for s, o in _outputs(ctx, SingleModel(a), run_splits, tok, names).items()})
        variants["single"] = {"probs_id": single["test"]["probs"], "probs_ood": single.get("ood_test", {}).get("probs")}
        if members:  # the deep-ensemble baseline (off with baselines.deep_ensemble: false)
            de_id = np.stack([m["test"] for m in members], 1)
            de_ood = np.stack([m["ood_test"] for m in members], 1) if has_ood else None
            variants["deep-ensemble"] = {"probs_id": ensemble_probs(de_id),
                                         "probs_ood": None if de_ood is None else ensemble_probs(de_ood),
                                         "member_logits_id": de_id, "member_logits_ood": de_ood}
    from toolchain.hydra.fuse import load_hydra

    hyd = _outputs(ctx, load_hydra(ctx.stage_dir("fuse") / "hydra"), run_splits, tok, names)
    variants["hydra"] = {"probs_id": hyd["test"]["probs"], "probs_ood": hyd.get("ood_test", {}).get("probs"),
                         "member_logits_id": hyd["test"]["member_logits"],
                         "member_logits_ood": hyd.get("ood_test", {}).get("member_logits")}
    several = ctx.recipe.pruning.members >= 2
    metrics: dict[str, Any] = {}
    for name, v in variants.items():
        kw = {k: val for k, val in v.items() if val is not None and k != "probs_id"}
        if not several or "member_logits_ood" not in kw:  # member scores (MI, disagreement) are OOD scores
            kw.pop("member_logits_id", None)
            kw.pop("member_logits_ood", None)
        metrics[name] = uq_report(v["probs_id"], labels, **kw)
        plot_reliability(reliability_bins(v["probs_id"], labels), work / f"reliability-{name}.png",
                         title=f"{ctx.recipe.name}: {name}")
        if v.get("probs_ood") is not None:
            plot_ood_histograms(-v["probs_id"].max(-1), -v["probs_ood"].max(-1), work / f"ood-hist-{name}.png",
                                title=f"{name}: -max probability, ID vs OOD")
    # each Hydra member on its own: the ensemble gain is ensemble minus the mean member
    per_member = _member_metrics(hyd["test"]["member_logits"], labels, hyd.get("ood_test", {}).get("member_logits"))
    metrics["hydra-members-mean"] = {k: float(np.mean([p[k] for p in per_member])) for k in per_member[0]}
    diversity: dict[str, Any] = {}
    if several:
        for name in ("hydra", "deep-ensemble"):
            if name in variants:
                v = variants[name]
                diversity[name] = ensemble_diversity(v["member_logits_id"], labels, v.get("member_logits_ood"),
                                                     seed=ctx.recipe.seed)
    selection: dict[str, Any] = {}
    if "val" in hyd:
        from toolchain.metrics.gain import ensemble_gain

        val_labels = np.asarray(ctx.data["val"].labels)
        kw = {"probs_ood": hyd["ood_val"]["probs"]} if "ood_val" in hyd else {}
        if several and "ood_val" in hyd:  # member scores (MI, disagreement) are OOD scores: both or neither
            kw["member_logits_id"] = hyd["val"]["member_logits"]
            kw["member_logits_ood"] = hyd["ood_val"]["member_logits"]
        selection["hydra"] = uq_report(hyd["val"]["probs"], val_labels, **kw)
        val_members = _member_metrics(hyd["val"]["member_logits"], val_labels,
                                      hyd.get("ood_val", {}).get("member_logits"))
        selection["hydra-members-mean"] = {k: float(np.mean([p[k] for p in val_members])) for k in val_members[0]}
        if single:  # what a user would deploy instead, on the same validation rows (the selection rule's baselines)
            has_ood_val = "ood_val" in single
            selection["single"] = uq_report(single["val"]["probs"], val_labels,
                                            probs_ood=single["ood_val"]["probs"] if has_ood_val else None)
            if members:
                de_val = np.stack([m["val"] for m in members], 1)
                de_kw: dict[str, Any] = {}
                if has_ood_val:
                    de_ood = np.stack([m["ood_val"] for m in members], 1)
                    de_kw = {"probs_ood": ensemble_probs(de_ood)}
                    if several:
                        de_kw |= {"member_logits_id": de_val, "member_logits_ood": de_ood}
                selection["deep-ensemble"] = uq_report(ensemble_probs(de_val), val_labels, **de_kw)
            if not ctx.recipe.baselines.temperature:  # the baselines a temperature-scaled Hydra is compared with
                selection["temperature-scaled"] = _scaled_baselines(single, members, val_labels)
        if "ood_val" in hyd:
            start, stop = selection_ood_rows(len(ctx.data["ood_val"]))
            seen = min(ctx.recipe.scoring.calib_samples, stop) if circuit_sees_ood(ctx) else 0
            selection["ood_val_rows"] = [start, stop]
            selection["ood_val_rows_seen_by_scoring"] = max(0, seen - start)
        if several:
            selection["gain"] = ensemble_gain(hyd["val"]["member_logits"], val_labels,
                                              hyd.get("ood_val", {}).get("member_logits"), seed=ctx.recipe.seed)
    ood_outs: dict[str, dict[str, dict[str, np.ndarray]]] = {}
    if single:
        ood_outs["single"] = {s: {"probs": single[s]["probs"]} for s in splits + near}
    if members:
        stacked = {s: np.stack([m[s] for m in members], 1) for s in splits + near}
        ood_outs["deep-ensemble"] = {s: {"probs": ensemble_probs(v), "member_logits": v} for s, v in stacked.items()}
    ood_outs["hydra"] = {s: {"probs": hyd[s]["probs"], "member_logits": hyd[s]["member_logits"]} for s in splits + near}
    ood = ood_report(ood_outs, labels, ctx.recipe.seed, several)
    for kind, rep in ood.items():
        ctx.console.print(f"  {kind}-OOD ({rep['split']}, {rep['rows']} rows) AUROC MSP: " + "  ".join(
            f"{v} {m['auroc_msp']:.4f}" for v, m in rep["metrics"].items()))
    shift: dict[str, Any] = {}
    if shift_models:  # not for compare variants (PyTorch-only extra rows)
        shift = _shift(ctx, {**shift_models, "hydra": [load_hydra(ctx.stage_dir("fuse") / "hydra")]}, tok, names)
        if shift:
            from toolchain.metrics.plots import plot_shift

            plot_shift(shift, work / "shift.png", title=f"{ctx.recipe.name}: corrupted test rows")
            for lv in ["0", *map(str, shift["severities"])]:
                ctx.console.print(f"  shift severity {lv}: " + "  ".join(
                    f"{v} nll {m['nll']:.4f} acc {m['accuracy']:.4f}" for v, m in shift["mean"][lv].items()))
    atomic_write_json(work / "shift.json", shift)
    atomic_write_json(work / "ood.json", ood)
    atomic_write_json(work / "metrics.json", metrics)
    atomic_write_json(work / "diversity.json", diversity)
    atomic_write_json(work / "selection.json", selection)
    if hyd_t := (read_json(ctx.stage_dir("fuse") / "summary.json").get("temperature") or {}):
        temperatures["hydra"] = hyd_t
    atomic_write_json(work / "temperatures.json", temperatures)  # {} when nothing is temperature-scaled
    np.savez_compressed(work / "outputs.npz", labels=labels,
                        **{f"{n}_{k}": v for n, d in variants.items() for k, v in d.items() if v is not None})
    keys = view_keys("console")
    for name, m in metrics.items():
        ctx.console.print(f"  {name:>18}: " + "  ".join(f"{k} {m[k]:.4f}" for k in keys if k in m))
    for name, d in diversity.items():
        g = d["gain"]
        ctx.console.print(f"  {name:>18} ensemble gain: " + "  ".join(
            f"{k} {g[k]['gain']:+.4f} [{g[k]['ci'][0]:+.4f}, {g[k]['ci'][1]:+.4f}]"
            for k in view_keys("gain_console") if k in g))
    return {"variants": sorted(metrics)}
