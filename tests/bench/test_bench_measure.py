"""measure.py: statistics, per-round ratios, the interleaving order, clocks, memory and sizes."""

import importlib
import math

import numpy as np
import onnx
import pytest
from bench_fakes import FakeClock, FakeRunner, feed
from onnx import TensorProto, helper, numpy_helper

from toolchain.bench.measure import (
    Case,
    Variant,
    clock_for,
    file_footprint,
    is_cuda_runner,
    measure,
    paired_ratios,
    process_memory,
    summarize,
)

measure_mod = importlib.import_module("toolchain.bench.measure")  # the package re-exports the function


def _active(*runners):
    for r in runners:
        r.activate()
    return runners


class TestSummarize:
    def test_known_quantiles(self):
        s = summarize([0.005, 0.001, 0.004, 0.002, 0.003], batch=8)
        assert s["n"] == 5
        assert s["median"] == pytest.approx(0.003)
        assert s["min"] == pytest.approx(0.001) and s["max"] == pytest.approx(0.005)
        assert s["p10"] == pytest.approx(0.0014)  # linear interpolation: 0.001 + 0.4 * 0.001
        assert s["p90"] == pytest.approx(0.0046)
        assert s["p25"] == pytest.approx(0.002) and s["p75"] == pytest.approx(0.004)
        assert s["iqr"] == pytest.approx(0.002)
        assert s["spread"] == pytest.approx((0.0046 - 0.0014) / 0.003)
        assert s["rel_iqr"] == pytest.approx(0.002 / 0.003)
        assert s["throughput"] == pytest.approx(8 / 0.003)
        assert s["mean"] == pytest.approx(0.003)

    def test_single_sample(self):
        s = summarize([0.01])
        assert s["median"] == s["p99"] == s["min"] == 0.01
        assert s["std"] == 0.0 and s["spread"] == 0.0
        assert "throughput" not in s

    @pytest.mark.parametrize("bad", [[], [1.0, math.nan], [math.inf]])
    def test_rejects_empty_and_non_finite(self, bad):
        with pytest.raises(ValueError):
            summarize(bad)


class TestPairedRatios:
    def test_per_round_ratios(self):
        r = paired_ratios([2.0, 4.0, 9.0], [1.0, 2.0, 3.0])
        assert r["per_round"] == pytest.approx([2.0, 2.0, 3.0])
        assert r["median"] == pytest.approx(2.0)
        assert r["min"] == pytest.approx(2.0) and r["max"] == pytest.approx(3.0)
        assert r["ratio_of_medians"] == pytest.approx(4.0 / 2.0)
        assert r["spread"] == pytest.approx((2.8 - 2.0) / 2.0)  # p90 = 2 + 0.8 * 1

    def test_pairing_is_per_round_not_sorted(self):
        # drift: both variants slow down together in round 2; per-round ratios stay 2
        r = paired_ratios([2.0, 20.0, 2.0], [1.0, 10.0, 1.0])
        assert r["per_round"] == pytest.approx([2.0, 2.0, 2.0])
        assert r["spread"] == pytest.approx(0.0)

    @pytest.mark.parametrize(("num", "den"), [([1.0], [1.0, 2.0]), ([], []), ([1.0], [0.0])])
    def test_rejects_bad_input(self, num, den):
        with pytest.raises(ValueError):
            paired_ratios(num, den)


class TestInterleaving:
    def _variants(self, log, clock=None):
        a = FakeRunner("a", log, clock, costs_ms=(1.0,))
        b1 = FakeRunner("b1", log, clock, costs_ms=(2.0,))
        b2 = FakeRunner("b2", log, clock, costs_ms=(3.0,))
        c = FakeRunner("c", log, clock, costs_ms=(4.0,))
        _active(a, b1, b2, c)
        return [Variant("A", [a]), Variant("B", [b1, b2]), Variant("C", [c])]

    def test_call_order_warmup_then_rounds(self):
        log: list[str] = []
        hooks: list[tuple[str, int]] = []
        variants = self._variants(log)
        measure(variants, [Case({"batch": 1}, feed())], warmup=2, rounds=3, progress=False,
                on_call=lambda name, r: hooks.append((name, r)))
        one_pass = ["a", "b1", "b2", "c"]  # a variant's runners run back to back, in order
        assert log == one_pass * (2 + 3)
        assert hooks == [(v, -1) for v in "ABC"] * 2 + [(v, r) for r in range(3) for v in "ABC"]

    def test_cases_run_one_after_another(self):
        log: list[str] = []
        order: list[tuple[str, int]] = []
        variants = self._variants(log)
        cases = [Case({"batch": 1}, feed(1)), Case({"batch": 2}, feed(2))]
        results = measure(variants, cases, warmup=0, rounds=2, progress=False,
                          on_call=lambda name, r: order.append((name, r)))
        assert order == [(v, r) for r in range(2) for v in "ABC"] * 2
        assert [res.case.batch for res in results] == [1, 2]
        assert all(res.order == ["A", "B", "C"] for res in results)

    def test_a_case_can_have_its_own_rounds(self):
        log: list[str] = []
        variants = self._variants(log)
        cases = [Case({"batch": 1}, feed(1), rounds=4), Case({"batch": 8}, feed(8))]
        results = measure(variants, cases, warmup=0, rounds=2, progress=False)
        assert [len(r.samples["A"]) for r in results] == [4, 2]
        assert log == ["a", "b1", "b2", "c"] * 6
        with pytest.raises(ValueError, match="rounds"):
            measure(variants, [Case({"batch": 1}, feed(1), rounds=0)], progress=False)

    def test_samples_and_ratios_from_a_fake_clock(self, monkeypatch):
        clock = FakeClock()
        monkeypatch.setattr(measure_mod.time, "perf_counter_ns", clock)
        log: list[str] = []
        variants = self._variants(log, clock)
        [res] = measure(variants, [Case({"batch": 4}, feed(4))], warmup=1, rounds=5, progress=False)
        assert res.samples["A"] == pytest.approx([1e-3] * 5)
        assert res.samples["B"] == pytest.approx([5e-3] * 5)  # the two runners of B, summed
        assert res.samples["C"] == pytest.approx([4e-3] * 5)
        assert res.clocks == {"A": "perf_counter", "B": "perf_counter", "C": "perf_counter"}
        assert res.ratio("B", "A")["median"] == pytest.approx(5.0)
        assert res.ratio("C", "B")["per_round"] == pytest.approx([0.8] * 5)
        assert res.stats()["A"]["throughput"] == pytest.approx(4 / 1e-3)

    def test_per_round_ratio_follows_drift(self, monkeypatch):
        clock = FakeClock()
        monkeypatch.setattr(measure_mod.time, "perf_counter_ns", clock)
        log: list[str] = []
        slow = [1.0, 1.0, 3.0, 1.0]  # warm-up call, then rounds; round 1 is 3x slower for both
        a = FakeRunner("a", log, clock, costs_ms=slow)
        b = FakeRunner("b", log, clock, costs_ms=[2 * x for x in slow])
        _active(a, b)
        [res] = measure([Variant("A", [a]), Variant("B", [b])], [Case({"batch": 1}, feed())],
                        warmup=1, rounds=3, progress=False)
        assert res.samples["A"] == pytest.approx([1e-3, 3e-3, 1e-3])
        assert res.ratio("B", "A")["per_round"] == pytest.approx([2.0, 2.0, 2.0])

    def test_per_variant_feed(self):
        log: list[str] = []
        seen = {}

        class Spy(FakeRunner):
            def _infer_impl(self, f):
                seen[self.name] = f["x"].shape
                return super()._infer_impl(f)

        a, b = Spy("a", log), Spy("b", log)
        _active(a, b)
        case = Case({"batch": 1}, feed(1), {"B": feed(3)})
        measure([Variant("A", [a]), Variant("B", [b])], [case], warmup=0, rounds=1, progress=False)
        assert seen == {"a": (1, 2), "b": (3, 2)}

    def test_validation(self):
        log: list[str] = []
        a = FakeRunner("a", log)
        a.activate()
        case = Case({"batch": 1}, feed())
        with pytest.raises(ValueError, match="unique"):
            measure([Variant("A", [a]), Variant("A", [a])], [case], progress=False)
        with pytest.raises(ValueError, match="rounds"):
            measure([Variant("A", [a])], [case], rounds=0, progress=False)
        with pytest.raises(ValueError, match="runners"):
            Variant("empty", [])


class TestClocks:
    def test_cuda_runners_get_cuda_events_without_importing_cuda(self):
        log: list[str] = []
        cpu = FakeRunner("cpu", log)
        trt = FakeRunner("trt", log, kind="tensorrt")
        ort_cuda = FakeRunner("ortc", log, kind="onnxrt-cuda")
        assert not is_cuda_runner(cpu)
        assert is_cuda_runner(trt) and is_cuda_runner(ort_cuda)
        assert clock_for(Variant("v", [cpu]))[0] == "perf_counter"
        assert clock_for(Variant("v", [cpu, trt]))[0] == "cuda-event"

    def test_torch_runner_device(self):
        from torch import nn

        from toolchain.engines import make_runner

        r = make_runner("torch", module=nn.Identity(), input_specs={"x": (np.float32, ("batch",))})
        assert not is_cuda_runner(r)
        r.device = type("D", (), {"type": "cuda"})()
        assert is_cuda_runner(r)


class TestMemoryAndSize:
    def test_process_memory(self):
        m = process_memory()
        assert m["rss_bytes"] > 0 and m["peak_rss_bytes"] >= m["rss_bytes"]

    def test_footprint_counts_external_data(self, tmp_path):
        w = numpy_helper.from_array(np.ones((64, 64), dtype=np.float32), "w")
        node = helper.make_node("MatMul", ["x", "w"], ["y"])
        graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
                                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64])], [w])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        path = tmp_path / "m.onnx"
        onnx.save_model(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                        location="m.onnx.data", size_threshold=0)
        fp = file_footprint(path)
        assert fp["external_data_bytes"] == (tmp_path / "m.onnx.data").stat().st_size >= 64 * 64 * 4
        assert fp["total_bytes"] == fp["file_bytes"] + fp["external_data_bytes"]
        assert fp["initializer_bytes"] == 64 * 64 * 4
        engine = tmp_path / "x.engine"
        engine.write_bytes(b"\0" * 10)
        assert file_footprint(engine)["total_bytes"] == 10
        with pytest.raises(FileNotFoundError):
            file_footprint(tmp_path / "nope.onnx")
