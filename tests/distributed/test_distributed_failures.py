"""A rank that raises (or never arrives, or dies) ends the job on every rank with its message, nonzero, without a hang.

Every rank runs with SIGINT ignored, as a job started in the background by a script (``cmd &``) or a CI runner
inherits it: the watcher used to stop a busy rank with ``_thread.interrupt_main()`` (a simulated SIGINT), which
does nothing then, so [fail-busy] and [hang] computed on for 120 s when the suite ran in the background.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

# a hang fails the test here; the jobs' collective timeout is 60 s (3 s for "hang"). The limit leaves room for
# process start-up (torch import) on a loaded 2-core machine: 8 processes at once timed out at 90 s there
LIMIT_S = 240
SCENARIOS = {  # scenario: (failing rank, message both ranks report, extra environment)
    "fail-collective": (1, "rank 1 failed: ValueError: boom from rank 1", {}),  # rank 0 waits in a collective
    "fail-busy": (1, "rank 1 failed: ValueError: boom from rank 1", {}),  # rank 0 computes, no collective
    "fail-main": (0, "rank 0 failed: ValueError: boom from rank 0", {}),  # the store host fails, rank 1 in barrier
    "hang": (0, "Timed out waiting", {"HYDRA_DIST_TIMEOUT_S": "3"}),  # rank 1 never arrives: rank 0 times out
}
LOST = "lost-host"  # rank 0, the store host, dies without posting while rank 1 computes


@pytest.fixture(scope="module")
def outcomes(jobs, tmp_path_factory):
    """Every scenario's two ranks, the scenarios run side by side."""
    out = tmp_path_factory.mktemp("dist-fail")
    envs = {**{s: env for s, (_, _, env) in SCENARIOS.items()}, LOST: {}}
    with ThreadPoolExecutor(2) as pool:  # two scenarios (4 processes) at a time on 2 cores
        futures = {s: pool.submit(jobs.worker, s, out, timeout=LIMIT_S, WORKER_IGNORE_SIGINT="1", **env)
                   for s, env in envs.items()}
        return {s: f.result() for s, f in futures.items()}


def _seconds(stderr: str) -> float:
    return float(stderr.rsplit("exits after ", 1)[1].split(" s")[0])


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_failure_on_one_rank_ends_every_rank(outcomes, scenario):
    failing, message, _env = SCENARIOS[scenario]
    results = outcomes[scenario]
    for rank, r in enumerate(results):
        assert r.returncode != 0, (rank, r.stderr[-2000:])
        assert message in r.stderr, (rank, r.stderr[-2000:])
        assert "unreachable" not in r.stderr
        # every rank stopped long before the 60 s collective timeout / the 120 s busy loops
        assert _seconds(r.stderr) < 20, (rank, r.stderr[-2000:])
    other = results[1 - failing]
    assert f"rank {failing} failed" in other.stderr and "the job ends on every rank" in other.stderr
    if scenario != "hang":
        assert results[failing].returncode == 4  # its own (internal) error, like the CLI
        assert other.returncode == 4  # the failing rank's exit code is carried over
    else:
        assert "lost contact" in results[0].stderr and results[0].returncode == 2


def test_a_busy_rank_stops_when_the_store_host_dies(outcomes):
    """The watcher retries the store, warns when it gives up, and stops its rank (no 120 s of computing on)."""
    host, busy = outcomes[LOST]
    assert host.returncode == 9
    assert busy.returncode == 2, busy.stderr[-2000:]
    assert "failure watcher gives up after 5 retries" in busy.stderr, busy.stderr[-2000:]  # a warning, not silence
    assert "error: rank 1 lost contact with the other ranks in lost-host" in busy.stderr, busy.stderr[-2000:]
    assert _seconds(busy.stderr) < 20, busy.stderr[-2000:]
