"""evaluate reuses the single model's outputs for deep-ensemble member 0 only when the files are the same."""

from __future__ import annotations

import json
from pathlib import Path

from toolchain.pipeline import Context, same_stage_files
from toolchain.recipe import load_recipe

ROOT = Path(__file__).resolve().parents[2]


def _ctx(tmp_path: Path, finetune: dict, ensemble: dict) -> Context:
    recipe = load_recipe(ROOT / "recipes" / "minilm-tweets.yaml", profile="quick").model_copy(
        update={"artifacts_dir": str(tmp_path)})
    ctx = Context(recipe)
    for name, files in (("finetune", finetune), ("ensemble", ensemble)):
        ctx.stage_dir(name).mkdir(parents=True)
        (ctx.stage_dir(name) / "manifest.json").write_text(json.dumps({"stage": name, "files": files}))
    return ctx


def test_member0_is_the_single_model_when_every_file_hash_matches(tmp_path):
    model = {"config.json": "a1", "model.safetensors": "b2"}
    ctx = _ctx(tmp_path, {"metrics.json": "x", **{f"model/{k}": v for k, v in model.items()}},
               {**{f"member0/{k}": v for k, v in model.items()}, "member1/model.safetensors": "c3"})
    assert same_stage_files(ctx, ("finetune", "model"), ("ensemble", "member0"))
    assert not same_stage_files(ctx, ("finetune", "model"), ("ensemble", "member1"))


def test_a_differing_or_missing_file_means_not_the_same(tmp_path):
    ctx = _ctx(tmp_path, {"model/config.json": "a1", "model/model.safetensors": "b2"},
               {"member0/config.json": "a1", "member0/model.safetensors": "zz"})
    assert not same_stage_files(ctx, ("finetune", "model"), ("ensemble", "member0"))
    ctx2 = _ctx(tmp_path / "2", {"model/config.json": "a1", "model/model.safetensors": "b2"},
                {"member0/config.json": "a1"})
    assert not same_stage_files(ctx2, ("finetune", "model"), ("ensemble", "member0"))
    assert not same_stage_files(ctx2, ("finetune", "nothing"), ("ensemble", "nothing"))
