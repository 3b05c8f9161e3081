"""Parity gates for CI: every engine against the FP32 reference, numerically and on UQ metrics.

* :mod:`.tolerances` - per-precision, per-output tolerances (atol AND rtol, a named statistic,
  ``""`` default key), UQ-metric tolerances, the exact pass rule and the measurements behind
  the defaults;
* :mod:`.numeric` - per-output errors, cosine, argmax agreement, NaN/Inf with the first index,
  and a Polygraphy ``Comparator.compare_accuracy`` cross-check;
* :mod:`.uq` - :func:`toolchain.metrics.uq_report` of reference vs candidate, one check per metric;
* :mod:`.verdict` - the verdict as data: ``report.json``, ``junit.xml``, ``summary.md``, exit code;
* :mod:`.weights` - :func:`weight_parity`: every weight a graph carries against the reference
  parameter it came from, at the graph's own rounding (a stale or wrong weight is found exactly);
* :mod:`.runner` - :func:`run_parity` (``graphs=``: a ``weights`` check per engine);
* :mod:`.rescue` - :func:`rescue_precision`: the smallest FP32 node set that makes a FP16/BF16
  graph pass;
* :mod:`.reference_engine` - an ``onnx.reference`` runner (true FP16/BF16 arithmetic on CPU);
* :mod:`.localize` - ``parity --localize``: where a failing graph first diverges, layer by layer
  against PyTorch and (:mod:`.localize_graph`) node by node against the FP32 graph, a baseline
  graph or the graph cast up to FP32 (:mod:`.scopes`: a graph's values by module scope).

Typical use (exit code 0 pass, 1 a check failed, 2 the run could not happen)::

    verdict = run_parity(make_runner("torch", module=m, input_specs=specs),
                         {"ort-fp16": make_runner("onnxrt-cpu", path=p16)},
                         generated_feeds, id_feeds, ood_feeds, out_dir=Path("parity"),
                         precisions={"ort-fp16": "fp16"})
    verdict.raise_for_status()
"""

from toolchain.parity.numeric import OutputComparison, compare_outputs, polygraphy_cross_check
from toolchain.parity.reference_engine import ReferenceEvaluatorRunner
from toolchain.parity.rescue import RescueResult, rescue_int8, rescue_precision
from toolchain.parity.runner import ParityData, check_candidate, engine_tolerances, run_parity
from toolchain.parity.tolerances import (
    DEFAULT_UQ_TOLERANCES,
    INT8_UQ_TOLERANCES,
    MetricTolerance,
    Tolerance,
    ToleranceError,
    default_tolerances,
    evaluate_rule,
    parse_tolerances,
    parse_uq_tolerances,
)
from toolchain.parity.uq import MetricCheck, UQOutputs, uq_parity
from toolchain.parity.verdict import Check, Verdict
from toolchain.parity.weights import TensorMatch, WeightReport, weight_parity

__all__ = [
    "DEFAULT_UQ_TOLERANCES",
    "INT8_UQ_TOLERANCES",
    "Check",
    "MetricCheck",
    "MetricTolerance",
    "OutputComparison",
    "ParityData",
    "ReferenceEvaluatorRunner",
    "RescueResult",
    "TensorMatch",
    "Tolerance",
    "ToleranceError",
    "UQOutputs",
    "Verdict",
    "WeightReport",
    "check_candidate",
    "compare_outputs",
    "default_tolerances",
    "engine_tolerances",
    "evaluate_rule",
    "parse_tolerances",
    "parse_uq_tolerances",
    "polygraphy_cross_check",
    "rescue_int8",
    "rescue_precision",
    "run_parity",
    "uq_parity",
    "weight_parity",
]
