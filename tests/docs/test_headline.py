"""The README's headline table is what ``benchmarks/recipes/results.py`` writes for the default recipe.

The committed ``benchmarks/recipes/minilm-tweets.json`` holds the numbers (the script reads them from
a finished run's artifacts); README.md's ``<!-- headline:minilm-tweets -->`` block and
``benchmarks/recipes/minilm-tweets.md`` must be the script's rendering of that JSON. The script
itself is tested on a small artifacts folder in the formats the evaluate, parity and bench stages
write (OpenVINO BF16 variants included).
"""

from __future__ import annotations

import json

import pytest
from doc_text import README, ROOT, script

results = script("benchmarks/recipes/results.py", "recipe_results")
SUMMARY = ROOT / "benchmarks" / "recipes" / "minilm-tweets.json"
REGENERATE = ("python benchmarks/recipes/results.py --recipe recipes/minilm-tweets.yaml --readme README.md "
              "(after hydra-toolchain run recipes/minilm-tweets.yaml)")


def test_readme_headline_is_the_scripts_table_of_the_committed_json():
    summary = json.loads(SUMMARY.read_text())
    assert summary["schema"] == results.SCHEMA and summary["name"] == "minilm-tweets"
    assert results.read_block(README.read_text(), "minilm-tweets") == results.readme_block(summary), \
        f"README.md's headline differs from {SUMMARY.relative_to(ROOT)}: run {REGENERATE}"


def test_committed_results_page_is_the_scripts_rendering():
    summary = json.loads(SUMMARY.read_text())
    assert (SUMMARY.with_suffix(".md")).read_text() == results.markdown(summary), f"run {REGENERATE}"


def _stats(median: float, **more: float) -> dict:
    return {"median": median, "p10": median * 0.9, "p90": median * 1.1, "n": 3, **more}


def _artifacts(root):
    """A finished run's artifacts, cut down to what the script reads, in the stages' formats."""
    def write(rel, data):
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(data))

    variants = ("single", "deep-ensemble", "hydra")
    write("evaluate/metrics.json", {v: {"accuracy": 0.7 + i / 100, "nll": 0.6 - i / 100, "ece": 0.04}
                                    for i, v in enumerate([*variants, "hydra-members-mean"])})
    write("evaluate/manifest.json", {"key": "k1", "created": "2026-12-05T10:00:00+0000", "seconds": 1.0})
    write("evaluate/ood.json", {k: {"split": s, "rows": r, "metrics": {v: {"auroc_msp": a + i / 10}
                                                                      for i, v in enumerate(variants)}}
                                for k, s, r, a in (("far", "ood_test", 500, 0.6), ("near", "near_ood_test", 400, 0.5))})
    cases, tput = [], {}
    for kind, precisions in (("onnxrt-cpu", ("",)), ("openvino-cpu", ("", ".bf16"))):
        for batch in (1, 8):
            names = [f"{d}{p}" for p in precisions for d in ("single", "deep-ensemble", "hydra-conv", "hydra-matmul")]
            ms = {"single": 0.010, "deep-ensemble": 0.030, "hydra-conv": 0.020, "hydra-matmul": 0.019}
            scale = (1 if kind == "onnxrt-cpu" else 0.5) * batch
            cases.append({"engine": kind, "batch": batch, "sequence": 64,
                          "variants": {n: _stats(ms[n.split(".")[0]] * scale * (0.5 if ".bf16" in n else 1))
                                       for n in names},
                          "ratios": {f"hydra-conv{p}/{den}{p}": _stats(2.0 if den == "single" else 0.66)
                                     for p in precisions for den in ("single", "deep-ensemble")}})
        tput[kind] = {f"{d}{p}": _stats(1.0, rows_per_s=100.0 / (i + 1) * (2 if p else 1))
                      for p in precisions for i, d in enumerate(("single", "deep-ensemble", "hydra-conv"))}
    write("bench/latency.json", {
        "cases": cases, "settings": {"engines": ["onnxrt-cpu", "openvino-cpu"], "sequence_length": 64, "threads": 2,
                                     "rounds": {"1": 15, "8": 15}, "precisions": ["fp32", "bf16"]},
        "machine": {"processor": "Test CPU", "usable_cores": 2},
        "engines": {"onnxrt-cpu": {"status": "ok", "skipped_variants": {"bf16 graphs": "emulator is for parity"}},
                    "openvino-cpu": {"status": "ok", "skipped_variants": {}}},
        "throughput": {"batch_size": 32, "rows": 1000, "rounds": 3, "engines": tput}})
    write("bench/manifest.json", {"key": "k2", "created": "2026-12-05T11:00:00+0000"})
    write("parity/verdict.json", {"exit_code": 0, "skipped": {"openvino-cpu:single.fp16": "no FP16 here"},
                                  "groups": {g: {"status": "pass", "exit_code": 0, "problems": [],
                                                 "unresolved": [], "precisions": {"a": "fp32", "b": "bf16"}}
                                             for g in ("hydra", "single")}})
    write("parity/hydra/report.json", {"summary": {"checks": 120, "passed": 118, "failed": 0, "unresolved": 2}})


def test_results_script_reads_a_finished_run(tmp_path):
    _artifacts(tmp_path / "art")
    summary = results.collect(tmp_path / "art", recipe="recipes/x.yaml", profile=None, name="x", lowering="conv")
    cols = summary["latency"]["columns"]
    assert [results.column_title(c) for c in cols] == ["ONNX Runtime FP32", "OpenVINO FP32", "OpenVINO BF16"]
    assert summary["latency"]["batch"] == 1 and summary["latency"]["rounds"] == 15
    assert cols[0]["ms"] == pytest.approx({"single": 10.0, "deep-ensemble": 30.0, "hydra": 20.0})
    assert cols[2]["ms"]["hydra"] == pytest.approx(5.0)  # hydra-conv.bf16 on OpenVINO, not hydra-matmul
    assert cols[2]["ratios"] == pytest.approx({"hydra/single": 2.0, "hydra/deep-ensemble": 0.66})
    assert cols[2]["rows_per_s"]["single"] == pytest.approx(200.0)
    assert summary["metrics"]["hydra"] == pytest.approx({"accuracy": 0.72, "nll": 0.58, "far_auroc_msp": 0.8,
                                                         "near_auroc_msp": 0.7})
    assert "hydra-members-mean" not in summary["metrics"]
    assert summary["parity"]["hydra"]["passed"] == 118 and summary["parity"]["single"]["checks"] is None
    table = results.headline_table(summary)
    assert "| Hydra (`hydra-conv`) | 0.7200 | 0.5800 | 0.8000 | 0.7000 | 20.00 | 10.00 | 5.00 |" in table
    page = results.markdown(summary)
    assert "| OpenVINO BF16 | 2.00 [1.80, 2.20] | 0.66 [0.59, 0.73] |" in page
    assert "onnxrt-cpu bf16 graphs: emulator is for parity" in page and "| hydra | pass | 2 | 120 | 118 |" in page


def test_a_precision_the_bench_asked_for_but_could_not_time_is_a_column_of_dashes(tmp_path):
    """No OpenVINO BF16 engine built (a CPU without BF16): the column stays, empty; ONNX Runtime gets no BF16 column
    (it runs no BF16 kernels of its own: the emulator is for parity only)."""
    _artifacts(tmp_path / "art")
    path = tmp_path / "art" / "bench" / "latency.json"
    latency = json.loads(path.read_text())
    for case in latency["cases"]:
        case["variants"] = {k: v for k, v in case["variants"].items() if ".bf16" not in k}
        case["ratios"] = {k: v for k, v in case["ratios"].items() if ".bf16" not in k}
    latency["engines"]["openvino-cpu"]["skipped_variants"] = {"bf16 engines": "none built here (no BF16 on this CPU)"}
    path.write_text(json.dumps(latency))
    summary = results.collect(tmp_path / "art", recipe="recipes/x.yaml", profile=None, name="x", lowering="conv")
    cols = summary["latency"]["columns"]
    assert [results.column_title(c) for c in cols] == ["ONNX Runtime FP32", "OpenVINO FP32", "OpenVINO BF16"]
    assert cols[2]["ms"] == {"single": None, "deep-ensemble": None, "hydra": None}
    assert "| Hydra (`hydra-conv`) | 0.7200 | 0.5800 | 0.8000 | 0.7000 | 20.00 | 10.00 | - |" in \
        results.headline_table(summary)
    page = results.markdown(summary)
    assert "| OpenVINO BF16 | - | - |" in page and "none built here (no BF16 on this CPU)" in page


def test_the_caption_names_the_cpus_generation_and_vector_extensions_where_the_bench_recorded_them(tmp_path):
    """``AMD EPYC`` is the brand string of a Zen 3 (AVX2) and a Zen 4 (AVX-512 BF16) here: the caption says which."""
    _artifacts(tmp_path / "art")
    caption = results.headline_table(results.collect(tmp_path / "art", recipe="recipes/x.yaml", profile=None,
                                                     name="x", lowering="conv"))
    assert "on Test CPU (2 cores);" in caption  # no flags recorded (older bench files): the brand string only
    path = tmp_path / "art" / "bench" / "latency.json"
    latency = json.loads(path.read_text())
    latency["machine"] |= {"cpu_id": "x86 family 25 model 1", "cpu_flags": ["avx", "avx2", "fma"]}
    path.write_text(json.dumps(latency))
    summary = results.collect(tmp_path / "art", recipe="recipes/x.yaml", profile=None, name="x", lowering="conv")
    assert summary["latency"]["machine"]["vector_isa"] == "AVX2"
    assert "on Test CPU (2 cores, x86 family 25 model 1, AVX2);" in results.headline_table(summary)


def test_results_script_writes_its_files_and_the_readme_block(tmp_path):
    _artifacts(tmp_path / "artifacts" / "minilm-tweets")
    readme = tmp_path / "README.md"
    readme.write_text("intro\n<!-- headline:minilm-tweets -->\nold table\n<!-- /headline -->\nafter\n")
    assert results.main(["--recipe", str(ROOT / "recipes" / "minilm-tweets.yaml"), "--artifacts",
                         str(tmp_path / "artifacts" / "minilm-tweets"), "--out", str(tmp_path / "out"),
                         "--readme", str(readme)]) == 0
    summary = json.loads((tmp_path / "out" / "minilm-tweets.json").read_text())
    assert summary["command"] == "hydra-toolchain run recipes/minilm-tweets.yaml" and summary["profile"] is None
    assert (tmp_path / "out" / "minilm-tweets.md").read_text() == results.markdown(summary)
    text = readme.read_text()
    assert text.startswith("intro\n") and text.endswith("<!-- /headline -->\nafter\n") and "old table" not in text
    assert results.read_block(text, "minilm-tweets") == results.readme_block(summary)
    assert "| engine | Hydra / single | Hydra / deep ensemble |" in results.readme_block(summary)
