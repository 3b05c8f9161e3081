"""roofline.py: bound arithmetic on hand-made cases, peaks, calibration and the variant costs."""

import pytest

from toolchain.bench.roofline import (
    CostModel,
    Peaks,
    calibrate,
    embedding_copies,
    resolve_peaks,
    roofline_bound,
    roofline_ratio,
    roofline_rows,
    variant_cost_key,
)
from toolchain.hydra.cost import EncoderSpec

PEAKS = Peaks(flops_per_s=1e11, bytes_per_s=1e10)  # ridge at 10 FLOP/byte


class TestBound:
    def test_compute_bound(self):
        row = roofline_bound(2e9, 1e8, PEAKS)
        assert row["compute_s"] == pytest.approx(0.02)
        assert row["memory_s"] == pytest.approx(0.01)
        assert row["bound_s"] == pytest.approx(0.02)
        assert row["regime"] == "compute"
        assert row["intensity"] == pytest.approx(20.0)

    def test_memory_bound(self):
        row = roofline_bound(1e8, 1e8, PEAKS)
        assert row["compute_s"] == pytest.approx(1e-3) and row["memory_s"] == pytest.approx(1e-2)
        assert row["bound_s"] == pytest.approx(1e-2)
        assert row["regime"] == "memory"

    def test_ratio(self):
        row = roofline_ratio(0.05, 2e9, 1e8, PEAKS)
        assert row["ratio"] == pytest.approx(2.5)
        assert row["attained_flops_per_s"] == pytest.approx(4e10)
        assert PEAKS.ridge_flops_per_byte == pytest.approx(10.0)

    def test_rejects_negative(self):
        with pytest.raises(ValueError):
            roofline_bound(-1, 0, PEAKS)


class TestPeaks:
    @pytest.mark.parametrize("bad", [0, -1.0, float("nan"), float("inf")])
    def test_validation(self, bad):
        with pytest.raises(ValueError, match="flops_per_s"):
            Peaks(bad, 1.0)

    def test_arguments_skip_calibration(self, monkeypatch):
        import toolchain.bench.roofline as rl

        monkeypatch.setattr(rl, "calibrate", lambda *a, **k: pytest.fail("must not calibrate"))
        p = resolve_peaks(2, peak_flops=5e10, bandwidth=2e10)
        assert (p.flops_per_s, p.bytes_per_s, p.source) == (5e10, 2e10, "arguments")

    def test_partial_override(self, monkeypatch):
        import toolchain.bench.roofline as rl

        monkeypatch.setattr(rl, "calibrate", lambda *a, **k: Peaks(1e9, 1e9, "calibrated", {"k": 1}))
        p = resolve_peaks(2, peak_flops=7e10)
        assert (p.flops_per_s, p.bytes_per_s, p.source) == (7e10, 1e9, "arguments+calibrated")

    def test_calibrate_validation(self):
        with pytest.raises(ValueError, match="matmul_sizes"):
            calibrate(1, matmul_sizes=())

    def test_calibrate_small(self):
        p = calibrate(1, matmul_sizes=(32, 64), copy_mib=1, repeats=2, min_seconds=0.0)
        assert p.flops_per_s > 0 and p.bytes_per_s > 0 and p.source == "calibrated"
        assert set(p.details["flops_per_s"]) == {f"{k}[{n}]" for n in (32, 64)
                                                 for k in ("torch.matmul", "numpy.matmul", "onnxruntime.MatMul")}
        assert p.flops_per_s == max(p.details["flops_per_s"].values())


class TestVariantCosts:
    def test_cost_keys(self):
        assert variant_cost_key("single") == "single"
        assert variant_cost_key("single.fp16") == "single"
        assert variant_cost_key("deep-ensemble") == "deep_ensemble"
        assert variant_cost_key("hydra-conv") == "hydra"
        assert variant_cost_key("hydra-matmul.bf16") == "hydra"
        assert variant_cost_key("member1") is None

    def test_rows_from_compare(self):
        spec = EncoderSpec(hidden=8, head_dim=2, intermediate=16, heads=(4, 4), embedding_params=100)
        model = CostModel(spec, ((2, 2), (2, 2)))
        costs = model.compare(batch=2, seq=3)
        lat = {"single": 1e-3, "deep-ensemble": 2e-3, "hydra-conv": 1.5e-3, "other": 1.0}
        unstreamed = {k: n * 100 * 4 for k, n in embedding_copies(model.members).items()}
        rows = roofline_rows(lat, costs, PEAKS, unstreamed_bytes=unstreamed)
        assert set(rows) == {"single", "deep-ensemble", "hydra-conv"}
        single = rows["single"]
        assert single["flops"] == costs["single"]["flops"]
        assert single["weight_bytes"] == costs["single"]["weight_bytes"] - 400
        assert single["stored_weight_bytes"] == costs["single"]["weight_bytes"]
        assert rows["deep-ensemble"]["weight_bytes"] == costs["deep_ensemble"]["weight_bytes"] - 2 * 400
        expected = max(costs["hydra"]["flops"] / 1e11, (costs["hydra"]["weight_bytes"] - 400) / 1e10)
        assert rows["hydra-conv"]["bound_s"] == pytest.approx(expected)
        assert rows["hydra-conv"]["ratio"] == pytest.approx(1.5e-3 / expected)
