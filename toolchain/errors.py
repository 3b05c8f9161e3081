"""Typed errors with actionable one-paragraph messages and documented exit codes.

Every error the toolchain raises on bad input derives from :class:`ToolchainError`. The CLI
prints ``error: <message>`` (no traceback unless ``--debug``) and exits with ``exit_code``.

Exit codes (documented in the README):

* 0 - success, every check passed
* 1 - a check failed (parity, lint, verify)
* 2 - the run could not happen: bad recipe, missing or broken file, bad data, bad inference
  inputs, an engine from another TensorRT version or GPU (``ToolchainError``)
* 3 - a required optional component is unavailable (TensorRT, CUDA, a data package)
* 4 - an internal error (a bug): the CLI says so and to rerun with ``--debug`` for the traceback
* 130 - interrupted (SIGINT / SIGTERM); completed artifacts are kept, the stage resumes next run
"""

from __future__ import annotations

import errno
import re


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
#: how libraries that do not raise OSError (safetensors, torch's zip writer) spell those errors
_ENV_TEXT = {"no space left on device": errno.ENOSPC, "os error 28": errno.ENOSPC, "code: 28": errno.ENOSPC,
             "read-only file system": errno.EROFS, "os error 30": errno.EROFS, "disk quota exceeded": errno.EDQUOT,
             "permission denied": errno.EACCES}


def environment_error(exc: BaseException, where: str | None = None) -> str | None:
    """``'PATH': what is wrong and what to do (ERRNO)`` when ``exc`` (or its cause) is the machine's fault, else None.

    ``where`` names the folder being written when the exception does not name a file (safetensors
    and torch's zip writer report the errno in their text only).
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
        cur = cur.__cause__ or cur.__context__
    return None


def _path_in(text: str) -> str | None:
    """A quoted absolute path in an exception's text (how safetensors and torch name the file)."""
    m = re.search(r"['\"](/[^'\"]+)['\"]", text)
    return m.group(1) if m else None
