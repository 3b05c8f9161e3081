"""The engine-kind registry: one :class:`EngineKind` per runner kind says everything callers need.

A kind declares how its runner is made (``make_runner(kind, **kw)``) and how it is built from an
export entry (a ``graphs.json`` entry, or for a kind the build stage builds first, an
``engines.json`` entry), the file suffixes it runs, whether it needs a GPU, which clock times it,
which precisions it runs (and which kind stands in for a precision it cannot run), whether the
build stage must build it, whether it may be named in a recipe. Callers (stages, bench, CLI)
ask the registry instead of branching on kind names; adding a kind is one :func:`register_kind`
call (see :mod:`toolchain.engines.kinds`).

Backends are imported only when their kind is asked for, so ``import toolchain.engines`` works
on a CPU machine without tensorrt or onnxruntime-gpu.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from toolchain.engines.base import Runner
from toolchain.errors import EngineError, MissingDependencyError

Factory = Callable[..., Runner]
Clock = Literal["wall", "cuda-event"]
PrecisionFrom = Literal["graph", "build"]
Entry = Mapping[str, Any]


class EngineUnavailable(MissingDependencyError):
    """A kind cannot run an entry here (no built engine for the graph, no module given ...)."""


@dataclass(frozen=True)
class EntryArgs:
    """What building a runner from an export entry may use besides the entry itself.

    Attributes:
        export_dir: the export folder (``graphs.json`` paths are relative to it).
        build_dir: the build folder (``engines.json`` paths are relative to it).
        threads: intra-op threads (CPU kinds).
        name: the runner's name in messages and reports.
        module: the PyTorch module, for a kind that runs one (``suffixes`` empty).
        input_specs: ``name -> (dtype, shape)`` of the module's inputs.
    """

    export_dir: Path | None = None
    build_dir: Path | None = None
    threads: int = 0
    name: str | None = None
    module: Any = None
    input_specs: Mapping[str, tuple] | None = None


@dataclass(frozen=True)
class EngineKind:
    """Everything about one runner kind.

    Attributes:
        name: the kind (``"onnxrt-cpu"``), as in recipes, reports and parity labels.
        factory: ``factory(**kw) -> Runner`` (:func:`make_runner`).
        from_entry: ``(entry, EntryArgs) -> Runner`` from a ``graphs.json`` entry (``path``,
            ``precision``, ``kind``, ``inputs``, ``outputs``) or, when ``needs_build``, an
            ``engines.json`` entry (``engine``, ``precision``, ``onnx``).
        suffixes: file suffixes it runs, the first one the file it writes (``(".onnx",)``;
            empty: it runs a PyTorch module, not a file).
        file_label: what its file is called in messages (``"ONNX file"``, ``"engine"``).
        runtime: what runs it, in messages (``"ONNX Runtime"``, ``"TensorRT"``).
        gpu: it needs a CUDA GPU.
        clock: ``"wall"`` (``perf_counter``) or ``"cuda-event"`` (CUDA events) in the bench.
        precisions: graph precisions it runs.
        substitutes: precision -> the kind that runs such graphs in its place.
        unsupported: precision -> why it does not run such graphs (recorded as skipped).
        needs_build: the ``build`` stage must build its files from the export first.
        builder: ``(onnx_path, out_path, *, precision, profile, timing_cache) -> Path`` when
            ``needs_build``; ``build_filter(entry)`` picks the graphs it builds.
        precision_from: ``"graph"``: it runs a graph in the precision the graph was exported in
            (ONNX Runtime; TensorRT, strongly typed); ``"build"``: it compiles an FP32 graph at a
            precision it is asked for (OpenVINO's inference-precision hint), so one FP32 graph
            gives an engine per precision (:func:`build_plan`) and an ``.onnx`` file can be run at
            any precision (compiled when the runner is activated).
        available: ``precision -> reason`` why this machine cannot run the precision, None when
            it can (OpenVINO: the CPU's BF16/FP16 capabilities, read at run time).
        selectable: it may be named in a recipe's ``engines`` and by ``infer --engine`` (False
            for a kind used only as a substitute).
        default: in a recipe's default ``engines`` list.
        reference: the kind that runs the PyTorch reference in parity.
        rescuable: parity ``--rescue`` searches FP32 islands for its failing FP16/BF16 graphs.
        thread_scope: ``threads -> context manager`` around a benchmark of its runners (torch's
            global thread pool).
        inspect_file: ``path -> (input specs known before loading, value limits)`` for ``infer``.
        describe: ``path -> dict``: what a compiled file's build record (its sidecar) says, in keys
            every kind fills: ``kind``, ``precision`` (asked for), ``ran_precision`` (read back from
            the compiled model; None when the kind does not read it back), ``runtime``, ``device``,
            ``onnx_file``, ``onnx_sha256``, ``onnx_path``, ``profile``, ``layers`` (layer type ->
            precision -> count; may be empty), ``kept_fp32``, ``built_at``, ``notes``, ``source``
            (:func:`toolchain.engines.source.source_status`: is its source graph at hand, current
            or stale), ``rebuild`` (the command that rebuilds the file) and ``sidecar`` (the record
            as written). EngineError (exit 2) when the record
            is missing or malformed. Callers read a compiled file through this, never by a kind's
            field names.
    """

    name: str
    factory: Factory
    from_entry: Callable[[Entry, EntryArgs], Runner] | None = None
    suffixes: tuple[str, ...] = ()
    file_label: str = "file"
    runtime: str = ""
    gpu: bool = False
    clock: Clock = "wall"
    precisions: tuple[str, ...] = ("fp32", "fp16", "bf16")
    substitutes: Mapping[str, str] = field(default_factory=dict)
    unsupported: Mapping[str, str] = field(default_factory=dict)
    needs_build: bool = False
    builder: Callable[..., Path] | None = None
    build_filter: Callable[[Entry], bool] = lambda entry: True
    precision_from: PrecisionFrom = "graph"
    available: Callable[[str], str | None] | None = None
    selectable: bool = True
    default: bool = False
    reference: bool = False
    rescuable: bool = False
    thread_scope: Callable[[int], contextlib.AbstractContextManager[Any]] | None = None
    inspect_file: Callable[[Path], tuple[dict[str, Any], Any]] | None = None
    describe: Callable[[Path], dict[str, Any]] | None = None

    @property
    def suffix(self) -> str | None:
        """The suffix of the file it runs (``.onnx``, ``.engine``); None for a module runner."""
        return self.suffixes[0] if self.suffixes else None

    @property
    def runs_files(self) -> bool:
        """It runs exported files (not a PyTorch module)."""
        return bool(self.suffixes)

    @property
    def compiles(self) -> bool:
        """It compiles FP32 graphs at a precision (``precision_from == "build"``): ``.onnx`` files run too."""
        return self.precision_from == "build"

    def unavailable(self, precision: str) -> str | None:
        """Why this machine cannot run ``precision`` with this kind (None: it can)."""
        if precision not in self.precisions and precision not in self.substitutes:
            return self.unsupported.get(precision, f"{self.name} does not run {precision}")
        return self.available(precision) if self.available is not None else None


_REGISTRY: dict[str, EngineKind] = {}


def register_kind(spec: EngineKind) -> EngineKind:
    """Add an engine kind (registration order is the order kinds are listed and tried in)."""
    if spec.name in _REGISTRY:
        raise EngineError(f"runner kind '{spec.name}' is already registered.")
    if spec.needs_build and spec.builder is None:
        raise EngineError(f"runner kind '{spec.name}' needs a build but declares no builder.")
    _REGISTRY[spec.name] = spec
    return spec


def register_runner(kind: str, factory: Factory, **spec: Any) -> None:
    """Add a backend; ``factory(**kw)`` returns a :class:`Runner`; ``spec``: more :class:`EngineKind` fields."""
    register_kind(EngineKind(kind, factory, **spec))


def runner_kinds() -> list[str]:
    """The registered runner kinds, sorted."""
    return sorted(_REGISTRY)


def engine_kind(kind: str) -> EngineKind:
    """The :class:`EngineKind` of ``kind`` (EngineError naming the known kinds otherwise)."""
    spec = _REGISTRY.get(kind)
    if spec is None:
        raise EngineError(f"unknown runner kind '{kind}'; choose one of {runner_kinds()}.")
    return spec


def engine_kinds(*, selectable: bool | None = None) -> list[EngineKind]:
    """The registered kinds in registration order (only the selectable ones with ``selectable=True``)."""
    return [s for s in _REGISTRY.values() if selectable is None or s.selectable == selectable]


def selectable_kinds() -> list[str]:
    """Kinds a recipe's ``engines`` and ``infer --engine`` may name, sorted."""
    return sorted(s.name for s in engine_kinds(selectable=True))


def default_engines() -> list[str]:
    """A recipe's default ``engines`` list (registration order)."""
    return [s.name for s in engine_kinds(selectable=True) if s.default]


def reference_kind() -> str:
    """The kind that runs the PyTorch reference module."""
    return next(s.name for s in _REGISTRY.values() if s.reference)


def kinds_for_suffix(suffix: str) -> list[str]:
    """Selectable kinds that run files with this suffix (``.onnx``), in registration order."""
    return [s.name for s in engine_kinds(selectable=True) if suffix.lower() in s.suffixes]


def known_suffixes() -> list[str]:
    """Every file suffix some selectable kind runs."""
    return list(dict.fromkeys(x for s in engine_kinds(selectable=True) for x in s.suffixes))


def make_runner(kind: str, **kw: Any) -> Runner:
    """Create a runner (not yet active).

    Examples::

        make_runner("torch", module=m, input_specs={"x": (np.float32, ("batch", 24, "time"))})
        make_runner("onnxrt-cpu", path=Path("model.onnx"), intra_op_threads=1)
        make_runner("onnxrt-cpu-bf16emu", path=Path("model.bf16.onnx"))  # BF16 graph, exact BF16 rounding
        make_runner("tensorrt", engine_path=Path("model.engine"))
    """
    return engine_kind(kind).factory(**kw)


def resolve_kind(kind: str, precision: str) -> str | None:
    """The kind that runs ``kind``'s graphs of ``precision``: itself, its substitute, or None."""
    spec = engine_kind(kind)
    if precision in spec.precisions:
        return kind
    return spec.substitutes.get(precision)


def runner_for(
    kind: str,
    entry: Entry,
    *,
    export_dir: Path | None = None,
    build_dir: Path | None = None,
    threads: int = 0,
    name: str | None = None,
    module: Any = None,
    input_specs: Mapping[str, tuple] | None = None,
) -> Runner:
    """A runner of ``kind`` (inactive) for one export entry; :class:`EngineUnavailable` when it cannot.

    Example::

        graphs = json.loads((export_dir / "graphs.json").read_text())
        runner_for("onnxrt-cpu", graphs["hydra-conv"], export_dir=export_dir, threads=2, name="hydra-conv")
    """
    spec = engine_kind(kind)
    if spec.from_entry is None:
        raise EngineError(f"runner kind '{kind}' cannot be built from an export entry.")
    return spec.from_entry(entry, EntryArgs(export_dir=export_dir, build_dir=build_dir, threads=threads, name=name,
                                            module=module, input_specs=input_specs))


def build_plan(kind: str, graphs: Mapping[str, Entry], precisions: Sequence[str]) -> list[tuple[str, str, str]]:
    """``(engine name, graph name, precision)`` of every engine the build stage makes for ``kind``.

    A kind that runs a graph's own precision builds each graph its ``build_filter`` picks, at that
    precision (TensorRT: ``hydra-conv.fp16`` from ``hydra-conv.fp16.onnx``). A kind that compiles
    FP32 graphs at a precision builds each FP32 graph once per precision, named as the export names
    its variants (``single.bf16`` from ``single.onnx``; FP32 keeps the graph's name).
    """
    spec = engine_kind(kind)
    picked = [(name, g) for name, g in graphs.items() if spec.build_filter(g)]
    if not spec.compiles:
        return [(name, name, str(g.get("precision", "fp32"))) for name, g in picked]
    plan = [(name if p == "fp32" else f"{name}.{p}", name, p)
            for name, g in picked if g.get("precision", "fp32") == "fp32" for p in precisions if p != "int8"]
    # an INT8 graph is its own precision (its Q/DQ pairs): compiled as it is, never from an FP32 graph
    return plan + [(name, name, "int8") for name, g in picked if g.get("precision") == "int8" and "int8" in precisions]


def read_built(build_dir: Path, kind: str) -> dict[str, dict[str, Any]]:
    """Engine name -> ``engines.json`` entry the build stage wrote for ``kind`` (MissingDependencyError: none).

    ``engines.json`` holds one record per kind the recipe asked to build: ``{"engines": {...},
    "unavailable": {name: reason}}``, or ``{"skipped": reason}`` when the kind could not build at all.
    """
    path = Path(build_dir) / "engines.json"
    if not path.is_file():
        raise MissingDependencyError(f"{kind}: no engines.json in {build_dir}; build the engines first "
                                     "(hydra-toolchain build).")
    data = json.loads(path.read_text()).get(kind)
    if data is None:
        raise MissingDependencyError(f"{kind}: the build stage built nothing for it (engines.json in {build_dir} has "
                                     "no record of it); add it to the recipe's engines.")
    if "skipped" in data:
        raise MissingDependencyError(f"{kind}: the build stage skipped the engines: {data['skipped']}")
    return dict(data.get("engines", {}))


def read_unavailable(build_dir: Path, kind: str) -> dict[str, str]:
    """Engine name -> why the build stage could not build it here (a precision this machine lacks)."""
    path = Path(build_dir) / "engines.json"
    if not path.is_file():
        return {}
    return dict((json.loads(path.read_text()).get(kind) or {}).get("unavailable", {}))


def entries_for(kind: str, graphs: Mapping[str, Entry], *, build_dir: Path) -> dict[str, Entry]:
    """The entries ``kind`` runs: ``graphs`` itself, or for a kind built first, ``engines.json``."""
    return read_built(build_dir, kind) if engine_kind(kind).needs_build else dict(graphs)


@contextlib.contextmanager
def thread_scope(kind: str, threads: int) -> Iterator[None]:
    """Whatever ``kind`` needs set around a benchmark with ``threads`` threads (torch's pool)."""
    scope = engine_kind(kind).thread_scope
    with scope(threads) if scope is not None else contextlib.nullcontext():
        yield


def clock_of(kind: str) -> Clock | None:
    """``"wall"`` or ``"cuda-event"`` for a registered kind; None for an unregistered one."""
    spec = _REGISTRY.get(kind)
    return spec.clock if spec is not None else None


#: mantissa bits per precision: fewer bits is a lower precision (BF16 7 < FP16 10 < FP32 23)
MANTISSA_BITS = {"fp32": 23, "fp16": 10, "bf16": 7, "int8": 0}  # INT8: fixed point, lowest of all


def ran_lower(asked: str, ran: str) -> bool:
    """Whether an engine ran in a lower precision (fewer mantissa bits) than it was asked for.

    ``ran_lower("fp32", "bf16")`` and ``ran_lower("fp16", "bf16")`` are True (BF16 has 7 mantissa
    bits, FP16 10); ``ran_lower("bf16", "fp32")`` is False (a layer kept in a higher precision).
    An unknown name is never lower.
    """
    return MANTISSA_BITS.get(ran, 99) < MANTISSA_BITS.get(asked, 0)


def candidate_label(kind: str, graph: str) -> str:
    """``"<kind>:<graph>"``: an engine's label in parity reports."""
    return f"{kind}:{graph}"


def split_label(label: str) -> tuple[str, str]:
    """``(kind, graph)`` of a :func:`candidate_label`."""
    kind, _, graph = label.partition(":")
    return kind, graph
