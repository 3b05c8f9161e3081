"""run_bench end to end on a tiny BERT export folder, plus its planning and feed helpers."""

import json

import numpy as np
import pytest
import torch

from toolchain.bench import Peaks, make_feed, plan_variants, ratio_pairs, run_bench
from toolchain.bench.suite import vocabulary_size
from toolchain.errors import GraphError
from toolchain.export.onnx_export import export_onnx
from toolchain.hydra.fuse import fuse, save_hydra
from toolchain.models.tiny import TINY_MODELS
from toolchain.models.wrappers import SingleModel

TEXT_INPUTS = [{"name": n, "dtype": "int64", "dims": ["batch", "sequence"]}
               for n in ("input_ids", "attention_mask", "token_type_ids")]


def _graphs(*names):
    out = {}
    for n in names:
        base, _, prec = n.partition(".")
        kind = "hydra" if base.startswith("hydra") else ("member" if base.startswith("member") else "single")
        out[n] = {"kind": kind, "precision": prec or "fp32", "path": f"{n}.onnx"}
    return out


class TestPlan:
    def test_fp32_plan(self):
        graphs = _graphs("single", "member2", "member1", "hydra-matmul", "hydra-conv", "hydra-conv.fp16")
        plan = plan_variants(graphs)
        assert plan == {"single": ["single"], "deep-ensemble": ["single", "member1", "member2"],
                        "hydra-conv": ["hydra-conv"], "hydra-matmul": ["hydra-matmul"]}

    def test_other_precisions_have_no_deep_ensemble(self):
        graphs = _graphs("single", "member1", "hydra-conv", "single.fp16", "hydra-conv.fp16")
        plan = plan_variants(graphs, ("fp32", "fp16"))
        assert list(plan) == ["single", "deep-ensemble", "hydra-conv", "single.fp16", "hydra-conv.fp16"]

    def test_member_order_is_numeric(self):
        graphs = _graphs("single", *(f"member{i}" for i in (10, 2, 1)))
        assert plan_variants(graphs)["deep-ensemble"] == ["single", "member1", "member2", "member10"]

    def test_ratio_pairs(self):
        pairs = ratio_pairs(["single", "deep-ensemble", "hydra-conv", "single.fp16", "hydra-conv.fp16"])
        assert pairs == [("hydra-conv", "single"), ("hydra-conv", "deep-ensemble"),
                         ("hydra-conv.fp16", "single.fp16"), ("deep-ensemble", "single")]
        assert ratio_pairs(["hydra-conv"]) == []


class TestFeeds:
    def test_text_feed(self):
        feed = make_feed(TEXT_INPUTS, 3, 16, seed=1)
        assert {k: (v.shape, v.dtype) for k, v in feed.items()} == {
            k: ((3, 16), np.dtype(np.int64)) for k in ("input_ids", "attention_mask", "token_type_ids")}
        assert 1000 <= feed["input_ids"].min() and feed["input_ids"].max() < 20000
        assert (feed["attention_mask"] == 1).all() and (feed["token_type_ids"] == 0).all()

    def test_small_vocabulary(self):
        ids = make_feed(TEXT_INPUTS, 4, 32, vocab=100)["input_ids"]
        assert 10 <= ids.min() and ids.max() < 100

    def test_image_feed(self):
        feed = make_feed([{"name": "pixel_values", "dtype": "float", "dims": ["batch", 3, 16, 16]}], 2, 128)
        assert feed["pixel_values"].shape == (2, 3, 16, 16) and feed["pixel_values"].dtype == np.float32
        with pytest.raises(GraphError, match="static"):
            make_feed([{"name": "pixel_values", "dtype": "float", "dims": ["batch", 3, "h", 16]}], 2, 128)


# ------------------------------------------------------------------------------ end to end
@pytest.fixture(scope="module")
def tiny_export(tmp_path_factory):
    """single.onnx + member1.onnx + hydra-{conv,matmul}.onnx of a tiny BERT, graphs.json, fuse/hydra."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        root = tmp_path_factory.mktemp("recipe")
        export = root / "export"
        base, other = TINY_MODELS["bert"](seed=0), TINY_MODELS["bert"](seed=1)
        feed = base.make_batch(2, seed=0, pad=False)
        dyn = {n: {0: "batch", 1: "sequence"} for n in feed}
        masks = torch.zeros(3, 2, 4, dtype=torch.bool)
        for m in range(3):
            masks[m, :, m:m + 2] = True
        graphs, modules = {}, {}
        hydra_out = ["probs", "member_logits"]
        for name, module, outputs in (("single", SingleModel(base.adapter), ["logits", "probs"]),
                                      ("member1", SingleModel(other.adapter), ["logits", "probs"]),
                                      ("hydra-conv", fuse(base.adapter, masks, lowering="conv"), hydra_out),
                                      ("hydra-matmul", fuse(base.adapter, masks, lowering="matmul"), hydra_out)):
            res = export_onnx(module, feed, outputs, export / f"{name}.onnx", dynamic_axes=dyn)
            kind = name.split("-")[0].rstrip("1")
            graphs[name] = {"kind": kind, "precision": "fp32", "path": f"{name}.onnx", "inputs": list(feed),
                            "outputs": outputs, "summary": res.summary,
                            **({"lowering": name.split("-")[1]} if kind == "hydra" else {})}
            modules[name] = module
        (export / "graphs.json").write_text(json.dumps(graphs))
        save_hydra(modules["hydra-conv"], root / "fuse" / "hydra")
        yield export, modules
    finally:
        torch.set_num_threads(previous)


@pytest.fixture(scope="module")
def bench_result(tiny_export, tmp_path_factory):
    export, modules = tiny_export
    out = tmp_path_factory.mktemp("bench")
    result = run_bench(export, batch_sizes=[1, 2], sequence_length=8, threads=1, warmup=1, rounds={1: 3, 2: 2},
                       engines=("onnxrt-cpu", "onnxrt-cuda", "tensorrt", "torch"), out_dir=out, progress=False,
                       torch_modules=modules, peaks=Peaks(1e11, 1e10))
    return result, out


VARIANTS = ["single", "deep-ensemble", "hydra-conv", "hydra-matmul"]
RATIOS = {"hydra-conv/single", "hydra-conv/deep-ensemble", "hydra-matmul/single", "hydra-matmul/deep-ensemble",
          "deep-ensemble/single"}


class TestRunBench:
    def test_engines_and_skips(self, bench_result):
        import onnxruntime as ort

        result, _ = bench_result
        engines = result["engines"]
        assert engines["onnxrt-cpu"]["status"] == "ok" and engines["torch"]["status"] == "ok"
        assert engines["tensorrt"]["status"] == "skipped" and "engines.json" in engines["tensorrt"]["reason"]
        if "CUDAExecutionProvider" not in ort.get_available_providers():
            assert engines["onnxrt-cuda"]["status"] == "skipped"
            assert "CUDAExecutionProvider" in engines["onnxrt-cuda"]["reason"]
        assert engines["onnxrt-cpu"]["variants"]["deep-ensemble"]["graphs"] == ["single", "member1"]
        assert engines["onnxrt-cpu"]["variants"]["deep-ensemble"]["runners"] == 2
        assert result["plan"]["deep-ensemble"] == ["single", "member1"]

    def test_cases_samples_and_ratios(self, bench_result):
        result, _ = bench_result
        cases = [c for c in result["cases"] if c["engine"] == "onnxrt-cpu"]
        assert [(c["batch"], c["sequence"]) for c in cases] == [(1, 8), (2, 8)]
        assert {c["engine"] for c in result["cases"]} == {"onnxrt-cpu", "torch"}
        assert result["settings"]["rounds"] == {"1": 3, "2": 2}
        for case in result["cases"]:
            assert list(case["variants"]) == VARIANTS == case["order"]
            for v in case["variants"].values():
                assert len(v["samples_s"]) == {1: 3, 2: 2}[case["batch"]] and all(s > 0 for s in v["samples_s"])
                assert v["median"] == pytest.approx(float(np.median(v["samples_s"])))
                assert v["throughput"] == pytest.approx(case["batch"] / v["median"])
            assert set(case["ratios"]) == RATIOS
            for key, r in case["ratios"].items():
                num, den = key.split("/")
                expected = np.array(case["variants"][num]["samples_s"]) / np.array(case["variants"][den]["samples_s"])
                assert r["per_round"] == pytest.approx(expected.tolist())

    def test_analytic_and_roofline(self, bench_result):
        result, _ = bench_result
        cm = result["analytic"]["cost_model"]
        assert cm["heads_per_member"] == [[2, 2]] * 3 and cm["spec"]["heads"] == [4, 4]
        assert result["settings"]["tokens"] == 8 and result["settings"]["vocabulary"] == 100
        case = result["cases"][0]
        expected = result["analytic"]["by_precision"]["fp32"]["1"]
        analytic = expected["ratios_vs_single"]["hydra"]["flops"]
        assert case["analytic_ratios"]["hydra"]["flops"] == pytest.approx(analytic)
        roof = case["roofline"]["hydra-conv"]
        assert roof["flops"] == expected["hydra"]["flops"]
        assert roof["bound_s"] == pytest.approx(max(roof["flops"] / 1e11, roof["weight_bytes"] / 1e10))
        assert roof["ratio"] == pytest.approx(case["variants"]["hydra-conv"]["median"] / roof["bound_s"])
        assert result["peaks"]["source"] == "arguments"

    def test_sizes_and_memory(self, bench_result, tiny_export):
        result, _ = bench_result
        export, _ = tiny_export
        case = result["cases"][0]
        single = (export / "single.onnx").stat().st_size
        member = (export / "member1.onnx").stat().st_size
        assert case["variants"]["single"]["file_bytes"] == single
        assert case["variants"]["deep-ensemble"]["file_bytes"] == single + member
        assert result["memory"]["end"]["peak_rss_bytes"] > 0
        assert result["machine"]["versions"]["onnxruntime"]

    def test_report_files(self, bench_result):
        result, out = bench_result
        data = json.loads((out / "latency.json").read_text())
        first = result["cases"][0]["variants"]["single"]["samples_s"]
        assert data["cases"][0]["variants"]["single"]["samples_s"] == first
        md = (out / "latency.md").read_text()
        assert "| onnxrt-cpu | 1 | hydra-conv |" in md and "hydra-conv/deep-ensemble" in md
        assert "tensorrt: skipped" in md
        assert (out / "latency.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    def test_vocabulary_size(self, tiny_export):
        export, _ = tiny_export
        assert vocabulary_size(export / "single.onnx") == 100

    def test_bad_arguments(self, tiny_export, tmp_path):
        export, _ = tiny_export
        with pytest.raises(ValueError, match="engines"):
            run_bench(export, engines=("bogus",), progress=False)
        with pytest.raises(ValueError, match="batch_sizes"):
            run_bench(export, batch_sizes=[0], progress=False)
        with pytest.raises(GraphError, match=r"graphs\.json"):
            run_bench(tmp_path, progress=False)


def test_rounds_per_batch():
    from toolchain.bench.suite import _rounds_per_batch

    assert _rounds_per_batch(5, [1, 8]) == {1: 5, 8: 5}
    assert _rounds_per_batch({1: 100, 8: 20}, [1, 8]) == {1: 100, 8: 20}
    assert _rounds_per_batch({1: 100, 8: 20}, [1, 4]) == {1: 100, 4: 100}  # left out: the largest count
    with pytest.raises(ValueError):
        _rounds_per_batch({}, [1])
