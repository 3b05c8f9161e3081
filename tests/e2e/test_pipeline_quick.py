"""End to end: the ``quick`` profiles through the CLI; caching, reruns and interrupted runs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from toolchain.artifacts import locked

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def _recipe(tmp_path: Path, name: str, **overrides: dict) -> Path:
    data = yaml.safe_load((ROOT / "recipes" / name).read_text())
    data["artifacts_dir"] = str(tmp_path / "artifacts")
    for section, values in overrides.items():
        data.setdefault(section, {}).update(values)
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data))
    return path


def _cli(*args: str, timeout: int = 900) -> subprocess.CompletedProcess:
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    return subprocess.run([sys.executable, "-m", "toolchain", *args], capture_output=True, text=True, cwd=ROOT,
                          env=env, timeout=timeout)


def _statuses(stderr: str) -> dict[str, str]:
    out = {}
    for line in stderr.splitlines():
        line = line.strip()
        if line.startswith("> ") and ":" in line:
            out[line[2:].split(":")[0]] = "ran"
        elif line.startswith("- ") and "up to date, skipped" in line:
            out[line[2:].split(":")[0]] = "skipped"
    return out


def test_text_quick_end_to_end_then_everything_skips(tmp_path, browser_dom):
    recipe = _recipe(tmp_path, "minilm-tweets.yaml")
    first = _cli("run", str(recipe), "--profile", "quick")
    assert first.returncode == 0, first.stderr[-3000:]
    # a CI log (stderr is a pipe here): progress as whole lines, no carriage-return redraws, labelled
    assert "\r" not in first.stderr and max(map(len, first.stderr.splitlines())) < 400
    assert "deep-ensemble member 1/1" in first.stderr
    art = tmp_path / "artifacts" / "minilm-tweets-quick"
    metrics = json.loads((art / "evaluate" / "metrics.json").read_text())
    assert {"single", "deep-ensemble", "hydra"} <= set(metrics)
    report = (art / "report" / "report.md").read_text()
    assert "## Parity" in report and "| hydra | pass |" in report and "| single | pass |" in report
    dom = browser_dom(art / "report" / "report.html")  # the HTML report as a browser renders it
    assert dom.count("<table>") >= 4 and "<td>hydra</td>" in dom and "<pre>" not in dom
    rows = [line for line in report.splitlines() if line.startswith("| hydra | ")]
    assert len(rows) == 5  # the results, ensemble-gain, far- and near-OOD tables and the parity verdict
    assert "## Exported graphs" in report and "| nodes without Constant |" in report  # node counts per graph
    # the corruption suite of the quick profile: 2 kinds x severities 1 and 5 on 32 test rows, every variant
    shift = json.loads((art / "evaluate" / "shift.json").read_text())
    assert shift["kinds"] == ["typos", "word_dropout"] and shift["severities"] == [1, 5] and shift["rows"] == 32
    assert set(shift["mean"]["5"]) == {"single", "deep-ensemble", "hydra"}
    assert set(shift["differences"]["5"]) == {"hydra-minus-single", "hydra-minus-deep-ensemble"}
    assert "## Under input corruption (test split)" in report and (art / "evaluate" / "shift.png").is_file()
    assert set(shift["differences_by_kind"]) == {"typos", "word_dropout"} and "Per corruption kind:" in report
    # far OOD (BBC) and near OOD (Coachella tweets held out of the ID data) for every variant, with paired intervals
    ood = json.loads((art / "evaluate" / "ood.json").read_text())
    assert {k: v["split"] for k, v in ood.items()} == {"far": "ood_test", "near": "near_ood_test"}
    assert ood["near"]["rows"] == 32 and set(ood["near"]["metrics"]) == {"single", "deep-ensemble", "hydra"}
    d = ood["near"]["differences"]["hydra-minus-deep-ensemble"]
    assert set(d) == {"auroc_msp", "auroc_entropy", "auroc_mi"} and d["auroc_msp"]["ci"][0] <= d["auroc_msp"]["diff"]
    assert "## Near-OOD detection (near_ood_test, 32 rows)" in report and "## Far-OOD detection" in report
    # the recipe's compare variants (Taylor, circuit) side by side, each pruned with its own criterion
    assert all(f"| hydra-{n} |" in report for n in ("hies", "taylor", "circuit"))
    compare = json.loads((art / "compare" / "compare.json").read_text())
    assert {k: v["criterion"] for k, v in compare.items()} == {"hies": "hies", "taylor": "taylor", "circuit": "circuit"}
    members_json = json.loads((art / "prune" / "members.json").read_text())
    assert (members_json["criterion"], members_json["strategy"]) == ("circuit", "circuit-samples")
    assert all((art / "prune" / f"member{i}").is_dir() for i in range(2))  # recovery fine-tuned members
    # validation numbers for model selection: ood_val rows the circuit objective never saw, gains with intervals
    selection = json.loads((art / "evaluate" / "selection.json").read_text())
    assert selection["ood_val_rows"] == [16, 32] and selection["ood_val_rows_seen_by_scoring"] == 0
    assert {"nll", "auroc_msp"} <= set(selection["gain"])
    assert {"single", "deep-ensemble", "hydra"} <= set(selection)  # the rule's baselines, on the same rows
    assert all("auroc_msp" in selection[v] for v in ("single", "deep-ensemble", "hydra"))
    assert selection["gain"]["nll"]["ci"][0] <= selection["gain"]["nll"]["gain"] <= selection["gain"]["nll"]["ci"][1]
    for name in compare:
        assert json.loads((art / "variants" / name / "prune" / "members.json").read_text())["criterion"] == name
    # ensemble gain with paired-bootstrap intervals, for Hydra and the deep ensemble
    diversity = json.loads((art / "evaluate" / "diversity.json").read_text())
    for name in ("hydra", "deep-ensemble"):
        nll = diversity[name]["gain"]["nll"]
        assert nll["ci"][0] <= nll["gain"] <= nll["ci"][1]
        assert nll["gain"] >= 0  # the mean of the members' probabilities never has a higher NLL (convexity)
    # the equal-budget deep ensemble: every member trained exactly as the single model, only the seed differs
    members = json.loads((art / "ensemble" / "metrics.json").read_text())["members"]
    base = json.loads((art / "finetune" / "metrics.json").read_text())
    budget = ("steps", "lr", "batch_size", "weight_decay", "schedule")
    assert len(members) == 2 and all({k: m[k] for k in budget} == {k: base[k] for k in budget} for m in members)
    assert len({m["seed"] for m in members}) == 2
    graphs = json.loads((art / "export" / "graphs.json").read_text())
    assert graphs["hydra-conv"]["summary"]["grouped_conv"] > 0
    assert all(g["dynamic_check"]["ok"] for g in graphs.values() if g["precision"] == "fp32")
    assert all(g["lint_ok"] for g in graphs.values() if g["precision"] == "fp32"), graphs["hydra-conv"]["lint"]
    lean = {n: g["stats"]["nodes_excluding_constant"] for n, g in graphs.items()}  # every graph is counted
    assert lean["hydra-conv"] <= 1.3 * lean["single"] and lean["hydra-matmul"] <= 1.3 * lean["single"], lean
    # OpenVINO: every FP32 graph compiled at FP32 and BF16 (BF16 where this CPU has it, else recorded with the
    # reason), gated against PyTorch at the precision it reports it ran, benched beside ONNX Runtime in one run
    from toolchain.engines import engine_kind

    bf16 = engine_kind("openvino-cpu").unavailable("bf16")
    built = json.loads((art / "build" / "engines.json").read_text())["openvino-cpu"]
    fp32_graphs = sorted(n for n, g in graphs.items() if g["precision"] == "fp32")
    assert sorted(n for n, e in built["engines"].items() if e["precision"] == "fp32") == fp32_graphs
    low = sorted(built["engines"] if bf16 is None else built["unavailable"])
    assert low == sorted([*fp32_graphs, *[f"{n}.bf16" for n in fp32_graphs]] if bf16 is None else
                         [f"{n}.bf16" for n in fp32_graphs])
    verdict = json.loads((art / "parity" / "verdict.json").read_text())
    assert set(verdict["groups"]) == {"hydra", "single", "member1"} and verdict["exit_code"] == 0
    assert verdict["groups"]["hydra"]["precisions"]["openvino-cpu:hydra-conv"] == "fp32"
    if bf16 is None:
        assert verdict["groups"]["single"]["precisions"]["openvino-cpu:single.bf16"] == "bf16"
    latency = json.loads((art / "bench" / "latency.json").read_text())
    assert latency["engines"]["openvino-cpu"]["status"] == "ok" and latency["settings"]["sequence_length"] == 32
    assert {"deep-ensemble.bf16", "hydra-conv.bf16"} <= set(latency["engines"]["openvino-cpu"]["plan"]) or bf16
    rows = latency["throughput"]
    assert rows["rows"] == 48 and rows["engines"]["onnxrt-cpu"]["hydra-conv"]["rows_per_s"] > 0
    assert "openvino-cpu:single/onnxrt-cpu:single" in latency["cross_ratios"][0]["ratios"]
    second = _cli("run", str(recipe), "--profile", "quick")
    assert second.returncode == 0
    st = _statuses(second.stderr)
    assert st and set(st.values()) == {"skipped"}, st
    assert _cli("verify", str(art)).returncode == 0


def test_image_quick_reruns_exactly_downstream_and_resumes_after_kill(tmp_path):
    recipe = _recipe(tmp_path, "vit-fashion-mnist.yaml")
    first = _cli("run", str(recipe), "--profile", "quick")
    assert first.returncode == 0, first.stderr[-3000:]
    art = tmp_path / "artifacts" / "vit-fashion-mnist-quick"

    # data.near_ood.rows only selects which held-out rows evaluate scores: evaluate and report rerun, nothing else
    fewer = yaml.safe_load(recipe.read_text())
    fewer["profiles"]["quick"]["data"]["near_ood"]["rows"] = 48
    (tmp_path / "fewer.yaml").write_text(yaml.safe_dump(fewer))
    rerun = _cli("run", str(tmp_path / "fewer.yaml"), "--profile", "quick")
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    st = _statuses(rerun.stderr)
    assert {s for s, v in st.items() if v == "ran"} == {"evaluate", "report"}, st
    assert json.loads((art / "evaluate" / "ood.json").read_text())["near"]["rows"] == 48  # the new count scored
    before = {p: p.stat().st_mtime_ns for p in art.glob("*/manifest.json")}

    # one field of the scoring section: score and everything after it rerun, nothing before
    changed = _recipe(tmp_path, "vit-fashion-mnist.yaml", scoring={"alpha": 0.8})
    rerun = _cli("run", str(changed), "--profile", "quick")
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    st = _statuses(rerun.stderr)
    assert [s for s, v in st.items() if v == "skipped"] == ["load", "finetune", "ensemble"], st
    assert {"score", "prune", "fuse", "export", "evaluate", "report"} <= {s for s, v in st.items() if v == "ran"}
    assert before[art / "finetune" / "manifest.json"] == (art / "finetune" / "manifest.json").stat().st_mtime_ns

    # kill the run in the middle of the export stage: the previous export stays complete
    again = _recipe(tmp_path, "vit-fashion-mnist.yaml", scoring={"alpha": 0.3})
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    proc = subprocess.Popen([sys.executable, "-m", "toolchain", "run", str(again), "--profile", "quick"],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 300
    while time.time() < deadline and not list(art.glob(".export.tmp-*")):
        time.sleep(0.05)
    assert list(art.glob(".export.tmp-*")), "the export stage never started"
    proc.send_signal(signal.SIGTERM)
    _out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-2000:]
    assert not list(art.glob(".*.tmp-*")), "no half-written stage folder may stay behind"
    assert not (art / ".lock.holder").exists()  # the holder's record goes with the lock
    with locked(art):  # and the lock is free (an OS lock: its file may stay, nobody holds it)
        pass
    assert _cli("verify", str(art)).returncode == 0  # every published stage is intact
    resumed = _cli("run", str(again), "--profile", "quick")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    st = _statuses(resumed.stderr)
    assert st["score"] == "skipped" and st["prune"] == "skipped" and st["export"] == "ran", st


def test_clip_quick_structural_run(tmp_path):
    recipe = _recipe(tmp_path, "clip-tiny.yaml")
    out = _cli("run", str(recipe), "--profile", "quick")
    assert out.returncode == 0, out.stderr[-3000:]
    art = tmp_path / "artifacts" / "clip-tiny-quick"
    graphs = json.loads((art / "export" / "graphs.json").read_text())
    assert "hydra-conv" in graphs and graphs["hydra-conv"]["dynamic_check"]["ok"]
    assert graphs["hydra-conv"]["lint_ok"], graphs["hydra-conv"]["lint"]
