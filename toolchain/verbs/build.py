"""Build the engines of kinds that compile graphs first (TensorRT, OpenVINO): the stage and ``build GRAPH...``.

:func:`build_engines` is the one build path. For each kind it asks the registry which engines to
make (:func:`~toolchain.engines.registry.build_plan`: TensorRT builds a graph at the precision it
was exported in; OpenVINO compiles each FP32 graph once per precision asked for), skips a
precision this machine cannot run with the kind's reason (recorded under ``unavailable``, not a
failure: a CPU without BF16, no GPU), calls the kind's builder and returns one record per kind,
which the caller writes as ``engines.json``::

    {"openvino-cpu": {"engines": {"single.bf16": {"engine": "single.bf16.blob", "precision": "bf16",
                                                  "ran_precision": "bf16", "onnx": "single.onnx", ...}},
                      "unavailable": {"single.fp16": "this CPU ... has no FP16 support ..."}},
     "tensorrt": {"skipped": "TensorRT is not installed ..."}}

The ``build`` stage calls it on the export folder with the recipe's profile;
``hydra-toolchain build GRAPH... --engine KIND --precision LIST -o OUT`` on files, with a profile
from ``--batch`` / ``--seq`` (:func:`file_profile`); ``export SRC -o OUT --engine KIND`` after exporting.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from toolchain.errors import GraphError, MissingDependencyError, ToolchainError

Profile = dict[str, tuple]


def _ran_precision(spec: Any, engine: Path) -> str | None:
    """The precision a built engine's layers really ran in, as its kind describes the file (None: not read back)."""
    if spec.describe is None:
        return None
    return spec.describe(engine).get("ran_precision")


def build_engines(
    kinds: Sequence[str],
    graphs: Mapping[str, Mapping[str, Any]],
    export_dir: Path,
    out_dir: Path,
    *,
    precisions: Sequence[str],
    profile: Callable[[Sequence[str]], Profile],
    timing_cache: Path | None = None,
    say: Callable[[str], None] = lambda _line: None,
) -> dict[str, dict[str, Any]]:
    """Build every engine of ``kinds`` from ``graphs`` (``graphs.json`` entries) into ``out_dir``.

    Args:
        kinds: engine kinds that need a build (others are ignored).
        graphs: name -> entry with ``path`` (relative to ``export_dir`` or absolute), ``precision``,
            ``inputs``, ``kind``, ``lowering``.
        export_dir: where the graphs are.
        out_dir: where the engine files and their sidecars go.
        precisions: the precisions a compiling kind builds each FP32 graph at.
        profile: input names -> ``{name: (min, opt, max)}`` shapes.
        timing_cache: TensorRT's timing cache file.
        say: one line per engine.

    Returns:
        kind -> ``{"engines": {name: entry}, "unavailable": {name: reason}}`` or ``{"skipped": reason}``.
    """
    from toolchain.engines import build_plan, engine_kind

    records: dict[str, dict[str, Any]] = {}
    for kind in kinds:
        spec = engine_kind(kind)
        if not spec.needs_build:
            continue
        assert spec.builder is not None and spec.suffix is not None  # register_kind checks the builder
        record: dict[str, Any] = {"engines": {}, "unavailable": {}}
        for name, gname, precision in build_plan(kind, graphs, precisions):
            g = graphs[gname]
            reason = spec.unavailable(precision)
            if reason is not None:
                record["unavailable"][name] = reason
                continue
            try:
                path = spec.builder(Path(export_dir) / g["path"], Path(out_dir) / f"{name}{spec.suffix}",
                                    precision=precision, profile=profile(list(g["inputs"])), timing_cache=timing_cache)
            except MissingDependencyError as exc:  # the kind cannot build here at all (no TensorRT, no GPU)
                record = {"skipped": str(exc)}
                say(f"{kind} skipped: {exc}")
                break
            ran = _ran_precision(spec, path)
            entry = {"engine": path.name, "precision": precision, "onnx": Path(g["path"]).name, "graph": gname,
                     **{k: g[k] for k in ("kind", "lowering", "inputs", "outputs") if k in g}}
            if ran is not None:
                entry["ran_precision"] = ran
            record["engines"][name] = entry
            say(f"{kind} {name}{spec.suffix}: {precision}" + (f" (ran {ran})" if ran not in (None, precision) else ""))
        records[kind] = record
    return records


def file_profile(graph_inputs: Mapping[str, Sequence[Any]], batch: Any, sequence: Any) -> Callable[..., Profile]:
    """A profile function for graphs given as files: axis 0 spans ``batch``, other dynamic axes ``sequence``.

    ``graph_inputs``: input name -> dims (int when static, else a name or None); ``batch`` and
    ``sequence`` have ``min`` / ``opt`` / ``max``.
    """
    def shapes(names: Sequence[str]) -> Profile:
        out: Profile = {}
        for name in names:
            dims = list(graph_inputs[name])
            triple = []
            for k in ("min", "opt", "max"):
                triple.append(tuple(d if isinstance(d, int) and d > 0 else
                                    getattr(batch if axis == 0 else sequence, k) for axis, d in enumerate(dims)))
            out[name] = tuple(triple)
        return out

    return shapes


def build_files(paths: Sequence[str | Path], out: str | Path, *, engines: Sequence[str], precisions: Sequence[str],
                batch: Any, sequence: Any, say: Callable[[str], None] = lambda _line: None) -> dict[str, Any]:
    """``hydra-toolchain build GRAPH... --engine KIND --precision LIST -o OUT``: engines of ONNX files.

    Each ``.onnx`` file is built by every kind in ``engines`` that needs a build; ``OUT/engines.json``
    lists what was built, what is unavailable here and why.
    """
    from toolchain.artifacts import atomic_write_json
    from toolchain.engines import engine_kind
    from toolchain.export.graph import graph_summary, load_checked
    from toolchain.export.precision import graph_precision

    files = [Path(p) for p in paths]
    for f in files:
        if not f.is_file() or f.suffix != ".onnx":
            raise GraphError(f"build: '{f}' is not an .onnx file" + (" (it is a folder)" if f.is_dir() else "")
                             + "; build takes exported graphs.")
    kinds = [k for k in engines if engine_kind(k).needs_build]
    if not kinds:
        raise ToolchainError(f"build: --engine {','.join(engines)} builds nothing; kinds that build engine files: "
                             + ", ".join(_built_kinds()) + ".")
    graphs: dict[str, dict[str, Any]] = {}
    dims: dict[str, list[Any]] = {}
    for f in files:
        summary = graph_summary(f)
        name = f.name[: -len(".onnx")]
        if name in graphs:
            raise GraphError(f"build: two graphs are named '{f.name}'; build graphs with distinct names.")
        outputs = [o["name"] for o in summary["outputs"]]
        precision = graph_precision(load_checked(f, load_weights=False, check=False))
        graphs[name] = {"path": str(f.resolve()), "precision": precision, "outputs": outputs,
                        "inputs": [e["name"] for e in summary["inputs"]],
                        "kind": "hydra" if "member_logits" in outputs else "single"}
        dims.update({e["name"]: e["dims"] for e in summary["inputs"]})
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    records = build_engines(kinds, graphs, out, out, precisions=precisions, profile=file_profile(dims, batch, sequence),
                            say=say)
    atomic_write_json(out / "engines.json", records)
    return records


def _built_kinds() -> list[str]:
    from toolchain.engines import engine_kinds

    return [s.name for s in engine_kinds(selectable=True) if s.needs_build]
