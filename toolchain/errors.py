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
