"""ONNX export (TorchScript exporter, opset 17) of a fused model, checked with ONNX Runtime.

Exported at one shape, run at two others (batch and sequence dynamic); the conv lowering must
put grouped ``Conv`` nodes (group = M, weights as initializers) in the graph, the MatMul
lowering none. Q, K and V run as one GFC (one ``Conv``), O as another.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from toolchain.hydra import fuse
from toolchain.models.tiny import tiny_bert

OUTPUTS = ["probs", "member_logits"]


def _export(model, batch, path):
    names = list(model.input_names)
    dynamic = {n: {0: "batch", 1: "sequence"} for n in names}
    dynamic.update({o: {0: "batch"} for o in OUTPUTS})
    torch.onnx.export(
        model, tuple(batch[n] for n in names), str(path), input_names=names, output_names=OUTPUTS,
        dynamic_axes=dynamic, opset_version=17, dynamo=False,
    )
    return onnx.load(str(path))


@pytest.mark.filterwarnings("ignore:You are using the legacy TorchScript-based ONNX export:DeprecationWarning")
@pytest.mark.parametrize("mlp", ["grouped", "average"])
@pytest.mark.parametrize("lowering", ["conv", "matmul"])
def test_export_dynamic_batch_and_sequence(unequal_masks, tmp_path, lowering, mlp):
    tiny = tiny_bert()
    model = fuse(tiny.adapter, unequal_masks, mlp=mlp, lowering=lowering)
    graph = _export(model, tiny.make_batch(2, seed=0), tmp_path / "hydra.onnx").graph

    convs = [n for n in graph.node if n.op_type == "Conv"]
    if lowering == "conv":
        groups = [next(a.i for a in n.attribute if a.name == "group") for n in convs]
        layers = len(model.blocks)
        # one Conv for Q, K and V together and one for O (+ fc1, fc2 when grouped), group = M
        assert groups.count(3) == (4 if mlp == "grouped" else 2) * layers
        assert len(groups) == 4 * layers
        initializers = {i.name for i in graph.initializer}
        assert all(n.input[1] in initializers for n in convs), "TensorRT needs Conv weights as initializers"
    else:
        assert convs == []

    sess = ort.InferenceSession(str(tmp_path / "hydra.onnx"), providers=["CPUExecutionProvider"])
    for batch_size, seq in ((1, 5), (3, 9)):
        batch = {k: v[:, :seq] for k, v in tiny.make_batch(batch_size, seed=batch_size).items()}
        feed = {i.name: batch[i.name].numpy() for i in sess.get_inputs()}
        got = dict(zip(OUTPUTS, sess.run(OUTPUTS, feed), strict=True))
        with torch.no_grad():
            want = model(**batch)
        assert got["member_logits"].shape == (batch_size, 3, 3)
        assert np.abs(got["probs"] - want["probs"].numpy()).max() <= 1e-5
        assert np.abs(got["member_logits"] - want["member_logits"].numpy()).max() <= 1e-4


def test_conv_graph_has_static_channels_for_tensorrt(tmp_path):
    """Grouped Conv inputs keep a static channel dim in the exported graph (TensorRT needs it)."""
    import torch

    from toolchain.export.lint import lint_tensorrt
    from toolchain.export.onnx_export import export_onnx
    from toolchain.hydra.fuse import fuse
    from toolchain.models.tiny import tiny_bert

    tiny = tiny_bert()
    masks = torch.ones(2, 2, 4, dtype=torch.bool)
    masks[0, 0, :2] = False
    model = fuse(tiny.adapter, masks, lowering="conv")
    batch = tiny.make_batch(2)
    names = ["input_ids", "attention_mask", "token_type_ids"]
    axes = {n: {0: "batch", 1: "seq"} for n in names}
    res = export_onnx(model, {n: batch[n] for n in names}, ["probs", "member_logits"], tmp_path / "h.onnx",
                      dynamic_axes=axes)
    assert res.summary["grouped_conv"] > 0
    profile = {n: ((1, 4), (2, 12), (8, 32)) for n in names}
    report = lint_tensorrt(tmp_path / "h.onnx", profile=profile)
    assert report.ok, [str(f) for f in report.findings]
