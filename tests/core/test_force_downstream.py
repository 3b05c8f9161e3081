"""``--force STAGE`` reruns that stage and every stage downstream of it, and says so.

The pipeline core with fake stages (a registry of its own, real artifacts folders, manifests and
locks), then the real registry's closure. A stage whose upstream outputs changed since it was built
(a forced run that stopped early, or ran only up to the forced stage) reruns in the next run.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from rich.console import Console

import toolchain.pipeline as pipeline
from toolchain.pipeline import Context, Stage, force_reasons, forced_summary, run_pipeline, stages
from toolchain.recipe import load_recipe

ROOT = Path(__file__).resolve().parents[2]

#: a diamond and a side branch: a -> b -> d, a -> c -> d, d -> e, a -> side
EDGES = {"a": (), "b": ("a",), "c": ("a",), "d": ("b", "c"), "e": ("d",), "side": ("a",)}


@pytest.fixture
def fake(monkeypatch, tmp_path):
    """Fake stages in place of the real registry; each build records its call and writes one file."""
    calls: list[str] = []
    builds = iter(range(10**6))  # every build writes new content
    failing: set[str] = set()

    def build(name):
        def run(ctx, work: Path):
            calls.append(name)
            if name in failing:
                raise RuntimeError(f"stage {name} fails")
            (work / "out.txt").write_text(f"{name} {next(builds)}")
            return {}
        return run

    registry = {n: Stage(n, (), up, build(n), f"fake stage {n}" if n != "c" else (lambda ctx: "summary of c"))
                for n, up in EDGES.items()}
    monkeypatch.setattr(pipeline, "STAGES", registry)
    recipe = load_recipe(ROOT / "recipes" / "minilm-tweets.yaml").model_copy(
        update={"artifacts_dir": str(tmp_path / "art")})

    def run(force=(), fail=(), **kw):
        failing.clear()
        failing.update(fail)
        out = io.StringIO()
        ctx = Context(recipe=recipe, console=Console(file=out, width=200), force=frozenset(force), progress=False)
        calls.clear()
        if fail:
            with pytest.raises(RuntimeError):
                run_pipeline(ctx, **kw)
            return ctx, None, list(calls), out.getvalue()
        status = run_pipeline(ctx, **kw)
        return ctx, status, list(calls), out.getvalue()

    return run


def test_force_reasons_is_the_downstream_closure():
    registry = {n: Stage(n, (), up, lambda ctx, work: {}, n) for n, up in EDGES.items()}
    assert force_reasons({"b"}, registry) == {"b": "forced", "d": "downstream of forced b",
                                              "e": "downstream of forced b"}
    assert force_reasons({"a"}, registry) == {"a": "forced", **{n: "downstream of forced a" for n in "bcde"},
                                              "side": "downstream of forced a"}
    # two forced stages, one downstream of the other: each downstream stage names every forced origin
    assert force_reasons({"c", "b"}, registry)["e"] == "downstream of forced b, c"
    assert force_reasons({"a", "d"}, registry)["e"] == "downstream of forced a, d"
    assert force_reasons({"e"}, registry) == {"e": "forced"}
    assert force_reasons(set(), registry) == {}


def test_the_real_registry_force_bench_reruns_the_report():
    reasons = force_reasons({"bench"}, stages())
    assert reasons == {"bench": "forced", "report": "downstream of forced bench"}
    fuse = force_reasons({"fuse"}, stages())
    assert {"export", "evaluate", "build", "parity", "bench", "report"} <= set(fuse)
    assert not {"load", "finetune", "score", "prune", "ensemble", "compare"} & set(fuse)


def test_forced_stage_and_its_downstream_rerun_the_rest_stays_cached(fake, tmp_path):
    _, status, calls, _ = fake()
    assert calls == ["a", "b", "c", "d", "e", "side"] and set(status.values()) == {"ran"}
    _, status, calls, log = fake()
    assert calls == [] and set(status.values()) == {"skipped"} and "forced" not in log

    ctx, status, calls, log = fake(force={"b"})
    assert calls == ["b", "d", "e"]
    assert status == {"a": "skipped", "b": "ran", "c": "skipped", "d": "ran", "e": "ran", "side": "skipped"}
    assert "> b: forced: fake stage b" in log
    assert "> d: rerun (downstream of forced b): fake stage d" in log
    assert "> e: rerun (downstream of forced b): fake stage e" in log
    assert "forced: b; rerun: d (downstream of forced b), e (downstream of forced b)" in log
    assert ctx.forced_reruns == {"b": "forced", "d": "downstream of forced b", "e": "downstream of forced b"}
    art = tmp_path / "art" / "minilm-tweets"
    assert json.loads((art / "d" / "manifest.json").read_text())["rerun_reason"] == "downstream of forced b"
    assert json.loads((art / "b" / "manifest.json").read_text())["rerun_reason"] == "forced"
    assert "rerun_reason" not in json.loads((art / "c" / "manifest.json").read_text())

    _, status, calls, log = fake()  # the forced run left everything up to date
    assert calls == [] and "rerun" not in log


def test_force_with_until_reruns_only_the_stages_it_runs(fake):
    fake()
    _, status, calls, log = fake(force={"a"}, until="c")
    assert calls == ["a", "b", "c"] and list(status) == ["a", "b", "c"]
    assert "forced: a; rerun: b (downstream of forced a), c (downstream of forced a)" in log
    assert "> c: rerun (downstream of forced a): summary of c" in log  # a summary computed from the context


def test_forced_summary_line():
    assert forced_summary({}) == ""
    assert forced_summary({"bench": "forced", "report": "downstream of forced bench"}) == \
        "forced: bench; rerun: report (downstream of forced bench)"
    assert forced_summary({"report": "downstream of forced bench"}) == "rerun: report (downstream of forced bench)"


def test_a_forced_run_that_stopped_early_leaves_its_downstream_stale(fake):
    fake()
    _, _, calls, _ = fake(force={"b"}, fail={"d"})  # b rebuilt, d fails: d and e keep outputs of the old b
    assert calls == ["b", "d"]
    ctx, status, calls, log = fake()
    assert calls == ["d", "e"] and status["c"] == "skipped" and status["side"] == "skipped"
    assert "> d: rerun (upstream b rebuilt since): fake stage d" in log
    assert "> e: rerun (upstream b, d rebuilt since): fake stage e" in log  # every rebuilt ancestor is named
    assert ctx.forced_reruns == {"d": "upstream b rebuilt since", "e": "upstream b, d rebuilt since"}
    _, _, calls, _ = fake()
    assert calls == []


def test_forcing_only_up_to_a_stage_reruns_its_downstream_in_the_next_full_run(fake):
    fake()
    _, _, calls, _ = fake(force={"c"}, until="c")  # e.g. `hydra-toolchain bench R --force bench`, then `run R`
    assert calls == ["c"]
    _, _, calls, log = fake()
    assert calls == ["d", "e"] and "rerun: d (upstream c rebuilt since), e (upstream c, d rebuilt since)" in log


def test_an_upstream_rebuilt_to_the_same_files_leaves_its_downstream_up_to_date(fake, tmp_path):
    fake()
    art = tmp_path / "art" / "minilm-tweets"
    manifest = json.loads((art / "a" / "manifest.json").read_text())
    side = json.loads((art / "side" / "manifest.json").read_text())
    assert set(side["upstream_outputs"]) == {"a"}
    (art / "a" / "manifest.json").write_text(json.dumps({**manifest, "created": "later"}))  # same files
    _, _, calls, _ = fake()
    assert calls == []
    (art / "a" / "out.txt").write_text("other")  # a's files differ from its manifest: a reruns, so do the others
    _, _, calls, log = fake()
    assert calls == ["a", "b", "c", "d", "e", "side"]
    assert "> b: rerun (upstream a rebuilt since)" in log


def test_stages_published_before_upstream_outputs_were_recorded_stay_up_to_date(fake, tmp_path):
    fake()
    art = tmp_path / "art" / "minilm-tweets"
    for name in EDGES:  # as written by an older version
        path = art / name / "manifest.json"
        path.write_text(json.dumps({k: v for k, v in json.loads(path.read_text()).items() if k != "upstream_outputs"}))
    _, _, calls, _ = fake()
    assert calls == []


def test_a_rebuilt_ancestor_reruns_a_stage_whose_direct_upstream_did_not_change(monkeypatch, tmp_path):
    """export -> build -> parity, where build's files stay the same (no compiled engines) while parity
    reads export's graphs: a forced export run that stopped there must still rerun parity next time."""
    calls: list[str] = []
    builds = iter(range(10**6))

    def build(name, constant=False):
        def run(ctx, work: Path):
            calls.append(name)
            (work / "out.txt").write_text(name if constant else f"{name} {next(builds)}")
            return {}
        return run

    registry = {"export": Stage("export", (), (), build("export"), "export"),
                "build": Stage("build", (), ("export",), build("build", constant=True), "build"),
                "parity": Stage("parity", (), ("build",), build("parity"), "parity")}
    monkeypatch.setattr(pipeline, "STAGES", registry)
    recipe = load_recipe(ROOT / "recipes" / "minilm-tweets.yaml").model_copy(
        update={"artifacts_dir": str(tmp_path / "art")})

    def run(force=(), **kw):
        calls.clear()
        run_pipeline(Context(recipe=recipe, console=Console(file=io.StringIO(), width=200), force=frozenset(force),
                             progress=False), **kw)
        return list(calls)

    assert run() == ["export", "build", "parity"]
    assert run(force=["export"], until="export") == ["export"]
    assert run() == ["build", "parity"]  # build's files are unchanged, but parity read the old graphs
    assert run() == []


def test_an_ancestor_this_context_does_not_publish_was_not_rebuilt(fake, tmp_path):
    """A compare variant reusing the recipe's own folders has no score stage of its own: they stay up to date.

    Only a stage the context declares it does not publish is left out: a published ancestor whose folder is
    missing or differs still makes its downstream rerun.
    """
    import shutil

    from toolchain.artifacts import StageDir

    ctx, *_ = fake()
    sd = StageDir(ctx.root, "d", ctx.key("d"))
    assert pipeline._decide(ctx, pipeline.STAGES["d"], sd, None) == (True, None)
    own = ctx.stage_dir
    ctx.stage_dir = lambda name: tmp_path / "variant" / name if name == "b" else own(name)  # b not here
    assert pipeline._decide(ctx, pipeline.STAGES["d"], sd, None) == (False, "upstream b rebuilt since")
    ctx.publishes = lambda name: name != "b"  # as a compare variant says of the score stage
    assert pipeline._decide(ctx, pipeline.STAGES["d"], sd, None) == (True, None)
    ctx.publishes = lambda name: True
    (tmp_path / "variant").mkdir()
    shutil.copytree(own("b"), tmp_path / "variant" / "b")
    (tmp_path / "variant" / "b" / "manifest.json").write_text(
        json.dumps({**json.loads((own("b") / "manifest.json").read_text()), "files": {"out.txt": "other"}}))
    assert pipeline._decide(ctx, pipeline.STAGES["d"], sd, None) == (False, "upstream b rebuilt since")


def test_a_compare_variant_publishes_only_its_own_and_linked_stages():
    from toolchain.stages.common import VARIANT_STAGES, VariantContext

    recipe = load_recipe(ROOT / "recipes" / "minilm-tweets.yaml", profile="quick")  # it has compare variants
    parent = Context(recipe=recipe, progress=False)
    variant = VariantContext(parent, recipe.variant(recipe.compare[0]))
    assert [s for s in stages() if variant.publishes(s)] == [s for s in stages()
                                                             if s in (*VariantContext.LINKED, *VARIANT_STAGES)]
    assert not variant.publishes("score") and parent.publishes("score")
