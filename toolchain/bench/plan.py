"""Planning a benchmark: which variants an export holds, which ratios to report, and the generated feeds.

* :func:`plan_variants`: ``graphs.json`` (or a kind's ``engines.json``) -> the deployments to time:
  ``single``, ``deep-ensemble`` (single then every member, M sessions), ``hydra-<lowering>``, and
  the same at each other precision where the graphs (or engines) exist;
* :func:`ratio_pairs`: Hydra against the single model and the deep ensemble of its precision, the
  deep ensemble against the single model;
* :func:`make_feed`: text graphs get ``input_ids`` with real token ids (1000..20000, limited to the
  vocabulary), a full ``attention_mask`` and zero ``token_type_ids`` (int64, ``[batch, sequence]``);
  image graphs get ``pixel_values`` (float32, standard normal) with the graph's static ``C, H, W``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from toolchain.engines import Runner
from toolchain.errors import GraphError

TOKEN_RANGE = (1000, 20000)
_MEMBER = re.compile(r"^member(\d+)$")
_FLOAT_DTYPES = ("float", "float32", "float16", "bfloat16")


# ------------------------------------------------------------------------------- graphs.json
def read_graphs(export_dir: Path) -> dict[str, dict[str, Any]]:
    """``graphs.json`` of an export folder, every listed file checked to exist."""
    path = Path(export_dir) / "graphs.json"
    if not path.is_file():
        raise GraphError(f"no graphs.json in {export_dir}; run the export stage first (hydra-toolchain export).")
    graphs = json.loads(path.read_text())
    missing = [f"{name} ({g.get('path')})" for name, g in graphs.items()
               if not (Path(export_dir) / str(g.get("path", ""))).is_file()]
    if missing:
        raise GraphError(f"graphs.json in {export_dir} lists files that are missing: {', '.join(missing)}.")
    return graphs


def plan_variants(
    graphs: Mapping[str, Mapping[str, Any]], precisions: Sequence[str] = ("fp32",)
) -> dict[str, list[str]]:
    """Variant name -> graph names run one after another, in the report's order.

    FP32: ``single``, ``deep-ensemble`` (when members exist), ``hydra-<lowering>`` per lowering;
    another precision ``p``: ``single.p``, ``deep-ensemble.p`` (when the members exist at ``p``:
    a kind that compiles FP32 graphs at a precision builds them) and ``hydra-<lowering>.p``.
    """
    plan: dict[str, list[str]] = {}
    for precision in precisions:
        suffix = "" if precision == "fp32" else f".{precision}"
        chosen = {n: g for n, g in graphs.items() if g.get("precision", "fp32") == precision}
        single = f"single{suffix}"
        if single in chosen:
            plan[single] = [single]
        members = sorted((int(m.group(1)), n) for n in chosen if (m := _MEMBER.match(n.removesuffix(suffix))))
        if single in chosen and members:
            plan[f"deep-ensemble{suffix}"] = [single] + [n for _, n in members]
        for name in sorted(n for n, g in chosen.items() if g.get("kind") == "hydra"):
            plan[name] = [name]
    return plan


def ratio_pairs(variants: Sequence[str]) -> list[tuple[str, str]]:
    """``(numerator, denominator)`` pairs whose per-round ratios are reported.

    Every Hydra variant against the single model and the deep ensemble of its precision; each deep
    ensemble against the single model of its precision.
    """
    present = set(variants)
    pairs = []
    for name in variants:
        if name.startswith("hydra"):
            suffix = name[len(name.split(".")[0]):]
            for den in (f"single{suffix}", f"deep-ensemble{suffix}"):
                if den in present:
                    pairs.append((name, den))
    for name in variants:
        if name.startswith("deep-ensemble"):
            suffix = name[len("deep-ensemble"):]
            if f"single{suffix}" in present:
                pairs.append((name, f"single{suffix}"))
    return pairs


# ------------------------------------------------------------------------------------- feeds
def _input_entries(graphs: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The inputs (name, dtype, dims) from the first graph with a summary."""
    for g in graphs.values():
        entries = (g.get("summary") or {}).get("inputs")
        if entries:
            return [dict(e) for e in entries]
    names = next(iter(graphs.values())).get("inputs") or []
    return [{"name": n, "dtype": "float" if n == "pixel_values" else "int64", "dims": []} for n in names]


def vocabulary_size(onnx_path: Path, input_name: str = "input_ids") -> int | None:
    """Rows of the embedding table gathered by ``input_name`` (None when not found)."""
    import onnx

    model = onnx.load(str(onnx_path), load_external_data=False)
    inits = {i.name: i for i in model.graph.initializer}
    sources = {input_name}
    for node in model.graph.node:  # follow Cast/Identity of the ids to the Gather
        if node.op_type in ("Cast", "Identity") and node.input and node.input[0] in sources:
            sources.update(node.output)
    for node in model.graph.node:
        if node.op_type == "Gather" and len(node.input) > 1 and node.input[1] in sources and node.input[0] in inits:
            dims = list(inits[node.input[0]].dims)
            if dims:
                return int(dims[0])
    return None


def make_feed(
    inputs: Sequence[Mapping[str, Any]],
    batch: int,
    sequence: int,
    *,
    vocab: int | None = None,
    seed: int = 0,
) -> dict[str, np.ndarray]:
    """One feed for graphs with these ``inputs`` (``[{"name", "dtype", "dims"}]``).

    Text: ``input_ids`` uniform in ``TOKEN_RANGE`` (scaled down into a smaller vocabulary),
    ``attention_mask`` all ones, ``token_type_ids`` zeros, int64 ``[batch, sequence]``.
    Images: ``pixel_values`` standard normal float32 ``[batch, C, H, W]`` (static dims).
    """
    rng = np.random.default_rng(seed)
    feed: dict[str, np.ndarray] = {}
    low, high = TOKEN_RANGE
    if vocab is not None and vocab <= high:
        low, high = max(1, vocab // 10), vocab
    for entry in inputs:
        name, dims = entry["name"], list(entry.get("dims") or [])
        if _is_float(entry):
            rest = dims[1:]
            if not rest or not all(isinstance(d, int) for d in rest):
                raise GraphError(f"input '{name}' has dims {dims}: the image benchmark needs static C, H, W.")
            feed[name] = rng.standard_normal((batch, *rest)).astype(np.float32)
        elif name == "input_ids":
            feed[name] = rng.integers(low, high, size=(batch, sequence), dtype=np.int64)
        elif name == "attention_mask":
            feed[name] = np.ones((batch, sequence), dtype=np.int64)
        else:  # token_type_ids and any other id input
            feed[name] = np.zeros((batch, sequence), dtype=np.int64)
    return feed


def _is_float(entry: Mapping[str, Any]) -> bool:
    """A floating-point input (image pixels): static ``C, H, W``, no sequence axis."""
    return entry.get("dtype") in _FLOAT_DTYPES


def _is_text(inputs: Sequence[Mapping[str, Any]]) -> bool:
    return not any(_is_float(e) for e in inputs)


def _cast_for(runner: Runner, feed: Mapping[str, np.ndarray]) -> dict[str, np.ndarray] | None:
    """A copy of ``feed`` in the runner's input dtypes, or None when it already matches."""
    specs = runner.input_specs()
    if all(feed[k].dtype == specs[k].dtype for k in feed if k in specs):
        return None
    return {k: v.astype(specs[k].dtype) if k in specs else v for k, v in feed.items()}


# ------------------------------------------------------------------------------------ runners
def _torch_specs(inputs: Sequence[Mapping[str, Any]]) -> dict[str, tuple]:
    specs = {}
    for e in inputs:
        if _is_float(e):
            specs[e["name"]] = (np.float32, ("batch", *list(e.get("dims") or [None])[1:]))
        else:
            specs[e["name"]] = (np.int64, ("batch", "sequence"))
    return specs
