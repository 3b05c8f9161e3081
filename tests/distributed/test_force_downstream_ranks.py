"""``--force`` on 2 ranks (gloo, CPU): every rank runs the same stages, rank 0 alone publishes.

Fake stages (no model, no data: seconds): ``a -> dist -> c``, ``a -> side``, where ``dist`` runs on
every rank. Rank 0 decides which stages are up to date and broadcasts it; the forced stage and its
downstream closure must rerun on the ranks that run them and the other stages stay skipped on all
ranks (a rank that disagreed would wait in a collective the others never reach: the job would hang).
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent("""\
    import io, json, os, sys
    from pathlib import Path
    from rich.console import Console
    import toolchain.pipeline as pipeline
    from toolchain import distributed as dist
    from toolchain.pipeline import Context, Stage, run_pipeline
    from toolchain.recipe import load_recipe

    root, force = Path(sys.argv[1]), [f for f in sys.argv[2].split(",") if f]
    calls = []

    def build(name):
        def run(ctx, work):
            calls.append(name)
            if name == "dist":
                dist.barrier(what="inside the distributed stage")  # every rank is here, or the job hangs
            (work / "out.txt").write_text(name)
            return {}
        return run

    edges = {"a": (), "dist": ("a",), "c": ("dist",), "side": ("a",)}
    pipeline.STAGES.update({n: Stage(n, (), up, build(n), "fake " + n, distributed=(n == "dist"))
                            for n, up in edges.items()})
    recipe = load_recipe(sys.argv[3]).model_copy(update={"artifacts_dir": str(root / "art")})
    out = io.StringIO()
    ctx = Context(recipe=recipe, console=Console(file=out, width=200), force=frozenset(force), progress=False)
    status = run_pipeline(ctx)
    rank = os.environ["RANK"]
    (root / f"rank{rank}-{sys.argv[2] or 'none'}.json").write_text(json.dumps(
        {"status": status, "calls": calls, "log": out.getvalue(), "reruns": ctx.forced_reruns}))
""")


def test_two_ranks_force_the_same_closure(jobs, tmp_path):
    script = tmp_path / "force_job.py"
    script.write_text(SCRIPT)
    recipe = str(ROOT / "recipes" / "minilm-tweets.yaml")

    def job(force: str) -> list[dict]:
        results = jobs.launch([str(script), str(tmp_path), force, recipe], world=2, timeout=120, TMPDIR=str(tmp_path))
        assert all(r.returncode == 0 for r in results), [r.stderr[-2000:] for r in results]
        return [json.loads((tmp_path / f"rank{r}-{force or 'none'}.json").read_text()) for r in range(2)]

    first = job("")
    assert first[0]["calls"] == ["a", "dist", "c", "side"] and first[1]["calls"] == ["dist"]
    forced = job("dist")
    for rank in forced:
        assert rank["status"] == {"a": "skipped", "dist": "ran", "c": "ran", "side": "skipped"}
    assert forced[0]["calls"] == ["dist", "c"] and forced[1]["calls"] == ["dist"]  # c: rank 0 only
    assert forced[0]["reruns"] == {"dist": "forced", "c": "downstream of forced dist"}
    assert "forced: dist; rerun: c (downstream of forced dist)" in forced[0]["log"]
    assert forced[1]["log"] == ""  # the other rank is quiet
    art = tmp_path / "art" / "minilm-tweets"
    assert json.loads((art / "c" / "manifest.json").read_text())["rerun_reason"] == "downstream of forced dist"
    again = job("")
    assert again[0]["calls"] == [] and again[1]["calls"] == []
    assert set(again[0]["status"].values()) == {"skipped"}
