"""Node count and operator histogram of an ONNX graph: how lean an exported graph is.

:func:`graph_stats` reads the graph only (never the weights) and counts its top-level nodes,
with and without ``Constant`` nodes (a ``Constant`` is a value, not work: the TorchScript
exporter writes one per shape constant, and ONNX Runtime and TensorRT fold them at load), and
per operator type. ``nodes_excluding_constant`` is the number to compare between graphs, e.g.
a Hydra graph against its single model (the export tests hold the Hydra graphs of the tiny BERT
and ViT to at most 1.3x the single model's). :data:`SHAPE_OPS` names the operators that do
shape arithmetic rather than tensor maths, and ``shape_nodes`` counts them.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from toolchain.export.graph import load_checked

#: Operators that compute shapes or index them (what a graph spends on dynamic-shape bookkeeping).
SHAPE_OPS: frozenset[str] = frozenset(
    {"Shape", "Gather", "Unsqueeze", "Squeeze", "Concat", "Slice", "ConstantOfShape", "Expand", "Range", "Size",
     "Mod"}
)


def graph_stats(path: str | Path) -> dict[str, Any]:
    """Count the nodes of an ONNX file.

    Args:
        path: the ``.onnx`` file (external weights are not read).

    Returns:
        ``{"nodes": int, "nodes_excluding_constant": int, "shape_nodes": int,
        "ops": {op type: count}}``, ``ops`` most frequent first (ties by name). Nodes inside
        control-flow subgraphs (``If``/``Loop`` bodies) are not counted; exported transformers
        have none.
    """
    graph = load_checked(Path(path), load_weights=False, check=False).graph
    ops = Counter(node.op_type for node in graph.node)
    return {
        "nodes": len(graph.node),
        "nodes_excluding_constant": len(graph.node) - ops.get("Constant", 0),
        "shape_nodes": sum(n for op, n in ops.items() if op in SHAPE_OPS),
        "ops": dict(sorted(ops.items(), key=lambda kv: (-kv[1], kv[0]))),
    }


def stats_table(stats: dict[str, dict[str, Any]], top: int = 12) -> str:
    """Markdown table of several graphs' :func:`graph_stats`: totals, then the ``top`` operators."""
    names = list(stats)
    ops = Counter()
    for s in stats.values():
        ops.update(s["ops"])
    rows = [("nodes", "nodes"), ("nodes without Constant", "nodes_excluding_constant"), ("shape nodes", "shape_nodes")]
    lines = ["| | " + " | ".join(names) + " |", "|---|" + "---:|" * len(names)]
    lines += [f"| {label} | " + " | ".join(str(stats[n][key]) for n in names) + " |" for label, key in rows]
    for op, _ in ops.most_common(top):
        lines.append(f"| {op} | " + " | ".join(str(stats[n]["ops"].get(op, 0)) for n in names) + " |")
    return "\n".join(lines)
