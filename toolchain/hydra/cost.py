"""Analytic FLOPs and weight bytes: single model, M separate members, deep ensemble, Hydra.

What is counted (FLOPs = 2 x multiply-adds of every MatMul / Linear / Conv):

* **projections**: Q, K, V and O of every (kept or zero-padding) head:
  ``4 x 2 x T x D x (h x d)`` per sample and stream;
* **attention**: scores ``Q^T K`` and context ``V P^T``: ``2 x 2 x T^2 x d x h``;
* **mlp**: fc1 and fc2: ``2 x 2 x T x D x I`` per stream, ``2 x 3 x T x D x I`` gated (the
  averaged MLP of a Hydra model still runs on all M streams);
* **embeddings** and **head**: per-sample numbers given in :class:`EncoderSpec` (0 by default;
  :func:`stage_flops` measures a stage's Linear/Conv FLOPs with hooks). The embeddings run once
  in a Hydra model, the head stage once per member.

Not counted: biases, LayerNorm, softmax, activations, residual adds, masking (all linear in
``T x D``, a few percent at most). Parameters count every stored floating-point tensor (weights,
biases, LayerNorm affine, zero-padding heads, stage buffers such as CLIP's prompt embeddings);
weight bytes are parameters x ``dtype_bytes``. A source's projections and MLP have biases unless
its config says ``attention_bias: false`` (LLaMA), its norms unless they are RMSNorms; the fused
model stores every bias. A gated MLP (SwiGLU) counts three matrices; grouped-query K/V heads are
counted as the source and its pruned members store them (see :class:`EncoderSpec`).

Conventions: ``heads_per_member`` is ``[M][L]`` real heads kept; the Hydra model pads every
member of layer ``l`` to ``max_m heads[m][l]`` (zero heads cost like real ones).

Two cost levers of the Hydra model (issue 45; both off by default, giving the plain fused model):

* **late fork** (``fork``): layers ``l < fork`` are the *trunk*, the source's own blocks run
  once on one stream: ``spec.heads[l]`` heads (K/V per query head, as every fused layer),
  the full MLP, one LayerNorm pair, all stored once. The stream is copied into the M member
  streams at layer ``fork`` (no FLOPs); layers ``l >= fork`` cost as above. Entries of
  ``heads_per_member`` / ``neurons_per_member`` for trunk layers are not used.
* **MLP slices** (``neurons_per_member``, ``[M][L]``): in member layers member ``m`` keeps
  ``neurons[m][l]`` of the ``I`` intermediate neurons. The fused MLP is grouped (each member
  its own fc1/fc2 slice, so ``mlp="grouped"`` is required), every member padded to
  ``I_l = max_m neurons[m][l]`` (zero neurons cost like real ones): ``2 x mlp_matrices x T x D
  x I_l`` FLOPs per stream and M MLPs of width ``I_l`` stored. M separate members
  (:func:`members_cost`) store and run only their real neurons.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from numbers import Integral
from typing import TYPE_CHECKING

import torch
from torch import nn

if TYPE_CHECKING:
    from toolchain.hydra.model import HydraModel


@dataclass(frozen=True)
class EncoderSpec:
    """Sizes of the source encoder.

    Attributes:
        hidden: D.  head_dim: d.  intermediate: I (MLP width).
        heads: heads per layer of the single (unpruned) model, one entry per layer.
        embedding_params, head_params: stored floats of the input stage and of one output stage.
        embedding_flops, head_flops: per-sample FLOPs of the input stage and of one output stage.
        mlp_matrices: 2 (fc1, fc2), 3 for a gated MLP (SwiGLU: gate, up, down).
        kv_heads: K/V heads per layer of the source with grouped-query attention (None: one per
            query head). A pruned layer stores one K/V head per kept query head
            (:func:`toolchain.models.base._prune_layer`), a layer that keeps every head its groups;
            the fused model computes K and V per query head.
        source_biases, source_norm_bias: whether the source's projections / MLP and its norms
            have biases (LLaMA: neither). The fused model stores every bias (zeros where the source has none).
    """

    hidden: int
    head_dim: int
    intermediate: int
    heads: tuple[int, ...]
    embedding_params: int = 0
    head_params: int = 0
    embedding_flops: int = 0
    head_flops: int = 0
    mlp_matrices: int = 2
    kv_heads: tuple[int, ...] | None = None
    source_biases: bool = True
    source_norm_bias: bool = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "heads", tuple(int(h) for h in self.heads))
        for name in ("hidden", "head_dim", "intermediate"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"EncoderSpec.{name} must be a positive int; got {value!r}")
        if not self.heads or min(self.heads) < 1:
            raise ValueError(f"EncoderSpec.heads must list >= 1 head per layer; got {self.heads!r}")

    @property
    def layers(self) -> int:
        """L."""
        return len(self.heads)


@dataclass(frozen=True)
class Cost:
    """FLOPs of one forward over the whole batch, and stored parameters."""

    flops: int
    params: int
    dtype_bytes: int
    breakdown: dict[str, int] = field(default_factory=dict)

    @property
    def weight_bytes(self) -> int:
        """``params x dtype_bytes``."""
        return self.params * self.dtype_bytes

    def as_dict(self) -> dict:
        """JSON-able view."""
        return {"flops": self.flops, "params": self.params, "weight_bytes": self.weight_bytes,
                "breakdown": dict(self.breakdown)}


def layer_flops(
    spec: EncoderSpec, heads: int, seq: int, kv: int | None = None, intermediate: int | None = None
) -> dict[str, int]:
    """FLOPs of one layer for one sample and one stream with ``heads`` heads.

    ``kv``: K/V heads (default ``heads``); ``intermediate``: MLP width (default ``spec.intermediate``).
    """
    inner = heads * spec.head_dim
    kv_inner = (heads if kv is None else kv) * spec.head_dim
    width = spec.intermediate if intermediate is None else intermediate
    return {
        "projections": 2 * seq * spec.hidden * (2 * inner + 2 * kv_inner),
        "attention": 2 * 2 * seq * seq * inner,
        "mlp": 2 * spec.mlp_matrices * seq * spec.hidden * width,
    }


def attention_params(spec: EncoderSpec, heads: int, kv: int | None = None, biases: bool = True) -> int:
    """Q/K/V/O weights (and biases) of one layer with ``heads`` heads and ``kv`` K/V heads (one member)."""
    inner = heads * spec.head_dim
    kv_inner = (heads if kv is None else kv) * spec.head_dim
    return (2 * inner + 2 * kv_inner) * spec.hidden + ((inner + 2 * kv_inner + spec.hidden) if biases else 0)


def mlp_params(spec: EncoderSpec, biases: bool = True, intermediate: int | None = None) -> int:
    """fc1 + fc2 (gated: gate + up + down) weights and biases of one layer (width ``intermediate``, default I)."""
    width = spec.intermediate if intermediate is None else intermediate
    bias = (spec.mlp_matrices - 1) * width + spec.hidden
    return spec.mlp_matrices * spec.hidden * width + (bias if biases else 0)


def layernorm_params(spec: EncoderSpec, bias: bool = True) -> int:
    """The two LayerNorms (RMSNorms: ``bias=False``) of one layer."""
    return 2 * (2 if bias else 1) * spec.hidden


def _check_members(spec: EncoderSpec, heads_per_member: Sequence[Sequence[int]]) -> list[list[int]]:
    rows = [list(map(int, r)) for r in heads_per_member]
    if not rows:
        raise ValueError("heads_per_member must have one row per member; got none")
    for m, row in enumerate(rows):
        if len(row) != spec.layers:
            raise ValueError(f"heads_per_member[{m}] has {len(row)} layers; the encoder has {spec.layers}")
        if min(row) < 1:
            raise ValueError(f"heads_per_member[{m}] keeps no head in some layer: {row}")
    return rows


def _check_fork(spec: EncoderSpec, fork: int) -> int:
    """``fork`` in ``[0, L - 1]``: at least one layer runs the members (as :class:`HydraConfig` requires)."""
    if not isinstance(fork, int) or isinstance(fork, bool) or not 0 <= fork < spec.layers:
        raise ValueError(f"fork must be an int in [0, {spec.layers - 1}] (layers run once before the members "
                         f"split); got {fork!r}")
    return fork


def _check_neurons(
    spec: EncoderSpec, neurons_per_member: Sequence[Sequence[int]] | None, members: int
) -> list[list[int]] | None:
    """``[M][L]`` ints in ``[1, I]``, one row per member of ``heads_per_member``; ``None`` passes through."""
    if neurons_per_member is None:
        return None
    rows = [list(r) for r in neurons_per_member]
    if len(rows) != members:
        raise ValueError(f"neurons_per_member has {len(rows)} rows; heads_per_member has {members} members")
    for m, row in enumerate(rows):
        if len(row) != spec.layers:
            raise ValueError(f"neurons_per_member[{m}] has {len(row)} layers; the encoder has {spec.layers}")
        for layer, n in enumerate(row):
            if not isinstance(n, Integral) or isinstance(n, bool) or not 1 <= n <= spec.intermediate:
                raise ValueError(f"neurons_per_member[{m}][{layer}] must be an int in [1, {spec.intermediate}] "
                                 f"(the source's MLP width); got {n!r}")
    return [[int(n) for n in row] for row in rows]


def _model_cost(spec: EncoderSpec, heads: Sequence[int], batch: int, seq: int, dtype_bytes: int,
                neurons: Sequence[int] | None = None) -> Cost:
    """One plain (possibly pruned) model with ``heads[l]`` heads and ``neurons[l]`` MLP neurons in layer ``l``."""
    parts = {"projections": 0, "attention": 0, "mlp": 0}
    params = spec.embedding_params + spec.head_params
    for layer, h in enumerate(heads):
        kv = None
        if spec.kv_heads is not None:  # grouped K/V in a layer that keeps every head; one per head once pruned
            kv = spec.kv_heads[layer] if h == spec.heads[layer] else h
        width = None if neurons is None else neurons[layer]
        for k, v in layer_flops(spec, h, seq, kv, width).items():
            parts[k] += batch * v
        params += (attention_params(spec, h, kv, spec.source_biases) + mlp_params(spec, spec.source_biases, width)
                   + layernorm_params(spec, spec.source_norm_bias))
    parts["embeddings"] = batch * spec.embedding_flops
    parts["head"] = batch * spec.head_flops
    return Cost(sum(parts.values()), params, dtype_bytes, parts)


def _sum_costs(costs: Sequence[Cost]) -> Cost:
    keys = costs[0].breakdown.keys()
    parts = {k: sum(c.breakdown[k] for c in costs) for k in keys}
    return Cost(sum(c.flops for c in costs), sum(c.params for c in costs), costs[0].dtype_bytes, parts)


def single_cost(spec: EncoderSpec, *, batch: int, seq: int, dtype_bytes: int = 4) -> Cost:
    """The unpruned single model."""
    return _model_cost(spec, spec.heads, batch, seq, dtype_bytes)


def members_cost(
    spec: EncoderSpec, heads_per_member: Sequence[Sequence[int]], *, batch: int, seq: int, dtype_bytes: int = 4,
    fork: int = 0, neurons_per_member: Sequence[Sequence[int]] | None = None,
) -> Cost:
    """M separate pruned members run one after another (each with its own embeddings and head).

    With ``fork`` each member is the source in layers ``< fork`` (all heads, full MLP), pruned after;
    with ``neurons_per_member`` each member stores and runs only its own neurons (no padding).
    """
    rows = _check_members(spec, heads_per_member)
    fork = _check_fork(spec, fork)
    neurons = _check_neurons(spec, neurons_per_member, len(rows))
    costs = []
    for m, row in enumerate(rows):
        heads = list(spec.heads[:fork]) + row[fork:]
        width = None if neurons is None else [spec.intermediate] * fork + neurons[m][fork:]
        costs.append(_model_cost(spec, heads, batch, seq, dtype_bytes, width))
    return _sum_costs(costs)


def deep_ensemble_cost(spec: EncoderSpec, members: int, *, batch: int, seq: int, dtype_bytes: int = 4) -> Cost:
    """M unpruned models (the classic deep ensemble): M x the single model."""
    one = single_cost(spec, batch=batch, seq=seq, dtype_bytes=dtype_bytes)
    return _sum_costs([one] * members)


def hydra_cost(
    spec: EncoderSpec,
    heads_per_member: Sequence[Sequence[int]],
    *,
    batch: int,
    seq: int,
    mlp: str = "average",
    layernorm: str = "grouped",
    head_copies: int | None = None,
    dtype_bytes: int = 4,
    fork: int = 0,
    neurons_per_member: Sequence[Sequence[int]] | None = None,
) -> Cost:
    """The fused model: embeddings once, trunk once, M padded streams, merged MLP, ``head_copies`` head stages.

    ``head_copies`` (stored head stages) defaults to 1 (a shared head); the head stage *runs*
    on all M streams either way. ``fork`` trunk layers run the source's layer once on one
    stream; ``neurons_per_member`` (``[M][L]``, needs ``mlp="grouped"``) slices the members' MLPs,
    each layer padded to its widest member (see the module docstring).
    """
    rows = _check_members(spec, heads_per_member)
    m = len(rows)
    fork = _check_fork(spec, fork)
    neurons = _check_neurons(spec, neurons_per_member, m)
    if neurons is not None and mlp != "grouped":
        raise ValueError(f"neurons_per_member needs mlp='grouped' (each member its own MLP slice); got mlp={mlp!r}")
    copies = 1 if head_copies is None else head_copies
    parts = {"projections": 0, "attention": 0, "mlp": 0}
    params = spec.embedding_params + copies * spec.head_params
    for layer in range(fork):  # the trunk: one stream, the source's heads, one MLP and LayerNorm pair
        for k, v in layer_flops(spec, spec.heads[layer], seq).items():
            parts[k] += batch * v
        params += attention_params(spec, spec.heads[layer]) + layernorm_params(spec) + mlp_params(spec)
    for layer in range(fork, spec.layers):
        padded = max(r[layer] for r in rows)
        width = None if neurons is None else max(r[layer] for r in neurons)
        for k, v in layer_flops(spec, padded, seq, intermediate=width).items():
            parts[k] += batch * m * v
        params += m * attention_params(spec, padded)
        params += (m if layernorm == "grouped" else 1) * layernorm_params(spec)
        params += (m if mlp == "grouped" else 1) * mlp_params(spec, intermediate=width)
    parts["embeddings"] = batch * spec.embedding_flops
    parts["head"] = batch * m * spec.head_flops
    return Cost(sum(parts.values()), params, dtype_bytes, parts)


def compare(
    spec: EncoderSpec,
    heads_per_member: Sequence[Sequence[int]],
    *,
    batch: int,
    seq: int,
    mlp: str = "average",
    layernorm: str = "grouped",
    head_copies: int | None = None,
    dtype_bytes: int = 4,
    fork: int = 0,
    neurons_per_member: Sequence[Sequence[int]] | None = None,
) -> dict:
    """Costs of the four deployments and the ratios the bench reports (JSON-able).

    ``fork`` and ``neurons_per_member`` apply to ``hydra`` and to the M separate ``members``
    (the same members unfused); ``single`` and ``deep_ensemble`` are unpruned.
    """
    kw = {"batch": batch, "seq": seq, "dtype_bytes": dtype_bytes}
    levers = {"fork": fork, "neurons_per_member": neurons_per_member}
    m = len(heads_per_member)
    costs = {
        "single": single_cost(spec, **kw),
        "members": members_cost(spec, heads_per_member, **levers, **kw),
        "deep_ensemble": deep_ensemble_cost(spec, m, **kw),
        "hydra": hydra_cost(spec, heads_per_member, mlp=mlp, layernorm=layernorm, head_copies=head_copies,
                            **levers, **kw),
    }
    out: dict = {k: c.as_dict() for k, c in costs.items()}
    single = costs["single"]
    out["ratios_vs_single"] = {
        k: {"flops": c.flops / single.flops, "weight_bytes": c.weight_bytes / single.weight_bytes}
        for k, c in costs.items()
    }
    return out


# ----------------------------------------------------------------- from models
def stage_size(module: nn.Module) -> int:
    """Stored floating-point numbers of a module (parameters and persistent buffers)."""
    return sum(t.numel() for t in module.state_dict().values() if t.is_floating_point())


def stage_flops(module: nn.Module, *args: object, **kwargs: object) -> int:
    """FLOPs of the Linear and Conv layers in one call ``module(*args, **kwargs)`` (hooks)."""
    total = 0

    def hook(mod: nn.Module, inputs: tuple, output: torch.Tensor) -> None:
        nonlocal total
        if isinstance(mod, nn.Linear):
            total += 2 * output.numel() * mod.in_features
        elif isinstance(mod, nn.Conv1d | nn.Conv2d | nn.Conv3d):
            per_out = (mod.in_channels // mod.groups) * int(torch.tensor(mod.kernel_size).prod())
            total += 2 * output.numel() * per_out

    handles = [m.register_forward_hook(hook) for m in module.modules()
               if isinstance(m, nn.Linear | nn.Conv1d | nn.Conv2d | nn.Conv3d)]
    try:
        with torch.no_grad():
            module(*args, **kwargs)
    finally:
        for h in handles:
            h.remove()
    return total


def _kv_heads(hf_config: dict, layers: int) -> tuple[int, ...] | None:
    """K/V heads per layer from a Hugging Face config with grouped-query attention (``num_key_value_heads``)."""
    kv, heads = hf_config.get("num_key_value_heads"), hf_config.get("num_attention_heads")
    return (int(kv),) * layers if kv and heads and int(kv) != int(heads) else None


def spec_from_hydra(model: HydraModel, example_inputs: dict[str, torch.Tensor] | None = None) -> EncoderSpec:
    """The source encoder's sizes from a fused model (``original_heads`` per layer, the source's MLP width).

    With ``example_inputs`` the embeddings and head stages' per-sample FLOPs are measured
    (:func:`stage_flops`); without, they are 0.
    """
    cfg = model.config
    first = cfg.layers[0]
    spec = EncoderSpec(
        hidden=cfg.hidden_size,
        head_dim=first.head_dim,
        intermediate=first.source_intermediate or first.intermediate_size,  # a sliced layer's padded width is not I
        heads=(cfg.original_heads,) * cfg.num_layers,
        embedding_params=stage_size(model.embeddings),
        head_params=stage_size(model.heads[0]),
        mlp_matrices=3 if first.mlp_gated else 2,
        kv_heads=_kv_heads(cfg.hf_config, cfg.num_layers),
        source_biases=bool(cfg.hf_config.get("attention_bias", True)),
        source_norm_bias=first.norm != "rms",
    )
    if example_inputs is None:
        return spec
    feed = {k: v for k, v in example_inputs.items() if k in cfg.input_names and v is not None}
    batch = next(iter(feed.values())).shape[0]
    with torch.no_grad():
        hidden = model.embeddings(**feed)[0]
    return replace(
        spec,
        embedding_flops=stage_flops(model.embeddings, **feed) // batch,
        head_flops=stage_flops(model.heads[0], hidden) // batch,
    )


def _levers_of(model: HydraModel) -> dict:
    """``hydra_cost`` / ``compare`` keywords read from a fused model's config (heads, fork, slices, modes)."""
    cfg = model.config
    return {
        "heads_per_member": cfg.heads_per_member(),
        "mlp": cfg.mlp,
        "layernorm": cfg.layernorm,
        "head_copies": len(model.heads),
        "fork": cfg.fork,
        "neurons_per_member": cfg.neurons_per_member() if cfg.sliced else None,
    }


def hydra_cost_of(
    model: HydraModel, *, batch: int, seq: int, dtype_bytes: int = 4,
    example_inputs: dict[str, torch.Tensor] | None = None,
) -> Cost:
    """:func:`hydra_cost` of a fused model: heads, fork, MLP slices, modes and head copies from ``model.config``.

    ``seq`` is T as the blocks see it (the input stage's tokens: a ViT's patches plus CLS);
    ``example_inputs`` measure the embeddings and head stages (:func:`spec_from_hydra`).
    """
    spec = spec_from_hydra(model, example_inputs)
    levers = _levers_of(model)
    heads = levers.pop("heads_per_member")
    return hydra_cost(spec, heads, batch=batch, seq=seq, dtype_bytes=dtype_bytes, **levers)


def compare_of(
    model: HydraModel, *, batch: int, seq: int, dtype_bytes: int = 4,
    example_inputs: dict[str, torch.Tensor] | None = None,
) -> dict:
    """:func:`compare` of a fused model (single, members, deep ensemble, Hydra), levers from ``model.config``."""
    spec = spec_from_hydra(model, example_inputs)
    levers = _levers_of(model)
    heads = levers.pop("heads_per_member")
    return compare(spec, heads, batch=batch, seq=seq, dtype_bytes=dtype_bytes, **levers)
