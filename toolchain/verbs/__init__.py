"""The file commands as functions (one implementation for the CLI, the stages and Python users).

``hydra-toolchain export|parity|bench|inspect`` run them on a checkpoint folder, a fused Hydra
folder or a graph; the package ``toolchain`` re-exports them (``toolchain.export_graphs`` ...).

* :func:`~toolchain.verbs.export.export_graphs` - a checkpoint or Hydra folder -> ONNX graphs,
  ``graphs.json`` and precision reports, every graph validated against PyTorch.
* :func:`~toolchain.verbs.parity.check_parity` - graphs or engines against their PyTorch source:
  the parity gate's verdict (numeric and UQ metrics, exit code, JSON/JUnit/Markdown).
* :func:`~toolchain.verbs.bench.bench_graphs` - latency of ONNX graphs side by side, as ratios to the first.
* :func:`~toolchain.verbs.inspect.inspect_path` - what a graph, an engine or a Hydra folder holds.
"""

from toolchain.verbs.bench import bench_graphs, bench_table
from toolchain.verbs.export import ExportOptions, Range, export_graphs, export_module
from toolchain.verbs.inspect import format_inspection, inspect_path
from toolchain.verbs.parity import ParityOptions, check_parity, rescue_graphs

__all__ = ["ExportOptions", "ParityOptions", "Range", "bench_graphs", "bench_table", "check_parity",
           "export_graphs", "export_module", "format_inspection", "inspect_path", "rescue_graphs"]
