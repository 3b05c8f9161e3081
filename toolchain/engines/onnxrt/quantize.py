"""ONNX Runtime's quantizer: the INT8 (Q/DQ) variant of an FP32 graph.

:mod:`toolchain.export.quantize` says what is quantized and why this quantizer; here are the calls
(:func:`quantize_int8`, :func:`write_int8_variant`) and the members' share of Hydra's shared
activation ranges (:func:`member_ranges`).
"""

from __future__ import annotations

import logging
import os
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from toolchain.artifacts import atomic_write_json
from toolchain.errors import GraphError, MissingDependencyError
from toolchain.export.quantize import (
    CALIBRATION_METHODS,
    QUANTIZED_OPS,
    Calibration,
    QuantResult,
    check_feeds,
    confine_qdq,
    head_layers,
    is_quantized,
    matrix_layers,
    same_shapes,
)

__all__ = ["member_ranges", "quantize_int8", "write_int8_variant"]

log = logging.getLogger(__name__)


class _QuietQuantizer(logging.Filter):
    """Drops the quantizer's advice to the root logger ("consider pre-processing", "bias is not constant").

    Our graphs are shape-inferred already, and what was quantized is reported in ``.precision.json``.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        return "/onnxruntime/quantization/" not in record.pathname.replace("\\", "/")


class _Reader:
    """ONNX Runtime's ``CalibrationDataReader`` protocol over a list of feeds (only the graph's inputs)."""

    def __init__(self, feeds: Sequence[Mapping[str, np.ndarray]], names: Sequence[str]) -> None:
        self._feeds = [{k: np.asarray(f[k]) for k in names} for f in feeds]
        self._it = iter(self._feeds)

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self._it, None)

    def rewind(self) -> None:
        self._it = iter(self._feeds)


def member_ranges(src: Path, feeds: Sequence[Mapping[str, np.ndarray]],
                  layers: Iterable[str]) -> dict[str, list[float]]:
    """Per grouped layer, each member's share of the one activation range all members share.

    For every grouped ``Conv`` (``group`` = M > 1) among ``layers``: each member's absolute maximum of the
    layer's input on ``feeds`` as a fraction of the shared one (1.0 = the member sets the scale; 0.25 = it
    keeps two bits fewer than a scale of its own would give). Runs the FP32 graph once with those inputs
    added as outputs.
    """
    import onnxruntime as ort

    model = onnx.load_model(str(src), load_external_data=False)
    wanted = set(layers)
    grouped = {}
    for node in model.graph.node:
        group = next((a.i for a in node.attribute if a.name == "group"), 1)
        if node.op_type == "Conv" and node.name in wanted and group > 1:
            grouped[node.name] = (node.input[0], group)
    if not grouped:
        return {}
    full = onnx.load_model(str(src))
    known = {o.name for o in full.graph.output}
    for tensor, _ in grouped.values():
        if tensor not in known:
            full.graph.output.append(onnx.helper.make_empty_tensor_value_info(tensor))
            known.add(tensor)
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(full.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    names = check_feeds(model, feeds)
    peaks: dict[str, np.ndarray] = {}
    for feed in feeds:
        got = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, {k: feed[k] for k in names}), strict=True))
        for node, (tensor, group) in grouped.items():
            x = np.abs(got[tensor])  # [B, M * C, ...]: channel axis 1, members in blocks
            per = x.reshape(x.shape[0], group, -1).max(axis=(0, 2))
            peaks[node] = per if node not in peaks else np.maximum(peaks[node], per)
    return {node: [round(float(p / max(per.max(), 1e-30)), 4) for p in per] for node, per in peaks.items()}


def quantize_int8(src: Path, dst: Path, feeds: Sequence[Mapping[str, np.ndarray]], *,
                  keep_float_nodes: Iterable[str] = (), keep_heads: bool = True,
                  calibrate: Calibration = "minmax", per_channel: bool = True,
                  measure_members: bool = True) -> QuantResult:
    """Write ``dst``: the FP32 graph ``src`` with its matrix layers in INT8 (explicit Q/DQ), calibrated on ``feeds``.

    Args:
        src: an FP32 ONNX file (weights inline or in an external file beside it).
        dst: where the Q/DQ graph goes (written to a temporary name in its folder, then renamed).
        feeds: input dicts (numpy arrays keyed by the graph's input names), e.g. batches of calibration rows.
        keep_float_nodes: matrix layers to leave in float on top of the heads (the float fallback's answer).
        keep_heads: keep :func:`head_layers` in float (default).
        calibrate: ``minmax`` | ``percentile`` (99.999th) | ``entropy``: how activation ranges are read.
        per_channel: per-output-channel weight scales (default) or one per tensor.
        measure_members: also run :func:`member_ranges` for grouped layers (the report; off in the rescue's
            evaluations).
    """
    try:
        from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static
    except ImportError as exc:  # onnxruntime is a core dependency; a broken install is the user's
        raise MissingDependencyError(f"INT8 export needs onnxruntime.quantization: {exc}") from exc
    if calibrate not in CALIBRATION_METHODS:
        raise GraphError(f"calibrate must be one of {list(CALIBRATION_METHODS)}, got {calibrate!r}.")
    src, dst = Path(src), Path(dst)
    model = onnx.load_model(str(src), load_external_data=False)
    if is_quantized(model):
        raise GraphError(f"{src} is already quantized (it has QuantizeLinear/DequantizeLinear nodes); "
                         "pass its FP32 graph.")
    names = check_feeds(model, feeds)
    layers = matrix_layers(model)
    keep = {n: "listed (keep_float_nodes)" for n in keep_float_nodes}
    unknown = sorted(set(keep) - set(layers))
    if unknown:
        raise GraphError(f"keep_float_nodes names no matrix layer of {src.name}: {unknown[:5]}"
                         f"{' ...' if len(unknown) > 5 else ''} (matrix layers: MatMul/Gemm/Conv with a constant "
                         "weight; see the graph's .int8.precision.json for their names).")
    if keep_heads:
        for h in head_layers(model):
            keep.setdefault(h, "classifier head (a graph output is reached from it without another matrix layer)")
    chosen = [n for n in layers if n not in keep]
    if not chosen:
        raise GraphError(f"{src.name}: no matrix layer left to quantize ({len(layers)} found, all kept float).")
    method = {"minmax": CalibrationMethod.MinMax, "percentile": CalibrationMethod.Percentile,
              "entropy": CalibrationMethod.Entropy}[calibrate]
    dst.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{dst.name}.", suffix=".tmp", dir=dst.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    quiet = _QuietQuantizer()
    root = logging.getLogger()
    root.addFilter(quiet)
    try:
        quantize_static(
            str(src), str(tmp), _Reader(feeds if calibrate == "minmax" else same_shapes(feeds), names),
            quant_format=QuantFormat.QDQ,
            activation_type=QuantType.QInt8, weight_type=QuantType.QInt8, per_channel=per_channel,
            op_types_to_quantize=list(QUANTIZED_OPS), nodes_to_quantize=chosen, calibrate_method=method,
            extra_options={"ActivationSymmetric": True, "WeightSymmetric": True,
                           "CalibTensorRangeSymmetric": True, "QuantizeBias": False,
                           # Q/DQ at a matrix layer's inputs only (TensorRT's placement): ORT would also
                           # quantize its output, a second rounding that cost MiniLM 4 points of accuracy
                           "OpTypesToExcludeOutputQuantization": list(QUANTIZED_OPS)},
            calibration_providers=["CPUExecutionProvider"])
        written = onnx.load_model(str(tmp))
        rewired = confine_qdq(written, chosen)  # residual adds and other consumers read float again
        onnx.save_model(written, str(tmp))
        onnx.checker.check_model(str(tmp), full_check=False)
        dq_inputs = {n.output[0] for n in written.graph.node if n.op_type == "DequantizeLinear"}
        quantized = tuple(n.name for n in written.graph.node if n.name in set(chosen)
                          and len(n.input) > 1 and n.input[1] in dq_inputs)
        ranges = member_ranges(src, feeds, quantized) if measure_members else {}
        tmp.replace(dst)  # only a complete graph takes the name
    except GraphError:
        raise
    except Exception as exc:  # ONNX Runtime's own errors (InvalidArgument, Fail) derive from Exception
        raise GraphError(f"INT8 quantization of {src} failed: {str(exc).splitlines()[0]}",
                         hint="Check the calibration rows (export --data): they must hold the graph's inputs "
                              "with its dtypes.") from exc
    finally:
        root.removeFilter(quiet)
        tmp.unlink(missing_ok=True)
    for n in chosen:
        if n not in quantized:
            keep[n] = "left float by the quantizer (no INT8 kernel pattern for it)"
    rows = sum(int(np.asarray(next(iter(f.values()))).shape[0]) for f in feeds)
    calib = {"method": calibrate, "rows": rows, "feeds": len(feeds), "per_channel_weights": per_channel,
             "float_consumers_rewired": rewired,
             "activations": "int8 symmetric, per tensor", "weights": "int8 symmetric",
             "quantizer": "onnxruntime.quantization.quantize_static (QDQ)"}
    log.info("int8: %d of %d matrix layers quantized, %d kept float", len(quantized), len(layers), len(keep))
    return QuantResult(quantized, keep, calib, ranges)


def write_int8_variant(src: Path, dst: Path, feeds: Sequence[Mapping[str, np.ndarray]],
                       **kwargs: Any) -> QuantResult:
    """:func:`quantize_int8` plus the files every variant has.

    ``<stem>.summary.json`` and ``<stem>.precision.json`` (the quantized nodes, the float ones with
    reasons, the calibration, the members' ranges).
    """
    from toolchain.export.graph import write_summary

    dst = Path(dst)
    result = quantize_int8(src, dst, feeds, **kwargs)
    write_summary(dst)
    atomic_write_json(dst.with_name(f"{dst.stem}.precision.json"), result.report())
    return result
