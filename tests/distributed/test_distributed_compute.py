"""Two gloo ranks give the single-process results: scores, circuits, member and data-parallel fine-tuning."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from toolchain import distributed as dist

_spec = importlib.util.spec_from_file_location("dist_worker", Path(__file__).with_name("_worker.py"))
W = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(W)

#: data parallel vs one process on the full batch (float summation order, see finetune's docstring)
DP_PARAM_ATOL = 2e-5
DP_LOSS_RTOL = 1e-5


@pytest.fixture(scope="module")
def ranks(tmp_path_factory, jobs):
    out = tmp_path_factory.mktemp("dist-compute")
    results = jobs.worker("compute", out, timeout=240)
    for r in results:
        assert r.returncode == 0, r.stderr[-4000:]
    return [torch.load(out / f"rank{i}.pt", weights_only=False) for i in range(2)]


@pytest.fixture(scope="module")
def single():
    """The same computations in this process, alone, with the workers' thread count."""
    assert not dist.enabled()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        scores, circuits = W.score_all()
        members = {j: W.train_member(seed) for j, seed in enumerate(W.MEMBER_SEEDS)}
    finally:
        torch.set_num_threads(threads)
    return scores, circuits, members


def _close(a: torch.Tensor, b: torch.Tensor, rtol: float) -> bool:
    return torch.allclose(a, b, rtol=rtol, atol=0.0, equal_nan=True)


@pytest.mark.parametrize("criterion", W.CRITERIA)
@pytest.mark.parametrize("family", W.FAMILIES)
def test_scores_equal_single_process(ranks, single, family, criterion):
    ref = single[0][(family, criterion)]
    for got in ranks:
        scores, data_hash, params, extras = got["scores"][(family, criterion)]
        assert _close(scores, ref.scores, 1e-6), (scores, ref.scores)
        assert data_hash == ref.data_hash  # describes all the data, not this rank's shard
        assert params == ref.params
        assert extras.get("num_samples") == ref.extras.get("num_samples")
    # both ranks hold the same result
    assert torch.equal(ranks[0]["scores"][(family, criterion)][0].nan_to_num(-9),
                       ranks[1]["scores"][(family, criterion)][0].nan_to_num(-9))


@pytest.mark.parametrize("setting", W.CIRCUITS, ids=lambda s: "-".join(map(str, s)))
def test_circuit_selection_identical(ranks, single, setting):
    ref = single[1][setting]
    for got in ranks:
        scores, circuit, data_hash = got["circuits"][setting]
        assert circuit == ref.extras["circuit"]
        assert data_hash == ref.data_hash
        assert _close(scores, ref.scores, 1e-9)


def test_members_spread_over_ranks_and_gathered_on_rank_0(ranks):
    assert [r["items"] for r in ranks] == [(0,), (1,)]
    assert ranks[1]["members"] is None
    assert sorted(ranks[0]["members"]) == [0, 1]


def test_member_trained_alone_on_a_rank_is_bitwise_the_single_process_run(ranks, single):
    for j in range(len(W.MEMBER_SEEDS)):
        ref_state, ref_hist = single[2][j]
        state, hist = ranks[0]["members"][j]  # gathered on rank 0 (job 1 trained on rank 1)
        assert hist["losses"] == ref_hist["losses"]
        assert all(torch.equal(state[k], ref_state[k]) for k in ref_state)
        own = ranks[j]["local_members"][j][0]
        assert all(torch.equal(own[k], ref_state[k]) for k in ref_state)


def test_data_parallel_finetune_matches_single_process_within_tolerance(ranks, single):
    assert ranks[0]["dp_group"] == ((0, 1),)
    ref_state, ref_hist = single[2][0]  # same seed, one process, full batches
    (s0, h0), (s1, h1) = ranks[0]["dp"], ranks[1]["dp"]
    assert all(torch.equal(s0[k], s1[k]) for k in s0)  # the two ranks end identical
    assert h0 == h1
    assert h0["lrs"] == ref_hist["lrs"]
    assert torch.allclose(torch.tensor(h0["losses"]), torch.tensor(ref_hist["losses"]), rtol=DP_LOSS_RTOL, atol=0)
    worst = max(float((s0[k].double() - ref_state[k].double()).abs().max()) for k in ref_state
                if ref_state[k].is_floating_point())
    assert worst <= DP_PARAM_ATOL, worst
    # it did train: the parameters moved much more than the tolerance
    moved = float((s0["classifier.weight"] - W.fresh_bert().model.state_dict()["classifier.weight"]).abs().max())
    assert moved > 100 * DP_PARAM_ATOL
