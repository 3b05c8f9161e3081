"""recipes/own-checkpoint.yaml end to end (quick profile) on a classifier folder and a CSV made here.

The checkpoint already classifies into the CSV's labels, so it is not fine-tuned again; the
deep ensemble is off, so nothing of it is trained, evaluated, exported or benched, and the
report says so; the recipe has no compare variants.
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def _inputs(folder: Path) -> tuple[Path, Path]:
    import numpy as np
    import torch
    import transformers

    from toolchain.data import load_tweets
    from toolchain.models import load_tokenizer, resolve_source, save_model

    tweets = load_tweets()
    rows = np.random.default_rng(1).permutation(len(tweets.texts))[:400]
    data = folder / "data.csv"
    with data.open("w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["text", "label"])
        w.writerows((tweets.texts[i], tweets.class_names[int(tweets.labels[i])]) for i in rows)
    torch.manual_seed(0)
    cfg = transformers.BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                  intermediate_size=64, max_position_embeddings=128, num_labels=3,
                                  id2label=dict(enumerate(tweets.class_names)),
                                  label2id={n: i for i, n in enumerate(tweets.class_names)})
    model = transformers.BertForSequenceClassification(cfg)
    tok = load_tokenizer(resolve_source("packaged:all-MiniLM-L6-v2"))
    return save_model(model, folder / "model", tokenizer=tok), data


def test_own_checkpoint_recipe_without_research_extras(tmp_path):
    model, data = _inputs(tmp_path)
    recipe = yaml.safe_load((ROOT / "recipes" / "own-checkpoint.yaml").read_text())
    assert recipe["baselines"]["deep_ensemble"] is False and not recipe.get("compare")
    recipe["model"]["source"] = str(model)
    recipe["data"]["id"] = f"csv:{data}"
    recipe["artifacts_dir"] = str(tmp_path / "artifacts")
    path = tmp_path / "own.yaml"
    path.write_text(yaml.safe_dump(recipe))
    out = subprocess.run([sys.executable, "-m", "toolchain", "run", str(path), "--profile", "quick"],
                         capture_output=True, text=True, cwd=ROOT, env=dict(os.environ, HF_HUB_OFFLINE="1"),
                         timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    art = tmp_path / "artifacts" / "own-checkpoint-quick"
    assert "not fine-tuned: the checkpoint already classifies into the data's labels" in out.stderr
    assert json.loads((art / "finetune" / "metrics.json").read_text())["steps"] == 0
    assert json.loads((art / "ensemble" / "metrics.json").read_text()) == {"members": [], "deep_ensemble": False}
    assert not list((art / "ensemble").glob("member*"))
    metrics = json.loads((art / "evaluate" / "metrics.json").read_text())
    assert "deep-ensemble" not in metrics and {"single", "hydra"} <= set(metrics)
    graphs = json.loads((art / "export" / "graphs.json").read_text())
    assert not [g for g in graphs.values() if g["kind"] == "member"]
    latency = json.loads((art / "bench" / "latency.json").read_text())
    assert all("deep-ensemble" not in c["variants"] for c in latency["cases"])
    report = (art / "report" / "report.md").read_text()
    assert "Deep-ensemble baseline: off" in report and "Compare variants: none" in report
    assert "| deep-ensemble |" not in report
    # the CI gate on the run's files: the Hydra folder carries its tokenizer, so --data needs nothing else
    from toolchain.verbs import ParityOptions, check_parity

    assert (art / "fuse" / "hydra" / "tokenizer_config.json").is_file()
    graphs = [art / "export" / "hydra-conv.onnx", art / "export" / "hydra-conv.fp16.onnx"]
    verdict = check_parity(graphs, art / "fuse" / "hydra", ParityOptions(data=data, max_rows=64, max_length=64))
    assert verdict.exit_code == 0, verdict.problems()
    assert verdict.meta["data"]["id_samples"] == 64 and len(verdict.engines) == 2
