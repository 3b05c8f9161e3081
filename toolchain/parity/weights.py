"""Weight parity: every weight a graph carries against the reference parameter it came from.

At BF16 the output checks pass most deliberately wrong graphs (rounding hides a weight scaled by
1.05); at FP32 a wrong key projection can move tiny logits by 1e-5. A graph file carries its
weights, so :func:`weight_parity` compares them with the reference module's parameters directly,
each at the graph's own rounding: a stale or wrong weight is found exactly, and named.

**What is checked.** Every float initializer (FP32, FP16, BF16, FP64) with at least
:data:`MIN_ELEMENTS` elements. Scalars and one-element tensors are constants the exporter made
(GELU's ``sqrt(2)``, the attention mask's fill value, a precision pass's copies of them), not
weights; they are counted as ``small`` and not judged.

**What it is compared with.** The reference's parameters and buffers (``named_parameters`` and
``named_buffers``, float ones), plus the tensors a module builds from them at export time and the
exporter folds into one initializer: :class:`~toolchain.hydra.attention.HydraAttention`
concatenates its Q, K and V GFC weights and biases per member (``torch.cat(..., dim=1)``). Each
candidate is laid out by the two transforms the exporters apply, both exact:

* ``reshape`` - the same elements in the same order (a name-kept initializer; the conv lowering's
  ``[M * out, in, 1]`` kernel and ``[M * out]`` bias; a 1x1 conv's ``weight.unsqueeze(-1)``; the
  matmul lowering's ``[M, 1, out]`` bias);
* ``transpose`` - the last two dims swapped, then reshaped (``nn.Linear``'s ``x @ W^T`` as an ONNX
  ``MatMul`` weight ``onnx::MatMul_123``; the matmul lowering's ``weight.transpose(1, 2)``).

**The rule.** The candidate is rounded the way :mod:`toolchain.export.precision` rounds
(FP16: clamp to +-65504 then round-to-nearest-even; BF16: clamp to the largest finite BF16 then
:func:`~toolchain.export.precision.float32_to_bfloat16_bits`) to the initializer's own element
type, and the two are compared in units in the last place of that type (ULPs, on the bit
patterns). Allowed: 0 ULPs for FP32/FP64 (the exporter copies or exactly re-lays out parameters;
measured: every FP32 initializer of the tiny BERT, ViT and both Hydra lowerings, and MiniLM, is
bit-identical), 1 ULP (one rounding step) for FP16/BF16 (measured: 0 on every graph the export
writes; the step allows another converter's rounding). A BF16 weight scaled by 1.05 is 6 to 13
BF16 ULPs off.

**Which parameter.** In order: the initializer's name (the exporter keeps a parameter's name,
with its wrapper prefix such as ``module.`` and a precision pass's ``__fp16``/``__bf16`` suffix):
it must then equal that parameter; else a parameter of equal value (a hash of the rounded bits);
else the parameters of the module whose nodes read it (the exporter names nodes by module scope:
``/module/model/bert/encoder/layer.0/attention/self/key/MatMul``), the closest of which is named
in the failure; else the closest parameter of the same size anywhere. A float initializer that
equals no parameter fails: a stale weight looks exactly like that. An initializer for which the
reference has no parameter of its size at all, and none by name or scope (a tensor another tool
derived from several parameters, e.g. a packed QKV of a fused attention), is **unmatched**:
reported by name and counted, not judged, so such a graph is gated by its outputs rather than
failed on a weight nobody can compare.

**INT8 (Q/DQ) graphs.** A quantized weight is an INT8 initializer read by a ``DequantizeLinear``
with its scale (per output channel) and zero point; those two are quantization parameters, not
weights, and are not matched against parameters. The weight is dequantized (``(q - zero point) *
scale``) and compared with the reference parameter (by name without the quantizer's ``_quantized``
suffix, else read by the same module, else the closest of its size) in quantization steps: round to
nearest leaves every element within half a step of the parameter (``int8`` allows 0.5 steps, plus
1e-3 for float rounding of the scale); a weight or a weight scale off by 1% of a step's worth of
magnitude fails.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

from toolchain.errors import GraphError, ToolchainError

__all__ = ["ALLOWED_ULPS", "MIN_ELEMENTS", "TensorMatch", "WeightReport", "reference_tensors", "weight_parity"]

#: float initializers with fewer elements are exporter constants, not weights (not judged)
MIN_ELEMENTS = 2
#: ULPs of the initializer's own type allowed between it and the rounded reference parameter
ALLOWED_ULPS = {"fp32": 0, "fp64": 0, "fp16": 1, "bf16": 1, "int8": 0}  # int8: whole steps beyond half a step
#: INT8 weights: quantization steps allowed between the dequantized weight and the parameter (round to nearest)
INT8_STEPS = 0.5 + 1e-3
_QUANT_SUFFIX = re.compile(r"_quantized$")
_TYPES = {TensorProto.FLOAT: "fp32", TensorProto.DOUBLE: "fp64", TensorProto.FLOAT16: "fp16",
          TensorProto.BFLOAT16: "bf16"}
_BITS = {"fp32": np.int32, "fp64": np.int64, "fp16": np.int16, "bf16": np.int16}
_LOW_SUFFIX = re.compile(r"__(fp16|bf16)$")
_TRANSFORMS = ("reshape", "transpose")
_MAX_LISTED = 8


# ------------------------------------------------------------------------------------ reference table
@dataclass(frozen=True, eq=False)
class RefTensor:
    """A reference tensor an initializer may hold: a parameter/buffer, or one built from several.

    ``parts``: ``(parameter name, size along axis 1)`` of a concatenation along axis 1 (empty for a
    plain parameter).
    """

    name: str
    array: np.ndarray
    parts: tuple[tuple[str, int], ...] = ()

    @property
    def sources(self) -> list[str]:
        """The parameter names it is made of."""
        return [p for p, _ in self.parts] or [self.name]

    @property
    def module(self) -> str:
        """The module path the tensor belongs to."""
        first = self.parts[0][0] if self.parts else self.name
        return first.rsplit(".", 1)[0] if "." in first else ""


def _numpy(t: Any) -> np.ndarray:
    return t.detach().float().cpu().numpy()


def reference_tensors(module: Any) -> dict[str, RefTensor]:
    """Name -> :class:`RefTensor` of every float parameter and buffer of ``module``, and the derived ones.

    Derived: :class:`~toolchain.hydra.attention.HydraAttention`'s per-member Q/K/V concatenation
    ``[M, 3 * Hp * d, D]`` and ``[M, 3 * Hp * d]`` (``<prefix>.qkv.weight`` / ``.qkv.bias``), which
    its forward builds and the exporter folds into one initializer.
    """
    import torch

    from toolchain.hydra.attention import HydraAttention

    if not isinstance(module, torch.nn.Module):
        raise ToolchainError(f"weight_parity: the reference must be a torch nn.Module, got {type(module).__name__}.")
    out: dict[str, RefTensor] = {}
    for name, tensor in [*module.named_parameters(remove_duplicate=False),
                         *module.named_buffers(remove_duplicate=False)]:
        if tensor.is_floating_point():
            out[name] = RefTensor(name, _numpy(tensor))
    for prefix, sub in module.named_modules():
        if isinstance(sub, HydraAttention):
            base = f"{prefix}." if prefix else ""
            for kind in ("weight", "bias"):
                tensors = [getattr(getattr(sub, p), kind) for p in ("q", "k", "v")]
                if any(t is None for t in tensors):
                    continue
                parts = tuple((f"{base}{p}.{kind}", int(t.shape[1])) for p, t in zip("qkv", tensors))
                joined = torch.cat(tensors, dim=1)  # as HydraAttention.forward
                out[f"{base}qkv.{kind}"] = RefTensor(f"{base}qkv.{kind}", _numpy(joined), parts)
    return out


# ------------------------------------------------------------------------------------ rounding and ULPs
def _round_bits(array: np.ndarray, kind: str) -> np.ndarray:
    """``array`` (FP32) rounded to ``kind`` as the precision pass rounds it, as signed integer bits.

    The pass's clamps (:data:`~toolchain.export.precision.FP16_MAX`, ``BF16_MAX``), then
    round-to-nearest-even: numpy's for FP16, ml_dtypes' for BF16 (the same bits as
    :func:`~toolchain.export.precision.float32_to_bfloat16_bits`, ten times faster; tested equal).
    """
    import ml_dtypes

    from toolchain.export.precision import BF16_MAX, FP16_MAX

    a = np.asarray(array, dtype=np.float32)
    if kind == "fp32":
        return np.ascontiguousarray(a).view(np.int32)
    if kind == "fp64":
        return np.ascontiguousarray(a.astype(np.float64)).view(np.int64)
    finite = np.isfinite(a)
    if kind == "fp16":
        return np.where(finite, np.clip(a, -FP16_MAX, FP16_MAX), a).astype(np.float16).view(np.int16)
    safe = np.where(finite, np.clip(a, -BF16_MAX, BF16_MAX), a)
    return safe.astype(ml_dtypes.bfloat16).view(np.int16)


def _stored(init: TensorProto) -> tuple[np.ndarray, np.ndarray]:
    """An initializer's values (FP32; FP64 for FP64) and its raw bits as signed integers (both flat)."""
    kind = _TYPES[init.data_type]
    array = numpy_helper.to_array(init)
    if kind == "bf16":  # ml_dtypes bfloat16 (or raw uint16 bits on older onnx)
        bits = np.ascontiguousarray(array).view(np.uint16).view(np.int16).reshape(-1)
        values = (bits.astype(np.uint16).astype(np.uint32) << 16).view(np.float32)
        return values, bits
    array = np.ascontiguousarray(array)
    values = array.reshape(-1) if kind == "fp64" else array.astype(np.float32).reshape(-1)
    return values, array.view(_BITS[kind]).reshape(-1)


def _ordered(bits: np.ndarray) -> np.ndarray:
    """Sign-magnitude bits -> integers ordered like the floats (+0 and -0 both 0), as int64."""
    width = bits.dtype.itemsize * 8
    b = bits.astype(np.int64)
    magnitude = b & ((1 << (width - 1)) - 1)
    return np.where(b < 0, -magnitude, magnitude)


def _ulps(found: np.ndarray, wanted: np.ndarray, kind: str) -> np.ndarray:
    """Per element ULP distance of two bit arrays of ``kind`` (NaN to NaN: 0; NaN to a number: huge)."""
    width = found.dtype.itemsize * 8
    exp_mask = {"fp32": 0x7F800000, "fp64": 0x7FF0000000000000, "fp16": 0x7C00, "bf16": 0x7F80}[kind]
    mant = (1 << {"fp32": 23, "fp64": 52, "fp16": 10, "bf16": 7}[kind]) - 1

    def nan(bits: np.ndarray) -> np.ndarray:
        b = bits.astype(np.int64) & ((1 << (width - 1)) - 1)
        return ((b & exp_mask) == exp_mask) & ((b & mant) != 0)

    distance = np.abs(_ordered(found) - _ordered(wanted))
    fn, wn = nan(found), nan(wanted)
    return np.where(fn & wn, 0, np.where(fn | wn, np.iinfo(np.int64).max, distance))


def _laid_out(ref: RefTensor, transform: str) -> np.ndarray | None:
    """The reference tensor in the transform's element order, flat (None: the transform does not apply)."""
    if transform == "reshape":
        return ref.array.reshape(-1)
    if ref.array.ndim < 2:
        return None
    return np.ascontiguousarray(np.swapaxes(ref.array, -1, -2)).reshape(-1)


def _digest(bits: np.ndarray) -> str:
    return hashlib.blake2b(np.ascontiguousarray(bits).tobytes(), digest_size=16).hexdigest()


# ------------------------------------------------------------------------------------ results
@dataclass(frozen=True)
class TensorMatch:
    """One graph initializer against the reference tensor it came from (or the closest, when none).

    ``how``: ``name`` (named after the parameter), ``value`` (equal to a parameter), ``scope`` (a
    parameter of the module reading it), ``size`` (the closest parameter of its size), ``none``.
    ``differs``: for a concatenation, the parameters whose slice differs.
    """

    initializer: str
    dtype: str
    shape: tuple[int, ...]
    status: str
    reference: str | None
    module: str | None
    how: str
    transform: str | None
    max_abs_diff: float | None
    max_ulps: int | None
    allowed_ulps: int
    differs: tuple[str, ...] = ()

    def describe(self) -> str:
        """One phrase: the initializer, the parameter, the difference."""
        what = f"'{self.initializer}' ({self.dtype} {list(self.shape)})"
        if self.reference is None:
            return f"{what} equals no reference parameter of its size"
        unit = "quantization steps beyond half a step" if self.dtype == "int8" else f"{self.dtype} ULPs"
        diff = (f"max |diff| {self.max_abs_diff:.3g}, {self.max_ulps} {unit} > {self.allowed_ulps}"
                if self.max_ulps is not None and self.max_abs_diff is not None else "")
        parts = f" (slices {', '.join(self.differs)})" if self.differs else ""
        found = {"name": "named after", "scope": "read by module", "size": "closest"}.get(self.how, "vs")
        target = self.module if self.how == "scope" else self.reference
        extra = f": parameter '{self.reference}'" if self.how == "scope" else ""
        return f"{what} {found} '{target}'{extra}{parts} differs: {diff}"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        return {"initializer": self.initializer, "dtype": self.dtype, "shape": list(self.shape),
                "status": self.status, "reference": self.reference, "module": self.module, "how": self.how,
                "transform": self.transform, "max_abs_diff": self.max_abs_diff, "max_ulps": self.max_ulps,
                "allowed_ulps": self.allowed_ulps, "differs": list(self.differs)}


@dataclass
class WeightReport:
    """Every checked initializer of one graph; ``passed`` when all equal their reference tensors."""

    graph: str
    precision: str
    tensors: list[TensorMatch]
    small: int = 0  #: float initializers under :data:`MIN_ELEMENTS` elements (not judged)
    reference_unused: list[str] = field(default_factory=list)  #: reference tensors no initializer holds

    @property
    def failures(self) -> list[TensorMatch]:
        """The initializers that differ from (or match no) reference tensor."""
        return [t for t in self.tensors if t.status == "fail"]

    @property
    def unmatched(self) -> list[str]:
        """Names of the initializers with no reference tensor of their size, by name or by scope (not judged)."""
        return [t.initializer for t in self.tensors if t.status == "unmatched"]

    @property
    def passed(self) -> bool:
        """Every checked initializer equals its reference tensor at the graph's rounding."""
        return not self.failures

    def message(self) -> str:
        """One paragraph: the counts, then each failing tensor (the first few) with its parameter."""
        n, bad = len(self.tensors), self.failures
        rule = ", ".join(f"{k} {v} ULP" for k, v in sorted(ALLOWED_ULPS.items())
                         if any(t.dtype == k for t in self.tensors))
        loose = self.unmatched
        unmatched = (f"; {len(loose)} match no reference parameter of their size, by name or module, and are not "
                     f"judged: {', '.join(loose[:_MAX_LISTED])}{' ...' if len(loose) > _MAX_LISTED else ''}"
                     if loose else "")
        if not bad:
            return (f"{n - len(loose)} weights of '{self.graph}' equal the reference's parameters at the graph's "
                    f"rounding ({rule or 'nothing to compare'}); {self.small} constants under {MIN_ELEMENTS} "
                    f"elements not checked{unmatched}")
        listed = "; ".join(t.describe() for t in bad[:_MAX_LISTED])
        more = f"; and {len(bad) - _MAX_LISTED} more" if len(bad) > _MAX_LISTED else ""
        hint = (" Most weights differ: was this graph exported from another checkpoint (a stale graph)?"
                if len(bad) * 2 > n else "")
        return (f"{len(bad)} of {n} weights of '{self.graph}' differ from the reference's parameters at the "
                f"graph's rounding ({rule}): {listed}{more}.{hint}{unmatched}")

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: counts, the rule, every tensor."""
        return {"graph": self.graph, "precision": self.precision, "status": "pass" if self.passed else "fail",
                "checked": len(self.tensors), "failed": len(self.failures), "small_not_checked": self.small,
                "min_elements": MIN_ELEMENTS, "allowed_ulps": dict(ALLOWED_ULPS), "unmatched": self.unmatched,
                "reference_unused": list(self.reference_unused),
                "tensors": [t.to_dict() for t in self.tensors]}


# ------------------------------------------------------------------------------------ graph side
def _strip_prefix(names: Iterable[str], known: set[str]) -> int:
    """How many leading dotted components (0-3, the export wrapper's attributes) make most names known."""
    names = list(names)

    def strip(name: str, k: int) -> str:
        return ".".join(name.split(".")[k:])

    return max(range(4), key=lambda k: (sum(strip(n, k) in known for n in names), -k))


def _reader_scopes(model: onnx.ModelProto, module_paths: set[str]) -> dict[str, list[str]]:
    """Initializer -> module paths of the scoped nodes that read it (through unscoped Identity/Cast nodes)."""
    nodes = list(model.graph.node)
    raw = [".".join(n.name.strip("/").split("/")[:-1]) if n.name.startswith("/") else None for n in nodes]
    k = _strip_prefix([s for s in raw if s], module_paths)
    scopes = [".".join(s.split(".")[k:]) if s is not None else None for s in raw]
    readers: dict[str, list[int]] = {}
    for i, node in enumerate(nodes):
        for name in node.input:
            if name:
                readers.setdefault(name, []).append(i)
    out: dict[str, list[str]] = {}
    for init in model.graph.initializer:
        found: list[str] = []
        stack, seen = [init.name], {init.name}
        while stack:
            for i in readers.get(stack.pop(), []):
                if scopes[i]:
                    found.append(scopes[i])  # type: ignore[arg-type]
                elif nodes[i].op_type in ("Identity", "Cast"):
                    stack += [o for o in nodes[i].output if o and o not in seen]
                    seen.update(nodes[i].output)
        out[init.name] = list(dict.fromkeys(found))
    return out


def _load(graph: str | Path | onnx.ModelProto) -> tuple[onnx.ModelProto, str]:
    if isinstance(graph, onnx.ModelProto):
        return graph, graph.graph.name or "<graph>"
    from toolchain.export.graph import load_checked

    path = Path(graph)
    return load_checked(path, load_weights=True, check=False), path.name


# ------------------------------------------------------------------------------------ matching
class _Matcher:
    """The reference table, its rounded layouts (cached) and hash indexes per stored type (built lazily)."""

    def __init__(self, refs: Mapping[str, RefTensor]) -> None:
        self.refs = refs
        self.by_size: dict[int, list[RefTensor]] = {}
        for ref in refs.values():
            self.by_size.setdefault(ref.array.size, []).append(ref)
        self._index: dict[str, dict[str, list[tuple[str, str]]]] = {}
        self._rounded: dict[tuple[str, str, str], np.ndarray | None] = {}

    def rounded(self, ref: RefTensor, transform: str, kind: str) -> np.ndarray | None:
        """``ref`` laid out by ``transform`` and rounded to ``kind``, as bits (None: the transform does not apply)."""
        key = (ref.name, transform, kind)
        if key not in self._rounded:
            flat = _laid_out(ref, transform)
            self._rounded[key] = None if flat is None else _round_bits(flat, kind)
        return self._rounded[key]

    def index(self, kind: str, sizes: set[int]) -> dict[str, list[tuple[str, str]]]:
        """Digest of the rounded bits -> ``(reference name, transform)``, for references of these sizes."""
        if kind not in self._index:
            table: dict[str, list[tuple[str, str]]] = {}
            for size in sorted(sizes):
                for ref in self.by_size.get(size, []):
                    for transform in _TRANSFORMS:
                        bits = self.rounded(ref, transform, kind)
                        if bits is not None:
                            table.setdefault(_digest(bits), []).append((ref.name, transform))
            self._index[kind] = table
        return self._index[kind]

    def compare(self, values: np.ndarray, bits: np.ndarray, kind: str, ref: RefTensor,
                transforms: tuple[str, ...] = _TRANSFORMS) -> tuple[int, float, str, np.ndarray | None] | None:
        """The best transform of ``ref`` against the initializer: (max ULPs, max |diff|, transform, ULPs or None).

        The ULP array is None when the bits are equal.
        """
        best = None
        for transform in transforms:
            expected = self.rounded(ref, transform, kind)
            if expected is None or expected.size != bits.size:
                continue
            flat = _laid_out(ref, transform)
            diff = float(np.max(np.abs(values - flat.astype(values.dtype)))) if flat.size else 0.0
            if np.array_equal(bits, expected):
                return 0, diff, transform, None
            ulps = _ulps(bits, expected, kind)
            top = int(ulps.max()) if ulps.size else 0
            score = _closeness(values, flat, ulps, top)
            if best is None or score < best[0]:
                best = (score, (top, diff, transform, ulps))
        return None if best is None else best[1]

    def closeness(self, values: np.ndarray, ref: RefTensor,
                  found: tuple[int, float, str, np.ndarray | None]) -> tuple[float, ...]:
        """The sort key of a comparison :meth:`compare` returned (smaller: closer)."""
        flat = _laid_out(ref, found[2])
        return _closeness(values, flat, found[3], found[0]) if flat is not None else (1.0, 0.0, float(found[0]))


def _closeness(values: np.ndarray, flat: np.ndarray, ulps: np.ndarray | None, top: int) -> tuple[float, ...]:
    """Sort key of a layout or parameter that does not match exactly: most elements equal, then most correlated.

    A wrong layout of a square weight and an unrelated parameter both differ everywhere; a weight
    scaled (by 1.05 or -2) keeps its correlation with the parameter it came from.
    """
    if ulps is None:
        return (-1.0, -1.0, float(top))
    equal = float(np.mean(ulps == 0)) if ulps.size else 1.0
    a, b = values.astype(np.float64), flat.astype(np.float64)
    a, b = a - a.mean(), b - b.mean()
    norm = float(np.sqrt(np.dot(a, a) * np.dot(b, b)))
    corr = abs(float(np.dot(a, b)) / norm) if norm > 0 else 0.0
    return (-equal, -corr, float(top))


def _differing_parts(ref: RefTensor, ulps: np.ndarray | None, transform: str, allowed: int) -> tuple[str, ...]:
    """The parameters of a concatenation whose slice is off by more than ``allowed`` ULPs."""
    if not ref.parts or ulps is None:
        return ()
    shape = ref.array.shape
    grid = (ulps.reshape(shape) if transform == "reshape"
            else np.swapaxes(ulps.reshape((*shape[:-2], shape[-1], shape[-2])), -1, -2))
    out, start = [], 0
    for name, size in ref.parts:
        if grid[:, start:start + size].max(initial=0) > allowed:
            out.append(name)
        start += size
    return tuple(out)


def _judge(name: str, kind: str, shape: tuple[int, ...], ref: RefTensor | None, how: str,
           found: tuple[int, float, str, np.ndarray | None] | None) -> TensorMatch:
    """The :class:`TensorMatch` of an initializer against ``ref`` as :meth:`_Matcher.compare` found it."""
    allowed = ALLOWED_ULPS[kind]
    if ref is None or found is None:  # nothing of its size to compare with: reported, not judged
        return TensorMatch(name, kind, shape, "unmatched", None, None, "none", None, None, None, allowed)
    top, diff, transform, ulps = found
    ok = top <= allowed
    return TensorMatch(name, kind, shape, "pass" if ok else "fail", ref.name, ref.module, how, transform, diff, top,
                       allowed, () if ok else _differing_parts(ref, ulps, transform, allowed))


def _judge_int8(name: str, shape: tuple[int, ...], deq: np.ndarray, step: np.ndarray, pool: list[RefTensor],
                how: str) -> TensorMatch:
    """A dequantized INT8 weight against the closest reference tensor of ``pool`` (each layout), in steps."""
    best: tuple[float, float, RefTensor, str] | None = None
    for ref in pool:
        for transform in _TRANSFORMS:
            flat = _laid_out(ref, transform)
            if flat is None or flat.size != deq.size:
                continue
            diff = np.abs(deq - flat.astype(np.float64))
            steps = float(np.max(diff / np.maximum(step, 1e-30))) if diff.size else 0.0
            if best is None or steps < best[0]:
                best = (steps, float(diff.max(initial=0.0)), ref, transform)
    if best is None:
        return TensorMatch(name, "int8", shape, "unmatched", None, None, "none", None, None, None, 0)
    steps, diff, ref, transform = best
    ok = steps <= INT8_STEPS
    # max_ulps for INT8: whole quantization steps beyond the half step round to nearest allows
    return TensorMatch(name, "int8", shape, "pass" if ok else "fail", ref.name, ref.module, how, transform, diff,
                       0 if ok else max(1, math.ceil(steps - 0.5)), 0)


def weight_parity(graph: str | Path | onnx.ModelProto, reference_module: Any,
                  precision: str | None = None) -> WeightReport:
    """Compare every weight initializer of ``graph`` with the reference parameter it came from.

    Args:
        graph: an ``.onnx`` file (external data is read from its folder) or a loaded ``ModelProto``.
        reference_module: the ``torch.nn.Module`` the parity gate runs as the reference (a
            :class:`~toolchain.models.wrappers.SingleModel`, a fused
            :class:`~toolchain.hydra.model.HydraModel` in any lowering).
        precision: the graph's precision for the report (default: read from the graph). Each
            initializer is judged at its own element type whatever this says.

    Returns:
        A :class:`WeightReport`: one :class:`TensorMatch` per float initializer with at least
        :data:`MIN_ELEMENTS` elements (see the module docstring for the rule).

    Raises:
        GraphError: the graph cannot be read (exit 2).
        ToolchainError: the reference is not a torch module.
    """
    from toolchain.export.precision import graph_precision
    from toolchain.export.quantize import dequantized_weights

    model, label = _load(graph)
    refs = reference_tensors(reference_module)
    if precision is None:
        try:
            precision = graph_precision(model)
        except GraphError:
            precision = "mixed"
    matcher = _Matcher(refs)
    quantized, qparams = dequantized_weights(model)
    inits = [i for i in model.graph.initializer if i.data_type in _TYPES and i.name not in qparams]
    k = _strip_prefix([_LOW_SUFFIX.sub("", i.name) for i in inits], set(refs))
    module_paths = {name for name, _ in reference_module.named_modules()}
    scopes = _reader_scopes(model, module_paths)
    prefix_of = {i.name: ".".join(_LOW_SUFFIX.sub("", i.name).split(".")[k:]) for i in inits}
    sizes: dict[str, set[int]] = {}  # per stored type, the sizes of initializers not named after a parameter
    for i in inits:
        if prefix_of[i.name] not in refs:
            sizes.setdefault(_TYPES[i.data_type], set()).add(int(np.prod(i.dims, dtype=np.int64)))
    tensors: list[TensorMatch] = []
    small = 0
    used: set[str] = set()
    for init in inits:
        shape = tuple(int(d) for d in init.dims)
        if int(np.prod(shape, dtype=np.int64)) < MIN_ELEMENTS:
            small += 1
            continue
        kind = _TYPES[init.data_type]
        allowed = ALLOWED_ULPS[kind]
        values, bits = _stored(init)
        by_name = refs.get(prefix_of[init.name])
        table = matcher.index(kind, sizes.get(kind, set()) | ({bits.size} if by_name is None else set()))
        hits = [(refs[n], t) for n, t in table.get(_digest(bits), []) if refs[n].array.size == bits.size]
        in_scope = [r for r in matcher.by_size.get(bits.size, [])
                    if any(r.module == s or r.module.startswith(s + ".") for s in scopes.get(init.name, []))]

        if by_name is not None:  # named after a parameter: it must hold that parameter
            if any(h[0] is by_name for h in hits):
                used.update(n for h in hits for n in h[0].sources)
            ref, how, found = by_name, "name", matcher.compare(values, bits, kind, by_name)
        elif hits:
            used.update(n for h in hits for n in h[0].sources)  # equal tensors the exporter stored once
            ref, transform = next((h for h in hits if any(h[0] is r for r in in_scope)), hits[0])
            how, found = "value", matcher.compare(values, bits, kind, ref, (transform,))
        else:
            pool, how = (in_scope, "scope") if in_scope else (matcher.by_size.get(bits.size, []), "size")
            scored = [(f, r) for r in pool if (f := matcher.compare(values, bits, kind, r)) is not None]
            ref, found = (None, None) if not scored else min(
                ((r, f) for f, r in scored), key=lambda rf: matcher.closeness(values, *rf))
            how = "none" if ref is None else ("value" if found[0] <= allowed else how)
        match = _judge(init.name, kind, shape, ref, how, found)
        if match.status == "pass" and ref is not None:
            used.update(ref.sources)
        tensors.append(match)
    if quantized:
        for name, (deq, step, shape) in quantized.items():
            base = ".".join(_QUANT_SUFFIX.sub("", name).split(".")[k:])
            by_name = refs.get(base)
            in_scope = [r for r in matcher.by_size.get(deq.size, [])
                        if any(r.module == s or r.module.startswith(s + ".") for s in scopes.get(name, []))]
            pool, how = (([by_name], "name") if by_name is not None else
                         (in_scope, "scope") if in_scope else (matcher.by_size.get(deq.size, []), "size"))
            match = _judge_int8(name, shape, deq, step, pool, how)
            if match.status == "pass" and match.reference is not None:
                used.update(refs[match.reference].sources)
            tensors.append(match)
    held = [refs[n] for n in used if n in refs]
    unused = sorted(n for n, r in refs.items() if not r.parts and n not in used  # equal ones are stored once
                    and not any(h.array.shape == r.array.shape and np.array_equal(h.array, r.array) for h in held))
    return WeightReport(label, precision, tensors, small, unused)

