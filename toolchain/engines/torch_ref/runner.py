"""``TorchRunner``: run an ``nn.Module`` whose forward returns a dict, behind the runner contract.

FP32 by default: the reference. ``autocast="bf16"`` or ``"fp16"`` previews what low precision
does to the outputs (``torch.autocast`` on the module's device), before any engine is built;
outputs always come back as float32 numpy arrays.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Literal

import numpy as np
import torch
from torch import nn

from toolchain.engines.base import Dim, Runner, TensorSpec
from toolchain.errors import EngineError, MissingDependencyError

_AUTOCAST = {"bf16": torch.bfloat16, "fp16": torch.float16}


class TorchRunner(Runner):
    """Runs ``module(**feed)`` under ``torch.inference_mode``.

    Args:
        module: forward takes the inputs as keyword arguments and returns a dict of tensors
            (or a tuple, named by ``output_names``).
        input_specs: name -> ``(dtype, shape)``, e.g. ``{"input_ids": (np.int64, ("batch", "seq"))}``.
        output_names: outputs to return, in order; None means every key the module returns.
        autocast: None (FP32), ``"bf16"`` or ``"fp16"`` (preview of low precision).
        device: torch device for the module and inputs (``"cpu"``, ``"cuda"``).
        max_batch: reject feeds whose axis 0 is larger.
    """

    kind = "torch"

    def __init__(
        self,
        module: nn.Module,
        input_specs: Mapping[str, tuple[np.dtype | type, Sequence[Dim]]],
        output_names: Sequence[str] | None = None,
        *,
        autocast: Literal["bf16", "fp16"] | None = None,
        device: str = "cpu",
        max_batch: int | None = None,
        name: str | None = None,
    ) -> None:
        super().__init__(name=name, max_batch=max_batch)
        if autocast is not None and autocast not in _AUTOCAST:
            raise EngineError(f"torch runner: autocast must be None, 'bf16' or 'fp16', got '{autocast}'.")
        if not input_specs:
            raise EngineError("torch runner: input_specs is empty; pass {name: (dtype, shape)}.")
        self.module = module
        self.autocast = autocast
        self.device = torch.device(device)
        self.output_names = list(output_names) if output_names is not None else None
        self._declared = {k: TensorSpec(np.dtype(d), tuple(s)) for k, (d, s) in input_specs.items()}
        self._modes: list[tuple[nn.Module, bool]] = []

    def _activate_impl(self) -> None:
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise MissingDependencyError("torch runner: device 'cuda' asked for but no CUDA device is visible.")
        self._modes = [(m, m.training) for m in self.module.modules()]
        self.module.to(self.device).eval()

    def _deactivate_impl(self) -> None:
        for m, flag in self._modes:  # restore each submodule's own flag
            m.training = flag
        self._modes = []

    def _input_specs_impl(self) -> dict[str, TensorSpec]:
        return dict(self._declared)

    def _infer_impl(self, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        tensors = {k: torch.from_numpy(np.ascontiguousarray(v)).to(self.device) for k, v in feed.items()}
        with torch.inference_mode():
            if self.autocast is None:
                out = self.module(**tensors)
            else:
                with torch.autocast(device_type=self.device.type, dtype=_AUTOCAST[self.autocast]):
                    out = self.module(**tensors)
        if isinstance(out, Mapping):
            named = dict(out)
        elif self.output_names is not None and isinstance(out, tuple | list) and len(out) == len(self.output_names):
            named = dict(zip(self.output_names, out))
        else:
            raise EngineError(f"{self.name}: the module must return a dict of tensors (got {type(out).__name__}); "
                              "or pass output_names matching its tuple.")
        names = self.output_names if self.output_names is not None else list(named)
        missing = [n for n in names if n not in named]
        if missing:
            raise EngineError(f"{self.name}: the module returned {sorted(named)}, not {missing}.")
        return {n: _to_host(named[n]) for n in names}


def _to_host(tensor: torch.Tensor) -> np.ndarray:
    """Tensor -> numpy; floating point always float32 (numpy has no bfloat16)."""
    tensor = tensor.detach()
    if tensor.is_floating_point():
        tensor = tensor.float()
    return tensor.cpu().numpy()
