"""The cost levers through the recipe (issue 45): ``pruning.fork``, ``pruning.mlp_share`` / ``mlp_core``.

A tiny ViT trained from a config on Fashion-MNIST, two members, forked after layer 0 with half of layer
1's MLP neurons each (an eighth shared): fused from the masks and neuron slices (no recovery), and from
recovered members (the trunk and the input stage frozen while they train). Bad settings exit 2 naming the field.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from tiny_recipes import TINY_VIT_MODEL

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow  # real data (Fashion-MNIST) through the CLI

RECIPE = """\
name: tiny-levers
seed: 0
artifacts_dir: {art}
""" + TINY_VIT_MODEL + """\
data:
  id: fashion-mnist
  ood: null
  splits: {{train: 64, val: 32, calib: 16, test: 32}}
finetune: {{steps: 2, batch_size: 8}}
scoring: {{criterion: his, calib_samples: 16, batch_size: 8}}
pruning: {{members: 2, strategy: partition, ratio: 0.5, fork: {fork}, mlp_share: 0.5, mlp_core: 0.125,
          recovery: {{steps: {steps}, batch_size: 8}}}}
fusion: {{mlp: {mlp}}}
engines: [torch]
"""


def fuse(tmp_path: Path, steps: int, fork: int = 1, mlp: str = "grouped") -> subprocess.CompletedProcess:
    recipe = tmp_path / f"r{steps}-{fork}-{mlp}.yaml"
    recipe.write_text(RECIPE.format(art=tmp_path / "art", steps=steps, fork=fork, mlp=mlp))
    return subprocess.run([sys.executable, "-m", "toolchain", "fuse", str(recipe)], cwd=ROOT, capture_output=True,
                          text=True, env=dict(os.environ, HF_HUB_OFFLINE="1"), timeout=600)


@pytest.mark.parametrize("steps", [0, 3])
def test_a_forked_sliced_hydra_is_fused_from_the_recipe(tmp_path, steps):
    out = fuse(tmp_path, steps)
    assert out.returncode == 0, out.stderr[-3000:]
    root = tmp_path / "art" / "tiny-levers"
    members = json.loads((root / "prune" / "members.json").read_text())
    assert members["fork"] == 1 and members["members"][0]["keep"][0] == [1, 1, 1, 1]  # the trunk keeps every head
    neurons = members["mlp"]["neurons"]
    assert [len(layer) for layer in neurons[0]] == [64, 32]
    shared = set(neurons[0][1]) & set(neurons[1][1])
    assert len(shared) == 8  # the core: round(0.125 * 64); the rest dealt disjointly
    config = json.loads((root / "fuse" / "hydra" / "hydra_config.json").read_text())
    assert config["fork"] == 1 and config["mlp"] == "grouped" and config["source"] == ("members" if steps else "masks")
    assert "neurons" not in config["layers"][0] and config["layers"][1]["neurons"] == [32, 32]
    assert config["layers"][1]["source_intermediate"] == 64
    summary = json.loads((root / "fuse" / "summary.json").read_text())
    assert summary["fork"] == 1 and summary["params"]["hydra"] == summary["params_analytic_hydra"]
    if steps:
        from toolchain.models import load_model

        base = load_model(root / "finetune" / "model", tokenizer=False).model.state_dict()
        for i in range(2):
            member = load_model(root / "prune" / f"member{i}", tokenizer=False)
            state = member.model.state_dict()
            trunk = [k for k in state if ".layers.0." in k or ".layer.0." in k]
            assert trunk and all(bool((state[k] == base[k]).all()) for k in trunk)  # frozen during recovery
            changed = [k for k in state if ".layers.1." in k and state[k].shape == base[k].shape
                       and not bool((state[k] == base[k]).all())]
            assert changed  # the member's own layer did train
            assert member.adapter.layers()[1].fc1.out_features == 32  # its own half of the MLP


def test_bad_lever_settings_exit_2_naming_the_field(tmp_path):
    out = fuse(tmp_path, 0, fork=2)
    assert out.returncode == 2 and "pruning.fork" in out.stderr and "2 layers" in out.stderr, out.stderr[-2000:]
    out = fuse(tmp_path, 0, mlp="average")
    assert out.returncode == 2 and "fusion.mlp" in out.stderr and "mlp_share" in out.stderr, out.stderr[-2000:]
