"""Every family's tiny recipe (recipes/families/) end to end through the CLI, quick profile.

Each trains a small config of its family from scratch (text: tweets with the MiniLM tokenizer;
DeiT: Fashion-MNIST), scores and prunes heads, recovers each member (10 steps, the shared input
stage frozen), fuses the recovered members, exports, checks parity and benches.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from toolchain.models import family_names

ROOT = Path(__file__).resolve().parents[2]
RECIPES = sorted((ROOT / "recipes" / "families").glob("*.yaml"))
pytestmark = pytest.mark.slow


def test_every_family_without_a_full_recipe_has_a_tiny_one():
    covered = {yaml.safe_load(p.read_text())["model"]["family"] for p in RECIPES}
    with_recipes = {"bert", "vit", "clip"}  # recipes/minilm-tweets.yaml, vit-fashion-mnist.yaml, clip-tiny.yaml
    assert covered | with_recipes == set(family_names())


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, tuple[dict, str]]:
    """Every family recipe's quick run, all at once with one thread each (2 cores, ~5x less wall time)."""
    tmp = tmp_path_factory.mktemp("families")
    env = dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    procs = {}
    for path in RECIPES:
        data = yaml.safe_load(path.read_text())
        data["artifacts_dir"] = str(tmp / path.stem / "artifacts")
        data.setdefault("parity", {})["deep_ensemble"] = False  # the option the default recipe sets (member
        #                                                         parity is gated by the quick pipeline test)
        (tmp / path.stem).mkdir()
        recipe = tmp / path.stem / path.name
        recipe.write_text(yaml.safe_dump(data))
        procs[path.stem] = (data, subprocess.Popen(
            [sys.executable, "-m", "toolchain", "run", str(recipe), "--profile", "quick"], cwd=ROOT, env=env,
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
    out = {}
    for stem, (data, proc) in procs.items():
        _o, err = proc.communicate(timeout=1800)
        out[stem] = (data, err if proc.returncode == 0 else f"exit {proc.returncode}: {err[-3000:]}")
    return out


@pytest.mark.parametrize("path", RECIPES, ids=[p.stem for p in RECIPES])
def test_family_recipe_quick_end_to_end(runs, path):
    data, err = runs[path.stem]
    assert not err.startswith("exit "), err
    tmp_path = Path(data["artifacts_dir"]).parent
    art = tmp_path / "artifacts" / f"{data['name']}-quick"
    members = json.loads((art / "prune" / "members.json").read_text())
    assert len(members["members"]) == 2
    hydra = json.loads((art / "fuse" / "hydra" / "hydra_config.json").read_text())
    assert hydra["family"] == data["model"]["family"] and hydra["members"] == 2
    # every family recipe recovers its members (a few steps): the fused model is built from the recovered
    # members, which fuse only if recovery froze what the adapter declares shared (ELECTRA's projection, ...)
    assert data["pruning"]["recovery"]["steps"] > 0
    assert hydra["source"] == "members" and all((art / "prune" / f"member{i}").is_dir() for i in range(2))
    if data["pruning"].get("fork"):  # the cost levers (LLaMA, DeiT): a trunk run once, per-member MLP slices
        assert hydra["fork"] == data["pruning"]["fork"] and hydra["layers"][-1]["neurons"]
        assert "neurons" not in hydra["layers"][0] and hydra["mlp"] == "grouped"
    graphs = json.loads((art / "export" / "graphs.json").read_text())
    for name in ("hydra-conv", "single"):
        assert graphs[name]["dynamic_check"]["ok"] and graphs[name]["lint_ok"], (name, graphs[name]["lint"])
    assert {"hydra-conv.bf16", "single.bf16"} <= set(graphs)
    report = (art / "report" / "report.md").read_text()
    assert "| hydra | pass |" in report and "| single | pass |" in report
    # parity.deep_ensemble: false: the members are exported and evaluated but not gated, and the verdict says so
    verdict = json.loads((art / "parity" / "verdict.json").read_text())
    assert set(verdict["groups"]) == {"hydra", "single"} and verdict["exit_code"] == 0
    assert "parity.deep_ensemble is false" in verdict["not_gated"]["member1"] and graphs["member1"]["kind"] == "member"
    metrics = json.loads((art / "evaluate" / "metrics.json").read_text())
    assert {"single", "deep-ensemble", "hydra"} <= set(metrics)
