"""Pruning quality on the real all-MiniLM-L6-v2 fine-tuned on tweet sentiment (no recovery fine-tune).

Protocol (HIES paper style): one-shot, global pruning of 10/30/50/70% of the 72 heads, no
fine-tuning after pruning; criteria random (mean of several seeds), l2, his, taylor and hies
(alpha swept; alpha chosen per ratio on the validation split, by accuracy). Reported on a test
split that neither the scores nor the alpha choice saw: accuracy and stability (the fraction of
test samples whose prediction equals the unpruned model's). Splits (stratified, seeded) are
disjoint: train / calib / val / test.

The fine-tuned model is cached in ``benchmarks/pruning_quality/.cache/`` (git-ignore it); delete
the folder to retrain.

    python benchmarks/pruning_quality/run.py            # full run, ~15-30 min on 2 cores
    python benchmarks/pruning_quality/run.py --quick    # smoke run (tiny splits, 2 training steps)
"""

from __future__ import annotations

import argparse
import io
import json
import logging
import os
import platform
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np
import torch

from toolchain.data import load_tweets, make_splits, tokenize
from toolchain.models import adapter_for, load_model, save_model
from toolchain.pruning import finetune, jaccard, keep_mask
from toolchain.scoring import HeadScores, combine_hies, score_heads
from toolchain.scoring.scores import atomic_write_bytes

HERE = Path(__file__).resolve().parent
log = logging.getLogger("pruning_quality")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=400, help="fine-tuning steps (batch 32: 400 steps = 12.8k tweets)")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=5e-5)
    p.add_argument("--max-length", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--calib", type=int, default=64, help="calibration samples for the criteria")
    p.add_argument("--calib-batch", type=int, default=32, help="calibration batch size (Taylor's mini-batches)")
    p.add_argument("--val", type=int, default=600)
    p.add_argument("--test", type=int, default=1500)
    p.add_argument("--ratios", default="0.1,0.3,0.5,0.7")
    p.add_argument("--alphas", default="0.25,0.5,0.75")
    p.add_argument("--random-seeds", type=int, default=3)
    p.add_argument("--eval-batch", type=int, default=128)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", type=Path, default=HERE)
    p.add_argument("--cache", type=Path, default=HERE / ".cache")
    p.add_argument("--quick", action="store_true", help="smoke run: tiny splits, 2 steps, all output in .cache/quick")
    args = p.parse_args(argv)
    if args.quick:
        args.steps, args.calib, args.val, args.test, args.random_seeds = 2, 32, 48, 64, 1
        args.cache = args.cache / "quick"
        args.out = args.cache / "out"
    return args


# ------------------------------------------------------------------------------------- data
def length_sorted_batches(texts: list[str], tokenizer, max_length: int, batch_size: int):
    """Batches of texts sorted by token length (little padding); yields (inputs, original indices)."""
    lengths = [len(ids) for ids in tokenizer(list(texts), truncation=True, max_length=max_length)["input_ids"]]
    order = np.argsort(np.asarray(lengths), kind="stable")
    out = []
    for s in range(0, len(order), batch_size):
        idx = order[s : s + batch_size]
        out.append((tokenize([texts[i] for i in idx], tokenizer, max_length, "longest"), idx))
    return out


def predict(adapter, batches, n: int) -> torch.Tensor:
    """Logits [n, C] (float64) in the original sample order."""
    out = None
    with torch.no_grad():
        for inputs, idx in batches:
            logits = adapter.logits(inputs).double()
            if out is None:
                out = torch.empty(n, logits.shape[-1], dtype=torch.float64)
            out[torch.from_numpy(idx)] = logits
    return out


def metrics(logits: torch.Tensor, labels: np.ndarray, reference: torch.Tensor | None) -> dict[str, float]:
    y = torch.from_numpy(labels)
    pred = logits.argmax(dim=-1)
    p_y = torch.softmax(logits, dim=-1).gather(1, y[:, None]).squeeze(1)
    out = {"accuracy": float((pred == y).double().mean()), "nll": float(-torch.log(p_y.clamp(min=1e-12)).mean())}
    if reference is not None:
        out["agreement"] = float((pred == reference).double().mean())
    return out


# -------------------------------------------------------------------------------- fine-tune
def fine_tuned_model(args, splits):
    key = (f"minilm-tweets-seed{args.seed}-steps{args.steps}-bs{args.batch_size}-lr{args.lr:g}"
           f"-len{args.max_length}-train{len(splits['train'])}")
    path = args.cache / key
    if (path / "config.json").is_file():
        log.info("loading the cached fine-tuned model %s", path)
        loaded = load_model(path, tokenizer=True)
        info = json.loads((path / "finetune.json").read_text()) if (path / "finetune.json").is_file() else {}
        return loaded, info, True
    loaded = load_model("packaged:all-MiniLM-L6-v2", num_labels=3, seed=args.seed)
    train = splits["train"]
    tok = loaded.tokenizer

    def batches_fn(batch_size: int, seed: int):
        order = np.random.default_rng(seed).permutation(len(train))
        for s in range(0, len(order) - batch_size + 1, batch_size):
            idx = order[s : s + batch_size]
            inputs = tokenize([train.texts[i] for i in idx], tok, args.max_length, "longest")
            yield inputs, torch.from_numpy(train.labels[idx])

    t0 = time.perf_counter()
    out = finetune(loaded.model, loaded.adapter, batches_fn, steps=args.steps, lr=args.lr,
                   batch_size=args.batch_size, seed=args.seed, progress=sys.stderr.isatty(), log_every=50)
    info = {"seconds": time.perf_counter() - t0, "steps": args.steps, "first_losses": out["losses"][:10],
            "last_losses": out["losses"][-10:],
            "mean_loss_last_50": float(np.mean(out["losses"][-50:]))}
    save_model(loaded.model, path, tok)
    atomic_write_bytes(path / "finetune.json", json.dumps(info, indent=1).encode())
    log.info("fine-tuned %d steps in %.0f s; saved to %s", args.steps, info["seconds"], path)
    return load_model(path, tokenizer=True), info, False


# --------------------------------------------------------------------------------- report
def plot(results: dict, path: Path) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, 4))
    FigureCanvasAgg(fig)
    ratios = results["config"]["ratios"]
    for k, (metric, title) in enumerate((("accuracy", "test accuracy"), ("agreement", "stability (agreement)"))):
        ax = fig.add_subplot(1, 2, k + 1)
        for method, rows in results["table"].items():
            ys = [rows[str(r)][metric] for r in ratios]
            ax.plot([100 * r for r in ratios], ys, marker="o", label=method)
        base = results["unpruned"]["test"][metric] if metric == "accuracy" else 1.0
        ax.axhline(base, color="grey", ls="--", lw=1, label="unpruned")
        ax.set_xlabel("heads pruned (%)")
        ax.set_ylabel(title)
        ax.set_title(title)
        ax.grid(alpha=0.3)
        if k == 0:
            ax.legend(fontsize=8)
    fig.suptitle("all-MiniLM-L6-v2 on tweets: one-shot global head pruning, no fine-tuning")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    atomic_write_bytes(path, buf.getvalue())


def markdown(results: dict) -> str:
    c = results["config"]
    ratios = c["ratios"]
    lines = [
        "# Pruning quality: all-MiniLM-L6-v2 on tweet sentiment",
        "",
        f"Fine-tuned {c['steps']} steps (batch {c['batch_size']}, lr {c['lr']}, max length {c['max_length']}, "
        f"seed {c['seed']}); one-shot **global** pruning, no fine-tuning after pruning; "
        f"{c['calib']} calibration samples; val {c['val']} / test {c['test']} tweets (disjoint, stratified).",
        f"Unpruned: test accuracy {results['unpruned']['test']['accuracy']:.4f}, "
        f"val accuracy {results['unpruned']['val']['accuracy']:.4f}.",
        "",
        "Cells: test accuracy / stability (agreement with the unpruned model's predictions).",
        "",
        "| criterion | " + " | ".join(f"{round(100 * r)}% pruned" for r in ratios) + " |",
        "|---|" + "---|" * len(ratios),
    ]
    for method, rows in results["table"].items():
        cells = []
        for r in ratios:
            row = rows[str(r)]
            extra = f" (a={row['alpha']:g})" if "alpha" in row else ""
            sd = f" ±{row['accuracy_sd']:.3f}" if "accuracy_sd" in row else ""
            cells.append(f"{row['accuracy']:.4f}{sd} / {row['agreement']:.4f}{extra}")
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "HIES alpha sweep (val accuracy used for the choice | test accuracy shown for reference only):",
        "",
        "| alpha | " + " | ".join(f"{round(100 * r)}%" for r in ratios) + " |",
        "|---|" + "---|" * len(ratios),
    ]
    for a in c["alphas"]:
        cells = []
        for r in ratios:
            row = results["hies_sweep"][str(r)][str(a)]
            cells.append(f"{row['val']['accuracy']:.4f} / {row['test']['accuracy']:.4f}")
        lines.append(f"| {a:g} | " + " | ".join(cells) + " |")
    lines += [
        "",
        f"random: mean over {c['random_seeds']} seeds (± sample sd of accuracy). "
        f"Jaccard of the kept heads, HIS vs HIES(chosen alpha): "
        + ", ".join(f"{round(100 * float(r))}%: {v:.2f}" for r, v in results["jaccard_his_hies"].items()) + ".",
        "",
        f"Fine-tuning: {results['finetune'].get('seconds', float('nan')):.0f} s "
        f"({'cached' if results['finetune_cached'] else 'this run'}); total run {results['seconds']:.0f} s; "
        f"torch {c['torch']}, {c['threads']} threads. Command: `{c['command']}`.",
        "",
    ]
    return "\n".join(lines)


# ----------------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s", datefmt="%H:%M:%S")
    logging.getLogger("toolchain").setLevel(logging.WARNING)
    logging.getLogger("toolchain.pruning.finetune").setLevel(logging.INFO)
    torch.set_num_threads(args.threads)
    t_start = time.perf_counter()
    ratios = [float(x) for x in args.ratios.split(",")]
    alphas = [float(x) for x in args.alphas.split(",")]

    tweets = load_tweets()
    n_train = args.steps * args.batch_size
    splits = make_splits(tweets, {"train": n_train, "calib": args.calib, "val": args.val, "test": args.test},
                         seed=args.seed)
    log.info("splits: %s", {k: len(v) for k, v in splits.items()})
    loaded, ft_info, cached = fine_tuned_model(args, splits)
    adapter, tok = loaded.adapter, loaded.tokenizer

    calib_data = splits["calib"]
    calib = []
    for s in range(0, len(calib_data), args.calib_batch):
        idx = np.arange(s, min(s + args.calib_batch, len(calib_data)))
        calib.append((tokenize([calib_data.texts[i] for i in idx], tok, args.max_length, "longest"),
                      torch.from_numpy(calib_data.labels[idx])))
    evals = {name: (length_sorted_batches(splits[name].texts, tok, args.max_length, args.eval_batch),
                    splits[name].labels) for name in ("val", "test")}

    t0 = time.perf_counter()
    base_logits = {name: predict(adapter, b, len(y)) for name, (b, y) in evals.items()}
    reference = {name: lg.argmax(dim=-1) for name, lg in base_logits.items()}
    unpruned = {name: metrics(base_logits[name], evals[name][1], None) for name in evals}
    log.info("unpruned: %s (%.0f s)", unpruned, time.perf_counter() - t0)

    t0 = time.perf_counter()
    scores: dict[str, HeadScores] = {
        "l2": score_heads(adapter, calib, "l2"),
        "his": score_heads(adapter, calib, "his"),
        "taylor": score_heads(adapter, calib, "taylor"),
        "entropy": score_heads(adapter, calib, "entropy"),
    }
    for s in range(args.random_seeds):
        scores[f"random{s}"] = score_heads(adapter, None, "random", seed=s)
    for a in alphas:
        scores[f"hies{a:g}"] = combine_hies(scores["his"], scores["entropy"], alpha=a, norm_scope="global")
    score_seconds = time.perf_counter() - t0
    log.info("scored heads in %.1f s", score_seconds)
    heat = args.out / "heatmaps"
    for name in ("his", "entropy", "taylor", "l2", "hies0.5"):
        if name in scores:
            scores[name].plot_heatmap(heat / f"{name}.png")

    def evaluate(name: str, ratio: float, splits_to_eval: tuple[str, ...]) -> tuple[dict, torch.Tensor]:
        keep = keep_mask(scores[name], ratio=ratio, scope="global")
        pruned = adapter_for(adapter.prune(keep))
        out = {}
        for split in splits_to_eval:
            batches, labels = evals[split]
            out[split] = metrics(predict(pruned, batches, len(labels)), labels, reference[split])
        out["kept"] = int(keep.sum())
        return out, keep

    table: dict[str, dict[str, dict]] = {}
    hies_sweep: dict[str, dict[str, dict]] = {}
    jac: dict[str, float] = {}
    for r in ratios:
        t0 = time.perf_counter()
        rows = {}
        rand = [evaluate(f"random{s}", r, ("test",))[0]["test"] for s in range(args.random_seeds)]
        acc = [x["accuracy"] for x in rand]
        rows["random"] = {
            "accuracy": float(np.mean(acc)),
            "agreement": float(np.mean([x["agreement"] for x in rand])),
            "nll": float(np.mean([x["nll"] for x in rand])),
            "per_seed": rand,
        }
        if len(acc) > 1:
            rows["random"]["accuracy_sd"] = float(np.std(acc, ddof=1))
        masks = {}
        for name in ("l2", "his", "taylor"):
            res, masks[name] = evaluate(name, r, ("test",))
            rows[name] = {**res["test"], "kept": res["kept"]}
        sweep = {}
        for a in alphas:
            res, masks[f"hies{a:g}"] = evaluate(f"hies{a:g}", r, ("val", "test"))
            sweep[str(a)] = res
        best = max(alphas, key=lambda a: (sweep[str(a)]["val"]["accuracy"], -abs(a - 0.5)))
        rows["hies"] = {**sweep[str(best)]["test"], "alpha": best, "kept": sweep[str(best)]["kept"]}
        hies_sweep[str(r)] = sweep
        jac[str(r)] = jaccard(masks["his"], masks[f"hies{best:g}"])
        for method, row in rows.items():
            table.setdefault(method, {})[str(r)] = row
        log.info("ratio %.1f done in %.0f s: %s", r, time.perf_counter() - t0,
                 {m: round(v["accuracy"], 4) for m, v in rows.items()})

    command = " ".join(["python benchmarks/pruning_quality/run.py", *(sys.argv[1:] if argv is None else argv)])
    results = {
        "config": {**{k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
                   "ratios": ratios, "alphas": alphas, "torch": torch.__version__, "python": platform.python_version(),
                   "scope": "global", "min_heads_per_layer": 1, "command": command.strip(),
                   "splits": {k: len(v) for k, v in splits.items()}},
        "finetune": ft_info,
        "finetune_cached": cached,
        "unpruned": unpruned,
        "table": table,
        "hies_sweep": hies_sweep,
        "jaccard_his_hies": jac,
        "scores": {k: v.to_dict() for k, v in scores.items() if not k.startswith("random")},
        "score_seconds": score_seconds,
        "seconds": time.perf_counter() - t_start,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(args.out / "results.json", json.dumps(results, indent=1).encode())
    atomic_write_bytes(args.out / "results.md", markdown(results).encode())
    plot(results, args.out / "results.png")
    log.info("wrote %s", args.out / "results.md")
    print(markdown(results))
    return results


if __name__ == "__main__":
    main()
