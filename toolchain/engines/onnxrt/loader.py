"""Lazy ONNX Runtime loaders: ``SessionFromOnnx(path, ...)()`` builds the session when called.

Session options come from explicit arguments (threads, optimisation level, spinning, where to
save the optimised graph). Spinning is off by default (``session.intra_op.allow_spinning = "0"``
and the inter-op twin): spinning worker threads keep cores busy after each run and distort
interleaved benchmarks of several runners on one machine.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from toolchain.errors import EngineError, GraphError, MissingDependencyError, ToolchainError

OptLevel = Literal["disable", "basic", "extended", "layout", "all"]
Provider = Literal["cpu", "cuda"]
_LEVELS = {
    "disable": "ORT_DISABLE_ALL",
    "basic": "ORT_ENABLE_BASIC",
    "extended": "ORT_ENABLE_EXTENDED",
    "layout": "ORT_ENABLE_LAYOUT",
    "all": "ORT_ENABLE_ALL",
}
_PROVIDERS = {"cpu": "CPUExecutionProvider", "cuda": "CUDAExecutionProvider"}
_PROTO_LIMIT = 2**31 - 1 - (16 << 20)  # protobuf's 2 GiB limit, less headroom for the serialised envelope


def build_session_options(
    *,
    intra_op_threads: int = 0,
    inter_op_threads: int = 0,
    optimization_level: OptLevel = "all",
    allow_spinning: bool = False,
    optimized_model_path: Path | None = None,
    log_severity: int = 3,
) -> Any:
    """An ``onnxruntime.SessionOptions`` from explicit arguments (0 threads = ORT's default)."""
    import onnxruntime as ort

    if intra_op_threads < 0 or inter_op_threads < 0:
        raise EngineError(
            f"onnxrt: thread counts must be >= 0, got intra={intra_op_threads}, inter={inter_op_threads}."
        )
    if optimization_level not in _LEVELS:
        raise EngineError(f"onnxrt: optimization_level must be one of {sorted(_LEVELS)}, got '{optimization_level}'.")
    options = ort.SessionOptions()
    options.intra_op_num_threads = intra_op_threads
    options.inter_op_num_threads = inter_op_threads
    level = getattr(ort.GraphOptimizationLevel, _LEVELS[optimization_level], None)
    if level is None:
        raise EngineError(f"onnxrt: this onnxruntime has no optimisation level '{optimization_level}'.")
    options.graph_optimization_level = level
    spin = "1" if allow_spinning else "0"
    options.add_session_config_entry("session.intra_op.allow_spinning", spin)
    options.add_session_config_entry("session.inter_op.allow_spinning", spin)
    options.log_severity_level = log_severity
    if optimized_model_path is not None:
        Path(optimized_model_path).parent.mkdir(parents=True, exist_ok=True)
        options.optimized_model_filepath = str(optimized_model_path)
    return options


def providers_for(provider: Provider) -> list[str]:
    """ORT provider list for ``"cpu"`` or ``"cuda"``; MissingDependencyError if CUDA is absent."""
    import onnxruntime as ort

    if provider not in _PROVIDERS:
        raise EngineError(f"onnxrt: provider must be 'cpu' or 'cuda', got '{provider}'.")
    if provider == "cuda":
        if _PROVIDERS["cuda"] not in ort.get_available_providers():
            raise MissingDependencyError(
                "onnxrt-cuda: CUDAExecutionProvider is not available in this onnxruntime "
                f"({ort.__version__}, providers {ort.get_available_providers()}); install onnxruntime-gpu "
                "(pip install 'hydra-toolchain[gpu]') on a machine with CUDA."
            )
        return [_PROVIDERS["cuda"], _PROVIDERS["cpu"]]
    return [_PROVIDERS["cpu"]]


class SessionFromOnnx:
    """Lazy loader: stores the arguments; calling it builds an ``InferenceSession``.

    Args:
        path: the ``.onnx`` file (external weights are found next to it).
        provider: ``"cpu"`` or ``"cuda"``.
        **options: keyword arguments of :func:`build_session_options`.
    """

    def __init__(self, path: Path, provider: Provider = "cpu", **options: Any) -> None:
        self.path = Path(path)
        self.provider = provider
        self.options = options

    def __call__(self, transform: Callable[[Any], Any] | None = None) -> Any:
        """Build the session; a bad file raises GraphError naming it.

        Args:
            transform: ``ModelProto -> ModelProto`` applied to the loaded graph (weights included)
                before the session is built from it, e.g. :func:`~toolchain.engines.onnxrt.bf16emu.emulate_bf16`.
        """
        import onnxruntime as ort

        providers = providers_for(self.provider)
        options = build_session_options(**self.options)
        try:
            if transform is None:
                session = ort.InferenceSession(str(self.path), options, providers=providers)
            else:
                session = self._transformed_session(transform, options, providers)
        except ToolchainError:  # the transform's own clear message (GraphError from load_checked, the rewrite)
            raise
        except Exception as exc:  # ORT raises pybind11 types; diagnose the file for a clear message
            from toolchain.export.graph import load_checked

            load_checked(self.path, load_weights=False)  # raises the precise GraphError when the file is bad
            raise GraphError(f"ONNX Runtime cannot load {self.path}: {str(exc).splitlines()[0]}") from exc
        if self.provider == "cuda" and _PROVIDERS["cuda"] not in session.get_providers():
            raise MissingDependencyError(
                f"onnxrt-cuda: the CUDA provider did not initialise for {self.path.name} (no CUDA device or "
                "driver?); check nvidia-smi and the onnxruntime-gpu CUDA version."
            )
        return session

    def _transformed_session(self, transform: Callable[[Any], Any], options: Any, providers: list[str]) -> Any:
        import onnxruntime as ort

        from toolchain.export.graph import load_checked

        model = transform(load_checked(self.path))
        if model.ByteSize() < _PROTO_LIMIT:
            return ort.InferenceSession(model.SerializeToString(), options, providers=providers)
        import onnx

        with tempfile.TemporaryDirectory(prefix="hydra-ort-") as tmp:  # > 2 GB: weights in an external file
            path = Path(tmp) / self.path.name
            onnx.save_model(model, str(path), save_as_external_data=True, location=path.name + ".data")
            return ort.InferenceSession(str(path), options, providers=providers)


def open_session(
    model: Path | bytes,
    *,
    provider: Provider = "cpu",
    profile_prefix: str | None = None,
    **options: Any,
) -> Any:
    """A plain ``onnxruntime.InferenceSession`` (for code that needs ORT itself, not a :class:`Runner`).

    Args:
        model: an ``.onnx`` file or a serialised ``ModelProto``.
        provider: ``"cpu"`` or ``"cuda"``.
        profile_prefix: turn ORT's profiler on, trace files named ``<prefix>_<date>.json``.
        **options: keyword arguments of :func:`build_session_options` (threads, optimisation
            level, spinning, ``optimized_model_path``, ``log_severity``).

    Example: ``open_session(path, intra_op_threads=2, inter_op_threads=1).run(None, feed)``.
    """
    import onnxruntime as ort

    providers = providers_for(provider)
    session_options = build_session_options(**options)
    if profile_prefix is not None:
        session_options.enable_profiling = True
        session_options.profile_file_prefix = profile_prefix
    source = model if isinstance(model, bytes) else str(model)
    try:
        return ort.InferenceSession(source, session_options, providers=providers)
    except Exception as exc:  # ORT raises pybind11 types
        what = "the serialised model" if isinstance(model, bytes) else str(model)
        raise GraphError(f"ONNX Runtime cannot load {what}: {str(exc).splitlines()[0]}") from exc


def available_providers() -> list[str] | None:
    """ONNX Runtime's execution providers, or None when onnxruntime is not installed."""
    try:
        import onnxruntime as ort
    except ImportError:
        return None
    return list(ort.get_available_providers())
