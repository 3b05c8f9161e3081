"""The source graph of a compiled engine file, where it is at hand, and the check that the file is not stale.

A compiled file (an OpenVINO ``.blob``, a TensorRT plan) records in its sidecar the name and the
sha256 of the ONNX graph it was built from (and, in sidecars written since, the graph's path at
build time). A file left over from an earlier graph would run and be judged as if it were
current, so every load compares the digest with the graph wherever that graph is at hand
(:func:`source_candidates`):

1. the graph named by the caller (a graph given on the same command line, the recipe's export
   entry), when that file exists;
2. the path the graph had when the file was built, when it still exists (the graph it was built
   from, whatever other files of the same name lie around: ONNX files are often all
   ``model.onnx``);
3. the file of the recorded name beside the compiled file;
4. the file of the recorded name in the artifacts' ``export`` folder (``<root>/build/x.blob`` ->
   ``<root>/export/x.onnx``): a copied or moved artifacts folder.

The first that exists is the source graph. A digest that differs raises :class:`StaleEngine`
(exit 2) naming both digests and the command that rebuilds the file; no graph at hand: the file
loads as before (a debug log line says so). Pure file checks: no runtime needed.
"""

from __future__ import annotations

import logging
import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from toolchain.errors import EngineError

log = logging.getLogger(__name__)

__all__ = ["StaleEngine", "check_source", "file_digest", "find_source", "rebuild_command", "source_candidates",
           "source_status"]

_DIGESTS: dict[tuple[str, int, int], str] = {}


class StaleEngine(EngineError):
    """A compiled file was built from another version of its source graph (exit 2: rebuild it)."""


def pads_neutral(graph: Path) -> bool:
    """The graph was exported by hydra-toolchain (its export stamp), so padding short rows keeps its result.

    Every family it exports pools where end padding cannot reach (the first token, the mask's last
    real token, the EOT token's argmax); a graph from elsewhere may pool at the last non-pad id.
    """
    import onnx

    from toolchain.export.graph import EXPORT_SHAPES_KEY

    try:
        model = onnx.load(str(graph), load_external_data=False)
    except Exception:
        return False
    return any(p.key == EXPORT_SHAPES_KEY for p in model.metadata_props)


def file_digest(path: Path) -> str:
    """sha256 of ``path``, remembered per (path, size, mtime) so that a graph is hashed once per process."""
    from toolchain.artifacts import sha256_file

    path = Path(path)
    stat = path.stat()
    key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns)
    if key not in _DIGESTS:
        _DIGESTS[key] = sha256_file(path)
    return _DIGESTS[key]


def source_candidates(engine_path: Path, onnx_file: str, recorded_path: str = "",
                      given: Path | None = None) -> list[Path]:
    """Where the source graph of ``engine_path`` may be, nearest first (the module docstring's order)."""
    engine_path = Path(engine_path)
    name = Path(onnx_file).name
    places = [Path(given)] if given is not None else []
    if recorded_path:
        places.append(Path(recorded_path))
    if name:
        places += [engine_path.parent / name, engine_path.parent.parent / "export" / name]
    return list(dict.fromkeys(places))


def find_source(engine_path: Path, onnx_file: str, recorded_path: str = "", given: Path | None = None) -> Path | None:
    """The source graph at hand (the first candidate that is a file), None when none is."""
    return next((p for p in source_candidates(engine_path, onnx_file, recorded_path, given) if p.is_file()), None)


def source_status(engine_path: Path, onnx_file: str, onnx_sha256: str, recorded_path: str = "",
                  given: Path | None = None) -> dict[str, Any]:
    """``{"graph": path or None, "status": "current" | "stale" | "not at hand", "sha256": the graph's}`` (no raise)."""
    graph = find_source(Path(engine_path), onnx_file, recorded_path, given)
    if graph is None:
        return {"graph": None, "status": "not at hand", "sha256": None}
    digest = file_digest(graph)
    return {"graph": str(graph), "status": "current" if digest == onnx_sha256 else "stale", "sha256": digest}


def _range(triples: Sequence[Sequence[Sequence[int]]], axis: int) -> str | None:
    """``MIN:OPT:MAX`` of one axis, when every input's profile gives it the same range."""
    ranges = {tuple(int(s[axis]) for s in t) for t in triples if len(t) == 3 and all(len(s) > axis for s in t)}
    return ":".join(map(str, ranges.pop())) if len(ranges) == 1 else None


def rebuild_command(graph: Path | str, engine_path: Path, kind: str, precision: str,
                    profile: Mapping[str, Sequence[Sequence[int]]] | None = None) -> str:
    """``hydra-toolchain build GRAPH -o DIR --engine KIND --precision P [--batch B --seq S]``: rebuilds the file.

    ``--batch`` and ``--seq`` are the recorded profile's (axis 0 and axis 1 of every input) when the
    inputs agree on them.
    """
    parts = ["hydra-toolchain", "build", str(graph), "-o", str(Path(engine_path).parent), "--engine", kind,
             "--precision", precision]
    triples = list((profile or {}).values())
    for flag, axis in (("--batch", 0), ("--seq", 1)):
        value = _range(triples, axis)
        if value is not None:
            parts += [flag, value]
    return shlex.join(parts)


def check_source(engine_path: Path, *, kind: str, onnx_file: str, onnx_sha256: str, precision: str,
                 profile: Mapping[str, Sequence[Sequence[int]]] | None = None, recorded_path: str = "",
                 given: Path | None = None) -> Path | None:
    """The source graph at hand when its sha256 is the recorded one; None when none is at hand.

    Raises:
        StaleEngine: the graph at hand is not the one the file was built from (both digests and the
            rebuild command in the message).
    """
    engine_path = Path(engine_path)
    status = source_status(engine_path, onnx_file, onnx_sha256, recorded_path, given)
    if status["graph"] is None:
        log.debug("%s: its source graph %s is not at hand; not checked for staleness", engine_path.name, onnx_file)
        return None
    source = Path(status["graph"])
    if status["status"] == "current":
        return source
    raise StaleEngine(
        f"{engine_path.name} is stale: it was built from a graph with sha256 {onnx_sha256} (its sidecar), and its "
        f"source graph {source} now has sha256 {status['sha256']}. Rebuild it: "
        f"{rebuild_command(source, engine_path, kind, precision, profile)}")
