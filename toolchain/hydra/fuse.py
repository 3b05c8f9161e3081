"""Build a Hydra model from one model + M keep masks, or from M member models.

* :func:`fuse` - members are the heads kept by ``keep_masks [M, L, H]`` in one source model:
  they share everything else (embeddings, MLPs, LayerNorms, head), so the head stage is shared
  by default and the averaged MLP *is* the source MLP (exact, no rounding).
* :func:`fuse_members` - members are separate (pruned, possibly fine-tuned) models of one
  architecture: per-member Q/K/V/O, LayerNorms (``grouped``) and head stages are each
  member's own; ``mlp="average"`` averages their MLPs (Hydra), ``mlp="grouped"`` keeps each
  (an exact deep ensemble of the members). The embeddings stage must be equal in all members
  (checked: a :class:`~toolchain.errors.ModelError`, exit 2; ``strict_embeddings=False`` takes
  member 0's and logs the difference).

Both fill one :class:`~toolchain.hydra.model.HydraModel`; members keeping fewer heads than
another member in a layer are padded with exact zero heads (logged per layer).

Cost levers (issue 45): ``fork=k`` fuses the first ``k`` layers as one stream, the source's own
layers (``fuse``: its masks must keep every head there; ``fuse_members``: the members' layers must
be equal there, as their embeddings are); members that keep their own MLP neurons (``neurons`` for
``fuse``, physically sliced members for ``fuse_members``) get a per-member MLP padded with zero
neurons to the layer's widest member (``mlp="grouped"``). Saving and
loading live in :mod:`toolchain.hydra.io`; they are re-exported here.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence

import torch
from torch import nn
from transformers.activations import ACT2FN

from toolchain.errors import ModelError
from toolchain.hydra.block import HydraBlock, check_mode
from toolchain.hydra.config import HEAD_MODES, HydraConfig, LayerSpec
from toolchain.hydra.gfc import check_lowering
from toolchain.hydra.io import encode_adapter_kwargs, format_summary, load_hydra, save_hydra, summary
from toolchain.hydra.model import HydraModel
from toolchain.models.base import LayerView, ModelAdapter, adapter_for

__all__ = ["format_summary", "fuse", "fuse_members", "load_hydra", "save_hydra", "summary"]

logger = logging.getLogger(__name__)

#: one member's weights for one layer: head slices (kept heads only), LayerNorms, MLP
MemberLayer = dict[str, torch.Tensor]


def fuse(
    adapter: ModelAdapter,
    keep_masks: torch.Tensor,
    *,
    mlp: str = "average",
    layernorm: str = "grouped",
    lowering: str = "conv",
    head: str = "shared",
    fork: int = 0,
    neurons: Sequence[Sequence[Sequence[int]]] | None = None,
) -> HydraModel:
    """Fuse M head subsets of one model.

    Args:
        adapter: the source model's adapter (not modified).
        keep_masks: ``[M, L, H]`` bool; member ``m`` keeps head ``h`` of layer ``l`` where true
            (``H`` >= the layer's head count; every member keeps >= 1 head per layer).
        mlp: ``average`` | ``grouped``. The members share the source MLP, so both give the
            same numbers; ``grouped`` stores M copies.
        layernorm: ``grouped`` | ``average`` (same numbers for the same reason).
        lowering: GFC lowering, ``conv`` | ``matmul``.
        head: ``shared`` (one head stage run on the B x M member rows) | ``member`` (M copies).
        fork: layers before it are the source's own, run once on one stream (the masks must keep
            every head there).
        neurons: ``[M][L]`` MLP intermediate neuron indices each member keeps (None: all); needs
            ``mlp="grouped"``. Layers before the fork must keep every neuron.

    Returns:
        An eval-mode :class:`HydraModel`.
    """
    _check_options(mlp, layernorm, lowering)
    if head not in HEAD_MODES:
        raise ValueError(f"head must be one of {HEAD_MODES}; got {head!r}")
    views = adapter.layers()
    masks = _check_masks(keep_masks, [lv.num_heads for lv in views])
    members = masks.shape[0]
    _check_fork(fork, len(views))
    kept_neurons = _check_neurons(neurons, members, [lv.fc1.out_features for lv in views], fork, mlp)
    per_layer: list[list[MemberLayer]] = []
    for idx, lv in enumerate(views):
        shared = _layer_weights(lv)
        if idx < fork:
            if not bool(masks[:, idx, : lv.num_heads].all()):
                raise ValueError(f"layer {idx} is before the fork ({fork}) but keep_masks prune heads there; the "
                                 "trunk is the source's own layer")
            per_layer.append([shared])
            continue
        rows = []
        for m in range(members):
            kept = torch.nonzero(masks[m, idx, : lv.num_heads]).flatten()
            logger.debug("member %d layer %d keeps heads %s of %d", m, idx, kept.tolist(), lv.num_heads)
            row = _select_heads(shared, kept)
            if kept_neurons is not None:
                row = _select_neurons(row, torch.as_tensor(kept_neurons[m][idx]), lv.fc1.out_features)
            rows.append(row)
        per_layer.append(rows)
    specs = []
    for idx, (lv, rows) in enumerate(zip(views, per_layer, strict=True)):
        heads = [r["q_w"].shape[0] for r in rows] * (members if idx < fork else 1)
        widths = None if kept_neurons is None or idx < fork else [len(kept_neurons[m][idx]) for m in range(members)]
        specs.append(_layer_spec([lv] * members, heads, idx, widths))
    config = _make_config(adapter, specs, members, mlp=mlp, layernorm=layernorm, lowering=lowering,
                          head=head, keep_masks=masks.tolist(), source="masks", fork=fork)
    heads = [adapter.head() for _ in range(1 if head == "shared" else members)]
    return _build(config, adapter.embeddings(), heads, per_layer)


def fuse_members(
    adapters_or_models: Sequence[ModelAdapter | nn.Module],
    *,
    mlp: str = "average",
    layernorm: str = "grouped",
    lowering: str = "conv",
    strict_embeddings: bool = True,
    fork: int = 0,
) -> HydraModel:
    """Fuse M separate member models (pruned and possibly fine-tuned) of one architecture.

    Args:
        adapters_or_models: the members, as adapters or models (an adapter is found with
            ``adapter_for``; pass adapters for families that need construction arguments, e.g.
            CLIP prompts).
        mlp: ``average`` (one MLP, the members' mean) | ``grouped`` (each member's own MLP).
        layernorm: ``grouped`` (each member's own) | ``average`` (the members' mean).
        lowering: ``conv`` | ``matmul``.
        strict_embeddings: raise :class:`~toolchain.errors.ModelError` if the members' embeddings stages
            differ (else use member 0's).
        fork: layers before it run once on one stream: the members' layers there must be equal
            (a :class:`~toolchain.errors.ModelError` names the first difference; freeze them while
            fine-tuning the members, ``ModelAdapter.freeze_layers``).

    Members whose MLPs were sliced (``ModelAdapter.prune(keep, neurons)``) need ``mlp="grouped"``.

    Returns:
        An eval-mode :class:`HydraModel` with one head stage per member.
    """
    _check_options(mlp, layernorm, lowering)
    adapters = [m if isinstance(m, ModelAdapter) else adapter_for(m) for m in adapters_or_models]
    if not adapters:
        raise ValueError("fuse_members needs at least one member; got none")
    first = adapters[0]
    for i, a in enumerate(adapters[1:], start=1):
        if type(a) is not type(first) or type(a.model) is not type(first.model):
            raise ValueError(f"member {i} is a {type(a.model).__name__} ({a.family}); member 0 is a "
                             f"{type(first.model).__name__} ({first.family})")
        if a.num_layers != first.num_layers:
            raise ValueError(f"member {i} has {a.num_layers} layers; member 0 has {first.num_layers}")
    views = [a.layers() for a in adapters]
    _check_fork(fork, first.num_layers)
    for idx in range(fork):
        _check_trunk_layer(idx, [v[idx] for v in views])
    per_layer = [[_layer_weights(v[idx]) for v in (views[:1] if idx < fork else views)]
                 for idx in range(first.num_layers)]
    source_width = _source_width(first)
    specs = []
    for idx in range(first.num_layers):
        layer = [v[idx] for v in views]
        widths = [lv.fc1.out_features for lv in layer]
        sliced = len(set(widths)) > 1 or (source_width is not None and max(widths) < source_width)
        if sliced and idx < fork:
            raise ValueError(f"layer {idx} is before the fork ({fork}) but the members' MLPs are sliced there")
        if sliced and mlp == "average":
            raise ValueError(f"layer {idx}: the members keep their own MLP neurons (widths {widths}); "
                             "mlp='average' cannot merge them, use mlp='grouped'")
        specs.append(_layer_spec(layer, [lv.num_heads for lv in layer], idx, widths if sliced else None,
                                 source_width))
    embeddings = first.embeddings()
    _check_shared_stage(embeddings, [a.embeddings() for a in adapters[1:]], strict_embeddings)
    config = _make_config(first, specs, len(adapters), mlp=mlp, layernorm=layernorm, lowering=lowering,
                          head="member", keep_masks=None, source="members", fork=fork)
    return _build(config, embeddings, [a.head() for a in adapters], per_layer)


# --------------------------------------------------------------------------- checks
def _check_options(mlp: str, layernorm: str, lowering: str) -> None:
    check_mode("mlp", mlp)
    check_mode("layernorm", layernorm)
    check_lowering(lowering)


def _check_masks(keep_masks: torch.Tensor, heads: list[int]) -> torch.Tensor:
    masks = torch.as_tensor(keep_masks)
    if masks.dtype != torch.bool:
        if masks.is_floating_point() or not bool(((masks == 0) | (masks == 1)).all()):
            raise ValueError(f"keep_masks must be bool (or 0/1 integers); got dtype {masks.dtype}")
        masks = masks.bool()
    if masks.dim() != 3 or masks.shape[0] < 1 or masks.shape[1] != len(heads) or masks.shape[2] < max(heads):
        raise ValueError(f"keep_masks must be [members >= 1, layers={len(heads)}, heads>={max(heads)}]; "
                         f"got {tuple(masks.shape)}")
    for idx, n in enumerate(heads):
        if bool(masks[:, idx, n:].any()):
            raise ValueError(f"keep_masks keeps a head >= {n} in layer {idx}, which has only {n} heads")
        empty = (~masks[:, idx, :n].any(dim=1)).nonzero().flatten().tolist()
        if empty:
            raise ValueError(f"member(s) {empty} keep no head in layer {idx}; keep at least one head per layer")
    return masks


def _check_fork(fork: int, layers: int) -> None:
    if not isinstance(fork, int) or isinstance(fork, bool) or not 0 <= fork < layers:
        raise ValueError(f"fork must be an int in [0, {layers - 1}] (the layers before the members split); "
                         f"got {fork!r}")


def _check_neurons(neurons: Sequence[Sequence[Sequence[int]]] | None, members: int, widths: list[int], fork: int,
                   mlp: str) -> list[list[list[int]]] | None:
    """``[M][L]`` sorted neuron indices, validated against the layers' widths (None stays None)."""
    if neurons is None:
        return None
    if mlp != "grouped":
        raise ValueError(f"neurons (per-member MLP slices) need mlp='grouped'; got mlp={mlp!r}")
    if len(neurons) != members or any(len(row) != len(widths) for row in neurons):
        raise ValueError(f"neurons must be [members={members}][layers={len(widths)}] index lists; got "
                         f"{len(neurons)} members with {sorted({len(row) for row in neurons})} layers")
    out = []
    for m, row in enumerate(neurons):
        member = []
        for idx, (kept, width) in enumerate(zip(row, widths, strict=True)):
            kept = sorted(int(i) for i in kept)
            if not kept or len(set(kept)) != len(kept) or kept[0] < 0 or kept[-1] >= width:
                raise ValueError(f"neurons[{m}][{idx}] must be distinct indices in [0, {width}); got {len(kept)} "
                                 f"indices in [{kept[0] if kept else '-'}, {kept[-1] if kept else '-'}]")
            if idx < fork and len(kept) != width:
                raise ValueError(f"neurons[{m}][{idx}] slices a layer before the fork ({fork}); the trunk keeps "
                                 "every neuron")
            member.append(kept)
        out.append(member)
    return out


def _check_trunk_layer(idx: int, layer: list[LayerView]) -> None:
    """The members' layer ``idx`` (before the fork) must be equal: the fused model runs it once."""
    ref_w = _layer_weights(layer[0])
    for m, lv in enumerate(layer[1:], start=1):
        w = _layer_weights(lv)
        for key, value in ref_w.items():
            if w[key].shape != value.shape or not torch.equal(w[key], value):
                raise ModelError(f"member {m}'s layer {idx} differs from member 0's at {key!r}; layers before the "
                                 "fork run once for every member.",
                                 hint="Freeze the trunk while fine-tuning the members (ModelAdapter.freeze_layers), "
                                      "or fuse with a smaller fork.")


def _source_width(adapter: ModelAdapter) -> int | None:
    """The MLP width of the unpruned architecture: its Hugging Face (tower) config's, which slicing leaves as it was."""
    cfg = adapter._layer_config()  # the config that holds the layers' sizes (CLIP: the vision tower's)
    for key in ("intermediate_size", "hidden_dim", "ffn_dim"):  # DistilBERT names it hidden_dim
        value = getattr(cfg, key, None)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def _check_shared_stage(ref: nn.Module, others: list[nn.Module], strict: bool) -> None:
    ref_state = ref.state_dict()
    for i, other in enumerate(others, start=1):
        for key, value in other.state_dict().items():
            base = ref_state.get(key)
            if base is not None and base.shape == value.shape and torch.equal(base, value):
                continue
            diff = (value.float() - base.float()).abs().max().item() if base is not None and \
                base.shape == value.shape else float("nan")
            message = (f"member {i}'s embeddings differ from member 0's at {key!r} (max abs diff {diff:.3g}); "
                       "the fused model computes the embeddings once")
            if strict:
                raise ModelError(message + ".", hint="Members must share the input stage their adapter declares "
                                 "(ModelAdapter.input_modules): freeze it while fine-tuning them "
                                 "(ModelAdapter.freeze_shared), or pass strict_embeddings=False to use member 0's.")
            logger.warning("%s; using member 0's", message)
            break


# ------------------------------------------------------------------- weight gathering
def _linear(lin: nn.Linear) -> tuple[torch.Tensor, torch.Tensor]:
    w = lin.weight.detach().float()
    b = lin.bias.detach().float() if lin.bias is not None else torch.zeros(w.shape[0])
    return w, b


def _norm(ln: nn.Module, hidden: int) -> tuple[torch.Tensor, torch.Tensor]:
    w = getattr(ln, "weight", None)
    b = getattr(ln, "bias", None)
    w = w.detach().float() if w is not None else torch.ones(hidden)
    b = b.detach().float() if b is not None else torch.zeros(hidden)
    return w, b


def _layer_weights(lv: LayerView) -> MemberLayer:
    """All of one layer's weights (every head of ``lv``), float32 detached views."""
    out = {k: v.float() for k, v in lv.head_weights().items()}
    hidden = out["o_b"].shape[0]
    out["ln_attn_w"], out["ln_attn_b"] = _norm(lv.ln_attn, hidden)
    out["ln_mlp_w"], out["ln_mlp_b"] = _norm(lv.ln_mlp, hidden)
    out["fc1_w"], out["fc1_b"] = _linear(lv.fc1)
    if lv.fc_up is not None:  # gated MLP: fc1 holds [gate; up], split again after it (HydraMLP)
        up_w, up_b = _linear(lv.fc_up)
        out["fc1_w"], out["fc1_b"] = torch.cat([out["fc1_w"], up_w]), torch.cat([out["fc1_b"], up_b])
    out["fc2_w"], out["fc2_b"] = _linear(lv.fc2)
    return out


def _eps(norm: nn.Module) -> float:
    """A LayerNorm's ``eps`` or an RMSNorm's ``variance_epsilon`` (Hugging Face's LLaMA name)."""
    return float(getattr(norm, "eps", getattr(norm, "variance_epsilon", 1e-5)))


def _select_neurons(weights: MemberLayer, kept: torch.Tensor, width: int) -> MemberLayer:
    """The MLP neurons ``kept`` of a layer ``width`` wide: fc1 rows (gate and up rows when gated), fc2 columns."""
    out = dict(weights)
    rows = kept if weights["fc1_w"].shape[0] == width else torch.cat([kept, kept + width])  # gated: [gate; up]
    out["fc1_w"], out["fc1_b"] = weights["fc1_w"][rows], weights["fc1_b"][rows]
    out["fc2_w"] = weights["fc2_w"][:, kept]
    return out


def _select_heads(weights: MemberLayer, kept: torch.Tensor) -> MemberLayer:
    out = dict(weights)
    for key in ("q_w", "q_b", "k_w", "k_b", "v_w", "v_b", "o_w"):
        out[key] = weights[key][kept]
    return out


def _layer_spec(views: list[LayerView], heads: list[int], idx: int, widths: list[int] | None = None,
                source_width: int | None = None) -> LayerSpec:
    """The layer's structure; all members must agree on everything but the head count and MLP slice.

    ``widths``: the members' MLP neurons when sliced (None: the layer's full width, equal in all).
    """
    ref = views[0]
    facts = {
        "head_dim": lambda lv: lv.head_dim,
        "act_name": lambda lv: lv.act_name,
        "norm_style": lambda lv: lv.norm_style,
        "scaling": lambda lv: float(lv.scaling),
        "ln_attn_eps": lambda lv: _eps(lv.ln_attn),
        "ln_mlp_eps": lambda lv: _eps(lv.ln_mlp),
        "norm": lambda lv: lv.norm,
        "mlp_gated": lambda lv: lv.fc_up is not None,
        "rope": lambda lv: bool(lv.rope),
    }
    values = {name: get(ref) for name, get in facts.items()}
    act_name = values["act_name"]
    if act_name not in ACT2FN or (isinstance(ref.act, nn.Module) and type(ACT2FN[act_name]) is not type(ref.act)):
        raise ValueError(f"layer {idx}: activation {act_name!r} does not rebuild {type(ref.act).__name__} "
                         "with transformers' ACT2FN, so the fused MLP would differ")
    for m, lv in enumerate(views[1:], start=1):
        for name, get in facts.items():
            if get(lv) != values[name]:
                raise ValueError(f"member {m} layer {idx} has {name}={get(lv)!r}; member 0 has {values[name]!r}")
    if widths is None:  # fuse: one source layer; fuse_members: equal widths (unequal ones come as slices)
        return LayerSpec(heads=tuple(heads), intermediate_size=ref.fc1.out_features, **values)
    source = source_width if source_width is not None else ref.fc1.out_features
    return LayerSpec(heads=tuple(heads), intermediate_size=max(widths), neurons=tuple(widths),
                     source_intermediate=max(source, max(widths)), **values)


def _make_config(adapter: ModelAdapter, specs: list[LayerSpec], members: int, **options: object) -> HydraConfig:
    model = adapter.model
    hidden = int(adapter.config_dict()["hidden_size"])
    return HydraConfig(
        family=adapter.family,
        model_class=type(model).__name__,
        # JSON form (what save/load sees), without the checkpoint path: the file is the same wherever it was made
        hf_config={k: v for k, v in json.loads(json.dumps(model.config.to_dict())).items() if k != "_name_or_path"},
        adapter_kwargs=encode_adapter_kwargs(adapter),
        input_names=tuple(adapter.input_names),
        members=members,
        hidden_size=hidden,
        original_heads=int(adapter.original_heads()),
        layers=tuple(specs),
        **options,
    )


# ------------------------------------------------------------------------- filling
def _merge(tensors: list[torch.Tensor], mode: str) -> torch.Tensor:
    """``grouped``: stack ``[M, ...]``; ``average``: the mean (exactly the tensor when all are equal)."""
    if mode == "grouped":
        return torch.stack(tensors)
    if all(t is tensors[0] or torch.equal(t, tensors[0]) for t in tensors[1:]):
        return tensors[0]
    return torch.stack(tensors).mean(dim=0)


@torch.no_grad()
def _fill_block(block: HydraBlock, rows: list[MemberLayer], scaling: float, mlp: str, layernorm: str) -> None:
    att = block.attention
    d = att.head_dim
    for m, w in enumerate(rows):
        n = w["q_w"].shape[0]
        for name in ("q", "k", "v"):
            lin = getattr(att, name)
            scale = scaling if name == "q" else 1.0  # the score scaling is folded into Q
            lin.weight[m].zero_()
            lin.bias[m].zero_()
            lin.weight[m, : n * d] = w[f"{name}_w"].reshape(n * d, -1) * scale
            lin.bias[m, : n * d] = w[f"{name}_b"].reshape(-1) * scale
        att.o.weight[m].zero_()
        att.o.weight[m, :, : n * d] = w["o_w"].permute(1, 0, 2).reshape(-1, n * d)
        att.o.bias[m] = w["o_b"]
    for ln_name in ("ln_attn", "ln_mlp"):
        ln = getattr(block, ln_name)
        ln.weight.copy_(_merge([w[f"{ln_name}_w"] for w in rows], layernorm))
        ln.bias.copy_(_merge([w[f"{ln_name}_b"] for w in rows], layernorm))
    if mlp == "grouped":  # per member, padded with zero neurons to the widest member (as heads are)
        _fill_grouped_mlp(block, rows)
        return
    for fc in ("fc1", "fc2"):
        lin = getattr(block.mlp, fc)
        lin.weight.copy_(_merge([w[f"{fc}_w"] for w in rows], mlp))
        lin.bias.copy_(_merge([w[f"{fc}_b"] for w in rows], mlp))


@torch.no_grad()
def _fill_grouped_mlp(block: HydraBlock, rows: list[MemberLayer]) -> None:
    mlp = block.mlp
    width = mlp.intermediate
    for m, w in enumerate(rows):
        n = w["fc2_w"].shape[1]  # the member's neurons
        mlp.fc1.weight[m].zero_()
        mlp.fc1.bias[m].zero_()
        mlp.fc2.weight[m].zero_()
        parts = [(0, 0)] + ([(n, width)] if mlp.gated else [])  # (source row, slot) of fc1's gate / up halves
        for src, dst in parts:
            mlp.fc1.weight[m, dst: dst + n] = w["fc1_w"][src: src + n]
            mlp.fc1.bias[m, dst: dst + n] = w["fc1_b"][src: src + n]
        mlp.fc2.weight[m, :, :n] = w["fc2_w"]
        mlp.fc2.bias[m] = w["fc2_b"]


def _build(config: HydraConfig, embeddings: nn.Module, heads: list[nn.Module],
           per_layer: list[list[MemberLayer]]) -> HydraModel:
    model = HydraModel(config, embeddings, heads)
    for idx, (block, rows) in enumerate(zip(model.blocks, per_layer, strict=True)):
        spec = config.layers[idx]
        if idx < config.fork:  # the trunk: one stream, the source's layer
            _fill_block(block, rows[:1], spec.scaling, "average", "average")
            logger.info("layer %d: shared trunk (before the fork at %d), %d heads, run once", idx, config.fork,
                        spec.padded_heads)
            continue
        _fill_block(block, rows, spec.scaling, config.mlp, config.layernorm)
        if spec.sliced:
            logger.info("layer %d: members keep %s of %d MLP neurons (padded to %d)", idx, list(spec.neurons),
                        spec.source_width, spec.intermediate_size)
        if spec.zero_heads:
            logger.info("layer %d: members keep %s heads; padded to %d per member (%d zero heads)",
                        idx, list(spec.heads), spec.padded_heads, spec.zero_heads)
        else:
            logger.info("layer %d: every member keeps %d heads (no padding)", idx, spec.padded_heads)
    logger.info("fused %d members of a %s (%s): mlp=%s, layernorm=%s, head=%s, lowering=%s",
                config.members, config.model_class, config.source, config.mlp, config.layernorm,
                config.head, config.lowering)
    return model.eval()
