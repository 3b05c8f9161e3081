"""Without a process group every helper gives the single-process answer (existing code paths unchanged)."""

from __future__ import annotations

import pytest
import torch

from toolchain import distributed as dist
from toolchain.errors import ToolchainError


def test_single_process_answers(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert dist.init_from_env() is False
    assert not dist.enabled() and dist.world_size() == 1 and dist.rank() == 0 and dist.is_main()
    assert dist.shard(list("abcde")) == list("abcde")
    assert dist.shard_indices(3, contiguous=True) == [0, 1, 2]
    x = torch.tensor([1.0, 2.0], dtype=torch.float32)
    y = dist.all_reduce_sum(x)
    assert y.dtype == torch.float64 and torch.equal(y, x.double()) and y.data_ptr() != x.data_ptr()
    assert dist.all_gather_objects({"a": 1}) == [{"a": 1}]
    assert dist.gather_objects(3) == [3]
    assert dist.broadcast_object("x") == "x"
    assert dist.map_shards(4, lambda i: i * i) == [0, 1, 4, 9]
    jobs = dist.assign(3)
    assert jobs.items == (0, 1, 2) and jobs.group is None and all(jobs.leads(i) for i in jobs.items)
    assert dist.gather_results(jobs, {0: "a", 1: "b", 2: "c"}) == {0: "a", 1: "b", 2: "c"}
    dist.barrier()
    with dist.local_only():
        assert dist.world_size() == 1
    with pytest.raises(ValueError, match="plain"), dist.guard():
        raise ValueError("plain")  # no process group: the exception passes through untouched


def test_world_size_without_launcher_variables_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    for key in ("RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(key, raising=False)
    with pytest.raises(ToolchainError, match="RANK, MASTER_ADDR, MASTER_PORT is not set"):
        dist.init_from_env()


def test_to_cpu_keeps_containers():
    from collections import OrderedDict

    state = OrderedDict(w=torch.ones(2, requires_grad=True))
    out = dist.to_cpu({"s": state, "t": (torch.zeros(1), 3), "l": [torch.ones(1)]})
    assert isinstance(out["s"], OrderedDict) and not out["s"]["w"].requires_grad
    assert isinstance(out["t"], tuple) and out["t"][1] == 3


def test_no_exception_is_swallowed_without_a_log_line():
    """Every broad ``except Exception`` in toolchain/distributed/ logs or re-raises (no silent suppress)."""
    import ast
    from pathlib import Path

    from toolchain import distributed

    trees = [ast.parse(p.read_text()) for p in Path(distributed.__file__).parent.glob("*.py")]
    for node in (n for tree in trees for n in ast.walk(tree)):
        if isinstance(node, ast.With):
            for item in node.items:
                call = item.context_expr
                assert not (isinstance(call, ast.Call) and getattr(call.func, "attr", "") == "suppress"
                            and any(getattr(a, "id", "") == "Exception" for a in call.args)), ast.unparse(node)[:80]
        if isinstance(node, ast.ExceptHandler) and getattr(node.type, "id", None) == "Exception":
            body = ast.unparse(node)
            assert "log." in body or "raise" in body, body[:200]


def test_tolerated_logs_why(caplog):
    import logging

    from toolchain.distributed.state import _tolerated

    with caplog.at_level(logging.DEBUG, logger="toolchain.distributed"), _tolerated("closing the store"):
        raise RuntimeError("gone")
    assert "closing the store failed: RuntimeError: gone" in caplog.text
