"""ONNX export, FP16/BF16 variants and a TensorRT lint that run on CPU."""

from toolchain.export.graph import graph_summary, load_checked
from toolchain.export.lint import Finding, LintReport, lint_tensorrt
from toolchain.export.onnx_export import ExportResult, export_onnx
from toolchain.export.precision import PrecisionResult, convert_precision, write_precision_variant

__all__ = [
    "ExportResult",
    "Finding",
    "LintReport",
    "PrecisionResult",
    "convert_precision",
    "export_onnx",
    "graph_summary",
    "lint_tensorrt",
    "load_checked",
    "write_precision_variant",
]
