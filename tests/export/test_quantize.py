"""The INT8 (Q/DQ) pass: what it quantizes, what stays float, the float fallback's graph edit, member ranges.

Tiny exported graphs (``bert_onnx``: a 2-layer BERT classifier; ``conv_onnx``: a grouped-Conv ensemble of 3
members), calibrated on generated rows; every graph runs on ONNX Runtime.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from export_models import bert_inputs, conv_inputs

from toolchain.engines.onnxrt.quantize import member_ranges, quantize_int8
from toolchain.errors import GraphError
from toolchain.export.precision import graph_precision
from toolchain.export.quantize import (
    confine_qdq,
    head_layers,
    is_quantized,
    keep_float_layers,
    matrix_layers,
    same_shapes,
)

Q_OPS = ("QuantizeLinear", "DequantizeLinear")


def _bert_feeds(n: int = 4, seed: int = 0) -> list[dict[str, np.ndarray]]:
    return [{k: v.numpy() for k, v in bert_inputs((4, 8 + 2 * i), seed=seed + i).items()} for i in range(n)]


def _run(model: onnx.ModelProto | str, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
    data = model.SerializeToString() if isinstance(model, onnx.ModelProto) else str(model)
    return ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, feed)


@pytest.fixture(scope="module")
def bert_int8(bert_onnx, tmp_path_factory):
    dst = tmp_path_factory.mktemp("q") / "bert.int8.onnx"
    result = quantize_int8(bert_onnx.path, dst, _bert_feeds())
    return dst, result


def test_matrix_layers_and_heads(bert_onnx):
    model = onnx.load(str(bert_onnx.path), load_external_data=False)
    layers = matrix_layers(model)
    assert len(layers) == 2 * 6 + 2  # per layer Q, K, V, O, up, down; the pooler and the classifier
    heads = head_layers(model)
    assert len(heads) == 1 and "classifier" in heads[0]  # the pooler reaches the logits only through it
    assert not is_quantized(model) and graph_precision(model) == "fp32"


def test_the_matrix_layers_are_int8_and_the_rest_float(bert_onnx, bert_int8):
    dst, result = bert_int8
    model = onnx.load(str(dst))
    fp32 = onnx.load(str(bert_onnx.path), load_external_data=False)
    assert is_quantized(model) and graph_precision(model) == "int8"
    assert set(result.quantized) == set(matrix_layers(fp32)) - set(head_layers(fp32))
    assert "classifier head" in result.kept_float[head_layers(fp32)[0]]
    producers = {o: n for n in model.graph.node for o in n.output}
    inits = {i.name for i in model.graph.initializer}
    quantized = set(result.quantized)
    for node in model.graph.node:
        if node.op_type in Q_OPS:
            continue
        reads_dq = [t for t in node.input if t in producers and producers[t].op_type == "DequantizeLinear"]
        if node.name in quantized:  # both its activation and its weight come through Q/DQ
            assert len(reads_dq) == 2, node.name
        else:  # residual adds, LayerNorm, Softmax, GELU, the head: float inputs only
            assert not reads_dq, (node.op_type, node.name)
    # Q/DQ at the layers' inputs only: no QuantizeLinear reads a matrix layer's output
    assert not [n for n in model.graph.node if n.op_type == "QuantizeLinear"
                and producers.get(n.input[0]) is not None and producers[n.input[0]].name in quantized]
    # symmetric: every zero point is 0; per-channel weight scales
    zps = [onnx.numpy_helper.to_array(i) for i in model.graph.initializer if i.name.endswith("zero_point")]
    assert zps and not any(z.any() for z in zps)
    weight_scales = [onnx.numpy_helper.to_array(next(i for i in model.graph.initializer if i.name == n.input[1]))
                     for n in model.graph.node if n.op_type == "DequantizeLinear" and n.input[0] in inits]
    assert any(s.size > 1 for s in weight_scales)
    assert result.calibration["rows"] == 16 and result.calibration["float_consumers_rewired"] > 0
    feed = {k: v.numpy() for k, v in bert_inputs((3, 9), seed=9).items()}
    ref, got = _run(fp32, feed)[0], _run(model, feed)[0]
    assert 0 < np.abs(got - ref).max() < 0.1 * np.abs(ref).max()  # rounded, not broken


def test_keep_float_layers_turns_layers_back_to_float(bert_onnx, bert_int8):
    dst, result = bert_int8
    qdq = onnx.load(str(dst))
    fp32 = onnx.load(str(bert_onnx.path))
    feed = {k: v.numpy() for k, v in bert_inputs((3, 9), seed=9).items()}
    every = keep_float_layers(qdq, fp32, result.quantized)
    assert not is_quantized(every)  # nothing reads a Q/DQ pair any more: all dropped
    np.testing.assert_allclose(_run(every, feed)[0], _run(fp32, feed)[0], rtol=1e-5, atol=1e-5)
    one = result.quantized[3]
    partly = keep_float_layers(qdq, fp32, [one])
    producers = {o: n for n in partly.graph.node for o in n.output}
    node = next(n for n in partly.graph.node if n.name == one)
    assert not any(producers.get(t) is not None and producers[t].op_type == "DequantizeLinear" for t in node.input)
    dq_weights = [n for n in partly.graph.node if n.op_type == "DequantizeLinear"
                  and n.input[0] in {i.name for i in partly.graph.initializer}]
    assert len(dq_weights) == len(result.quantized) - 1
    # a layer whose quantized input it shares with others (query with key and value): only it reads float
    producers = {o: n for n in qdq.graph.node for o in n.output}
    readers: dict[str, list[str]] = {}
    for n in qdq.graph.node:
        if n.name in result.quantized:
            act = next(t for t in n.input if t in producers and producers[t].op_type == "DequantizeLinear"
                       and producers[t].input[0] not in {i.name for i in qdq.graph.initializer})
            readers.setdefault(act, []).append(n.name)
    act, shared = next((a, r) for a, r in readers.items() if len(r) >= 3)
    alone = keep_float_layers(qdq, fp32, [shared[0]])
    nodes = {n.name: n for n in alone.graph.node}
    assert act not in nodes[shared[0]].input and all(act in nodes[o].input for o in shared[1:])
    assert np.isfinite(_run(alone, feed)[0]).all()  # the edited graph runs (a tiny random BERT's logits barely move)
    with pytest.raises(GraphError, match="not layers of both graphs"):
        keep_float_layers(qdq, fp32, ["nope"])


def test_confine_rewires_only_non_matrix_readers(bert_int8):
    dst, result = bert_int8
    model = onnx.load(str(dst))
    assert confine_qdq(model, result.quantized) == 0  # already confined by quantize_int8


def test_quantize_refuses_what_it_cannot_do(bert_onnx, bert_int8, tmp_path):
    dst, _ = bert_int8
    with pytest.raises(GraphError, match="already quantized"):
        quantize_int8(dst, tmp_path / "x.onnx", _bert_feeds())
    with pytest.raises(GraphError, match="names no matrix layer"):
        quantize_int8(bert_onnx.path, tmp_path / "x.onnx", _bert_feeds(), keep_float_nodes=["nope"])
    with pytest.raises(GraphError, match="lack the graph inputs"):
        quantize_int8(bert_onnx.path, tmp_path / "x.onnx", [{"input_ids": np.ones((1, 4), np.int64)}])
    with pytest.raises(GraphError, match="calibrate must be one of"):
        quantize_int8(bert_onnx.path, tmp_path / "x.onnx", _bert_feeds(), calibrate="max")
    assert not (tmp_path / "x.onnx").exists() and not list(tmp_path.glob(".x.onnx*"))  # nothing half-written


def test_histogram_calibration_takes_batches_of_other_shapes(bert_onnx, tmp_path):
    feeds = [*_bert_feeds(3), {k: v[:2] for k, v in _bert_feeds(1, seed=7)[0].items()}]  # 3 lengths, a short batch
    cut = same_shapes(feeds)
    assert len(cut) == 3 and {f["input_ids"].shape for f in cut} == {(4, 12)}
    assert not cut[0]["attention_mask"][:, 8:].any()  # padded positions are masked
    result = quantize_int8(bert_onnx.path, tmp_path / "p.onnx", feeds, calibrate="percentile")
    assert result.calibration["method"] == "percentile"
    assert graph_precision(onnx.load(str(tmp_path / "p.onnx"))) == "int8"


def test_member_ranges_measure_each_members_share_of_the_shared_scale(conv_onnx, tmp_path):
    feeds = []
    for i in range(3):
        x = conv_inputs((2, 24, 7), seed=i)["x"].numpy()
        x[:, 8:16] *= 0.25  # member 1's channels (8 per member) a quarter of the others'
        feeds.append({"x": x})
    model = onnx.load(str(conv_onnx.path), load_external_data=False)
    up = next(n.name for n in model.graph.node if n.op_type == "Conv")
    ranges = member_ranges(conv_onnx.path, feeds, [up])
    assert list(ranges) == [up]
    shares = ranges[up]
    assert len(shares) == 3 and max(shares) == 1.0 and 0.2 < shares[1] < 0.3 < min(shares[0], shares[2])
    result = quantize_int8(conv_onnx.path, tmp_path / "c.onnx", feeds)
    assert up in result.member_ranges and result.report()["member_ranges"][up] == result.member_ranges[up]


def test_weight_parity_judges_int8_weights_in_quantization_steps(bert_module, bert_int8):
    from toolchain.parity.weights import weight_parity

    dst, result = bert_int8
    model = onnx.load(str(dst))
    report = weight_parity(model, bert_module)
    int8 = [t for t in report.tensors if t.dtype == "int8"]
    assert report.passed, report.message()
    assert len(int8) == len(result.quantized) and all(t.status == "pass" for t in int8)
    assert not report.unmatched  # scales and zero points are quantization parameters, not weights
    inits = {i.name: i for i in model.graph.initializer}
    dq = next(n for n in model.graph.node if n.op_type == "DequantizeLinear" and n.input[0] in inits
              and onnx.numpy_helper.to_array(inits[n.input[1]]).size > 1)
    scale = inits[dq.input[1]]
    scale.CopyFrom(onnx.numpy_helper.from_array(onnx.numpy_helper.to_array(scale) * np.float32(1.01), scale.name))
    broken = weight_parity(model, bert_module)
    assert [t.initializer for t in broken.failures] == [dq.input[0]]
    assert "int8" in broken.failures[0].describe() and broken.failures[0].reference is not None


def test_the_tensorrt_lint_knows_explicit_quantization(bert_int8, tmp_path):
    from toolchain.export.lint import lint_tensorrt

    dst, _ = bert_int8
    for version in ("10", "11"):
        report = lint_tensorrt(dst, trt_version=version)
        assert report.ok, [str(f) for f in report.errors]
        assert any(f.code == "qdq" and "strongly typed (no INT8 builder flag" in f.message for f in report.findings)
    model = onnx.load(str(dst))
    zero = next(i for i in model.graph.initializer if i.name.endswith("zero_point") and not i.dims)
    zero.CopyFrom(onnx.numpy_helper.from_array(np.array(3, dtype=np.int8), zero.name))
    onnx.save(model, str(tmp_path / "asym.onnx"))
    report = lint_tensorrt(tmp_path / "asym.onnx", trt_version="11")
    assert not report.ok and any(f.code == "qdq" and "is not 0" in f.message for f in report.errors)
