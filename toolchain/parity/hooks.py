"""PyTorch's values of a module's submodules, by forward hooks, for :mod:`toolchain.parity.localize`.

:class:`ModuleValues` runs the module on numpy feeds under ``torch.inference_mode`` with a forward
hook on each submodule asked for, and keeps the first floating-point tensor of its output (a
tensor, a tuple's first tensor, a dict's or ``ModelOutput``'s first value); :meth:`ModuleValues.profile`
says how often each submodule runs and the rank of that tensor, so a module called twice (whose ONNX
scope would be ambiguous) or one without a float output is left out, and so is one that returns
several float tensors of that rank (RoPE's ``(cos, sin)``: its scope's two outputs cannot be told
apart by rank, and comparing ``sin`` with PyTorch's ``cos`` would blame it).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np

__all__ = ["ModuleValues", "module_outputs"]

Feed = Mapping[str, np.ndarray]
Values = list[dict[str, np.ndarray]]


def _tensors(out: Any) -> list[Any]:
    import torch

    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, Mapping):
        out = list(out.values())
    if isinstance(out, list | tuple):
        return [x for x in out if isinstance(x, torch.Tensor)]
    return []


def _first_tensor(out: Any) -> Any:
    import torch

    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, Mapping):
        out = list(out.values())
    if isinstance(out, list | tuple):
        return next((x for x in out if isinstance(x, torch.Tensor)), None)
    return None


class ModuleValues:
    """The PyTorch module run on the feeds with forward hooks on the modules asked for."""

    def __init__(self, module: Any, feeds: Sequence[Feed]) -> None:
        self.module, self.feeds = module, feeds
        self.modules = dict(module.named_modules())

    def _forward(self, feed: Feed, paths: Iterable[str], sink: Callable[[str, Any], None]) -> dict[str, np.ndarray]:
        import torch

        hooks = [self.modules[p].register_forward_hook(lambda _m, _i, out, p=p: sink(p, out)) for p in paths]
        try:
            with torch.inference_mode():
                out = self.module(**{k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in feed.items()})
        finally:
            for hook in hooks:
                hook.remove()
        if isinstance(out, Mapping):
            return {k: v.detach().float().cpu().numpy() for k, v in out.items() if isinstance(v, torch.Tensor)}
        return {}

    def profile(self) -> dict[str, tuple[int, int]]:
        """Module path -> (calls, rank of its first float output) on the first feed.

        Rank -1: no float tensor, or several float tensors of the first one's rank (ambiguous in the graph).
        """
        calls: dict[str, list[int]] = {}

        def sink(path: str, out: Any) -> None:
            t = _first_tensor(out)
            rank = t.dim() if t is not None and t.is_floating_point() else -1
            if rank >= 0 and sum(x.is_floating_point() and x.dim() == rank for x in _tensors(out)) > 1:
                rank = -1
            calls.setdefault(path, []).append(rank)

        self._forward(self.feeds[0], [p for p in self.modules if p], sink)
        return {p: (len(r), r[0]) for p, r in calls.items()}

    def values(self, wanted: Mapping[str, str]) -> tuple[Values, Values]:
        """``wanted``: value name -> module path; per feed the modules' outputs and the final outputs."""
        by_path: dict[str, list[str]] = {}
        for value, path in wanted.items():
            by_path.setdefault(path, []).append(value)
        values: Values = []
        finals: Values = []
        for feed in self.feeds:
            got: dict[str, np.ndarray] = {}

            def sink(path: str, out: Any, got: dict[str, np.ndarray] = got) -> None:
                t = _first_tensor(out)
                for value in by_path[path]:
                    got[value] = t.detach().float().cpu().numpy()

            finals.append(self._forward(feed, by_path, sink))
            values.append(got)
        return values, finals


def module_outputs(module: Any, feeds: Sequence[Feed]) -> Values:
    """The module's named outputs on each feed (the gate's reference, for ``localize_against_fp32``)."""
    return ModuleValues(module.eval(), feeds).values({})[1]
