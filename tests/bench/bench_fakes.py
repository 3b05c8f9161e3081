"""Fake runners for the bench tests: they record every call and advance a fake clock."""

from __future__ import annotations

import numpy as np

from toolchain.engines.base import Runner, TensorSpec


class FakeClock:
    """A ``perf_counter_ns`` stand-in: runners advance it by their cost."""

    def __init__(self) -> None:
        self.now_ns = 0

    def __call__(self) -> int:
        return self.now_ns


class FakeRunner(Runner):
    """Appends its name to ``log`` on every ``infer`` and advances ``clock`` by ``costs_ms[call]``."""

    def __init__(self, name: str, log: list[str], clock: FakeClock | None = None, costs_ms=(1.0,),
                 kind: str = "fake") -> None:
        self.kind = kind
        super().__init__(name=name)
        self.log = log
        self.clock = clock
        self.costs_ms = list(costs_ms)
        self.calls = 0

    def _activate_impl(self) -> None:
        pass

    def _deactivate_impl(self) -> None:
        pass

    def _input_specs_impl(self) -> dict[str, TensorSpec]:
        return {"x": TensorSpec(np.dtype(np.float32), ("batch", 2))}

    def _infer_impl(self, feed):
        self.log.append(self.name)
        if self.clock is not None:
            cost = self.costs_ms[min(self.calls, len(self.costs_ms) - 1)]
            self.clock.now_ns += round(cost * 1e6)
        self.calls += 1
        return {"y": feed["x"]}


def feed(batch: int = 1) -> dict[str, np.ndarray]:
    return {"x": np.zeros((batch, 2), dtype=np.float32)}
