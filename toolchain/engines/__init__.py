"""Inference backends behind one runner contract (torch, ONNX Runtime, TensorRT, OpenVINO), and their registry.

Importing this package never imports tensorrt, onnxruntime-gpu, openvino or CUDA: each backend lives in
its own sub-package and is loaded by :func:`make_runner` when its kind is asked for. Every
engine kind is declared once in :mod:`toolchain.engines.kinds` (an :class:`EngineKind`).
"""

from toolchain.engines import kinds as _kinds  # noqa: F401  (registers the built-in kinds)
from toolchain.engines.base import Runner, ShapeLimits, TensorSpec, check_feed
from toolchain.engines.registry import (
    EngineKind,
    EngineUnavailable,
    build_plan,
    candidate_label,
    clock_of,
    default_engines,
    engine_kind,
    engine_kinds,
    entries_for,
    kinds_for_suffix,
    known_suffixes,
    make_runner,
    ran_lower,
    read_built,
    read_unavailable,
    reference_kind,
    register_kind,
    register_runner,
    resolve_kind,
    runner_for,
    runner_kinds,
    selectable_kinds,
    split_label,
    thread_scope,
)

__all__ = [
    "EngineKind", "EngineUnavailable", "Runner", "ShapeLimits", "TensorSpec", "build_plan", "candidate_label",
    "check_feed", "clock_of", "default_engines", "engine_kind", "engine_kinds", "entries_for", "kinds_for_suffix",
    "known_suffixes", "make_runner", "ran_lower", "read_built", "read_unavailable", "reference_kind", "register_kind",
    "register_runner", "resolve_kind", "runner_for", "runner_kinds", "selectable_kinds", "split_label",
    "thread_scope",
]
