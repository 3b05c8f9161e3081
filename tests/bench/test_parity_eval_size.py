"""benchmarks/parity_tolerances/eval_size.py: its bookkeeping of the normalised error on synthetic outputs."""

from __future__ import annotations

import numpy as np
import pytest

from toolchain.parity.tolerances import default_tolerances


def test_first_rows_are_the_first_128_id_and_128_ood_rows(parity_eval_size):
    ident = [np.full((64, 2), i, float) for i in range(3)]  # 192 ID rows, row values = feed index
    ood = [np.full((64, 2), 10 + i, float) for i in range(3)]
    first = parity_eval_size._first_rows([*ident, *ood], n_id_feeds=3)
    assert first.size == 256 * 2
    assert sorted(set(first.tolist())) == [0, 1, 10, 11]  # feeds 2 and 12 lie beyond the first 128 rows


@pytest.mark.parametrize(("tail", "passes"), [(1.03, True), (5.0, False)])
def test_per_output_statistics_and_the_default_rules_verdict(parity_eval_size, tail, passes):
    atol = default_tolerances("bf16")["logits"].atol
    rng = np.random.default_rng(0)
    ref = [{"logits": np.zeros((64, 8))} for _ in range(20)]  # 2 generated feeds, 9 ID feeds, 9 OOD feeds
    cand = [{"logits": rng.uniform(-0.3, 0.3, (64, 8)) * atol} for _ in range(20)]
    cand[-1]["logits"][5, 3] = tail * atol  # one element of the last OOD feed
    out = parity_eval_size._per_output(ref, cand, "logits", "bf16", n_generated=2, n_ident=9)
    assert out["elements"] == 20 * 64 * 8 and out["over_1"] == 1
    assert out["max"] == pytest.approx(tail) and out["q0.999"] < 0.31
    assert out["max_first_256_rows"] < 0.31  # the tail is not in the first 128 OOD rows
    assert out["passes_default_rule"] is passes and "max <= 4" in out["default_rule"]


def test_the_differential_rule_compares_with_the_emulation_of_the_same_graph(parity_eval_size):
    emu = {"max": 1.0, "q0.999": 0.4}
    same = parity_eval_size._differential({"max": 2.0, "q0.999": 0.5}, emu)
    assert same["ratio_max"] == pytest.approx(2.0) and same["passes_k2"] and same["passes_k3"]
    worse = parity_eval_size._differential({"max": 2.5, "q0.999": 0.5}, emu)
    assert not worse["passes_k2"] and worse["passes_k3"]
    exact = parity_eval_size._differential({"max": 0.002, "q0.999": 0.001}, {"max": 0.0, "q0.999": 0.0})
    assert exact["passes_k2"]  # an exact emulation is floored, not a division by zero
    rows = [{"logits": {"passes_default_rule": True, "differential": same},
             "probs": {"passes_default_rule": True, "differential": worse}}]
    assert parity_eval_size._caught(rows, None) == 0 and parity_eval_size._caught(rows, 2) == 1
    assert parity_eval_size._caught(rows, 3) == 0
