"""SIGTERM stops at the next safe point (toolchain/interrupts.py), or at once on a second signal
or after the grace period; never in the middle of whatever C++ call the main thread is in."""

from __future__ import annotations

import os
import signal
import time

import pytest

from toolchain import interrupts


@pytest.fixture
def handler():
    old = signal.getsignal(signal.SIGTERM)
    interrupts.install(grace_s=30)
    yield
    interrupts.reset()
    signal.signal(signal.SIGTERM, old)


def _sigterm() -> None:
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(0.01)  # the handler runs in the main thread at the next bytecode


def test_first_sigterm_only_records_and_the_next_safe_point_raises(handler, capfd):
    _sigterm()
    assert interrupts.requested()
    total = sum(range(1000))  # work outside a safe point goes on
    assert total == 499500
    with pytest.raises(KeyboardInterrupt, match="signal 15"):
        interrupts.check()
    assert "stopping at the next safe point" in capfd.readouterr().err


def test_second_sigterm_raises_at_once(handler):
    _sigterm()
    with pytest.raises(KeyboardInterrupt):
        _sigterm()


def test_no_safe_point_within_the_grace_period_raises_anyway(handler):
    interrupts.install(grace_s=0.3)
    _sigterm()
    start = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        while time.monotonic() - start < 10:  # a long call with no safe point
            time.sleep(0.01)
    assert time.monotonic() - start < 5


def test_check_is_a_no_op_without_a_request(handler):
    interrupts.check()
    assert not interrupts.requested()


def test_a_training_loop_stops_between_steps(handler):
    import torch

    from toolchain.pruning.finetune import _train_loop

    model = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    losses: list[float] = []

    def batches(_bs, _seed):
        for _ in range(100):
            yield torch.randn(4, 2), torch.zeros(4, dtype=torch.long)

    def step_loss(x, y):
        if len(losses) == 3:
            _sigterm()  # the signal arrives in the middle of step 4: the step completes
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        return float(loss.detach())

    class Bar:
        def update(self, *_a):
            pass

        def set_postfix(self, *_a, **_k):
            pass

        def close(self):
            pass

    with pytest.raises(KeyboardInterrupt):
        _train_loop(model, batches, step_loss, opt=opt, sched=sched, bar=Bar(), steps=50, batch_size=4, seed=0,
                    grad_clip=None, log_every=0, losses=losses, lrs=[])
    assert len(losses) == 4
