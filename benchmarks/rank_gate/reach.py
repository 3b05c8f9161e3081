"""How far correct engines move the inputs of the UQ scores, in unit roundoffs: the reach ``ULPS[p]``.

The parity gate's rank bound (:mod:`toolchain.parity.resolution`) and its flip rule
(:mod:`toolchain.parity.flips`) model a correct engine at precision ``p`` as moving every
probability by a relative ``ULPS[p] * u`` (``u``: fp32 2^-24, fp16 2^-11, bf16 2^-8) and every
member logit by ``ULPS[p] * u * max(|z|, 1)``. This script measures those moves on a recipe's real
graphs, run as the parity stage runs them (every ID and OOD row of its parity inputs), against the
PyTorch reference, per candidate:

* ``probs``: ``|c / r - 1| / u`` over the probabilities that matter to the scores (the
  reference's top two classes of each row, where flips and MSP live);
* ``margin``: ``|delta log(p1 / p2)| / (2 u)`` of the reference's top two classes, the move the flip
  rule's reach must cover (two probabilities moving apart by ``eps`` each change it by ``~2 eps``);
* ``member_logits``: ``|c - r| / max(|r|, 1) / u``.

It prints and writes (``--out``) the largest value, the 0.999 and 0.99 quantiles of each, per
candidate, and per precision the largest over candidates: what ``ULPS`` must reach.

    python benchmarks/rank_gate/reach.py --recipe recipes/own-checkpoint.yaml --engines onnxrt-cpu,openvino-cpu
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from run import ROOT, RealCase, _concat  # noqa: E402

from toolchain.parity.resolution import UNIT_ROUNDOFF  # noqa: E402


def _stats(values: np.ndarray) -> dict[str, float]:
    v = np.asarray(values, dtype=np.float64).ravel()
    v = v[np.isfinite(v)]
    if not v.size:
        return {"max": 0.0, "q0.999": 0.0, "q0.99": 0.0, "n": 0}
    return {"max": float(v.max()), "q0.999": float(np.quantile(v, 0.999)), "q0.99": float(np.quantile(v, 0.99)),
            "n": int(v.size)}


def moves(ref: dict[str, np.ndarray], cand: dict[str, np.ndarray], precision: str) -> dict[str, dict[str, float]]:
    """The three measurements of the module docstring, in unit roundoffs of ``precision``."""
    u = UNIT_ROUNDOFF[precision]
    out: dict[str, dict[str, float]] = {}
    r, c = ref["probs"], cand["probs"]
    top2 = np.argsort(r, axis=1)[:, ::-1][:, :2]
    r2, c2 = np.take_along_axis(r, top2, 1), np.take_along_axis(c, top2, 1)
    with np.errstate(divide="ignore", invalid="ignore"):
        out["probs"] = _stats(np.abs(c2 / r2 - 1.0) / u)
        out["margin"] = _stats(np.abs(np.log(c2[:, 0] / c2[:, 1]) - np.log(r2[:, 0] / r2[:, 1])) / (2 * u))
    if "member_logits" in ref and "member_logits" in cand:
        z, zc = ref["member_logits"], cand["member_logits"]
        out["member_logits"] = _stats(np.abs(zc - z) / np.maximum(np.abs(z), 1.0) / u)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--recipe", default=str(ROOT / "recipes" / "own-checkpoint.yaml"))
    p.add_argument("--profile", default=None)
    p.add_argument("--engines", default="onnxrt-cpu,openvino-cpu")
    p.add_argument("--precisions", default="fp32,fp16,bf16")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", type=Path, default=None, help="JSON file of the measurements")
    args = p.parse_args(argv)
    from toolchain.engines import engine_kind

    t0 = time.time()
    kinds = [k.strip() for k in args.engines.split(",") if k.strip()]
    precisions = [x.strip() for x in args.precisions.split(",") if x.strip()]
    case = RealCase(args.recipe, args.profile, args.threads, any(engine_kind(k).needs_build for k in kinds),
                    deep_ensemble=False)
    result: dict[str, Any] = {"recipe": case.ctx.recipe.name, "rows": len(case.labels), "candidates": {},
                              "largest": {}}
    for group in ("hydra", "single"):
        ref_id, ref_ood, _ = case.reference(group)
        ref = _concat([*ref_id, *ref_ood])
        for label, precision, runner in case.candidates(group, kinds, precisions):
            c_id, c_ood = case.run(runner)
            m = moves(ref, _concat([*c_id, *c_ood]), precision)
            result["candidates"][label] = {"precision": precision, **m}
            largest = result["largest"].setdefault(precision, {})
            for what, st in m.items():
                largest[what] = max(largest.get(what, 0.0), st["max"])
            print(f"{label} ({precision}): " + "; ".join(f"{k} max {v['max']:.3g} q0.999 {v['q0.999']:.3g}"
                                                       for k, v in m.items()), flush=True)
    result["seconds"] = time.time() - t0
    result["command"] = "python benchmarks/rank_gate/reach.py" + "".join(
        f" {a}" for a in (argv if argv is not None else sys.argv[1:]))
    print(json.dumps(result["largest"], indent=1))
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
