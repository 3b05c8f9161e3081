"""Accuracy levers end to end: temperature scaling (fitted on validation rows, folded into every exported graph)
and the fused Hydra's end-to-end recovery, through export and the parity gate.

A tiny ViT trained from its config on real Fashion-MNIST rows (fast), with ``fusion.temperature``,
``fusion.recovery_steps`` and ``baselines.temperature`` on: the fused Hydra, the single model and the
deep ensemble each get one T; the fused model is fine-tuned before its T is fitted.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from tiny_recipes import TINY_VIT_MODEL

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow  # real data through the CLI, every stage

RECIPE = """\
name: tiny-temperature
seed: 0
artifacts_dir: {art}
""" + TINY_VIT_MODEL + """\
data:
  id: fashion-mnist
  ood: digits
  splits: {{train: 128, val: 64, calib: 16, test: 48}}
  ood_splits: {{ood_val: 32, ood_test: 48}}
finetune: {{steps: 30, batch_size: 16, lr: 2.0e-3}}
baselines: {{temperature: true}}
scoring: {{criterion: his, calib_samples: 16, batch_size: 8}}
pruning: {{members: 2, strategy: partition, ratio: 0.25, recovery: {{steps: 3, batch_size: 8, bootstrap: true}}}}
fusion: {{temperature: true, recovery_steps: 12}}
export: {{precisions: [fp32], batch: {{min: 1, opt: 2, max: 4}}}}
engines: [torch, onnxrt-cpu]
bench: {{batch_sizes: [1], warmup: 1, rounds: 2, rows: 8, rows_rounds: 1}}
shift: {{corruptions: []}}                 # off: this test is about the temperature, not the suites
"""


def test_every_variant_is_calibrated_on_validation_and_its_graphs_compute_the_scaled_logits(tmp_path):
    import onnxruntime as ort
    import torch

    from toolchain.models import load_model
    from toolchain.models.wrappers import SingleModel

    recipe = tmp_path / "r.yaml"
    recipe.write_text(RECIPE.format(art=tmp_path / "art"))
    out = subprocess.run([sys.executable, "-m", "toolchain", "run", str(recipe)], cwd=ROOT, capture_output=True,
                         text=True, env=dict(os.environ, HF_HUB_OFFLINE="1"), timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    root = tmp_path / "art" / "tiny-temperature"
    exported = json.loads((root / "export" / "temperatures.json").read_text())
    evaluated = json.loads((root / "evaluate" / "temperatures.json").read_text())
    assert set(exported) == {"val_rows", "single", "deep-ensemble", "hydra"} and exported == evaluated
    for name in ("single", "deep-ensemble", "hydra"):
        r = exported[name]
        assert r["temperature"] > 0 and r["temperature"] != 1.0
        assert r["val_nll_after"] <= r["val_nll_before"] + 1e-12, name  # the fit never makes validation worse
    # the exported single-model graph computes the fine-tuned model's logits over T (folded into the weights)
    raw = SingleModel(load_model(root / "finetune" / "model").adapter).eval()
    x = np.random.default_rng(0).normal(size=(3, 1, 28, 28)).astype(np.float32)
    with torch.no_grad():
        want = raw(pixel_values=torch.from_numpy(x))["logits"].numpy() / exported["single"]["temperature"]
    sess = ort.InferenceSession(str(root / "export" / "single.onnx"), providers=["CPUExecutionProvider"])
    got = sess.run(["logits"], {"pixel_values": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    # parity compares each graph with its calibrated PyTorch reference (a reference without T would fail)
    verdict = json.loads((root / "parity" / "verdict.json").read_text())
    assert verdict["exit_code"] == 0 and set(verdict["groups"]) == {"hydra", "single", "member1"}
    assert all(g["status"] == "pass" for g in verdict["groups"].values())
    # the fused model trained end to end: its exported graphs are the fuse folder's, the input stage untouched
    from safetensors.torch import load_file

    summary = json.loads((root / "fuse" / "summary.json").read_text())
    assert summary["recovery"]["steps"] == 12
    fused = load_file(str(root / "fuse" / "hydra" / "model.safetensors"))
    base = load_file(str(root / "finetune" / "model" / "model.safetensors"))
    emb = {k.removeprefix("embeddings."): v for k, v in fused.items() if k.startswith("embeddings.")}
    assert emb and all(any(bool(torch.equal(v, b)) for b in base.values() if b.shape == v.shape)
                       for v in emb.values())
    from toolchain.hydra.io import load_hydra

    hydra = load_hydra(root / "fuse" / "hydra")
    with torch.no_grad():
        want = hydra(pixel_values=torch.from_numpy(x))["member_logits"].numpy()
    for low in ("conv", "matmul"):
        sess = ort.InferenceSession(str(root / "export" / f"hydra-{low}.onnx"), providers=["CPUExecutionProvider"])
        np.testing.assert_allclose(sess.run(["member_logits"], {"pixel_values": x})[0], want, rtol=1e-4, atol=1e-5)
    # the selection rule's calibrated baselines are not written when the baselines themselves are calibrated
    assert "temperature-scaled" not in json.loads((root / "evaluate" / "selection.json").read_text())
