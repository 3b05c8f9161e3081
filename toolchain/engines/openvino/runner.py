"""``OvRunner``: an OpenVINO CPU compiled model behind the runner contract.

Two sources:

* a compiled file (``.blob``) written by :func:`~toolchain.engines.openvino.compile.build_ov_engine`:
  activation reads its sidecar first (without OpenVINO, so a machine without it is told what the
  file needs), refuses a file from another OpenVINO version or for a precision this CPU lacks
  (:func:`~toolchain.engines.openvino.sidecar.ensure_compatible`, exit 2) and a file built from
  another version of its source graph, where that graph is at hand (:mod:`toolchain.engines.source`,
  exit 2), then imports it with the properties it was built with (an import without them falls back
  to the plugin's default precision: seen here, an FP32 file imported as BF16) and this runner's
  thread count, and refuses it (exit 2) when the precision read back is not the one its sidecar
  recorded;
* an ONNX graph and a precision: compiled when activated (``parity GRAPH --engine openvino-cpu
  --precision bf16``, ``bench``).

Either way the precision every layer ran in is read back from the compiled model after loading
(:meth:`OvRunner.engine_info`), never assumed from what was asked.
"""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from toolchain.engines.base import Runner, ShapeLimits, TensorSpec, check_feed_why, pad_to_profile, recorded_specs
from toolchain.engines.openvino import _deps
from toolchain.engines.openvino.compile import (
    ProfileShapes,
    compile_model,
    precision_config,
    ran_precision,
    read_back,
    read_model,
    run_config,
)
from toolchain.engines.openvino.sidecar import KIND, OvSidecar, ensure_compatible, read_sidecar
from toolchain.engines.source import check_source, rebuild_command
from toolchain.errors import EngineError


class OvRunner(Runner):
    """Run a compiled OpenVINO model file, or an ONNX graph compiled at ``precision``, on the CPU.

    Args:
        engine_path: a ``.blob`` written by ``build_ov_engine`` (``<blob>.json`` next to it).
        onnx_path: an ONNX graph to compile instead (exactly one of the two).
        precision: ``fp32`` | ``fp16`` | ``bf16`` for ``onnx_path`` (a file keeps the one it was built with).
        threads: inference threads (0: OpenVINO's choice); the latency hint and one stream always.
        profile: input name -> ``(min, opt, max)`` bounds for ``onnx_path`` (None: dims stay dynamic).
        name: runner name in messages.
        max_batch: reject feeds whose axis 0 is larger.
        source: the ONNX graph a compiled file must have been built from (a graph given beside it
            on the command line, the recipe's export entry); besides it, the graph is looked for
            where :func:`toolchain.engines.source.source_candidates` says.
    """

    kind = "openvino-cpu"

    def __init__(self, engine_path: Path | None = None, *, onnx_path: Path | None = None, precision: str = "fp32",
                 threads: int = 0, profile: ProfileShapes | None = None, name: str | None = None,
                 max_batch: int | None = None, source: Path | None = None) -> None:
        if (engine_path is None) == (onnx_path is None):
            raise EngineError("openvino-cpu: give exactly one of engine_path (a compiled .blob) and onnx_path.")
        super().__init__(name=name, max_batch=max_batch)
        self.engine_path = Path(engine_path) if engine_path is not None else None
        self.onnx_path = Path(onnx_path) if onnx_path is not None else None
        self.precision = precision
        self.threads = int(threads)
        self.profile = profile
        self.source = Path(source) if source is not None else None
        self._compiled: Any = None
        self._request: Any = None
        self._info: dict[str, Any] = {}
        self._recorded: dict[str, dict[str, Any]] = {}
        self._limits: dict[str, ShapeLimits] = {}

    # ------------------------------------------------------------------------------ sources
    def _sidecar(self) -> OvSidecar:
        assert self.engine_path is not None
        if not self.engine_path.is_file():
            raise EngineError(f"OpenVINO compiled model not found: {self.engine_path}; build it with "
                              "hydra-toolchain build GRAPH --engine openvino-cpu, or fix the path.")
        return read_sidecar(self.engine_path)

    def precheck(self, feed: Mapping[str, object]) -> bool:
        """Check ``feed`` against a compiled file's sidecar (inputs, profile) without OpenVINO."""
        if self.engine_path is None:
            return False
        sidecar = self._sidecar()
        specs, limits, complete = recorded_specs(sidecar.profile, sidecar.inputs)
        if not specs:
            return False
        padded, _padding, why = pad_to_profile(feed, limits, neutral=sidecar.pad_neutral)  # as infer() pads it
        check_feed_why(padded, specs, why, limits=limits, runner=self.name, complete=complete)
        return True

    def _activate_impl(self) -> None:
        from toolchain.engines.inputs import graph_inputs
        from toolchain.export.graph import load_checked

        sidecar: OvSidecar | None = None
        if self.engine_path is not None:
            sidecar = self._sidecar()
            check_source(self.engine_path, kind=KIND, onnx_file=sidecar.onnx_file, onnx_sha256=sidecar.onnx_sha256,
                         precision=sidecar.precision, profile=sidecar.profile, recorded_path=sidecar.onnx_path,
                         given=self.source if self.source is not None and self.source.is_file() else None)
            identity = _deps.current_identity()
            ensure_compatible(sidecar, identity, self.engine_path)
            try:
                compiled = _deps.core().import_model(io.BytesIO(self.engine_path.read_bytes()), "CPU",
                                               {**sidecar.config, **run_config(self.threads)})
            except RuntimeError as exc:
                raise EngineError(f"OpenVINO could not import {self.engine_path.name}: {str(exc).splitlines()[0]}; "
                                  f"rebuild it from {sidecar.onnx_file}.") from exc
            asked, recorded, profile = sidecar.precision, sidecar.inputs, sidecar.profile
            source = {"engine": self.engine_path.name, "onnx_file": sidecar.onnx_file,
                      "onnx_sha256": sidecar.onnx_sha256, "built_with": sidecar.openvino_version}
        else:
            assert self.onnx_path is not None
            identity = _deps.current_identity()
            compiled = compile_model(read_model(self.onnx_path, self.profile), self.precision, self.threads)
            asked = self.precision
            recorded = graph_inputs(load_checked(self.onnx_path, load_weights=False, check=False))
            profile = {k: [list(map(int, s)) for s in v] for k, v in (self.profile or {}).items()}
            source = {"onnx_file": self.onnx_path.name}
        layers = read_back(compiled)
        ran, kept = ran_precision(layers, asked)
        if sidecar is not None and self.engine_path is not None and ran != sidecar.ran_precision:
            raise EngineError(
                f"{self.engine_path.name}: its matrix layers run {ran} after loading, but its sidecar records "
                f"{sidecar.ran_precision} ({sidecar.precision} asked at build time): the file or its sidecar changed "
                "after the build, or this OpenVINO imports it differently. Rebuild it: "
                + rebuild_command(sidecar.onnx_path or sidecar.onnx_file, self.engine_path, KIND, sidecar.precision,
                                  sidecar.profile))
        self._compiled, self._request = compiled, compiled.create_infer_request()
        self._recorded = recorded
        self._limits = recorded_specs(profile, {})[1]
        self._info = {"kind": self.kind, "runtime": f"OpenVINO {identity.openvino_version}",
                      "device": identity.device_name, "precision": asked, "ran_precision": ran,
                      "kept_fp32_matrix_layers": kept, "layers": layers, "config": precision_config(asked),
                      "threads": self.threads, **source}

    def _deactivate_impl(self) -> None:
        self._request = self._compiled = None

    # -------------------------------------------------------------------------------- contract
    def engine_info(self) -> dict[str, Any]:
        """Precision asked and really run (read back from the compiled model), runtime, device, layer counts."""
        return dict(self._info)

    def _input_specs_impl(self) -> dict[str, TensorSpec]:
        specs = {}
        for port in self._compiled.inputs:
            # the graph's own input name: compiling can merge an input with the tensor a Cast makes of it (a
            # LLaMA attention_mask), and get_any_name() may then return the Cast's output name
            name = next((n for n in sorted(port.get_names()) if n in self._recorded), port.get_any_name())
            try:
                dtype = np.dtype(port.get_element_type().to_dtype())
            except (TypeError, RuntimeError) as exc:
                raise EngineError(f"{self.name}: input '{name}' has OpenVINO type {port.get_element_type()}, "
                                  "which numpy cannot feed.") from exc
            shape = port.get_partial_shape()
            dims: list[Any] = [d.get_length() if d.is_static else None for d in shape]
            graph_dims = (self._recorded.get(name) or {}).get("shape")
            if isinstance(graph_dims, Sequence) and len(graph_dims) == len(dims):  # the graph's dim names
                dims = [g if d is None and isinstance(g, str) else d for d, g in zip(dims, graph_dims)]
            specs[name] = TensorSpec(dtype, tuple(dims))
        return specs

    def _shape_limits(self) -> dict[str, ShapeLimits]:
        return dict(self._limits)

    def _pads_neutral(self) -> bool:
        if self.engine_path is None:
            return False
        if getattr(self, "_neutral", None) is None:
            self._neutral = bool(self._sidecar().pad_neutral)
        return self._neutral

    def _output_dims(self) -> dict[str, tuple[int | None, ...]]:
        return {p.get_any_name(): tuple(d.get_length() if d.is_static else None for d in p.get_partial_shape())
                for p in self._compiled.outputs}

    def output_names(self) -> list[str]:
        """Output names in order."""
        self._require_active("output_names()")
        return [p.get_any_name() for p in self._compiled.outputs]

    def _infer_impl(self, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        try:
            results = self._request.infer({k: np.ascontiguousarray(v) for k, v in feed.items()})
        except RuntimeError as exc:
            what = self.engine_path.name if self.engine_path is not None else self.onnx_path.name  # type: ignore[union-attr]
            raise EngineError(f"{self.name}: OpenVINO failed on {what}: {str(exc).splitlines()[0]}") from exc
        out = {}
        for port in self._compiled.outputs:
            out[port.get_any_name()] = np.array(results[port], copy=True)
        return out
