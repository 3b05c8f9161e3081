"""The TensorRT lint's version-gated rules (trt_ops.OP_SINCE / FEATURE_SINCE / OPSET_MAX), on CPU."""

import os
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from toolchain.export import trt_ops
from toolchain.export.lint import default_trt_version, lint_tensorrt

F, I64 = TensorProto.FLOAT, TensorProto.INT64
ROOT = Path(__file__).resolve().parents[2]


def _vi(name, dtype, dims):
    return helper.make_tensor_value_info(name, dtype, dims)


def _save(tmp_path, nodes, inputs, outputs, inits=(), opset=17, functions=(), extra_opsets=(), name="m.onnx"):
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    opsets = [helper.make_opsetid("", opset), *(helper.make_opsetid(d, 1) for d in extra_opsets)]
    model = helper.make_model(graph, opset_imports=opsets, functions=list(functions))
    path = tmp_path / name
    onnx.save(model, str(path))
    return path


def _min_version(report, op):
    return [f for f in report.findings if f.code == "min-version" and f.op == op]


def _one(tmp_path, op, inputs, outputs, inits=(), opset=17, **attrs):
    node = helper.make_node(op, [i.name for i in inputs] + [i.name for i in inits], ["y"], name="n", **attrs)
    return _save(tmp_path, [node], inputs, outputs, inits, opset=opset)


# ----------------------------------------------------------------------------- ops added in a release


def _hann(tmp_path):
    size = numpy_helper.from_array(np.array(8, np.int64), "size")
    return _save(tmp_path, [helper.make_node("HannWindow", ["size"], ["y"], name="win")], [],
                 [_vi("y", F, [8])], [size])


def test_window_op_needs_10_4(tmp_path):
    path = _hann(tmp_path)
    old = lint_tensorrt(path, "10.3")
    assert not old.ok
    (finding,) = _min_version(old, "HannWindow")
    assert finding.severity == "error" and "10.4" in finding.message and "Changelog" in finding.message
    assert lint_tensorrt(path, "10.4").ok and not _min_version(lint_tensorrt(path, "10.4"), "HannWindow")
    # a major only: cannot tell which 10.x, so a warning
    assert [f.severity for f in _min_version(lint_tensorrt(path, "10"), "HannWindow")] == ["warning"]
    assert not _min_version(lint_tensorrt(path, "11"), "HannWindow")


def test_stft_needs_10_5(tmp_path):
    step = numpy_helper.from_array(np.array(4, np.int64), "step")
    length = numpy_helper.from_array(np.array(8, np.int64), "length")
    node = helper.make_node("STFT", ["x", "step", "", "length"], ["y"], name="stft")
    path = _save(tmp_path, [node], [_vi("x", F, [1, 64, 1])], [_vi("y", F, None)], [step, length])
    assert _min_version(lint_tensorrt(path, "10.4"), "STFT")[0].severity == "error"
    assert not _min_version(lint_tensorrt(path, "10.5"), "STFT")


def test_deform_conv_needs_10_1(tmp_path):
    node = helper.make_node("DeformConv", ["x", "w", "off"], ["y"], name="dc")
    path = _save(tmp_path, [node], [_vi("x", F, [1, 2, 5, 5]), _vi("w", F, [2, 2, 3, 3]),
                                    _vi("off", F, [1, 18, 3, 3])], [_vi("y", F, None)], opset=19)
    assert not lint_tensorrt(path, "10.0").ok
    assert not _min_version(lint_tensorrt(path, "10.1"), "DeformConv")


def test_dft_is_supported_from_11_2(tmp_path):
    node = helper.make_node("DFT", ["x"], ["y"], name="dft")
    path = _save(tmp_path, [node], [_vi("x", F, [1, 16, 1])], [_vi("y", F, None)], opset=20)
    for version in ("10.15", "11.1"):
        report = lint_tensorrt(path, version)
        assert not report.ok and _min_version(report, "DFT")[0].severity == "error", version
    report = lint_tensorrt(path, "11.2")
    assert report.ok, [str(f) for f in report.errors]


# ----------------------------------------------------------------------------- forms of supported ops


def test_einsum_ellipsis_needs_10_12(tmp_path):
    path = _one(tmp_path, "Einsum", [_vi("a", F, [2, 3, 4]), _vi("b", F, [2, 4, 5])], [_vi("y", F, None)],
                equation="...ij,...jk->...ik")
    assert _min_version(lint_tensorrt(path, "10.11"), "Einsum")[0].severity == "error"
    assert lint_tensorrt(path, "10.12").ok
    (tmp_path / "p").mkdir()
    plain = _one(tmp_path / "p", "Einsum", [_vi("a", F, [2, 3, 4]), _vi("b", F, [2, 4, 5])],
                 [_vi("y", F, None)], equation="bij,bjk->bik")
    assert lint_tensorrt(plain, "10.0").ok


def test_pow_with_integer_base_needs_10_12(tmp_path):
    path = _one(tmp_path, "Pow", [_vi("a", I64, [4]), _vi("e", I64, [4])], [_vi("y", I64, [4])])
    finding = _min_version(lint_tensorrt(path, "10.11"), "Pow")[0]
    assert finding.severity == "error" and "integer" in finding.message
    assert lint_tensorrt(path, "10.12").ok
    (tmp_path / "f").mkdir()
    floats = _one(tmp_path / "f", "Pow", [_vi("a", F, [4]), _vi("e", F, [4])], [_vi("y", F, [4])])
    assert lint_tensorrt(floats, "10.0").ok


def test_squeeze_without_axes_needs_11_5(tmp_path):
    path = _one(tmp_path, "Squeeze", [_vi("x", F, [1, 4, 1])], [_vi("y", F, None)])
    assert _min_version(lint_tensorrt(path, "11.4"), "Squeeze")[0].severity == "error"
    assert _min_version(lint_tensorrt(path, "10.15"), "Squeeze")[0].severity == "error"
    assert lint_tensorrt(path, "11.5").ok
    axes = numpy_helper.from_array(np.array([0], np.int64), "axes")
    (tmp_path / "a").mkdir()
    given = _one(tmp_path / "a", "Squeeze", [_vi("x", F, [1, 4, 1])], [_vi("y", F, None)], inits=[axes])
    assert lint_tensorrt(given, "10.0").ok


def test_topk_with_runtime_k_is_accepted(tmp_path):
    node = helper.make_node("TopK", ["x", "k"], ["v", "i"], name="topk")
    path = _save(tmp_path, [node], [_vi("x", F, [2, 16]), _vi("k", I64, [1])], [_vi("v", F, None), _vi("i", I64, None)])
    report = lint_tensorrt(path, "10.0")
    assert report.ok, [str(f) for f in report.errors]
    assert any(f.code == "restriction" and "3840" in f.message for f in report.findings if f.severity == "info")


@pytest.mark.parametrize(("k", "ok"), [(3839, True), (3840, False)])
def test_topk_constant_k_limit(tmp_path, k, ok):
    kt = numpy_helper.from_array(np.array([k], np.int64), "k")
    node = helper.make_node("TopK", ["x", "k"], ["v", "i"], name="topk")
    path = _save(tmp_path, [node], [_vi("x", F, [2, 4096])], [_vi("v", F, None), _vi("i", I64, None)], [kt])
    report = lint_tensorrt(path, "10.15")
    assert report.ok is ok
    if not ok:
        assert report.errors[0].code == "topk-k" and f"K = {k}" in report.errors[0].message


def test_nonzero_graph_for_the_data_dependent_engine_test_passes(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "tests" / "engines"))
    from test_engines_tensorrt import _nonzero_onnx

    report = lint_tensorrt(_nonzero_onnx(tmp_path / "nz.onnx"), "10.0", {"x": ((1, 6), (4, 6), (8, 6))})
    assert report.ok, [str(f) for f in report.errors]


# ----------------------------------------------------------------------------- local functions


def _with_function(tmp_path, body_op="Relu"):
    body = [helper.make_node(body_op, ["a"], ["b"], name="inner")]
    function = helper.make_function("com.example", "MyAct", ["a"], ["b"], body,
                                    [helper.make_opsetid("", 17)])
    node = helper.make_node("MyAct", ["x"], ["y"], name="act", domain="com.example")
    return _save(tmp_path, [node], [_vi("x", F, [4])], [_vi("y", F, [4])], functions=[function],
                 extra_opsets=["com.example"])


def test_local_function_node_is_imported(tmp_path):
    report = lint_tensorrt(_with_function(tmp_path), "10.0")
    assert report.ok, [str(f) for f in report.errors]
    assert "custom-op" not in report.codes()


def test_local_function_body_is_checked(tmp_path):
    report = lint_tensorrt(_with_function(tmp_path, body_op="Unique"), "10.15")
    (finding,) = report.errors
    assert (finding.code, finding.op, finding.node) == ("unsupported-op", "Unique", "MyAct/inner")


def test_custom_domain_without_a_function_still_needs_a_plugin(tmp_path):
    node = helper.make_node("FusedThing", ["x"], ["y"], name="fused", domain="com.example")
    path = _save(tmp_path, [node], [_vi("x", F, [4])], [_vi("y", F, [4])], extra_opsets=["com.example"])
    assert lint_tensorrt(path, "11.5").codes() == {"custom-op"}


# ----------------------------------------------------------------------------- opsets


def _relu(tmp_path, opset):
    return _one(tmp_path, "Relu", [_vi("x", F, [2])], [_vi("y", F, [2])], opset=opset)


@pytest.mark.parametrize(("opset", "version", "severity"), [
    (25, "11.4", "error"), (25, "11.5", None), (25, "11", "warning"), (25, "10.15", "error"),
    (21, "10.0", "error"), (21, "10.3", "warning"), (24, "10.15", None), (20, "10.0", None), (8, "11.5", "error"),
])
def test_opset_range_per_version(tmp_path, opset, version, severity):
    found = [f.severity for f in lint_tensorrt(_relu(tmp_path, opset), version).findings if f.code == "opset"]
    assert found == ([severity] if severity else []), (opset, version, found)


# ----------------------------------------------------------------------------- target version


def test_default_target_is_the_newest_rules_without_tensorrt(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorrt", None)  # import tensorrt raises ImportError
    assert default_trt_version() == "{}.{}".format(*trt_ops.NEWEST)
    report = lint_tensorrt(_relu(tmp_path, 25))
    assert report.trt_version == "11.5" and report.ok


def test_default_target_is_the_installed_tensorrt(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorrt", types.SimpleNamespace(__version__="10.3.0.26"))
    assert default_trt_version() == "10.3"
    report = lint_tensorrt(_hann(tmp_path))
    assert report.trt_version == "10.3" and not report.ok


def test_cli_trt_version_option(tmp_path):
    path = _hann(tmp_path)
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    run = [sys.executable, "-m", "toolchain", "lint", str(path), "--target", "tensorrt", "--trt-version"]
    old = subprocess.run([*run, "10.3"], capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)
    assert old.returncode == 1, old.stderr
    assert "HannWindow needs TensorRT >= 10.4" in old.stderr
    new = subprocess.run([*run, "10.4"], capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)
    assert new.returncode == 0, new.stderr
    assert "passes the TensorRT 10.4 lint" in new.stderr
    bad = subprocess.run([*run, "9.2"], capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)
    assert bad.returncode == 2 and "9.2" in bad.stderr and "Traceback" not in bad.stderr
