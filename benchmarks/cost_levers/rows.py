"""The cost-lever rows (issue 45): recipe overrides over the default recipe, fixed before any run.

Each row moves the levers that decide what Hydra costs on a CPU, where every member stream pays its
FLOPs: the MLP neurons each member keeps (``pruning.mlp_share``, with or without a shared core
``pruning.mlp_core``; sliced rows need ``fusion.mlp: grouped``), the layer the members fork at
(``pruning.fork``: the fine-tuned model's first layers run once), the heads each member keeps
(``pruning.ratio``), and combinations. ``averaged`` is the paper's Hydra (averaged MLP, no fork: the default
recipe before this benchmark's pick).
Everything else (circuit-sample members, distilled recovery, 300 steps of fused recovery) is the
recipe's own, so a row's difference from ``averaged`` is its levers' cost or gain.

The analytic FLOPs ratio of each row to the single model (MiniLM, sequence 64, M = 3, half the heads):
``averaged`` 2.47x, ``mlp-0.33`` 1.18x, ``mlp-0.4`` 1.30x, ``mlp-0.5`` 1.50x, ``fork-4`` 1.49x,
``fork3-mlp-0.33`` 1.09x, ``fork2-mlp-0.4`` 1.20x, ``prune67-mlp-0.33`` 1.00x (``toolchain/hydra/cost.py``
gives the exact numbers; the benchmarks write them per row).
"""

from __future__ import annotations

THIRD = 0.3334  # round(0.3334 * 1536) = 512: a disjoint third of MiniLM's MLP per member


def _row(fork: int = 0, share: float | None = None, core: float = 0.0, ratio: float | None = None) -> dict:
    """Every lever written out (fork, MLP share and core, MLP fusion), so a row means the same whatever the
    recipe's own levers are (the default recipe follows this benchmark's pick); ``ratio`` only where it moves."""
    pruning: dict = {"fork": fork, "mlp_share": share, "mlp_core": core}
    if ratio is not None:
        pruning["ratio"] = ratio
    return {"pruning": pruning, "fusion": {"mlp": "grouped" if share is not None else "average"}}


#: name -> recipe overrides (partial sections merged over the recipe's)
ROWS: dict[str, dict] = {
    "averaged": _row(),
    # MLP neurons per member: a disjoint third, 0.4 and 0.5 (overlapping), with and without a shared core
    "mlp-0.33": _row(share=THIRD),
    "mlp-0.4": _row(share=0.4),
    "mlp-0.5": _row(share=0.5),
    "mlp-0.4-core-0.1": _row(share=0.4, core=0.1),
    "mlp-0.5-core-0.1": _row(share=0.5, core=0.1),
    # the fork: the first 2, 3 or 4 of MiniLM's 6 layers run once
    "fork-2": _row(fork=2),
    "fork-3": _row(fork=3),
    "fork-4": _row(fork=4),
    # heads per member: a third (ratio 0.67) and a quarter (0.75) instead of half
    "prune67": _row(ratio=0.67),
    "prune75": _row(ratio=0.75),
    # combinations
    "fork3-mlp-0.33": _row(fork=3, share=THIRD),
    "fork2-mlp-0.4": _row(fork=2, share=0.4),
    "fork2-mlp-0.5-core-0.1": _row(fork=2, share=0.5, core=0.1),
    "fork3-mlp-0.5": _row(fork=3, share=0.5),
    "prune67-mlp-0.33": _row(share=THIRD, ratio=0.67),
}
