"""benchmarks/gpu/run.py and scripts/gpu-check.sh: the dry run on CPU, the no-CUDA exit, the time guard,
and the torch-only models against the project's (transformers + toolchain.hydra.fuse)."""

import importlib.util
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
RUN = ROOT / "benchmarks" / "gpu" / "run.py"
PRECISIONS = ("fp32", "fp16-autocast", "bf16-autocast", "fp16", "bf16")
MODES = ("eager", "cudagraph", "compile", "compile-cudagraph")
KINDS = ("single", "single-sdpa", "deep-ensemble", "hydra-k4-conv", "hydra-k4-matmul", "hydra-k6-conv",
         "hydra-k6-matmul")


def _load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def gpu_run():
    """run.py loaded as a module (it puts benchmarks/gpu and the repository root on sys.path)."""
    return _load(RUN, "gpu_bench_run")


@pytest.fixture
def restore_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def _env() -> dict:
    return {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHON": sys.executable, "CUDA_VISIBLE_DEVICES": ""}


# ------------------------------------------------------------------------------------------ models
def test_standalone_models_equal_the_projects(gpu_run):
    """Same weights, same outputs: HF BertForSequenceClassification vs the standalone encoder, and
    toolchain.hydra.fuse vs the standalone Hydra (both lowerings, 4 and 6 heads kept)."""
    import gpu_models as gm

    torch.set_num_threads(1)
    shape = gm.TOY_SHAPES["bert-base"]
    cpu = torch.device("cpu")
    kw = {"members": 3, "kept": (4, 6), "lowerings": ("conv", "matmul"), "device": cpu}
    ours = gm.build_models(shape, impl="standalone", **kw)
    theirs = gm.build_models(shape, impl="project", **kw)
    assert set(ours) == set(theirs) == set(KINDS)
    inputs = gm.make_inputs(shape, 4, 16, cpu)
    assert int(inputs[1].sum()) < inputs[1].numel()  # some keys are padded: the key bias matters
    with torch.no_grad():
        outs = {name: ours[name](*inputs) for name in KINDS}
        for name in KINDS:
            ref_logits, ref_probs = theirs[name](*inputs)
            torch.testing.assert_close(outs[name][0], ref_logits, atol=1e-5, rtol=1e-5, msg=name)
            torch.testing.assert_close(outs[name][1], ref_probs, atol=1e-6, rtol=1e-5, msg=name)
    # the Hydra really prunes: its members differ from each other and from the single model
    member_logits = outs["hydra-k4-conv"][0]
    assert member_logits.shape == (4, 3, gm.NUM_LABELS)
    assert (member_logits[:, 0] - member_logits[:, 1]).abs().max() > 1e-3
    assert (outs["hydra-k4-conv"][1] - outs["single"][1]).abs().max() > 1e-4
    torch.testing.assert_close(outs["hydra-k6-conv"][1], outs["hydra-k6-matmul"][1], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(outs["single-sdpa"][1], outs["single"][1], atol=1e-5, rtol=1e-5)


def test_keep_masks_counts_and_overlap():
    sys.path.insert(0, str(RUN.parent))
    import gpu_models as gm

    four = gm.keep_masks(3, 2, 12, 4)
    assert four.sum(-1).eq(4).all() and four.sum(0).max() == 1  # disjoint
    six = gm.keep_masks(3, 2, 12, 6)
    assert six.sum(-1).eq(6).all() and six.sum(0).sum() == 36 and six.any(0).all()


def test_ratio_statistics_match_numpy(gpu_run):
    import gpu_report

    rng = np.random.default_rng(0)
    values = rng.lognormal(size=37).tolist()
    for q in (0, 10, 50, 90, 100):
        assert gpu_report.percentile(values, q) == pytest.approx(float(np.percentile(values, q)))
    num, den = rng.uniform(1, 2, 41).tolist(), rng.uniform(1, 2, 41).tolist()
    stats = gpu_report.ratio_stats(num, den)
    ratios = np.asarray(num) / np.asarray(den)
    assert stats["median"] == pytest.approx(float(np.median(ratios)))
    assert stats["ci95"][0] <= stats["median"] <= stats["ci95"][1]
    assert stats["p10"] < stats["median"] < stats["p90"]
    with pytest.raises(ValueError):
        gpu_report.ratio_stats([1.0], [1.0, 2.0])


# ------------------------------------------------------------------------------------------ dry run
@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    """The CI dry run through scripts/gpu-check.sh (default matrix, toy sizes, CPU)."""
    out = tmp_path_factory.mktemp("gpu-dry")
    # no time budget here: the guard is tested below; a loaded CI machine must not skip rows
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "gpu-check.sh"), str(out), "--dry-run",
                           "--budget-s", "100000"], cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads((out / "results.json").read_text()), (out / "results.md").read_text()


def test_dry_run_has_every_row_with_finite_ratios(dry_run):
    result, _ = dry_run
    rows = result["rows"]
    keys = {(r["shape"], r["batch"], r["precision"], r["mode"], r["variant"]) for r in rows}
    expected = {(s, b, p, m, k) for s in ("minilm", "bert-base") for b in (1, 2) for p in PRECISIONS
                for m in MODES for k in KINDS}
    assert keys == expected and len(rows) == len(expected)
    for r in rows:
        compiled = r["mode"].startswith("compile")
        planned = not compiled or (r["precision"] == "bf16" and r["variant"] != "single-sdpa")
        assert r["status"] == ("measured" if planned else "not-planned"), r
        if r["status"] != "measured":
            continue
        assert 0 < r["p10_ms"] <= r["median_ms"] <= r["p90_ms"]
        assert r["parity"]["finite"] == 1.0
        if r["variant"].startswith("hydra"):
            for den in ("single", "deep-ensemble"):
                ratio = r[f"ratio_vs_{den}"]
                assert ratio["n"] == 2
                assert all(math.isfinite(ratio[k]) and ratio[k] > 0 for k in ("median", "p10", "p90")), ratio
                assert ratio["ci95"][0] <= ratio["median"] <= ratio["ci95"][1]
    groups = [g for g in result["groups"] if g["status"] == "measured"]
    assert len(groups) == 2 * 2 * (5 * 2 + 2)  # eager + cudagraph at every precision, compile (x2) at bf16
    # a deep ensemble runs three models: over all groups it is slower than one
    assert np.median([g["ratios"]["deep-ensemble/single"]["median"] for g in groups]) > 1.2


def test_dry_run_parity_is_exact_for_fp32_and_small_for_half(dry_run):
    result, _ = dry_run
    for g in result["groups"]:
        if g["status"] != "measured":
            continue
        for name, p in g["parity"].items():
            if g["precision"] == "fp32":  # the same FP32 computation, replayed or traced
                assert p["logits_max_abs"] < 1e-5 and p["probs_max_abs"] < 1e-6, (g["mode"], name, p)
            else:
                assert 0 < p["logits_rel"] < 0.1 and p["probs_max_abs"] < 0.05, (g["precision"], name, p)


def test_dry_run_markdown(dry_run):
    result, md = dry_run
    assert "Paper (seed numbers, BF16): Hydra 1.07x the single model's latency, deep ensemble 2.99x." in md
    assert "Dry run" in md and "## Hydra / single" in md and "## Hydra / deep-ensemble" in md
    assert "## Numeric parity vs FP32 eager" in md
    for g in result["groups"]:
        if g["status"] == "measured":
            row = f"| {g['shape']} | {g['batch']} | {g['precision']} | {g['mode']} |"
            assert md.count(row) >= 4, row  # both ratio tables, other ratios, latency
    assert result["meta"]["impl"] in ("project", "standalone")
    assert result["meta"]["clock"].startswith("perf_counter")


# ------------------------------------------------------------------------------------------ exits and guard
@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_no_cuda_exits_3_with_a_clear_message(tmp_path):
    out = tmp_path / "res"
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "gpu-check.sh"), str(out)], cwd=ROOT, env=_env(),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 3, proc.stderr
    assert "no CUDA device" in proc.stderr and "--dry-run" in proc.stderr
    assert not (out / "results.json").exists()


def test_time_guard_skips_and_records(gpu_run, tmp_path, restore_threads):
    base = ["--dry-run", "--impl", "standalone", "--shapes", "minilm", "--batches", "1", "--precisions", "fp32,bf16",
            "--compile-precisions", "fp32,bf16"]
    gpu_run.STARTED = time.monotonic()
    # priors: an eager group ~1 s, a compile group ~3 s (x1.3): eager fits in 2 s, compile never does
    assert gpu_run.main([*base, "--budget-s", "2", "--out", str(tmp_path / "a")]) == 0
    groups = json.loads((tmp_path / "a" / "results.json").read_text())["groups"]
    assert groups[0]["status"] == "measured" and groups[0]["mode"] == "eager"
    for g in groups:
        if g["mode"] == "compile":
            assert g["status"] == "skipped" and g["reason"].startswith("time budget"), g
        if g["mode"] == "compile-cudagraph":
            assert g["status"] == "skipped", g
    assert "## Not measured" in (tmp_path / "a" / "results.md").read_text()
    # nothing fits: every group skipped and recorded, exit 1
    assert gpu_run.main([*base, "--budget-s", "0", "--out", str(tmp_path / "b")]) == 1
    rows = json.loads((tmp_path / "b" / "results.json").read_text())["rows"]
    assert len(rows) == 2 * 4 * len(KINDS) and all(r["status"] == "skipped" for r in rows)


def test_standalone_dry_run_compiles_under_autocast(gpu_run, tmp_path, restore_threads):
    args = ["--dry-run", "--impl", "standalone", "--shapes", "bert-base", "--batches", "2",
            "--precisions", "fp32,bf16-autocast", "--compile-precisions", "bf16-autocast", "--out", str(tmp_path)]
    gpu_run.STARTED = time.monotonic()
    assert gpu_run.main(args) == 0
    result = json.loads((tmp_path / "results.json").read_text())
    assert result["meta"]["impl"] == "standalone"
    status = {(g["precision"], g["mode"]): g["status"] for g in result["groups"]}
    assert status == {("fp32", "eager"): "measured", ("fp32", "cudagraph"): "measured",
                      ("bf16-autocast", "eager"): "measured", ("bf16-autocast", "cudagraph"): "measured",
                      ("bf16-autocast", "compile"): "measured", ("bf16-autocast", "compile-cudagraph"): "measured",
                      ("fp32", "compile"): "not-planned", ("fp32", "compile-cudagraph"): "not-planned"}
    compiled = next(g for g in result["groups"] if g["mode"] == "compile")
    assert "single-sdpa" not in compiled["latency"] and len(compiled["latency"]) == 6
