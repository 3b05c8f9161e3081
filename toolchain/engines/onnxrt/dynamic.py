"""Prove an exported graph's dynamic axes: ONNX Runtime (CPU) against the torch module at other shapes.

Moved here from :mod:`toolchain.export.onnx_export` so that every ONNX Runtime session is made in
:mod:`toolchain.engines` (the export layer sits below the engines).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from toolchain.engines.onnxrt.loader import open_session
from toolchain.errors import CheckFailed
from toolchain.export.graph import graph_summary, load_checked
from toolchain.export.onnx_export import _restore_modes, _training_modes

__all__ = ["DynamicCheckReport", "OutputComparison", "check_dynamic"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class OutputComparison:
    """One output at one test shape: the max abs difference and whether it passed."""

    case: str
    output: str
    max_abs_diff: float
    passed: bool
    detail: str = ""


@dataclass(frozen=True)
class DynamicCheckReport:
    """Result of :func:`check_dynamic`: every comparison and every failure message."""

    path: Path
    comparisons: tuple[OutputComparison, ...]
    failures: tuple[str, ...]

    @property
    def ok(self) -> bool:
        """True when every output matched at every shape."""
        return not self.failures


def _tolerance(value: float | Mapping[str, float], output: str) -> float:
    """Per-output tolerance: a float, or a mapping whose ``""`` key is the default (Polygraphy style)."""
    if isinstance(value, Mapping):
        return float(value.get(output, value.get("", 0.0)))
    return float(value)


def _to_numpy(value: Any) -> np.ndarray:
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().float().numpy() if value.is_floating_point() else value.detach().cpu().numpy()
    return np.asarray(value)


def _compare(case: str, name: str, got: np.ndarray, ref: np.ndarray, atol: float, rtol: float) -> OutputComparison:
    if got.shape != ref.shape:
        return OutputComparison(case, name, float("inf"), False, f"shape {got.shape} != torch {ref.shape}")
    got64, ref64 = got.astype(np.float64), ref.astype(np.float64)
    diff = np.abs(got64 - ref64)
    nan = np.isnan(got64) | np.isnan(ref64)
    worst = float(np.max(np.where(nan, np.inf, diff))) if diff.size else 0.0
    over = (diff > atol + rtol * np.abs(ref64)) | nan
    if over.any():
        detail = f"{int(over.sum())}/{over.size} elements over atol={atol:g} rtol={rtol:g}"
        return OutputComparison(case, name, worst, False, detail + (" (NaN)" if nan.any() else ""))
    return OutputComparison(case, name, worst, True)


def check_dynamic(
    path: Path,
    module: nn.Module,
    make_inputs: Callable[[Any], Mapping[str, Any]],
    shapes: Sequence[Any],
    *,
    atol: float | Mapping[str, float] = 1e-4,
    rtol: float | Mapping[str, float] = 0.0,
    raise_on_failure: bool = True,
) -> DynamicCheckReport:
    """Compare ONNX Runtime (CPU) with torch at shapes other than the export shapes.

    A silently specialised dim shows up here as a runtime error, a wrong output shape or wrong
    values. Names are checked first, then shapes, then values (``|ort - torch| <= atol + rtol *
    |torch|`` elementwise; NaN always fails); every failure is collected and reported together.

    Args:
        path: the exported ``.onnx`` file.
        module: the torch module that was exported (run in eval mode for the check).
        make_inputs: ``shape -> {input name: tensor or array}``, e.g. ``(B, S) -> {"input_ids": [B, S]}``.
        shapes: the cases passed to ``make_inputs``; use shapes different from the export shapes.
        atol: absolute tolerance, a float or a per-output mapping (``""`` key = default).
        rtol: relative tolerance (times ``|torch|``), same forms as ``atol``.
        raise_on_failure: raise :class:`CheckFailed` listing every failure (else only report).
    """
    path = Path(path)
    load_checked(path, load_weights=False)
    session = open_session(path)  # GraphError naming the file when ONNX Runtime cannot load it
    names = [o.name for o in session.get_outputs()]
    export_shapes = graph_summary(path).get("export_input_shapes") or {}
    comparisons: list[OutputComparison] = []
    failures: list[str] = []
    modes = _training_modes(module)
    module.eval()
    try:
        for shape in shapes:
            case = str(tuple(shape) if isinstance(shape, Sequence) else shape)
            feed = {k: _to_numpy(v) for k, v in make_inputs(shape).items()}
            if export_shapes and all(list(v.shape) == export_shapes.get(k) for k, v in feed.items()):
                log.warning("check_dynamic %s: case %s equals the export shapes and proves nothing", path.name, case)
            with torch.inference_mode():
                ref = module(**{k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in feed.items()})
            if isinstance(ref, Mapping):
                ref_map = dict(ref)
            else:
                ref_map = dict(zip(names, ref if isinstance(ref, Sequence) else [ref]))
            missing = [n for n in names if n not in ref_map]
            if missing:
                failures.append(f"{case}: torch returned no {missing}")
                continue
            try:
                got = dict(zip(names, session.run(None, feed)))
            except Exception as exc:  # a specialised shape typically fails inside ORT
                failures.append(f"{case}: ONNX Runtime failed ({str(exc).splitlines()[0]})")
                continue
            for name in names:
                result = _compare(case, name, got[name], _to_numpy(ref_map[name]), _tolerance(atol, name),
                                  _tolerance(rtol, name))
                comparisons.append(result)
                if not result.passed:
                    failures.append(f"{case} '{name}': max abs diff {result.max_abs_diff:.3g}, {result.detail}")
    finally:
        _restore_modes(modes)
    report = DynamicCheckReport(path, tuple(comparisons), tuple(failures))
    if failures and raise_on_failure:
        raise CheckFailed(
            f"{path.name}: ONNX Runtime and torch disagree in {len(failures)} check(s): " + "; ".join(failures)
            + ". A dynamic dim was probably specialised at export; re-export with the TorchScript exporter "
            "and check dynamic_axes."
        )
    return report
