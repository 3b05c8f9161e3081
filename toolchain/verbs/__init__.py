"""The file commands as functions (one implementation for the CLI, the stages and Python users).

``hydra-toolchain export|inspect`` run them on a checkpoint folder, a fused Hydra folder or a graph.

* :func:`~toolchain.verbs.export.export_graphs` - a checkpoint or Hydra folder -> ONNX graphs,
  ``graphs.json`` and precision reports, every graph validated against PyTorch.
* :func:`~toolchain.verbs.inspect.inspect_path` - what a graph, an engine or a Hydra folder holds.
* :func:`~toolchain.verbs.bench.bench_graphs` - latency of ONNX graphs side by side, as ratios to the first.
"""

from toolchain.verbs.bench import bench_graphs, bench_table
from toolchain.verbs.export import ExportOptions, Range, export_graphs, export_module
from toolchain.verbs.inspect import format_inspection, inspect_path

__all__ = ["ExportOptions", "Range", "bench_graphs", "bench_table", "export_graphs", "export_module",
           "format_inspection", "inspect_path"]
