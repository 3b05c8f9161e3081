"""BF16 graphs gated on CPU: onnxrt-cpu-bf16emu through run_parity, against onnx.reference and a broken graph."""

from __future__ import annotations

import numpy as np
from parity_models import bf16_verdict

from toolchain.engines import make_runner
from toolchain.parity import ReferenceEvaluatorRunner


def test_bf16_graph_gets_numeric_and_uq_verdicts_and_a_broken_one_fails(vit_case, tmp_path):
    verdict, bf16 = bf16_verdict(vit_case, tmp_path, relative=0.5)
    good = verdict.engine_checks("emu-bf16")
    assert {c.kind for c in good} == {"run", "numeric", "uq"}
    assert not [c.message for c in good if c.status in ("fail", "error")]
    assert all(c.status == "pass" for c in good if c.kind == "numeric")
    failed = {c.name for c in verdict.failures if c.engine == "emu-broken"}
    assert {"numeric/logits", "numeric/probs"} <= failed
    assert verdict.exit_code == 1

    # the emulation and onnx.reference (numpy bfloat16) compute the same BF16 graph; both differ from FP32
    feed = vit_case.id_feeds[0][0]
    with make_runner("onnxrt-cpu-bf16emu", path=bf16) as emu, ReferenceEvaluatorRunner(bf16) as ref, \
            make_runner("onnxrt-cpu", path=vit_case.onnx_path) as fp32:
        e, r, f = (x.infer(feed)["logits"] for x in (emu, ref, fp32))
    assert np.abs(e - r).max() < 0.5 * np.abs(f - r).max()
    assert np.abs(e - f).max() > 1e-3  # BF16 rounding is really there
