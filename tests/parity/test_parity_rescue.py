"""Precision rescue on a graph that fails FP16 parity on purpose (LayerNorm in FP16, activations x300)."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
import torch

from toolchain.engines import make_runner
from toolchain.errors import CheckFailed
from toolchain.export import convert_precision, export_onnx
from toolchain.parity import ReferenceEvaluatorRunner, rescue_precision, run_parity

AXES = {"x": {0: "batch"}, "logits": {0: "batch"}, "probs": {0: "batch"}}


def _calibrate_script():
    """``benchmarks/parity_tolerances/calibrate.py`` (the measurements behind the default tolerances)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "parity_tolerances" / "calibrate.py"
    spec = importlib.util.spec_from_file_location("parity_calibrate", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


_CAL = _calibrate_script()
RsqrtLayerNormNet, perturb_initializer = _CAL.RsqrtLayerNormNet, _CAL.perturb_initializer


@pytest.fixture(scope="module")
def ln_case(tmp_path_factory):
    folder = tmp_path_factory.mktemp("rescue")
    net = RsqrtLayerNormNet()
    src = folder / "net.onnx"
    export_onnx(net, {"x": torch.randn(2, 16)}, ["logits", "probs"], src, dynamic_axes=AXES)
    rng = np.random.default_rng(0)
    generated = [{"x": (rng.standard_normal((b, 16)) * 300).astype(np.float32)} for b in (1, 4, 16)]
    x_id = (rng.standard_normal((64, 16)) * 300).astype(np.float32)
    with torch.inference_mode():
        labels = net(torch.from_numpy(x_id))["logits"].argmax(-1).numpy()
    labels[::4] = (labels[::4] + 1) % 4
    ood = [{"x": rng.uniform(-600, 600, (32, 16)).astype(np.float32)}]
    reference = make_runner("torch", module=net, input_specs={"x": (np.float32, ("batch", 16))}, name="torch-fp32")
    return {"folder": folder, "src": src, "net": net, "generated": generated, "id": [({"x": x_id}, labels)],
            "ood": ood, "reference": reference}


def _parity(case, model_or_path, **kw):
    return run_parity(case["reference"], {"fp16": ReferenceEvaluatorRunner(model_or_path)}, case["generated"],
                      case["id"], case["ood"], precisions={"fp16": "fp16"}, **kw)


def test_layernorm_forced_to_fp16_fails_parity(ln_case):
    forced = convert_precision(ln_case["src"], "fp16", keep_fp32_ops=()).model
    verdict = _parity(ln_case, forced)
    assert verdict.exit_code == 1
    failed = {c.name for c in verdict.failures}
    assert {"numeric/logits", "numeric/probs", "uq/accuracy"} <= failed


def test_rescue_keeps_only_layernorm_nodes_and_passes(ln_case):
    dst = ln_case["folder"] / "net.fp16.onnx"
    result = rescue_precision(ln_case["src"], dst, "fp16", ln_case["reference"], ln_case["generated"], ln_case["id"],
                              ln_case["ood"], keep_fp32_ops=())
    assert result.passed and result.path == dst and dst.is_file()
    kept = result.kept_fp32_nodes
    assert 0 < len(kept) <= 6 < result.candidates
    assert all(name.startswith("/module/ln") for name in kept), kept  # LayerNorm nodes only
    assert any(name.endswith("/Mul") for name in kept)  # the squared deviation that overflows
    assert {c.name for c in result.initial_failures} >= {"numeric/logits", "uq/accuracy"}
    assert len(result.evaluations) <= 60
    # the written graph passes on its own, and each kept node is needed (1-minimal)
    assert _parity(ln_case, dst).exit_code == 0
    for name in kept:
        fewer = [n for n in kept if n != name]
        model = convert_precision(ln_case["src"], "fp16", keep_fp32_ops=(), keep_fp32_nodes=fewer).model
        assert _parity(ln_case, model).exit_code == 1, f"{name} was not needed"
    precision = json.loads(dst.with_name("net.fp16.precision.json").read_text())
    assert set(precision["kept_fp32"]) == set(kept)
    log = json.loads(dst.with_name("net.fp16.rescue.json").read_text())
    assert log["kept_fp32_nodes"] == list(kept) and log["passed"] is True


def test_rescue_of_a_passing_variant_keeps_nothing(ln_case):
    small = [{"x": f["x"] / 300.0} for f in ln_case["generated"]]
    dst = ln_case["folder"] / "small.fp16.onnx"
    result = rescue_precision(ln_case["src"], dst, "fp16", ln_case["reference"], small, keep_fp32_ops=())
    assert result.kept_fp32_nodes == () and result.passed and len(result.evaluations) == 1
    assert onnx.load(str(dst)).graph.node


def test_rescue_refuses_a_graph_that_is_wrong_in_fp32(ln_case):
    model = onnx.load(str(ln_case["src"]))
    head = next(i.name for i in model.graph.initializer if "head" in i.name and len(i.dims) == 2)
    broken = ln_case["folder"] / "broken.onnx"
    onnx.save(perturb_initializer(model, head, 0.5), str(broken))
    with pytest.raises(CheckFailed, match="even with all"):
        rescue_precision(broken, ln_case["folder"] / "broken.fp16.onnx", "fp16", ln_case["reference"],
                         ln_case["generated"], keep_fp32_ops=())
