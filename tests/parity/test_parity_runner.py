"""run_parity end to end on a tiny ViT: a correct FP32 engine passes, a broken one fails numeric AND UQ
parity, a missing engine is exit 2, NaN is located, runners are activated and deactivated properly."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from junitparser import Failure, JUnitXml
from parity_models import SPECS, broken_copy

from toolchain.engines import make_runner
from toolchain.engines.base import Runner, TensorSpec
from toolchain.errors import CheckFailed, ToolchainError
from toolchain.export import export_onnx, write_precision_variant
from toolchain.metrics import report_keys
from toolchain.parity import ReferenceEvaluatorRunner, Tolerance, run_parity

UQ_KEYS = report_keys(with_probs_ood=True, with_members=False)


def _run(case, candidates, out_dir=None, **kw):
    return run_parity(case.reference(), candidates, case.generated, case.id_feeds, case.ood_feeds, out_dir=out_dir,
                      **kw)


def test_fp32_onnxruntime_engine_passes(vit_case, tmp_path):
    verdict = _run(vit_case, {"ort-fp32": make_runner("onnxrt-cpu", path=vit_case.onnx_path)}, tmp_path)
    assert verdict.exit_code == 0, verdict.problems()
    names = [c.name for c in verdict.checks]
    assert names == ["run", "numeric/logits", "numeric/probs", *[f"uq/{k}" for k in UQ_KEYS]]
    report = json.loads((tmp_path / "report.json").read_text())
    logits = report["engines"]["ort-fp32"]["checks"][1]["data"]
    assert logits["max_abs_err"] < 1e-4 and logits["argmax_agreement"] == 1.0
    assert logits["polygraphy"]["passed"] is True
    assert [f["shape"] for f in logits["per_feed"]][:3] == [[1, 10], [3, 10], [8, 10]]
    xml = JUnitXml.fromfile(str(tmp_path / "junit.xml"))
    assert sum(1 for suite in xml for _ in suite) == len(verdict.checks)
    assert (tmp_path / "summary.md").read_text().startswith("## Parity: PASS (exit 0)")


def test_broken_engine_fails_numeric_and_uq_parity(vit_case, tmp_path):
    broken, weight = broken_copy(vit_case.onnx_path, tmp_path / "broken.onnx", relative=0.5)
    verdict = _run(vit_case, {"ort-fp32": make_runner("onnxrt-cpu", path=vit_case.onnx_path),
                              "ort-broken": make_runner("onnxrt-cpu", path=broken)}, tmp_path / "out")
    assert verdict.exit_code == 1
    assert all(c.status == "pass" for c in verdict.engine_checks("ort-fp32"))
    failed = {c.name: c.message for c in verdict.failures}
    assert all(c.engine == "ort-broken" for c in verdict.failures)
    assert {"numeric/logits", "numeric/probs"} <= set(failed), weight
    assert failed["numeric/logits"].startswith("output 'logits': FAIL") and "max|c-r|" in failed["numeric/logits"]
    uq_failed = [name for name in failed if name.startswith("uq/")]
    assert uq_failed, "the perturbed classifier must move the UQ metrics"
    for name in uq_failed:
        metric = name.split("/", 1)[1]
        assert failed[name].startswith(f"{metric}: FAIL: reference") and "delta" in failed[name]
    with pytest.raises(CheckFailed) as info:
        verdict.raise_for_status()
    assert all(name in str(info.value) for name in failed)  # every failure listed, not only the first
    xml = JUnitXml.fromfile(str(tmp_path / "out" / "junit.xml"))
    junit_failures = [(case.classname, case.name) for suite in xml for case in suite
                      if any(isinstance(r, Failure) for r in case.result)]
    assert sorted(junit_failures) == sorted(("parity.ort-broken", name) for name in failed)


def test_missing_engine_file_is_exit_2_and_other_engines_still_run(vit_case, tmp_path):
    verdict = _run(vit_case, {"ort-fp32": make_runner("onnxrt-cpu", path=vit_case.onnx_path),
                              "missing": make_runner("onnxrt-cpu", path=tmp_path / "nope.onnx")}, tmp_path)
    assert verdict.exit_code == 2
    (error,) = verdict.errors
    assert error.engine == "missing" and error.name == "run" and "nope.onnx" in error.message
    assert all(c.status == "pass" for c in verdict.engine_checks("ort-fp32"))
    with pytest.raises(ToolchainError) as info:
        verdict.raise_for_status()
    assert info.value.exit_code == 2
    assert json.loads((tmp_path / "report.json").read_text())["exit_code"] == 2


def test_bad_inputs_raise_with_exit_2(vit_case):
    good = {"ort": make_runner("onnxrt-cpu", path=vit_case.onnx_path)}
    feed, labels = vit_case.id_feeds[0]
    with pytest.raises(ToolchainError, match=r"id_feeds\[0\] has 99 labels"):
        run_parity(vit_case.reference(), good, vit_case.generated, [(feed, labels[:99])], [])
    with pytest.raises(ToolchainError, match="no feeds"):
        run_parity(vit_case.reference(), good, [], [], [])
    with pytest.raises(ToolchainError, match="not numpy arrays"):
        run_parity(vit_case.reference(), good, [{"pixel_values": [[0.0]]}], [], [])
    with pytest.raises(ToolchainError, match="unknown engine"):
        run_parity(vit_case.reference(), good, vit_case.generated, [], [], precisions={"trt": "fp16"})
    with pytest.raises(ToolchainError, match="no candidate"):
        run_parity(vit_case.reference(), {}, vit_case.generated, [], [])


def test_bad_feed_shape_for_one_engine_is_a_run_error(vit_case):
    verdict = run_parity(vit_case.reference(), {"ort": make_runner("onnxrt-cpu", path=vit_case.onnx_path)},
                         [{"pixel_values": np.zeros((1, 1, 8, 8), np.float32)}], [], [])
    assert verdict.exit_code == 2
    assert "reference" in verdict.errors[0].engine and "axis 2 is 8, expected 16" in verdict.errors[0].message


def test_runners_are_activated_and_deactivated(vit_case):
    reference = vit_case.reference()
    owned = make_runner("onnxrt-cpu", path=vit_case.onnx_path)
    shared = make_runner("onnxrt-cpu", path=vit_case.onnx_path)
    shared.activate()
    verdict = run_parity(reference, {"owned": owned, "shared": shared}, vit_case.generated, [], [])
    assert verdict.exit_code == 0
    assert not reference.is_active and not owned.is_active
    assert shared.is_active  # the caller activated it: the caller deactivates it
    shared.deactivate()


class _NaNRunner(Runner):
    """The torch reference, with NaN written into one output of one feed."""

    kind = "nan-test"

    def __init__(self, module, poison_batch: int, index: tuple[int, int]) -> None:
        super().__init__(name="nan")
        self.module, self.poison_batch, self.index = module, poison_batch, index

    def _activate_impl(self) -> None:
        pass

    def _deactivate_impl(self) -> None:
        pass

    def _input_specs_impl(self):
        return {"pixel_values": TensorSpec(np.dtype(np.float32), ("batch", 1, 16, 16))}

    def _infer_impl(self, feed):
        with torch.inference_mode():
            out = {k: v.numpy().copy() for k, v in self.module(pixel_values=torch.from_numpy(feed["pixel_values"]))
                   .items()}
        if feed["pixel_values"].shape[0] == self.poison_batch:
            out["probs"][self.index] = np.nan
        return out


def test_nan_fails_with_output_feed_and_first_index(vit_case):
    verdict = run_parity(vit_case.reference(), {"nan": _NaNRunner(vit_case.module, 3, (1, 4))},
                         vit_case.generated, [], [], tolerances={"": Tolerance(1e6, 1e6, "median")})
    (failure,) = verdict.failures
    assert failure.name == "numeric/probs"
    assert "generated[1]" in failure.message and "index (1, 4)" in failure.message and "nan" in failure.message
    assert failure.data["nonfinite"]["index"] == [1, 4]


def test_nan_in_eval_outputs_fails_every_uq_metric(vit_case):
    verdict = _run(vit_case, {"nan": _NaNRunner(vit_case.module, 100, (0, 0))})
    uq = [c for c in verdict.checks if c.kind == "uq"]
    assert len(uq) == len(UQ_KEYS) and all(c.status == "fail" for c in uq)
    assert "cannot be scored" in uq[0].message and "non-finite" in uq[0].message


def test_per_engine_tolerances(vit_case):
    runners = {name: make_runner("onnxrt-cpu", path=vit_case.onnx_path) for name in ("strict", "default")}
    verdict = run_parity(vit_case.reference(), runners, vit_case.generated, [], [],
                         tolerances={"strict": {"probs": Tolerance(0.0, 0.0)}})
    assert [(c.engine, c.name) for c in verdict.failures] == [("strict", "numeric/probs")]
    assert verdict.meta["tolerances"]["default"]["probs"]["atol"] == 1e-5


def test_correct_fp16_and_bf16_graphs_pass_their_default_tolerances(vit_case, tmp_path):
    fp16 = tmp_path / "vit.fp16.onnx"
    bf16 = tmp_path / "vit.bf16.onnx"
    write_precision_variant(vit_case.onnx_path, fp16, "fp16")
    write_precision_variant(vit_case.onnx_path, bf16, "bf16")
    candidates = {"ort-fp16": make_runner("onnxrt-cpu", path=fp16), "true-fp16": ReferenceEvaluatorRunner(fp16),
                  "true-bf16": ReferenceEvaluatorRunner(bf16)}
    precisions = {"ort-fp16": "fp16", "true-fp16": "fp16", "true-bf16": "bf16"}
    verdict = run_parity(vit_case.reference(), candidates, vit_case.generated, vit_case.id_feeds[:1], [],
                         precisions=precisions)
    numeric = [c for c in verdict.checks if c.kind == "numeric"]
    assert len(numeric) == 6 and all(c.status == "pass" for c in numeric), verdict.problems()
    # the same BF16 graph fails the FP16 tolerances on 100 images: the defaults tell the precisions apart
    images = [vit_case.id_feeds[0][0]]
    strict = run_parity(vit_case.reference(), {"true-bf16": ReferenceEvaluatorRunner(bf16)}, images, [], [],
                        precisions={"true-bf16": "fp16"})
    assert strict.exit_code == 1 and {c.name for c in strict.failures} <= {"numeric/logits", "numeric/probs"}


def test_fused_hydra_model_with_member_logits(tmp_path):
    hydra = pytest.importorskip("toolchain.hydra")
    from toolchain.models.tiny import tiny_vit

    tiny = tiny_vit()
    masks = torch.zeros(3, 2, 4, dtype=torch.bool)
    for m in range(3):
        masks[m, :, [m, (m + 1) % 4]] = True
    model = hydra.fuse(tiny.adapter, masks).eval()
    path = tmp_path / "hydra.onnx"
    outputs = ["probs", "member_logits"]
    export_onnx(model, {"pixel_values": tiny.make_batch(2)["pixel_values"]}, outputs, path,
                dynamic_axes={"pixel_values": {0: "batch"}, **{o: {0: "batch"} for o in outputs}})
    feeds = [{"pixel_values": tiny.make_batch(b, seed=b)["pixel_values"].numpy()} for b in (1, 4)]
    x_id = tiny.make_batch(64, seed=7)["pixel_values"].numpy()
    labels = (np.arange(64) % 10).astype(np.int64)
    x_ood = np.random.default_rng(0).uniform(-3, 3, (32, 1, 16, 16)).astype(np.float32)
    reference = make_runner("torch", module=model, input_specs=SPECS, name="hydra-torch")
    verdict = run_parity(reference, {"hydra-ort": make_runner("onnxrt-cpu", path=path)}, feeds,
                         [({"pixel_values": x_id}, labels)], [{"pixel_values": x_ood}])
    assert verdict.exit_code == 0, verdict.problems()
    names = {c.name for c in verdict.checks}
    assert {"numeric/probs", "numeric/member_logits", "uq/auroc_mi", "uq/fpr95_disagreement"} <= names
    members = next(c for c in verdict.checks if c.name == "numeric/member_logits")
    assert members.data["argmax_rows"] == (1 + 4 + 64 + 32) * 3  # [B, M, C]: one row per sample and member
