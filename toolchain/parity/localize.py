"""``parity --localize``: where a failing graph or engine first diverges, in graph order.

Every value is judged by the parity gate's own rule (:func:`~toolchain.parity.tolerances.evaluate_rule`
with the candidate precision's default ``""`` tolerance, the logits rule: FP32 the elementwise max
rule, FP16/BF16 the normalised-error quantile rule with its max and per-feed bounds), in the value's
own units: its ``atol`` is scaled by the value's RMS over the RMS of the output that rule is for
(``logits``, ``member_logits``), so on that output it is exactly the gate's rule, and a residual
stream a tenth the size of the logits gets a tenth the absolute slack (an unscaled BF16 ``atol`` of
0.1 let a ViT's corrupted MLP output pass and blamed the next LayerNorm, which rescales it). Two
comparisons:

* :func:`localize_against_torch` - layer by layer against the PyTorch module the graph was exported
  from. The TorchScript exporter names every node after the module that made it
  (``/module/model/bert/encoder/layer.1/attention/self/query/MatMul``), so a module's ONNX value is
  the float value that its scope's nodes produce and nodes outside the scope read (its output);
  forward hooks on the same module give PyTorch's. These module outputs are the sites.
* :func:`~toolchain.parity.localize_graph.localize_against_graph` - node by node against a reference
  graph run in ONNX Runtime: the FP32 graph an FP16/BF16 graph or compiled engine was made from
  (:func:`~toolchain.parity.localize_graph.localize_against_fp32`), a ``--baseline`` graph, or the
  low-precision graph itself cast up to FP32 (:func:`~toolchain.parity.localize_graph.cast_up`: the
  same weights, so only where 16-bit arithmetic loses digits shows). It needs no module-scoped
  names: values are matched by name (a precision pass keeps them), else by structure
  (:func:`~toolchain.parity.localize_graph.match_values`: op, attributes and inputs, recursively; a
  renamed graph, another exporter's numbering). The sites are the outputs of the scopes found in
  the node names (block boundaries) when there are any, else every matched float value; the
  walk-back below then goes node by node. A walk-back that ends on a node that only moves elements
  (a decoder's last-token pooling ``Gather``) goes on through the values whose largest normalised
  error exceeds 1: such a node fails because it selects elements its input held, which the rule's
  quantile let pass there.

Module paths: the exporter's scope can differ from the module's path by a wrapper prefix both
ways (:func:`map_scopes`: a BERT graph's ``/module/model/bert/...`` is ``model.bert``, a LLaMA
graph's ``/module/model/layers.0/...`` is ``model.model.layers.0``).

Search (both): the candidate's final outputs must fail on the chosen feeds, unmarked (else there is
nothing to localise and the report says so). Bisection: mark ``per_round`` sites spread evenly
between the last passing and the first failing one (graph order; the final outputs fail), run the
candidate and the reference with them exposed as extra outputs, keep the first failing site and the
last passing one before it, repeat until none lies between (against the FP32 graph, then once more
node by node between those two boundaries). Walk-back: from that value, check the
nearest checkable values it is computed from (module outputs against PyTorch; every float node
output against the FP32 graph); while one fails, move to the earliest failing one. The answer is a
value that fails the rule while every checked value it is computed from passes: the divergence
starts in the nodes between (against PyTorch: in that module; against FP32: at that node). The
bisection assumes a divergence propagates downstream, as :mod:`~toolchain.parity.rescue` does; the
walk-back makes the answer local anyway (a passing site on a parallel branch cannot hide it).
Against PyTorch the module's initializers are also compared with its parameters (up to transpose,
within the precision's rounding), which names the node reading a wrong weight; against FP32 the
node's low-precision weights are compared with the FP32 graph's.

Marking: exposing values changes which kernels a compiler fuses and can hide or create a failure
(TensorRT issues #2571, #3452, #4837). Every marked run's final outputs are judged against the
reference's with the gate's output tolerances; :attr:`Localization.survived_marking` says whether
the failure survived every marking, and a note names the runs where it did not.

Engines: the candidate runs through ``run_marked(path) -> Runner`` (a
:class:`~toolchain.engines.base.Runner` for an ONNX file with extra outputs, made the way the failing
engine is made: an engine compiled from the graph compiles the marked copy); :func:`onnx_runner`
makes the default through the engine registry. Elements equal in both runs (matching ±inf/NaN such as
masked attention scores) and elements both at or beyond the candidate precision's largest finite
value with the same sign (a mask fill of ``finfo(float32).min`` clamped to -65504 in FP16) count as
exact. The values are compared on a few feeds (:func:`pick_feeds`: the feeds with the largest
errors in the failing checks, up to ``max_rows`` rows).
"""

from __future__ import annotations

import logging
import math
import tempfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from toolchain.engines.base import Runner
from toolchain.errors import GraphError, ToolchainError
from toolchain.parity.hooks import ModuleValues, module_outputs
from toolchain.parity.scopes import (
    LARGEST,
    Graph,
    Site,
    block_of,
    module_weight_mismatches,
    scope_outputs,
    sites_from,
    upstream,
)
from toolchain.parity.tolerances import Tolerance, default_tolerances, evaluate_rule, resolve_tolerance
from toolchain.parity.verdict import jsonable

__all__ = [
    "Localization",
    "RunMarked",
    "SiteCheck",
    "localize_against_torch",
    "map_scopes",
    "module_outputs",
    "onnx_runner",
    "pick_feeds",
]

log = logging.getLogger(__name__)

Feed = Mapping[str, np.ndarray]
Values = list[dict[str, np.ndarray]]  #: per feed, value name -> array
RunMarked = Callable[[Path], Runner]  #: an ONNX file (with extra outputs) -> a runner of it, not yet active

_MAX_WALK = 64
#: ops that only compute shapes or constants: not listed among the nodes where a divergence starts
_PLUMBING = frozenset({"Shape", "Constant", "ConstantOfShape", "Gather", "Unsqueeze", "Squeeze", "Concat", "Cast",
                       "Range", "Equal", "Where", "Expand", "Reshape", "Transpose", "Identity", "Slice", "Size"})
_LARGE_PROTO = int(1.5 * 2**30)


def onnx_runner(kind: str | None = None, precision: str = "fp32", **options: Any) -> RunMarked:
    """The default ``run_marked``: the registry's runner of ``kind`` for a marked graph at ``precision``.

    ``kind`` None is the CPU kind every recipe has (the registry's first default kind that runs
    files); BF16 graphs then run on its substitute, the exact-rounding emulation
    (:func:`~toolchain.engines.registry.resolve_kind`). A kind that compiles FP32 graphs at a
    precision (OpenVINO) compiles the marked FP32 graph at ``precision``, as the failing engine was.
    ``options`` go to :func:`~toolchain.engines.runner_for` (``threads`` ...).
    """
    from toolchain.engines import default_engines, engine_kind, resolve_kind, runner_for

    kind = kind or next(k for k in default_engines() if engine_kind(k).runs_files)
    actual = resolve_kind(kind, precision)
    if actual is None:
        raise GraphError(f"localize: the engine kind '{kind}' does not run {precision} graphs.")
    return lambda path: runner_for(actual, {"path": str(path), "precision": precision}, **options)


# ------------------------------------------------------------------------------------ results
@dataclass
class SiteCheck:
    """One value compared: where it is and its error under the rule (``status``: pass | fail | unmatched)."""

    value: str
    node: str
    op_type: str
    layer: str
    status: str
    statistic: float = math.nan  #: the rule's statistic of the normalised error (<= 1 passes)
    max_error: float = math.nan  #: the largest normalised error
    failed: str | None = None  #: the rule clause that failed (stat | max_limit | feed | nonfinite)
    atol: float = math.nan  #: the rule's atol in this value's units (the module docstring)
    run: int = 0  #: the marked run that exposed it (1-based)
    position: int = 0  #: its place in graph order
    detail: str = ""

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields (the graph-order position left out)."""
        out = asdict(self)
        out.pop("position")
        return out


#: what a node-by-node reference is, in the report: ``against`` -> words
_AGAINST = {"fp32-graph": "the FP32 graph", "baseline": "the baseline graph",
            "fp32-cast": "itself run in FP32 (its low-precision weights and casts made FP32)"}


@dataclass
class Localization:
    """Where a candidate first diverges from its reference (see the module docstring)."""

    against: str  #: ``pytorch`` | ``fp32-graph`` | ``baseline`` | ``fp32-cast``
    graph: str
    precision: str
    rule: str  #: the rule every intermediate value is judged by
    found: bool = False
    value: str | None = None  #: the first diverging value
    node: str | None = None  #: the node where it diverges (its producer, or the node reading a wrong weight)
    op_type: str | None = None
    layer: str | None = None  #: the module path of that node's scope
    block: str | None = None  #: the enclosing numbered block (``model.bert.encoder.layer.1``)
    statistic: float | None = None
    max_error: float | None = None
    failed: str | None = None
    fails_unmarked: bool | None = None  #: the unmarked candidate fails on the localisation feeds
    survived_marking: bool | None = None  #: every marked run still failed the rule on the final outputs
    runs: list[dict[str, Any]] = field(default_factory=list)  #: per marked run: marked values, final outputs
    checked: list[SiteCheck] = field(default_factory=list)  #: every value compared, in graph order
    nodes: list[str] = field(default_factory=list)  #: the nodes computing the value from inputs that pass
    weights: list[dict[str, Any]] = field(default_factory=list)  #: weights read by those nodes that differ
    feeds: list[str] = field(default_factory=list)
    rows: int = 0
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: the answer, the one-line summary, every checked value and every marked run."""
        out = {k: v for k, v in asdict(self).items() if k != "checked"}
        out["checked"] = [c.to_dict() for c in self.checked]
        out["summary"] = self.summary()
        return jsonable(out)

    def summary(self) -> str:
        """One line for the console and ``summary.md``."""
        what = "PyTorch" if self.against == "pytorch" else _AGAINST.get(self.against, self.against)
        head = f"{self.graph} ({self.precision}) vs {what}: "
        if not self.found:
            return head + "not localised: " + ("; ".join(self.notes) or "no value diverges")
        text = (head + f"first diverges at node {self.node} ({self.op_type}), layer {self.layer or '-'}"
                + (f" (block {self.block})" if self.block and self.block != self.layer else "")
                + f": value {self.value} has {self.failed or 'stat'} normalised error {self.statistic:.3g} "
                f"(max {self.max_error:.3g}) under {self.rule}")
        if self.weights:
            w = self.weights[0]
            text += f"; weight {w['initializer']} differs from {w['reference']} (max |diff| {w['max_abs_diff']:.3g})"
        marks = ("the failure survived every marking" if self.survived_marking else
                 "the failure did NOT survive every marking (see notes)")
        return text + (f"; {len(self.checked)} values checked in {len(self.runs)} marked runs on {self.rows} rows; "
                       f"{marks}")


# ------------------------------------------------------------------------------------ comparisons
def _judge(reference: Sequence[np.ndarray], candidate: Sequence[np.ndarray], tol: Tolerance,
           precision: str) -> tuple[str, Any, str]:
    """``(status, RuleResult | None, detail)`` of one value over every feed (see the module docstring)."""
    shapes = [(np.shape(r), np.shape(c)) for r, c in zip(reference, candidate)]
    bad = [s for s in shapes if s[0] != s[1]]
    if bad:
        return "unmatched", None, f"shape {list(bad[0][1])} vs the reference's {list(bad[0][0])}"
    r = np.concatenate([np.asarray(x, dtype=np.float64).reshape(-1) for x in reference])
    c = np.concatenate([np.asarray(x, dtype=np.float64).reshape(-1) for x in candidate])
    largest = LARGEST.get(precision, LARGEST["fp32"])
    with np.errstate(invalid="ignore"):
        exact = (c == r) | (np.isnan(c) & np.isnan(r)) | ((np.abs(r) >= largest) & (np.abs(c) >= largest)
                                                         & (np.sign(c) == np.sign(r)))
    c, r = np.where(exact, 0.0, c), np.where(exact, 0.0, r)
    rule = evaluate_rule(c, r, tol, feed_sizes=[int(np.size(x)) for x in reference])
    return ("pass" if rule.passed else "fail"), rule, ""


def _judge_outputs(reference: Values, candidate: Values, tolerances: Mapping[str, Tolerance],
                   precision: str) -> dict[str, dict[str, Any]]:
    """Per final output: passed, statistic, max error (the gate's output rule)."""
    out = {}
    for name in reference[0] if reference else []:
        if not all(name in c for c in candidate):
            continue
        status, rule, detail = _judge([r[name] for r in reference], [c[name] for c in candidate],
                                      resolve_tolerance(tolerances, name), precision)
        out[name] = {"passed": status == "pass", "statistic": rule.value if rule else math.nan,
                     "max_error": rule.max_value if rule else math.nan, "failed": rule.failed if rule else detail}
    return out


# ------------------------------------------------------------------------------------ running
class _Marked:
    """The candidate graph run with some values exposed as extra outputs."""

    def __init__(self, graph: Graph, run_marked: RunMarked, feeds: Sequence[Feed], workdir: Path) -> None:
        self.graph, self.run_marked, self.feeds, self.workdir = graph, run_marked, feeds, workdir
        self.count = 0

    def run(self, names: Sequence[str]) -> Values:
        model = onnx.ModelProto()
        model.CopyFrom(self.graph.model)
        outputs = set(self.graph.outputs)
        for name in names:
            if name not in outputs:
                model.graph.output.append(self.graph.infos[name])
        self.count += 1
        path = self.workdir / f"marked-{self.count}.onnx"
        external = model.ByteSize() > _LARGE_PROTO
        onnx.save_model(model, str(path), save_as_external_data=external, all_tensors_to_one_file=True,
                        location=f"{path.name}.data" if external else None)
        try:
            with self.run_marked(path) as runner:
                return [{k: np.asarray(v) for k, v in runner.infer(dict(feed)).items()} for feed in self.feeds]
        finally:
            path.unlink(missing_ok=True)
            path.with_name(f"{path.name}.data").unlink(missing_ok=True)


Reference = Callable[[Sequence[str]], tuple[Values, Values]]  #: value names -> (values, final outputs) per feed


class _Probe:
    """Marked runs of the candidate and the reference; every value's :class:`SiteCheck`, each run's record."""

    def __init__(self, candidate: _Marked, reference: Reference, final_reference: Values, value_tol: Tolerance,
                 output_tols: Mapping[str, Tolerance], precision: str, per_round: int) -> None:
        self.candidate, self.reference = candidate, reference
        self.final_reference, self.value_tol, self.output_tols = final_reference, value_tol, output_tols
        self.precision, self.per_round = precision, per_round
        self.results: dict[str, SiteCheck] = {}
        self.runs: list[dict[str, Any]] = []
        names = list(final_reference[0]) if final_reference else []
        fallback = names[0] if names else ""
        self.unit = next((n for n in names if resolve_tolerance(output_tols, n) == value_tol), fallback)
        self.unit_rms = _rms([f[self.unit] for f in final_reference]) if self.unit else 0.0

    def rule(self) -> str:
        """The rule every value is judged by, in words."""
        return (f"{self.value_tol.describe()}, atol in each value's units (x its RMS / the RMS "
                f"{self.unit_rms:.3g} of '{self.unit}', whose rule it is)")

    def check(self, sites: Sequence[Site]) -> dict[str, SiteCheck]:
        todo = [s for s in dict.fromkeys(sites) if s.value not in self.results]
        for start in range(0, len(todo), self.per_round):
            self._run(todo[start:start + self.per_round])
        return {s.value: self.results[s.value] for s in sites}

    def _run(self, sites: Sequence[Site]) -> None:
        names = [s.value for s in sites]
        cand = self.candidate.run(names)
        ref, _final = self.reference(names)
        outputs = _judge_outputs(self.final_reference, cand, self.output_tols, self.precision)
        survived = any(not o["passed"] for o in outputs.values())
        self.runs.append({"run": len(self.runs) + 1, "marked": names, "survived": survived, "outputs": outputs})
        for site in sites:
            values = [r[site.value] for r in ref]
            scale = _rms(values) / self.unit_rms if self.unit_rms > 0 else 1.0
            tol = replace(self.value_tol, atol=self.value_tol.atol * scale)
            status, rule, detail = _judge(values, [c[site.value] for c in cand], tol, self.precision)
            self.results[site.value] = SiteCheck(
                site.value, site.node, site.op_type, site.layer, status,
                rule.value if rule else math.nan, rule.max_value if rule else math.nan, rule.failed if rule else None,
                tol.atol, len(self.runs), site.position, detail)
            log.info("localize run %d: %s %s (%s)", len(self.runs), status, site.value,
                     f"{rule.value:.3g}" if rule else detail)


def _rms(arrays: Sequence[np.ndarray]) -> float:
    """Root mean square of the finite elements within FP16's range (mask fills such as -3.4e38 left out)."""
    x = np.concatenate([np.asarray(a, dtype=np.float64).reshape(-1) for a in arrays]) if arrays else np.zeros(0)
    x = x[np.isfinite(x) & (np.abs(x) <= LARGEST["fp16"])]
    return float(np.sqrt(np.mean(x * x))) if x.size else 0.0


def _spread(between: Sequence[Site], k: int) -> list[Site]:
    """Up to ``k`` sites spread evenly over ``between`` (all of them when there are few)."""
    n = len(between)
    if n <= k:
        return list(between)
    return [between[i] for i in sorted({min(n - 1, (j + 1) * n // (k + 1)) for j in range(k)})]


def _bisect(sites: Sequence[Site], probe: _Probe) -> Site | None:
    """The first failing site after the last passing one, by k-ary search (None: every site passes)."""
    lo, hi = -1, math.inf
    hi_site: Site | None = None
    dropped: set[str] = set()
    while True:
        between = [s for s in sites if lo < s.position < hi and s.value not in dropped]
        if not between:
            return hi_site
        picks = _spread(between, probe.per_round)
        results = probe.check(picks)
        dropped |= {s.value for s in picks if results[s.value].status == "unmatched"}
        judged = [s for s in picks if results[s.value].status != "unmatched"]
        first = next((s for s in judged if results[s.value].status == "fail"), None)
        if first is None:
            lo = max((s.position for s in judged), default=lo)
        else:
            hi, hi_site = first.position, first
            lo = max((s.position for s in judged if s.position < first.position), default=lo)


def map_scopes(g: Graph, module_paths: Iterable[str]) -> int:
    """Re-read ``g.scopes`` so that the most node scopes are paths of the module; the number that are.

    The exporter's scope can differ from the module's path by a wrapper prefix both ways: a BERT
    graph's ``/module/model/bert/...`` is the module's ``model.bert`` (one component dropped), a
    LLaMA graph's ``/module/model/layers.0/...`` is ``model.model.layers.0`` (the export wrapper
    traced the ``LlamaModel`` one level down: one dropped, ``model`` put in front). Tries dropping
    0-3 leading components and every prefix that turns a scope into a module path; keeps the current
    reading unless another makes more scopes module paths.
    """
    from collections import Counter

    known = set(module_paths)
    raw = [".".join(n.name.strip("/").split("/")[:-1]) if n.name.startswith("/") else None for n in g.nodes]
    distinct = {s for s in raw if s}
    current = len({s for s in g.scopes if s} & known)
    prefixes: dict[str, set[str]] = {}
    for path in known:
        parts = path.split(".")
        for i in range(len(parts)):
            prefixes.setdefault(".".join(parts[i:]), set()).add(".".join(parts[:i]))
    counts: Counter[tuple[int, str]] = Counter()
    for scope in distinct:
        parts = scope.split(".")
        for k in range(min(4, len(parts))):
            for prefix in prefixes.get(".".join(parts[k:]), ()):
                counts[(k, prefix)] += 1
    if not counts:
        return current
    (k, prefix), n = max(counts.items(), key=lambda kv: (kv[1], -kv[0][0], -len(kv[0][1])))
    if n <= current:
        return current

    def read(scope: str) -> str:
        rest = ".".join(scope.split(".")[k:])
        return ".".join(p for p in (prefix, rest) if p)

    g.scopes = [read(s) if s is not None else None for s in raw]
    return n


#: ops that only move or select elements: a value they output cannot lose precision there
_MOVES = frozenset({"Gather", "GatherElements", "GatherND", "Slice", "Reshape", "Transpose", "Squeeze", "Unsqueeze",
                    "Flatten", "Identity", "Expand", "Concat", "Split", "Tile", "Where"})


def _walk_back(g: Graph, start: Site, probe: _Probe, site_of: Callable[[str], Site | None],
               notes: list[str], follow_moves: bool = False) -> tuple[Site, list[int]]:
    """From a failing site, move to its earliest failing upstream site until none fails; the origin and its nodes.

    The nodes are those computing the origin from the upstream sites that pass (graph order). With
    ``follow_moves``, an origin that only moves elements (:data:`_MOVES`: the pooling ``Gather`` of a
    decoder's last token) is not an answer: its failing elements were in its input, which passed the
    rule's quantile over many more elements; the walk goes on through the values whose largest
    normalised error exceeds 1, to the node where an element first goes beyond the tolerance.
    """
    def checkable(value: str) -> bool:
        return site_of(value) is not None

    current, strict = start, False
    for _ in range(_MAX_WALK):
        values, nodes = upstream(g, current.value, checkable)
        ups = [s for s in (site_of(v) for v in values) if s]
        results = probe.check(ups)
        failing = [s for s in ups if results[s.value].status == "fail"
                   or (strict and results[s.value].max_error > 1)]
        if not failing and follow_moves and not strict and current.op_type in _MOVES:
            worst = [s for s in ups if results[s.value].max_error > 1]
            if worst:
                strict = True
                notes.append(f"{current.node} ({current.op_type}) only moves values: it fails because its input "
                             f"holds elements beyond the tolerance that the rule's quantile over the whole input "
                             f"let pass; followed back through the values whose largest normalised error exceeds 1")
                failing = [max(worst, key=lambda s: results[s.value].max_error)]
        if not failing:
            return current, nodes
        current = failing[0]
    notes.append(f"the walk back stopped after {_MAX_WALK} steps at {current.value}")
    return current, upstream(g, current.value, checkable)[1]


def _finish(loc: Localization, probe: _Probe, origin: Site, g: Graph, nodes: Sequence[int]) -> None:
    """Copy the origin and the nodes computing it into ``loc``."""
    check = probe.results[origin.value]
    loc.nodes = [g.nodes[i].name for i in nodes if g.nodes[i].op_type not in _PLUMBING]
    loc.found = True
    loc.value, loc.node, loc.op_type, loc.layer = origin.value, origin.node, origin.op_type, origin.layer
    loc.block = block_of(origin.layer) if origin.layer else None
    loc.statistic, loc.max_error, loc.failed = check.statistic, check.max_error, check.failed or "stat"


def _record(loc: Localization, probe: _Probe) -> Localization:
    loc.runs = probe.runs
    loc.checked = sorted(probe.results.values(), key=lambda c: c.position)
    hidden = [r["run"] for r in probe.runs if not r["survived"]]
    loc.survived_marking = not hidden if probe.runs else None
    if hidden:
        loc.notes.append(f"the failure did not survive the marking in run(s) {hidden}: with those values exposed the "
                         "engine passes the rule on its final outputs (marking changed what it computes), so their "
                         "errors describe another build than the failing one")
    return loc


def _baseline(loc: Localization, graph: Graph, run_marked: RunMarked, feeds: Sequence[Feed], final: Values,
              output_tols: Mapping[str, Tolerance], workdir: Path) -> bool:
    """Run the candidate unmarked; False (with a note) when its final outputs pass on these feeds."""
    unmarked = _Marked(graph, run_marked, feeds, workdir).run([])
    outputs = _judge_outputs(final, unmarked, output_tols, loc.precision)
    loc.fails_unmarked = any(not o["passed"] for o in outputs.values())
    if not loc.fails_unmarked:
        where = f" ({', '.join(loc.feeds)})" if loc.feeds else ""
        loc.notes.append(f"the final outputs pass the rule on the {loc.rows} rows tried{where}: the failure is "
                         "elsewhere (other rows, or UQ metrics only)")
    return loc.fails_unmarked


def _tolerances(precision: str, tolerances: Mapping[str, Tolerance] | None,
                per_round: int) -> tuple[Tolerance, dict[str, Tolerance]]:
    if isinstance(per_round, bool) or not isinstance(per_round, int) or per_round < 1:
        raise ToolchainError(f"localize: per_round must be a positive integer (values exposed per run), got "
                             f"{per_round!r}.")
    tols = dict(tolerances) if tolerances else default_tolerances(precision)
    return resolve_tolerance(tols, ""), tols


def _rows(feeds: Sequence[Feed]) -> int:
    return int(sum(np.shape(next(iter(f.values())))[0] if f else 0 for f in feeds))


# ------------------------------------------------------------------------------------ against PyTorch
def localize_against_torch(graph: str | Path, module: Any, feeds: Sequence[Feed], *, precision: str = "fp32",
                           run_marked: RunMarked | None = None, tolerances: Mapping[str, Tolerance] | None = None,
                           per_round: int = 4, labels: Sequence[str] = ()) -> Localization:
    """Where ``graph`` first diverges from ``module`` (the PyTorch module it was exported from), layer by layer.

    Args:
        graph: the failing ``.onnx`` graph (TorchScript export: module-scoped node names).
        module: the module it was exported from (the graph's input names are its keyword arguments).
        feeds: inputs (:func:`pick_feeds`), numpy arrays by input name.
        precision: the candidate's precision: the rule (``tolerances[""]``) for every value.
        run_marked: ``path -> Runner`` for the graph with extra outputs (default: ``onnx_runner(None,
            precision)``, the CPU kind).
        tolerances: per-output tolerances of the gate (``""`` default key); None: the precision's defaults.
        per_round: values exposed per marked run.
        labels: the feeds' labels, for the report.
    """
    value_tol, output_tols = _tolerances(precision, tolerances, per_round)
    run_marked = run_marked or onnx_runner(None, precision)
    torch_side = ModuleValues(module.eval(), feeds)
    g = Graph(Path(graph), [p for p in torch_side.modules if p])
    map_scopes(g, [p for p in torch_side.modules if p])
    loc = Localization("pytorch", Path(graph).name, precision, value_tol.describe(), feeds=list(labels),
                       rows=_rows(feeds))
    profile = torch_side.profile()
    once = {p for p, (calls, rank) in profile.items() if calls == 1 and rank >= 0}
    chosen = {}
    for path, values in scope_outputs(g, lambda s: s in once).items():
        fits = [v for v in values if g.ranks.get(v, profile[path][1]) == profile[path][1]]
        if fits:
            chosen[path] = max(fits, key=lambda v: g.position[v])
    sites = sites_from(g, chosen, lambda v: True)
    site_by_value = {s.value: s for s in sites}
    owner = {s.value: s.layer for s in sites}
    with tempfile.TemporaryDirectory(prefix="localize-") as tmp:
        final = torch_side.values({})[1]
        if not _baseline(loc, g, run_marked, feeds, final, output_tols, Path(tmp)):
            return loc
        if not sites:
            loc.notes.append("no module output of the PyTorch module was found in the graph's node names (not a "
                             "TorchScript export of this module?)")
            return loc
        probe = _Probe(_Marked(g, run_marked, feeds, Path(tmp)), lambda names: torch_side.values(
            {n: owner[n] for n in names}), final, value_tol, output_tols, precision, per_round)
        loc.rule = probe.rule()
        first = _bisect(sites, probe)
        if first is None:
            loc.notes.append("every module output passes: the divergence is in the nodes after the last module "
                             f"output ({sites[-1].value})")
            return _record(loc, probe)
        origin, nodes = _walk_back(g, first, probe, site_by_value.get, loc.notes)
        _finish(loc, probe, origin, g, nodes)
        loc.weights = module_weight_mismatches(g, module, nodes, precision)
        if loc.weights:
            w = loc.weights[0]
            loc.node, loc.op_type, loc.layer, loc.block = w["node"], w["op_type"], w["layer"], block_of(w["layer"])
        else:
            loc.notes.append(f"PyTorch has no values inside a module: the divergence starts in one of the "
                             f"{len(loc.nodes)} node(s) computing {origin.value} from module outputs that pass")
        return _record(loc, probe)


# ------------------------------------------------------------------------------------ feeds
def pick_feeds(feeds: Sequence[tuple[str, Feed]], checks: Iterable[Mapping[str, Any]],
               max_rows: int = 64) -> list[tuple[str, Feed]]:
    """The feeds to localise on: largest error first in the failing checks' data, until ``max_rows`` rows.

    Args:
        feeds: ``(label, feed)`` in the gate's order (:meth:`~toolchain.parity.runner.ParityData.feeds`).
        checks: the ``data`` of the failing numeric checks (``per_feed``, ``nonfinite``, ``worst``).
        max_rows: stop adding feeds once this many rows are in (at least one feed is always taken).

    Returns:
        The chosen ``(label, feed)`` pairs, in the gate's order.
    """
    score: dict[str, float] = {}
    for data in checks:
        for entry in data.get("per_feed") or []:
            err = entry.get("max_abs_err")
            err = math.inf if err is None or isinstance(err, str) or not math.isfinite(float(err)) else float(err)
            score[entry["feed"]] = max(score.get(entry["feed"], 0.0), err)
        for key in ("nonfinite", "worst"):
            if isinstance(data.get(key), Mapping) and "feed" in data[key]:
                score[data[key]["feed"]] = math.inf
    order = sorted(range(len(feeds)), key=lambda i: (-score.get(feeds[i][0], 0.0), i))
    chosen: list[int] = []
    rows = 0
    for i in order:
        if chosen and rows >= max_rows:
            break
        chosen.append(i)
        rows += _rows([feeds[i][1]])
    return [feeds[i] for i in sorted(chosen)]
