"""benchmarks/cost_levers/latency.py: ``measure`` on a tiny BERT Hydra with a fork and MLP slices, and the row builder.

No timing assertions: the result's structure (every model, engine and batch; positive per-round ratios; the
machine's capabilities; precisions that do not run here recorded as unavailable, never emulated), and that
each row of ``rows.py`` gets the fork, heads and MLP neurons its overrides say.
"""

from __future__ import annotations

import math

import pytest
import torch
from bench_scripts import load_script


@pytest.fixture(scope="module")
def latency():
    return load_script("benchmarks/cost_levers/latency.py", "cost_levers_latency")


@pytest.fixture(scope="module")
def rows():
    return load_script("benchmarks/cost_levers/rows.py", "cost_levers_rows").ROWS


def test_measure_tiny_hydra_with_fork_and_slices(latency, tmp_path):
    from toolchain.engines import engine_kind
    from toolchain.models.tiny import tiny_bert
    from toolchain.models.wrappers import SingleModel

    tiny = tiny_bert(layers=3, heads=4)
    overrides = {"pruning": {"fork": 1, "mlp_share": 0.4, "mlp_core": 0.1}, "fusion": {"mlp": "grouped"}}
    hydra = latency.build_row(tiny.adapter, overrides)
    assert hydra.config.fork == 1 and hydra.config.sliced
    other = tiny_bert(seed=1, layers=3, heads=4)
    models = {"hydra fork1/mlp-0.4": hydra, "deep": [SingleModel(tiny.adapter), SingleModel(other.adapter)]}
    engines = (("onnxrt-cpu", "fp32"), ("onnxrt-cpu", "bf16"), ("openvino-cpu", "bf16"))
    out = latency.measure(models, SingleModel(tiny.adapter), tiny.make_batch(2, 0), seq=12, batches=(1, 2),
                          engines=engines, warmup=0, rounds=1, work=tmp_path, progress=False)

    assert out["engines"]["onnxrt-cpu:fp32"]["status"] == "ok"
    # ONNX Runtime's CPU BF16 is an emulator: recorded as unavailable, never measured
    assert out["engines"]["onnxrt-cpu:bf16"]["status"] == "unavailable"
    assert "emulat" in out["engines"]["onnxrt-cpu:bf16"]["reason"]
    ov_reason = engine_kind("openvino-cpu").unavailable("bf16")
    ov = out["engines"]["openvino-cpu:bf16"]
    ran = [k for k, v in out["engines"].items() if v["status"] == "ok"]
    if ov_reason is None:  # this CPU has BF16: compiled, and the precision read back for every graph
        assert ov["status"] == "ok"
        assert set(ov["ran_precision"]) == {"single", "hydra fork1/mlp-0.4", "deep[0]", "deep[1]"}
        assert all(isinstance(p, str) and p for p in ov["ran_precision"].values())
    else:
        assert ov == {"status": "unavailable", "reason": ov_reason}
    assert set(out["models"]) == set(models)
    for name in models:
        assert set(out["models"][name]) == set(ran)
        for key in ran:
            assert set(out["models"][name][key]) == {"1", "2"}
            for cell in out["models"][name][key].values():
                r = cell["ratio"]
                assert cell["median_ms"] > 0 and r["median"] > 0 and r["min"] <= r["median"] <= r["max"]
                assert r["p25"] <= r["p75"] and len(r["per_round"]) == 1
    for key in ran:
        assert set(out["single"][key]) == {"1", "2"} and out["single"][key]["1"]["median_ms"] > 0
        assert "ratio" not in out["single"][key]["1"]
    caps = out["capabilities"]
    assert {"avx512_bf16", "amx_bf16", "avx512_vnni"} <= set(caps["flags"]) and caps["processor"]
    assert out["settings"]["rounds"] == {"1": 1, "2": 1}
    exported = {p.name for p in (tmp_path / "export").glob("*.onnx")}
    assert {"single.onnx", "m0.onnx", "m1-0.onnx", "m1-1.onnx"} <= exported

    with pytest.raises(ValueError, match="'single'"):
        latency.measure({"single": hydra}, SingleModel(tiny.adapter), tiny.make_batch(2, 0), seq=12,
                        work=tmp_path)


def test_row_structure_matches_every_row(latency, rows):
    for name, overrides in rows.items():
        pruning = overrides.get("pruning", {})
        s = latency.row_structure(overrides)
        fork = pruning.get("fork", 0)
        keep = 12 - math.floor(pruning.get("ratio", 0.5) * 12 + 1e-9)
        assert s["fork"] == fork, name
        masks = s["keep_masks"]
        assert masks.shape == (3, 6, 12) and masks[:, :fork].all(), name
        assert (masks[:, fork:].sum(dim=-1) == keep).all(), name
        if keep * 3 <= 12:  # disjoint head sets while they fit
            assert masks[:, fork:].sum(dim=0).max() == 1, name
        share = pruning.get("mlp_share")
        if share is None:
            assert s["neurons"] is None and s["mlp"] == "average", name
            continue
        assert s["mlp"] == "grouped" == overrides["fusion"]["mlp"], name
        n, c = round(share * 1536), round(pruning.get("mlp_core", 0.0) * 1536)
        assert s["neurons_per_member"] == n, name
        for m in range(3):
            for idx in range(6):
                kept = s["neurons"][m][idx]
                assert len(set(kept)) == len(kept), name
                assert kept == list(range(1536)) if idx < fork else (len(kept) == n and kept[:c] == list(range(c)))
        if share * 3 <= 1 and not c:  # a disjoint third
            for idx in range(fork, 6):
                sets = [set(s["neurons"][m][idx]) for m in range(3)]
                assert not (sets[0] & sets[1] or sets[0] & sets[2] or sets[1] & sets[2]), name


def test_build_row_fuses_the_levers(latency, rows):
    """The fused model's config carries each row's fork, heads and neuron counts (a tiny 6-layer BERT)."""
    from toolchain.models.tiny import tiny_bert

    tiny = tiny_bert(layers=6, heads=4)
    for name in ("averaged", "fork3-mlp-0.33", "fork2-mlp-0.5-core-0.1", "prune75"):
        overrides = rows[name]
        s = latency.row_structure(overrides, layers=6, heads=4, width=64)
        cfg = latency.build_row(tiny.adapter, overrides).config
        fork = overrides.get("pruning", {}).get("fork", 0)
        assert cfg.fork == fork and cfg.mlp == s["mlp"], name
        heads = cfg.heads_per_member()
        assert all(heads[m][idx] == s["heads_per_member"] for m in range(3) for idx in range(fork, 6)), name
        if s["neurons"] is None:
            assert not cfg.sliced, name
        else:
            widths = cfg.neurons_per_member()
            assert all(widths[m][idx] == s["neurons_per_member"] for m in range(3) for idx in range(fork, 6)), name
        with torch.no_grad():
            probs = latency.build_row(tiny.adapter, overrides)(**tiny.make_batch(2, 0))["probs"]
        assert probs.shape == (2, 3) and torch.allclose(probs.sum(-1), torch.ones(2), atol=1e-5), name
