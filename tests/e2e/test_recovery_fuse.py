"""Recovery fine-tuned members fuse: the pipeline freezes the shared embeddings while members recover."""

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
name: tiny-recovery
seed: 0
artifacts_dir: {art}
""" + TINY_VIT_MODEL + """\
data:
  id: fashion-mnist
  ood: null
  splits: {{train: 64, val: 32, calib: 16, test: 32}}
finetune: {{steps: 2, batch_size: 8}}
scoring: {{criterion: his, calib_samples: 16, batch_size: 8}}
pruning: {{members: 2, strategy: partition, ratio: 0.25, recovery: {{steps: 3, batch_size: 8, bootstrap: true}}}}
engines: [torch]
"""


def test_recovered_members_fuse_and_keep_the_base_embeddings(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text(RECIPE.format(art=tmp_path / "art"))
    out = subprocess.run([sys.executable, "-m", "toolchain", "fuse", str(recipe)], cwd=ROOT, capture_output=True,
                         text=True, env=dict(os.environ, HF_HUB_OFFLINE="1"), timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    from safetensors.torch import load_file

    root = tmp_path / "art" / "tiny-recovery"
    base = load_file(str(root / "finetune" / "model" / "model.safetensors"))
    for i in range(2):
        member = load_file(str(root / "prune" / f"member{i}" / "model.safetensors"))
        emb = [k for k in member if ".embeddings." in k]
        assert emb and all(bool((member[k] == base[k]).all()) for k in emb)  # frozen during recovery
        changed = [k for k in member if ".embeddings." not in k and k in base and member[k].shape == base[k].shape
                   and not bool((member[k] == base[k]).all())]
        assert changed  # the rest did train
    assert json.loads((root / "fuse" / "summary.json").read_text())["members"] == 2


def test_a_prune_that_differs_only_in_recovery_reuses_the_member_masks(tmp_path):
    """The search's masks are cached by its own inputs (not recovery): a second prune reuses them, the same masks.

    A prune with another search input (the ratio) must search again (the key is not too coarse), and so must
    ``--force prune`` and a prune whose cache file is unreadable.
    """
    art = tmp_path / "art"

    def prune(recovery_steps: int, ratio: float = 0.25, *extra: str) -> tuple[str, list]:
        recipe = tmp_path / f"r{recovery_steps}-{ratio}.yaml"
        text = RECIPE.format(art=art).replace("recovery: {steps: 3,", f"recovery: {{steps: {recovery_steps},")
        recipe.write_text(text.replace("ratio: 0.25", f"ratio: {ratio}"))
        out = subprocess.run([sys.executable, "-m", "toolchain", "prune", str(recipe), *extra], cwd=ROOT,
                             capture_output=True, text=True, env=dict(os.environ, HF_HUB_OFFLINE="1"), timeout=600)
        assert out.returncode == 0, out.stderr[-3000:]
        members = json.loads((art / "tiny-recovery" / "prune" / "members.json").read_text())["members"]
        return out.stdout + out.stderr, [m["keep"] for m in members]

    log1, keep1 = prune(3)
    assert "member masks" not in log1
    log2, keep2 = prune(1)
    assert "member masks reused: cache/member-masks/" in log2 and keep2 == keep1
    log3, keep3 = prune(1, 0.5)
    assert "member masks" not in log3 and sum(map(sum, keep3[0])) < sum(map(sum, keep1[0]))
    log4, keep4 = prune(3, 0.25, "--force", "prune")  # a forced prune searches again, to the same masks
    assert "member masks" not in log4 and keep4 == keep1
    # an unreadable cache file is not an error: the search runs again and rewrites it
    for f in (art / "tiny-recovery" / "cache" / "member-masks").iterdir():
        f.write_text("{not json")
    log5, keep5 = prune(2)
    assert "member masks" not in log5 and keep5 == keep1
