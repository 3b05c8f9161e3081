"""One rank of a distributed test job (launched by tests/distributed with RANK / WORLD_SIZE / MASTER_* set).

    python tests/distributed/_worker.py SCENARIO OUT_DIR

Scenarios: ``compute`` (scores, circuit searches, member and data-parallel fine-tuning; results
saved to ``OUT_DIR/rank<r>.pt``), ``fail-collective`` / ``fail-busy`` / ``fail-main`` (one rank
raises), ``hang`` (one rank never reaches the collective), ``lost-host`` (rank 0, the store host,
dies without posting while rank 1 computes). A failing process exits like the CLI:
``error: <message>`` on stderr and the error's exit code.
Also imported by the tests, which compute the single-process reference with :func:`score_all` and :func:`train_member`.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

FAMILIES = ("bert", "vit", "clip")
CRITERIA = ("his", "taylor", "entropy", "hies")
BATCH_SIZES = (4, 3, 5, 2, 4)  # 5 uneven batches: rank 0 gets 3, rank 1 gets 2
CIRCUITS = [  # (objective, mode, max_batch_size): 8 rows per forward -> several forwards per step
    ("loss", "batched", 8),
    ("nll", "batched", 128),
    ("ood_auroc", "batched", 8),
    ("loss", "looped", 128),
]
MEMBER_SEEDS = (11, 12)
FT = {"steps": 12, "lr": 5e-3, "batch_size": 8}


def calib(tiny, sizes=BATCH_SIZES, seed=0, ood_every=0):
    """Labelled batches (label -1 on every ``ood_every``-th row when > 0)."""
    return tiny.labelled_batches(sizes, seed, ood_every)


def task(n=40, seed=0):
    """A separable two-class bag-of-words task for the tiny BERT; ``batches(batch_size, seed)``."""
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 2, (n,), generator=g)
    ids = torch.randint(5, 50, (n, 8), generator=g) + 47 * labels[:, None]
    ids[:, 0] = 2

    def batches(batch_size, seed):
        order = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
        for s in range(0, n, batch_size):
            i = order[s : s + batch_size]
            x = ids[i]
            batch = {"input_ids": x, "attention_mask": torch.ones_like(x), "token_type_ids": torch.zeros_like(x)}
            yield batch, labels[i]

    return batches


def fresh_bert():
    from toolchain.models.tiny import tiny_bert

    tiny = tiny_bert(seed=0, num_labels=2)
    with torch.no_grad():
        tiny.model.classifier.weight.div_(300.0)  # undo the tiny model's saturated head
    return tiny


def score_all():
    """{(family, criterion): HeadScores} and {(objective, mode, mbs): HeadScores}, same on every rank count."""
    from toolchain.models.tiny import TINY_MODELS
    from toolchain.scoring import score_heads

    scores = {}
    for fam in FAMILIES:
        tiny = TINY_MODELS[fam]()
        data = calib(tiny)
        for crit in CRITERIA:
            scores[(fam, crit)] = score_heads(tiny.adapter, data, crit)
    circuits = {}
    tiny = TINY_MODELS["bert"]()
    for objective, mode, mbs in CIRCUITS:
        data = calib(tiny, ood_every=3 if objective == "ood_auroc" else 0)
        circuits[(objective, mode, mbs)] = score_heads(tiny.adapter, data, "circuit", n_heads=2, objective=objective,
                                                       mode=mode, max_batch_size=mbs)
    return scores, circuits


def train_member(seed, group=None):
    from toolchain.pruning import finetune

    tiny = fresh_bert()
    hist = finetune(tiny.model, tiny.adapter, task(), seed=seed, progress=False, process_group=group, **FT)
    return {k: v.clone() for k, v in tiny.model.state_dict().items()}, hist


def _compute(out: Path) -> None:
    from toolchain import distributed as dist

    with dist.guard("compute"):
        scores, circuits = score_all()
        jobs = dist.assign(len(MEMBER_SEEDS))
        local = {j: train_member(MEMBER_SEEDS[j]) for j in jobs.items}
        members = dist.gather_results(jobs, {j: v for j, v in local.items() if jobs.leads(j)})
        pair = dist.assign(1)  # one job, two ranks: data parallel
        dp_state, dp_hist = train_member(MEMBER_SEEDS[0], group=pair.group)
    torch.save({
        "rank": dist.rank(), "world": dist.world_size(), "items": jobs.items,
        "scores": {k: (v.scores, v.data_hash, v.params, v.extras) for k, v in scores.items()},
        "circuits": {k: (v.scores, v.extras["circuit"], v.data_hash) for k, v in circuits.items()},
        "members": members, "local_members": local, "dp": (dp_state, dp_hist), "dp_group": pair.ranks,
    }, out / f"rank{dist.rank()}.pt")


def _fail(scenario: str) -> None:
    from toolchain import distributed as dist

    me = dist.rank()
    with dist.guard(scenario):
        if scenario == "fail-collective":  # rank 0 waits in a collective while rank 1 fails
            if me == 1:
                time.sleep(0.5)
                raise ValueError("boom from rank 1")
            dist.all_reduce_sum(torch.ones(3))
        elif scenario == "fail-busy":  # rank 0 computes (no collective) for a long time while rank 1 fails
            if me == 1:
                time.sleep(0.5)
                raise ValueError("boom from rank 1")
            t0 = time.monotonic()
            while time.monotonic() - t0 < 120:
                torch.randn(64, 64) @ torch.randn(64, 64)
        elif scenario == "hang":  # rank 1 never reaches the collective: rank 0 times out (HYDRA_DIST_TIMEOUT_S)
            if me == 1:
                t0 = time.monotonic()
                while time.monotonic() - t0 < 120:
                    torch.randn(64, 64) @ torch.randn(64, 64)
            else:
                dist.all_reduce_sum(torch.ones(3))
        elif scenario == "lost-host":  # rank 0 (the store host) dies without a word while rank 1 computes
            if me == 0:
                time.sleep(0.5)
                os._exit(9)
            t0 = time.monotonic()
            while time.monotonic() - t0 < 120:
                torch.randn(64, 64) @ torch.randn(64, 64)
        elif scenario == "fail-main":  # rank 0 (the store host) fails while rank 1 waits at a barrier
            if me == 0:
                time.sleep(0.5)
                raise ValueError("boom from rank 0")
            dist.barrier()
        raise AssertionError("unreachable: the job should have failed")


def main() -> None:
    from toolchain import distributed as dist
    from toolchain.errors import ToolchainError

    scenario, out = sys.argv[1], Path(sys.argv[2])
    if os.environ.get("WORKER_IGNORE_SIGINT") == "1":  # like a job started in the background by a script (cmd &)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    torch.set_num_threads(int(os.environ.get("WORKER_THREADS", "1")))
    dist.init_from_env()
    t0 = time.monotonic()
    try:
        if scenario == "compute":
            _compute(out)
        else:
            _fail(scenario)
    except ToolchainError as exc:  # like the CLI
        print(f"error: {exc}", file=sys.stderr, flush=True)
        print(f"rank {dist.rank()} exits after {time.monotonic() - t0:.2f} s", file=sys.stderr, flush=True)
        sys.exit(exc.exit_code)
    except Exception as exc:
        print(f"internal error: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        print(f"rank {dist.rank()} exits after {time.monotonic() - t0:.2f} s", file=sys.stderr, flush=True)
        sys.exit(4)


if __name__ == "__main__":
    main()
