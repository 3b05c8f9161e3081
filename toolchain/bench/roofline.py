"""Roofline bounds: how far a measured latency is from what the machine could do at best.

For an engine that must do ``F`` FLOPs and read ``W`` weight bytes, no implementation is faster
than ``bound = max(F / peak_flops, W / bandwidth)``. The *roofline ratio* ``measured / bound``
says how many times slower than that the engine ran (1.0 = at the roofline), and the *regime*
which term is larger (``compute`` or ``memory``). FLOPs and weight bytes are the analytic
counts of :mod:`toolchain.hydra.cost` (MatMul/Conv FLOPs; stored weights). The input stages'
tables (BERT's word embeddings: 47 MB of MiniLM's 91 MB) are stored but only the looked-up
rows are read, so :func:`roofline_rows` can leave them out of the memory term
(``unstreamed_bytes``; :func:`~toolchain.bench.suite.run_bench` does).

Peaks come from arguments when given, else from two small calibration kernels
(:func:`calibrate`):

* **peak FLOP/s**: float32 matrix products (``torch.matmul`` and ONNX Runtime's ``MatMul`` on
  ``threads`` threads, ``numpy.matmul``) of sizes that fit the caches, the best of many
  repeats: the highest rate observed, i.e. what a GEMM reaches on this machine when nothing
  else runs (ORT's MLAS GEMM is the one the ONNX engines use).
* **bandwidth**: a copy of a large float32 array (``numpy.copyto`` and ``torch.Tensor.copy_``),
  counted as read + write (2 x the array's bytes), best of several repeats.

On a shared machine the best repeat is the right estimate of the peak (contention only ever
slows a repeat down); report the peaks next to every ratio.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from toolchain.hydra.cost import EncoderSpec, compare


@dataclass(frozen=True)
class Peaks:
    """Machine peaks: FLOP/s and bytes/s, with where they came from."""

    flops_per_s: float
    bytes_per_s: float
    source: str = "arguments"
    details: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("flops_per_s", "bytes_per_s"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or not np.isfinite(value) or value <= 0:
                raise ValueError(f"Peaks.{name} must be a positive finite number; got {value!r}")

    @property
    def ridge_flops_per_byte(self) -> float:
        """Arithmetic intensity (FLOP/byte) where compute and memory bounds meet."""
        return self.flops_per_s / self.bytes_per_s

    def as_dict(self) -> dict[str, Any]:
        """JSON-able view."""
        return {**asdict(self), "ridge_flops_per_byte": self.ridge_flops_per_byte}


def _best_rate(work: float, fn: Any, repeats: int, min_seconds: float = 0.0, max_repeats: int = 500) -> float:
    """Highest ``work / seconds`` over at least ``repeats`` calls and ``min_seconds`` of calls."""
    best = 0.0
    spent = 0.0
    done = 0
    while done < repeats or (spent < min_seconds and done < max_repeats):
        start = time.perf_counter()
        fn()
        elapsed = time.perf_counter() - start
        spent += elapsed
        done += 1
        if elapsed > 0:
            best = max(best, work / elapsed)
    return best


def _ort_matmul(weight: np.ndarray, threads: int) -> Any:
    """``x -> x @ weight`` by an ONNX Runtime CPU session (MLAS, the engines' own GEMM); None without ORT."""
    from toolchain.engines.onnxrt import available_providers, open_session

    if available_providers() is None:
        return None
    from onnx import TensorProto, helper, numpy_helper

    n = weight.shape[0]
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], "calibration",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [n, n])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [n, n])], [numpy_helper.from_array(weight, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return open_session(model.SerializeToString(), intra_op_threads=threads, inter_op_threads=1)


def calibrate(
    threads: int,
    *,
    matmul_sizes: Sequence[int] = (512, 1024),
    copy_mib: int = 256,
    repeats: int = 8,
    min_seconds: float = 0.5,
) -> Peaks:
    """Measure peak FLOP/s and memory bandwidth with small kernels (the best repeat of each).

    FLOP/s: ``n x n @ n x n`` float32 products by ``torch.matmul`` (``threads`` threads),
    ``numpy.matmul`` and ONNX Runtime's ``MatMul`` (``threads`` intra-op threads), per size;
    bandwidth: ``numpy.copyto`` and ``torch.Tensor.copy_`` of a ``copy_mib`` array (read + write).

    Args:
        threads: threads for the kernels (the engines' thread count).
        matmul_sizes: the ``n`` of the products (``2 n^3`` FLOPs each); sizes whose operands fit
            the caches.
        copy_mib: size of the copied array in MiB (choose it larger than the last-level cache).
        repeats: at least this many timed repeats per kernel, after one untimed call.
        min_seconds: keep repeating each kernel until this much time is spent (at most 500
            repeats): on a shared machine more tries find an uncontended moment.

    Returns:
        :class:`Peaks` with ``source="calibrated"``, the best kernel's rates, and each kernel's
        best rate in ``details``.
    """
    import torch

    sizes = list(matmul_sizes)
    if threads < 1 or not sizes or min(sizes) < 16 or copy_mib < 1 or repeats < 1 or min_seconds < 0:
        raise ValueError(f"calibrate: threads >= 1, matmul_sizes >= 16, copy_mib >= 1, repeats >= 1, min_seconds >= 0 "
                         f"expected; got threads={threads}, matmul_sizes={sizes}, copy_mib={copy_mib}, "
                         f"repeats={repeats}, min_seconds={min_seconds}")
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    details: dict[str, Any] = {"threads": threads, "matmul_sizes": sizes, "copy_mib": copy_mib, "repeats": repeats,
                               "min_seconds": min_seconds}
    flop_rates: dict[str, float] = {}
    byte_rates: dict[str, float] = {}
    try:
        rng = np.random.default_rng(0)
        for n in sizes:
            a, b = rng.standard_normal((n, n), dtype=np.float32), rng.standard_normal((n, n), dtype=np.float32)
            c = np.empty((n, n), dtype=np.float32)
            ta, tb, tc = torch.from_numpy(a), torch.from_numpy(b), torch.empty(n, n)
            kernels = {
                f"torch.matmul[{n}]": lambda ta=ta, tb=tb, tc=tc: torch.matmul(ta, tb, out=tc),
                f"numpy.matmul[{n}]": lambda a=a, b=b, c=c: np.matmul(a, b, out=c),
            }
            session = _ort_matmul(b, threads)
            if session is not None:
                kernels[f"onnxruntime.MatMul[{n}]"] = lambda s=session, a=a: s.run(None, {"x": a})
            for name, fn in kernels.items():
                fn()
                flop_rates[name] = _best_rate(2.0 * n**3, fn, repeats, min_seconds)
        elements = copy_mib * 2**20 // 4
        src = np.ones(elements, dtype=np.float32)
        dst = np.empty_like(src)
        tsrc, tdst = torch.from_numpy(src), torch.from_numpy(dst)
        moved = 2.0 * src.nbytes  # read + write
        copies = {"numpy.copyto": lambda: np.copyto(dst, src), "torch.copy_": lambda: tdst.copy_(tsrc)}
        for name, fn in copies.items():
            fn()
            byte_rates[name] = _best_rate(moved, fn, max(2, repeats // 2), min_seconds)
    finally:
        torch.set_num_threads(previous)
    details["flops_per_s"] = flop_rates
    details["bytes_per_s"] = byte_rates
    return Peaks(max(flop_rates.values()), max(byte_rates.values()), "calibrated", details)


def resolve_peaks(
    threads: int,
    *,
    peak_flops: float | None = None,
    bandwidth: float | None = None,
    calibrate_kwargs: Mapping[str, Any] | None = None,
) -> Peaks:
    """Peaks from the arguments; whatever is not given is calibrated (:func:`calibrate`)."""
    if peak_flops is not None and bandwidth is not None:
        return Peaks(float(peak_flops), float(bandwidth), "arguments")
    measured = calibrate(threads, **dict(calibrate_kwargs or {}))
    flops = float(peak_flops) if peak_flops is not None else measured.flops_per_s
    bw = float(bandwidth) if bandwidth is not None else measured.bytes_per_s
    source = "calibrated" if peak_flops is None and bandwidth is None else "arguments+calibrated"
    return Peaks(flops, bw, source, measured.details)


def roofline_bound(flops: float, weight_bytes: float, peaks: Peaks) -> dict[str, Any]:
    """The roofline lower bound of one forward.

    Returns:
        ``compute_s = flops / peak``, ``memory_s = bytes / bandwidth``, ``bound_s`` (the larger),
        ``regime`` (``compute`` or ``memory``) and ``intensity`` (FLOP per weight byte).
    """
    if flops < 0 or weight_bytes < 0:
        raise ValueError(f"roofline_bound: flops and bytes must be >= 0; got {flops}, {weight_bytes}")
    compute = flops / peaks.flops_per_s
    memory = weight_bytes / peaks.bytes_per_s
    return {
        "flops": float(flops),
        "weight_bytes": float(weight_bytes),
        "compute_s": compute,
        "memory_s": memory,
        "bound_s": max(compute, memory),
        "regime": "compute" if compute >= memory else "memory",
        "intensity": flops / weight_bytes if weight_bytes else float("inf"),
    }


def roofline_ratio(measured_s: float, flops: float, weight_bytes: float, peaks: Peaks) -> dict[str, Any]:
    """:func:`roofline_bound` plus ``measured_s``, ``ratio = measured / bound`` and the attained FLOP/s."""
    row = roofline_bound(flops, weight_bytes, peaks)
    row["measured_s"] = float(measured_s)
    row["ratio"] = measured_s / row["bound_s"] if row["bound_s"] > 0 else float("inf")
    row["attained_flops_per_s"] = flops / measured_s if measured_s > 0 else float("nan")
    return row


# -------------------------------------------------------------------------- analytic variant costs
@dataclass(frozen=True)
class CostModel:
    """What the analytic cost of each deployment needs (see :func:`toolchain.hydra.cost.compare`).

    Attributes:
        spec: the source encoder's sizes.
        heads_per_member: ``[M][L]`` real heads each Hydra member keeps.
        mlp, layernorm: the fused model's merge modes.
        head_copies: stored head stages of the fused model (None: one).
        fork: layers run once on one stream before the members split.
        neurons_per_member: ``[M][L]`` MLP neurons each member keeps (None: the whole MLP).
    """

    spec: EncoderSpec
    heads_per_member: tuple[tuple[int, ...], ...]
    mlp: str = "average"
    layernorm: str = "grouped"
    head_copies: int | None = None
    fork: int = 0
    neurons_per_member: tuple[tuple[int, ...], ...] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "heads_per_member", tuple(tuple(int(h) for h in r) for r in self.heads_per_member))
        if self.neurons_per_member is not None:
            object.__setattr__(self, "neurons_per_member",
                               tuple(tuple(int(n) for n in r) for r in self.neurons_per_member))
        if not self.heads_per_member:
            raise ValueError("CostModel.heads_per_member needs one row per member; got none")

    @property
    def members(self) -> int:
        """M."""
        return len(self.heads_per_member)

    def compare(self, batch: int, seq: int, dtype_bytes: int = 4) -> dict[str, Any]:
        """:func:`toolchain.hydra.cost.compare` at one shape."""
        return compare(self.spec, self.heads_per_member, batch=batch, seq=seq, mlp=self.mlp,
                       layernorm=self.layernorm, head_copies=self.head_copies, dtype_bytes=dtype_bytes,
                       fork=self.fork, neurons_per_member=self.neurons_per_member)

    def as_dict(self) -> dict[str, Any]:
        """JSON-able view."""
        spec = asdict(self.spec)
        spec["heads"] = list(spec["heads"])
        out = {"spec": spec, "heads_per_member": [list(r) for r in self.heads_per_member],
               "mlp": self.mlp, "layernorm": self.layernorm, "head_copies": self.head_copies}
        if self.fork:
            out["fork"] = self.fork
        if self.neurons_per_member is not None:
            out["neurons_per_member"] = [list(r) for r in self.neurons_per_member]
        return out


#: variant kind -> key in :func:`toolchain.hydra.cost.compare`'s output
COST_KEYS = {"single": "single", "deep-ensemble": "deep_ensemble", "hydra": "hydra", "members": "members"}


def variant_cost_key(variant: str) -> str | None:
    """``"hydra-conv.fp16"`` -> ``"hydra"``, ``"deep-ensemble"`` -> ``"deep_ensemble"``; None if unknown."""
    base = variant.split(":")[-1].split(".")[0]
    if base.startswith("hydra"):
        return "hydra"
    return COST_KEYS.get(base)


def roofline_rows(
    latencies: Mapping[str, float],
    costs: Mapping[str, Mapping[str, Any]],
    peaks: Peaks,
    *,
    variants: Sequence[str] | None = None,
    unstreamed_bytes: Mapping[str, float] | None = None,
) -> dict[str, dict[str, Any]]:
    """Roofline ratio of each variant whose analytic cost is known.

    Args:
        latencies: variant -> measured seconds (the median).
        costs: :func:`toolchain.hydra.cost.compare` output (``single``, ``deep_ensemble``, ``hydra`` ...).
        peaks: the machine's peaks.
        variants: restrict to these names (default: all of ``latencies``).
        unstreamed_bytes: cost key -> stored bytes a forward does not read in full (the word
            embedding tables, of which only the looked-up rows are read); subtracted from the
            weight bytes of the memory term. None: every stored byte counts.

    Returns:
        variant -> :func:`roofline_ratio` row (plus ``cost_key`` and ``stored_weight_bytes``).
    """
    out = {}
    for name in variants or list(latencies):
        key = variant_cost_key(name)
        if key is None or key not in costs:
            continue
        cost = costs[key]
        streamed = max(0.0, cost["weight_bytes"] - float((unstreamed_bytes or {}).get(key, 0.0)))
        out[name] = {"cost_key": key, "stored_weight_bytes": float(cost["weight_bytes"]),
                     **roofline_ratio(latencies[name], cost["flops"], streamed, peaks)}
    return out


def embedding_copies(members: int) -> dict[str, int]:
    """How many input stages each deployment stores: one, except the M models of a deep ensemble."""
    return {"single": 1, "hydra": 1, "deep_ensemble": members, "members": members}


def cost_model_from_hydra(model: Any, example_inputs: Mapping[str, Any] | None = None) -> CostModel:
    """The :class:`CostModel` of a fused :class:`~toolchain.hydra.model.HydraModel`.

    Args:
        model: the fused model (its config gives ``heads_per_member``, ``mlp``, ``layernorm``, ``head``).
        example_inputs: model inputs (torch tensors); when given, the embeddings and head stages'
            per-sample FLOPs are measured (:func:`toolchain.hydra.cost.spec_from_hydra`).
    """
    from toolchain.hydra.cost import spec_from_hydra

    cfg = model.config
    heads = [[int(layer.heads[m]) for layer in cfg.layers] for m in range(cfg.members)]
    spec = spec_from_hydra(model, dict(example_inputs) if example_inputs is not None else None)
    copies = 1 if cfg.head == "shared" else cfg.members
    neurons = tuple(map(tuple, cfg.neurons_per_member())) if cfg.sliced else None
    return CostModel(spec, tuple(map(tuple, heads)), mlp=cfg.mlp, layernorm=cfg.layernorm, head_copies=copies,
                     fork=cfg.fork, neurons_per_member=neurons)
