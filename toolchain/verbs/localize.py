"""``parity GRAPH... --reference SRC --localize``: where each failing graph first diverges.

For every candidate with a failed check, on the feeds where its outputs were furthest off
(:func:`~toolchain.parity.localize.pick_feeds`, up to :data:`MAX_ROWS` rows):

* against PyTorch, layer by layer (:func:`~toolchain.parity.localize.localize_against_torch`): the
  reference folder's module, built at the graph's lowering (``hydra-<lowering>.onnx``);
* node by node against a reference graph in ONNX Runtime
  (:func:`~toolchain.parity.localize_graph.localize_against_graph`; no module-scoped node names needed):
  the ``baseline`` graph when given (``--baseline GRAPH``); else, for an FP16/BF16 graph or an engine
  compiled from an FP32 graph at a lower precision, the FP32 graph: the graph's name without its
  precision beside it (``hydra-conv.fp16.onnx`` -> ``hydra-conv.onnx``), the candidate graph itself
  when it is FP32, or else the candidate cast up to FP32
  (:func:`~toolchain.parity.localize_graph.cast_up`: only where low precision loses digits shows). An
  FP32 graph without module-scoped names and without ``--baseline`` is localised by nothing but
  PyTorch, which needs those names; the report says to pass ``--baseline``.

The marked graphs run through ``marked_runner(candidate)`` (default: the candidate's engine kind
through the registry, :func:`~toolchain.parity.localize.onnx_runner`). The results go to
``verdict.localization`` (``report.json``: ``engines.<label>.localization``; ``summary.md``; the
console prints each result's ``summary``). An engine file without its ONNX graph is reported as not localisable.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from toolchain.errors import ToolchainError

#: rows of the feeds the values are compared on (the feeds with the largest errors first)
MAX_ROWS = 64


def _lowering(path: Path, source: Any) -> str | None:
    """The Hydra lowering a graph's name says (``hydra-matmul.fp16.onnx`` -> ``matmul``); None for a checkpoint."""
    from toolchain.hydra.gfc import LAYOUTS

    found = re.match(r"hydra-([a-z]+)", path.name)
    return found.group(1) if source.kind == "hydra" and found and found.group(1) in LAYOUTS else None


def _fp32_graph(path: Path, precision: str) -> Path | None:
    """The FP32 graph a low-precision candidate comes from: itself when FP32 (an engine's hint), else beside it."""
    from toolchain.export.graph import load_checked
    from toolchain.export.precision import graph_precision

    if graph_precision(load_checked(path, load_weights=False, check=False)) == "fp32":
        return path
    fp32 = path.with_name(path.name.replace(f".{precision}.onnx", ".onnx"))
    return fp32 if fp32 != path and fp32.is_file() else None


def _node_reference(path: Path, precision: str, baseline: Path | None, cast_up: Callable[[Any], Any]
                    ) -> tuple[Any, str]:
    """The graph to compare ``path`` with node by node, and what it is (``against``); None when there is none."""
    from toolchain.export.graph import load_checked

    if baseline is not None:
        return Path(baseline), "baseline"
    if precision == "fp32":
        return None, ""
    fp32 = _fp32_graph(path, precision)
    if fp32 is not None:
        return fp32, "fp32-graph"
    return cast_up(load_checked(path)), "fp32-cast"


def localize_failures(verdict: Any, candidates: Sequence[Any], source: Any, feeds: Any, *,
                      marked_runner: Callable[[Any], Callable[[Path], Any]] | None = None, max_rows: int = MAX_ROWS,
                      baseline: Path | None = None,
                      say: Callable[[str], None] = lambda _line: None) -> dict[str, list[dict[str, Any]]]:
    """Localise every failing candidate; store the results in ``verdict.localization`` and return them.

    Args:
        verdict: the gate's :class:`~toolchain.parity.Verdict` (its failing checks pick the feeds).
        candidates: the :class:`~toolchain.verbs.targets.Target` s it checked.
        source: the reference folder (:func:`~toolchain.verbs.export.open_source`).
        feeds: the gate's :class:`~toolchain.verbs.parity.Feeds`.
        marked_runner: ``candidate -> (path -> Runner)``, how a marked copy of the candidate's graph is
            run (default: :func:`~toolchain.parity.localize.onnx_runner` of its kind and precision).
        max_rows: rows to localise on.
        baseline: a reference graph to compare every candidate with node by node (``--baseline``).
        say: progress lines.
    """
    from toolchain.parity import ParityData, Tolerance
    from toolchain.parity.localize import localize_against_torch, module_outputs, onnx_runner, pick_feeds
    from toolchain.parity.localize_graph import cast_up, localize_against_graph

    labelled = [(label, feed) for _, label, feed in ParityData.build(feeds.generated, feeds.ident, feeds.ood).feeds()]
    for c in candidates:
        checks = verdict.engine_checks(c.label)
        if not any(ch.status == "fail" for ch in checks):
            continue
        if c.path.suffix != ".onnx":
            note = (f"{c.path.name}: --localize marks values of an ONNX graph; check the graph this engine was "
                    "built from")
            verdict.localization[c.label] = [{"found": False, "graph": c.path.name, "summary": note}]
            say(f"localize {c.label}: {note}")
            continue
        numeric = [ch.data for ch in checks if ch.status == "fail" and ch.kind == "numeric"]
        if not numeric:
            failed = ", ".join(ch.name for ch in checks if ch.status == "fail")
            note = (f"{c.path.name}: not localised: only {failed} failed; every output meets the numeric rule, so "
                    "no value diverges beyond it (near-tied scores whose order or bins moved)")
            verdict.localization[c.label] = [{"found": False, "graph": c.path.name, "summary": note}]
            continue
        chosen = pick_feeds(labelled, numeric, max_rows)
        rows, labels = [f for _, f in chosen], [label for label, _ in chosen]
        say(f"localize {c.label}: on {', '.join(labels)}")
        tolerances = {k: Tolerance(**v) for k, v in verdict.meta["tolerances"][c.label].items()}
        run_marked = (marked_runner(c) if marked_runner is not None else None) or onnx_runner(c.kind, c.precision)
        module, _outputs = source.build(_lowering(c.path, source))
        results = []
        try:
            torch_side = localize_against_torch(c.path, module, rows, precision=c.precision, run_marked=run_marked,
                                                tolerances=tolerances, labels=labels).to_dict()
            results.append(torch_side)
            reference, against = _node_reference(c.path, c.precision, baseline, cast_up)
            if reference is None and torch_side["fails_unmarked"] and not torch_side["found"]:
                results.append({"found": False, "graph": c.path.name, "summary": (
                    f"{c.path.name} ({c.precision}): not localised node by node: give the graph to compare it with "
                    "(--baseline GRAPH, e.g. the graph it was exported or copied from)")})
            elif reference is not None:
                results.append(localize_against_graph(
                    c.path, reference, rows, precision=c.precision, against=against, run_marked=run_marked,
                    reference_outputs=module_outputs(module, rows), tolerances=tolerances,
                    module_paths=[p for p, _ in module.named_modules() if p], labels=labels).to_dict())
        except ToolchainError as exc:  # a graph that cannot be marked or run: say so, keep the verdict
            results.append({"found": False, "graph": c.path.name, "summary": f"{c.path.name}: not localised: {exc}"})
        verdict.localization[c.label] = results
    return verdict.localization


__all__ = ["MAX_ROWS", "localize_failures"]
