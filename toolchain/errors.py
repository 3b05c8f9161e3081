"""Typed errors with actionable one-paragraph messages and documented exit codes.

Every error the toolchain raises on bad input derives from :class:`ToolchainError`. The CLI
prints ``error: <message>`` (no traceback unless ``--debug``) and exits with ``exit_code``.

Exit codes (documented in docs/commands.md):

* 0 - success, every check passed
* 1 - a check failed (parity, lint, verify)
* 2 - the run could not happen: a usage mistake (missing argument, unknown command or option,
  bad value), bad recipe, missing or broken file, a path the user gave that does not exist or is
  a file where a folder is needed (or the reverse), bad data, bad inference inputs, an engine from
  another TensorRT version or GPU (``ToolchainError``), the machine (disk full, read-only, permissions)
* 3 - a required optional component is unavailable (TensorRT, CUDA, a data package)
* 4 - an internal error (a bug): the CLI says so and to rerun with ``--debug`` for the traceback
* 130 - interrupted (SIGINT / SIGTERM); completed artifacts are kept, the stage resumes next run
"""

from __future__ import annotations

import errno
import re
from collections.abc import Iterable
from pathlib import Path


class ToolchainError(Exception):
    """Base class: a clear message for a person; ``exit_code`` for CI."""

    exit_code: int = 2

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        self.message = message
        self.hint = hint
        super().__init__(message if hint is None else f"{message} {hint}")


class RecipeError(ToolchainError):
    """The recipe file is missing, not YAML, or does not match the schema."""


class ModelError(ToolchainError):
    """A model folder is missing, incomplete, or not of a supported family."""


class DataError(ToolchainError):
    """A data set is missing, empty, or unusable (one class, empty split...)."""


class MissingDependencyError(ToolchainError):
    """An optional package (data package, TensorRT, onnxruntime-gpu) is not installed."""

    exit_code = 3


class GraphError(ToolchainError):
    """An ONNX file is missing, truncated, corrupted, or fails a check."""


class EngineError(ToolchainError):
    """An engine cannot be built, loaded or run (wrong version, GPU, inputs, shapes)."""


class FeedError(EngineError):
    """The arrays given to a graph or engine do not match its inputs (names, dtypes, shapes, profile)."""


class ArtifactError(ToolchainError):
    """The artifacts folder is locked, corrupted, or does not match its manifests."""


class CheckFailed(ToolchainError):
    """A gate (parity, lint, verify) ran and failed: exit code 1."""

    exit_code = 1


#: errno values that describe the machine, not the program: exit 2 with the path and what to do
_ENV_ERRNOS = {
    errno.ENOSPC: "no space left on the device: free space or point artifacts_dir / --out elsewhere",
    errno.EDQUOT: "disk quota exceeded: free space or point artifacts_dir / --out elsewhere",
    errno.EROFS: "the file system is read-only: point artifacts_dir / --out at a writable folder",
    errno.EACCES: "permission denied: make it writable for this user or choose another folder",
    errno.EPERM: "operation not permitted: make it writable for this user or choose another folder",
    errno.EFBIG: "file too large for this file system: use another folder",
    errno.EMFILE: "too many open files: raise the limit (ulimit -n)",
    errno.ENFILE: "too many open files on this machine: raise the system limit",
    errno.EIO: "an input/output error from the storage: check the disk",
}
#: errno values that describe a path the user gave (a file where a folder is needed, a folder where a file is, a
#: missing file or folder): exit 2 naming the path, but only when the culprit is in a path the user gave (an argument,
#: the recipe's artifacts_dir or model folder); the same errno on a file the toolchain itself manages is a bug
_PATH_ERRNOS = {
    errno.ENOTDIR: "is a file, not a folder, and the path needs a folder there: choose another path or move the file",
    errno.EISDIR: "is a folder where a file is needed: give a file's path",
    errno.ENOENT: "does not exist: check the path (a missing folder is not created for a file argument)",
}
#: how libraries that do not raise OSError (safetensors, torch's zip writer) spell those errors
_ENV_TEXT = {"no space left on device": errno.ENOSPC, "os error 28": errno.ENOSPC, "code: 28": errno.ENOSPC,
             "read-only file system": errno.EROFS, "os error 30": errno.EROFS, "disk quota exceeded": errno.EDQUOT,
             "permission denied": errno.EACCES}


def environment_error(exc: BaseException, where: str | None = None,
                      user_paths: Iterable[str | Path] = ()) -> str | None:
    """``'PATH': what is wrong and what to do (ERRNO)`` when ``exc`` (or its cause) is the machine's fault, else None.

    ``where`` names the folder being written when the exception does not name a file (safetensors
    and torch's zip writer report the errno in their text only). ``user_paths`` are the paths the
    user gave: ENOTDIR, EISDIR and ENOENT count only when the part of the path at fault (the
    regular file in the way, the folder, the first missing folder) is one of them or above one.
    """
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        code = cur.errno if isinstance(cur, OSError) else None
        if code is None:
            text = str(cur).lower()
            code = next((c for needle, c in _ENV_TEXT.items() if needle in text), None)
        if code in _ENV_ERRNOS:
            where = getattr(cur, "filename", None) or _path_in(str(cur)) or where or "(path not reported)"
            return f"'{where}': {_ENV_ERRNOS[code]} ({errno.errorcode[code]})"
        if code in _PATH_ERRNOS and isinstance(cur, OSError):
            found = _culprit(code, cur.filename, cur.filename2)
            if found is not None and _given(found[0], user_paths):
                culprit, path = found
                inside = f" (on the way to '{path}')" if path != culprit else ""
                return f"'{culprit}'{inside}: {_PATH_ERRNOS[code]} ({errno.errorcode[code]})"
        cur = cur.__cause__ or cur.__context__
    return None


def _culprit(code: int, *names: object) -> tuple[Path, Path] | None:
    """``(part at fault, failed path)`` of a failed path; None when the exception names no path.

    The part at fault is the regular file in the way (ENOTDIR), the folder (EISDIR), or the first
    missing folder or file (ENOENT).
    """
    for name in names:
        if not isinstance(name, str | bytes) or not name:
            continue
        path = Path(name.decode() if isinstance(name, bytes) else name).absolute()
        if code == errno.EISDIR:
            return path, path
        for part in (*reversed(path.parents), path):  # from the root down
            if code == errno.ENOTDIR and part.exists() and not part.is_dir():
                return part, path
            if code == errno.ENOENT and not part.exists():
                return part, path
    return None


def _given(culprit: Path, user_paths: Iterable[str | Path]) -> bool:
    """Whether ``culprit`` is a path the user gave or a folder above one (not something below it)."""
    for given in user_paths:
        path = Path(given).expanduser().absolute()
        if culprit == path or culprit in path.parents:
            return True
    return False


def _path_in(text: str) -> str | None:
    """A quoted absolute path in an exception's text (how safetensors and torch name the file)."""
    m = re.search(r"['\"](/[^'\"]+)['\"]", text)
    return m.group(1) if m else None
