"""hydra-toolchain: head pruning, Hydra ensembles, ONNX/TensorRT export, parity gates and latency reports.

The file commands as a Python API (the same functions the CLI and the recipe stages call)::

    import toolchain

    toolchain.export_graphs("hydra/", "graphs/", toolchain.ExportOptions(precisions=("fp32", "fp16")))
    verdict = toolchain.check_parity(["graphs/hydra-conv.fp16.onnx"], "hydra/",
                                     toolchain.ParityOptions(data="test.csv"), out="parity/")
    assert verdict.exit_code == 0, verdict.problems()
    toolchain.bench_graphs(["graphs/hydra-conv.onnx", "graphs/hydra-conv.fp16.onnx"], out="bench/")
    toolchain.inspect_path("graphs/hydra-conv.fp16.onnx")["fp32_islands"]

Importing ``toolchain`` is cheap: the API is loaded on first use.
"""

from typing import Any

__version__ = "0.1.0"

_API = ("ExportOptions", "ParityOptions", "Range", "bench_graphs", "check_parity", "export_graphs", "inspect_path",
        "rescue_graphs")
__all__ = ["__version__", *_API]


def __getattr__(name: str) -> Any:
    if name in _API:
        import toolchain.verbs as verbs

        return getattr(verbs, name)
    raise AttributeError(f"module 'toolchain' has no attribute {name!r}")
