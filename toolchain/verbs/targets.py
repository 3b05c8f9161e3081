"""What the file commands run: each given file on each engine kind asked for, at each precision asked for.

``parity``, ``bench`` and ``build`` on files take ``--engine KIND[,KIND]`` and ``--precision
P[,P]``; :func:`targets_for` turns the files and both lists into :class:`Target` s, one per
(file, kind, precision) that can run, and the reason for each combination that cannot:

* an ``.onnx`` graph on a kind that runs the graph's own precision (ONNX Runtime): the graph's
  precision (BF16 graphs on the CPU kind go to its exact-rounding substitute); a precision
  asked for that is not the graph's is skipped (that kind runs the graph as exported: give the
  graph's ``.fp16`` / ``.bf16`` variant);
* an ``.onnx`` FP32 graph on a kind that compiles (OpenVINO): once per precision asked for (the
  graph's own when none), compiled when the runner is activated; a precision this machine
  lacks (a CPU without BF16) is skipped with the kind's reason;
* an engine file (``.engine``, ``.blob``): the kind that owns its suffix, at the precision it was
  built for (what its kind's ``describe`` hook reads from its sidecar, or its name; ``--precision``
  when neither says). An ``.onnx`` file on the same command line with the name its record gives is
  its source graph: loading it refuses a file built from another version of that graph (exit 2).

Labels are ``<kind>:<file name>`` and, for compiled graphs, ``<kind>:<file name>@<precision>``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from toolchain.errors import GraphError, ToolchainError

PRECISIONS = ("fp32", "fp16", "bf16", "int8")


@dataclass(frozen=True)
class Target:
    """One (file, kind, precision) a file command runs.

    Attributes:
        label: ``<kind>:<file>`` (``@<precision>`` for a graph a kind compiles) in reports.
        kind: the engine kind that runs it (a substitute already resolved).
        precision: the precision asked for (the engine may report another it really ran: parity
            judges at that one).
        path: the file.
        entry: what :func:`toolchain.engines.runner_for` builds the runner from.
        inputs, outputs: the graph's (empty when the file does not say).
    """

    label: str
    kind: str
    precision: str
    path: Path
    entry: dict[str, Any]
    inputs: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)

    def runner(self, *, threads: int = 0, name: str | None = None) -> Any:
        """An inactive runner (:func:`toolchain.engines.runner_for`)."""
        from toolchain.engines import runner_for

        return runner_for(self.kind, self.entry, threads=threads, name=name or self.label)


def parse_list(text: str | Sequence[str] | None, option: str, allowed: Sequence[str]) -> list[str] | None:
    """``"a,b"`` (or a list of such) -> ``["a", "b"]``, each checked against ``allowed``; None stays None."""
    if text is None:
        return None
    parts = [text] if isinstance(text, str) else list(text)
    values = [v.strip().lower() for p in parts for v in str(p).split(",") if v.strip()]
    bad = [v for v in values if v not in allowed]
    if bad or not values:
        raise ToolchainError(f"{option} '{','.join(parts)}': use a comma-separated list of {', '.join(allowed)}.")
    return list(dict.fromkeys(values))


def file_kinds() -> list[str]:
    """Kinds a file command may name with ``--engine`` (selectable kinds that run files)."""
    from toolchain.engines import engine_kinds

    return [k.name for k in engine_kinds(selectable=True) if k.runs_files]


def default_kind() -> str:
    """The CPU kind every recipe has (``onnxrt-cpu``): the default of ``--engine``."""
    from toolchain.engines import default_engines, engine_kind

    return next(k for k in default_engines() if engine_kind(k).runs_files)


def _graph_facts(path: Path) -> tuple[str, list[str], list[str]]:
    from toolchain.export.graph import graph_summary, load_checked
    from toolchain.export.precision import graph_precision

    summary = graph_summary(path)
    precision = graph_precision(load_checked(path, load_weights=False, check=False))
    return precision, [e["name"] for e in summary["inputs"]], [e["name"] for e in summary["outputs"]]


def _engine_precision(path: Path, description: dict[str, Any], given: Sequence[str] | None) -> str:
    """An engine file's precision: its sidecar's, else its name's (``x.fp16.engine``), else the one ``--precision``."""
    recorded = description.get("precision")
    if recorded in PRECISIONS:
        return str(recorded)
    named = [p for p in PRECISIONS if p in path.name.split(".")]
    if len(named) == 1:
        return named[0]
    if given is not None and len(given) == 1:
        return given[0]
    raise ToolchainError(f"cannot tell the precision of '{path}' from its sidecar or name; pass --precision "
                         "fp32|fp16|bf16|int8 (one).")


def _describe(spec: Any, path: Path) -> dict[str, Any]:
    """What ``spec``'s hook says about a compiled file (empty when the kind has none or the record is unreadable)."""
    if spec.describe is None:
        return {}
    try:
        return dict(spec.describe(path))
    except ToolchainError:  # a missing or malformed sidecar: the name or --precision decides; loading says why
        return {}


def _given_source(description: dict[str, Any], paths: Sequence[str | Path]) -> Path | None:
    """The ``.onnx`` file among ``paths`` that an engine file's record names as its source graph, if one is."""
    name = Path(str(description.get("onnx_file") or "")).name
    given = [Path(p) for p in paths if Path(p).suffix.lower() == ".onnx" and Path(p).name == name and Path(p).is_file()]
    return given[0] if name and len(given) == 1 else None


def targets_for(paths: Sequence[str | Path], engines: Sequence[str] | None = None,
                precisions: Sequence[str] | None = None) -> tuple[list[Target], dict[str, str]]:
    """Every runnable (file, kind, precision) and, per combination that cannot run here, why (module docstring).

    Raises:
        ToolchainError: an unknown kind, a kind that cannot take a file at all (``--engine tensorrt``
            on an ``.onnx`` graph), a missing file, or nothing left to run (every reason listed).
    """
    from toolchain.engines import candidate_label, engine_kind, kinds_for_suffix, known_suffixes, resolve_kind

    allowed = file_kinds()
    for kind in engines or []:
        if kind not in allowed:
            raise ToolchainError(f"--engine '{kind}': use one of {', '.join(allowed)}.")
    targets: list[Target] = []
    skipped: dict[str, str] = {}
    machine: set[str] = set()  # skipped because this machine lacks the precision (not the user's mistake)
    for raw in paths:
        path = Path(raw)
        if not path.is_file():
            raise GraphError(f"'{path}' does not exist" + (" (it is a folder)" if path.is_dir() else "")
                             + f"; give .onnx graphs or engine files ({', '.join(known_suffixes())}).")
        suffix = path.suffix.lower()
        owners = kinds_for_suffix(suffix)
        if not owners and suffix != ".onnx":
            raise GraphError(f"'{path}': give .onnx graphs or engine files ({', '.join(known_suffixes())}).")
        if suffix != ".onnx":  # an engine file: the kind that owns its suffix, as built
            kind = owners[0]
            if engines and kind not in engines:
                raise ToolchainError(f"'{path.name}' is an {engine_kind(kind).file_label}, which {kind} runs; "
                                     f"--engine {','.join(engines)} does not include it.")
            spec = engine_kind(kind)
            description = _describe(spec, path)
            precision = _engine_precision(path, description, precisions)
            specs = spec.inspect_file(path)[0] if spec.inspect_file is not None else {}
            entry = {"engine": str(path), "path": str(path), "precision": precision}
            source = _given_source(description, paths)
            if source is not None:  # its graph, given on the same command line: the file must be built from it
                entry["onnx"] = str(source.resolve())
            targets.append(Target(candidate_label(kind, path.name), kind, precision, path, entry, list(specs)))
            continue
        graph_precision, inputs, outputs = _graph_facts(path)
        for kind in engines or [default_kind()]:
            spec = engine_kind(kind)
            if spec.compiles and graph_precision == "int8":  # a Q/DQ graph compiles as it is, at its own precision
                for precision in [p for p in (precisions or ["int8"]) if p != "int8"]:
                    skipped[candidate_label(kind, f"{path.name}@{precision}")] = (
                        f"'{path.name}' is an INT8 (Q/DQ) graph; {kind} compiles it as INT8 only")
                if precisions and "int8" not in precisions:
                    continue
                label = candidate_label(kind, f"{path.name}@int8")
                reason = spec.unavailable("int8")
                if reason is not None:
                    skipped[label] = reason
                    machine.add(label)
                    continue
                targets.append(Target(label, kind, "int8", path, {"path": str(path), "precision": "int8"},
                                      inputs, outputs))
                continue
            if spec.compiles:
                if graph_precision != "fp32":
                    raise ToolchainError(f"--engine {kind} compiles FP32 graphs at a precision; '{path.name}' is a "
                                         f"{graph_precision} graph: give its FP32 graph and --precision "
                                         f"{graph_precision}.")
                if precisions and "int8" in precisions:
                    skipped[candidate_label(kind, f"{path.name}@int8")] = (
                        f"'{path.name}' is an FP32 graph; INT8 needs its Q/DQ graph "
                        "(hydra-toolchain export --precision int8 --data CALIB.csv)")
                for precision in [p for p in (precisions or [graph_precision]) if p != "int8"]:
                    label = candidate_label(kind, f"{path.name}@{precision}")
                    reason = spec.unavailable(precision)
                    if reason is not None:
                        skipped[label] = reason
                        machine.add(label)
                        continue
                    targets.append(Target(label, kind, precision, path, {"path": str(path), "precision": precision},
                                          inputs, outputs))
                continue
            if ".onnx" not in spec.suffixes:
                raise ToolchainError(f"--engine {kind} runs {spec.file_label}s ({'/'.join(spec.suffixes)}), not "
                                     f"'{path.name}'; build one first (hydra-toolchain build).")
            for precision in [p for p in (precisions or [graph_precision]) if p != graph_precision]:
                skipped[candidate_label(kind, f"{path.name}@{precision}")] = (
                    f"{kind} runs a graph in the precision it was exported in ({graph_precision}); give the "
                    f"graph's {precision} variant")
            if precisions and graph_precision not in precisions:
                continue
            actual = resolve_kind(kind, graph_precision)
            if actual is None:
                skipped[candidate_label(kind, path.name)] = spec.unsupported.get(
                    graph_precision, f"{kind} does not run {graph_precision} graphs")
                continue
            targets.append(Target(candidate_label(actual, path.name), actual, graph_precision, path,
                                  {"path": str(path), "precision": graph_precision}, inputs, outputs))
    labels = [t.label for t in targets]
    dupes = sorted({x for x in labels if labels.count(x) > 1})
    if dupes:
        raise ToolchainError(f"two files would both be reported as {dupes}; give files with distinct names.")
    if not targets:
        from toolchain.errors import MissingDependencyError

        why = "; ".join(f"{k}: {v}" for k, v in skipped.items()) or "no files given"
        error = MissingDependencyError if skipped and set(skipped) <= machine else ToolchainError
        raise error(f"nothing to run: {why}.")
    return targets, skipped
