"""The model-adapter contract: one adapter per model family, one interface for the pipeline.

transformers 5.x removed ``head_mask`` and ``prune_heads()``, so this module implements head
gating, attention capture and physical head removal on top of plain Hugging Face modules,
without editing their source:

* **gating** - a forward pre-hook on each layer's attention output projection multiplies the
  context vector of head ``h`` (its ``head_dim`` slice of the projection's input) by
  ``gates[..., layer, h]``. Gates are ``[layers, max_heads]`` (one mask for the batch) or
  ``[batch, layers, max_heads]`` (one mask per sample: the batched circuit search uses it).
  The hook is differentiable with respect to the gates.
* **attention capture** - a forward hook on each attention module reads the attention
  probabilities that the eager attention kernel returns (``[batch, heads, query, key]``); the
  attention implementation is switched to ``eager`` for the duration (same maths as SDPA, so
  outputs do not change beyond float rounding) and restored afterwards.
* **pruning** - Q/K/V output rows and O input columns of the removed heads are deleted with
  ``transformers.pytorch_utils.prune_linear_layer`` on a deep copy. HF attention modules reshape
  with ``-1`` heads, so the remaining heads run unchanged. MLP neurons are sliced the same way
  (``fc1``/``fc_up`` output rows, ``fc2`` input columns). The per-layer head counts (and MLP
  widths, when sliced) are stored in the config (``hydra_heads_per_layer``,
  ``hydra_mlp_per_layer``) so :func:`toolchain.models.load_model` can rebuild the pruned shapes.

Adding a family means writing one :class:`ModelAdapter` subclass that declares the family's
facts (Hugging Face ``model_types``, classes, inputs, tokenizer use, ``from_config``, example
inputs), registering it with :func:`register_adapter` (its module imported in
``toolchain/models/__init__.py``), and a tiny model in :mod:`toolchain.models.tiny`. Nothing
outside :mod:`toolchain.models` names a family: the pipeline asks the registry
(:mod:`toolchain.models.registry`) and the adapter.
"""

from __future__ import annotations

import contextlib
import copy
import itertools
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import torch
from torch import nn

from toolchain.models.slicing import _neuron_index, _prune_layer, _prune_mlp

NormStyle = Literal["post", "pre"]
#: what a family needs a tokenizer for: its own inputs (text), class prompts (zero-shot), or nothing
TokenizerUse = Literal["inputs", "prompts"] | None

#: config attribute holding the per-layer head counts of a pruned model
HEADS_ATTR = "hydra_heads_per_layer"
#: config attribute holding the per-layer MLP widths (intermediate neurons) of a neuron-sliced model
MLP_ATTR = "hydra_mlp_per_layer"


@dataclass
class LayerView:
    """Live references to the parts of one transformer layer (no copies).

    ``post`` (BERT): ``x = ln_attn(x + O(attn(x)))``; ``x = ln_mlp(x + fc2(act(fc1(x))))``.
    ``pre`` (ViT, CLIP): ``x = x + O(attn(ln_attn(x)))``; ``x = x + fc2(act(fc1(ln_mlp(x))))``.

    Decoder facts (LLaMA): ``fc_up`` makes the MLP gated, ``fc2(act(fc1(x)) * fc_up(x))`` (SwiGLU);
    ``norm="rms"`` marks RMSNorms (no mean, no bias); ``rope`` says Q and K are rotated by
    position (the input stage computes the angles). K and V may have fewer heads than Q
    (grouped-query attention): query head ``h`` reads key/value head ``h // (H / H_kv)``.
    """

    attention: nn.Module  #: the block that contains q, k, v and o
    probs_module: nn.Module  #: the module whose forward returns ``(context, attn_probs)``
    q: nn.Linear
    k: nn.Linear
    v: nn.Linear
    o: nn.Linear
    ln_attn: nn.LayerNorm
    ln_mlp: nn.LayerNorm
    fc1: nn.Linear
    fc2: nn.Linear
    act: Callable[[torch.Tensor], torch.Tensor]
    act_name: str
    norm_style: NormStyle
    head_dim: int
    scaling: float
    #: attribute names on ``attention`` that hold the head count / projected size
    heads_attr: str = "num_attention_heads"
    size_attr: str | None = None
    fc_up: nn.Linear | None = None
    norm: Literal["layer", "rms"] = "layer"
    rope: bool = False

    @property
    def num_heads(self) -> int:
        """Number of heads the layer has now (after any pruning)."""
        return self.q.out_features // self.head_dim

    @property
    def kv_repeat(self) -> int:
        """Query heads per key/value head (1 without grouped-query attention)."""
        return self.q.out_features // self.k.out_features

    def head_weights(self) -> dict[str, torch.Tensor]:
        """Per-head weight slices for fusion (detached views, float32).

        Returns ``q_w, k_w, v_w``: ``[H, head_dim, hidden]``; ``q_b, k_b, v_b``: ``[H, head_dim]``
        (zeros where the projection has no bias); ``o_w``: ``[H, hidden, head_dim]`` (the
        output-projection columns of each head); ``o_b``: ``[hidden]``.
        """
        h, d, rep = self.num_heads, self.head_dim, self.kv_repeat
        out: dict[str, torch.Tensor] = {}
        for name, lin in (("q", self.q), ("k", self.k), ("v", self.v)):
            n = h if name == "q" else h // rep  # grouped K/V: each query head gets its group's slice
            weight = lin.weight.detach().reshape(n, d, -1)
            bias = (lin.bias.detach() if lin.bias is not None else torch.zeros(n * d)).reshape(n, d)
            out[f"{name}_w"] = weight.repeat_interleave(rep, dim=0) if name != "q" else weight
            out[f"{name}_b"] = bias.repeat_interleave(rep, dim=0) if name != "q" else bias
        out["o_w"] = self.o.weight.detach().reshape(-1, h, d).permute(1, 0, 2)
        out["o_b"] = self.o.bias.detach() if self.o.bias is not None else torch.zeros(self.o.out_features)
        return out


@dataclass(frozen=True)
class InputSpec:
    """One model input as engines and exporters see it.

    ``dtype`` is a numpy dtype name (``"int64"``, ``"float32"``); ``axes`` has one entry per
    dimension: a dynamic axis name (``"batch"``, ``"sequence"``) or ``None`` for a static size
    (taken from an example input).
    """

    name: str
    dtype: str
    axes: tuple[str | None, ...]

    def dynamic_axes(self) -> dict[int, str]:
        """``{dimension: axis name}`` of the dynamic dimensions (the ONNX exporter's ``dynamic_axes``)."""
        return {i: a for i, a in enumerate(self.axes) if a is not None}

    def shape(self, example: Sequence[int], sizes: Mapping[str, Any] | None = None) -> tuple:
        """The shape: dynamic axes as ``sizes[axis]`` (the axis name when ``sizes`` is None).

        Static axes take their size from ``example`` (the shape of an example input).
        """
        return tuple(int(example[i]) if a is None else (a if sizes is None else sizes[a])
                     for i, a in enumerate(self.axes))


#: the inputs of a BERT-style text model and of an image model
TEXT_AXES: tuple[str, str] = ("batch", "sequence")
IMAGE_AXES: tuple[str, None, None, None] = ("batch", None, None, None)


def random_pixels(batch: int, channels: int, size: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """``pixel_values``: standard normal float32 ``[batch, channels, size, size]`` from ``seed``."""
    g = torch.Generator().manual_seed(seed)
    return {"pixel_values": torch.randn(batch, channels, size, size, generator=g)}


_REGISTRY: list[type[ModelAdapter]] = []


def register_adapter(cls: type[ModelAdapter]) -> type[ModelAdapter]:
    """Class decorator: make an adapter findable by :func:`adapter_for`."""
    _REGISTRY.append(cls)
    return cls


def registered_adapters() -> list[type[ModelAdapter]]:
    """All registered adapter classes, in registration order."""
    return list(_REGISTRY)


def adapter_for(model: nn.Module, **kwargs: object) -> ModelAdapter:
    """Return the adapter that handles ``model`` (first registered match)."""
    from toolchain.errors import ModelError

    for cls in _REGISTRY:
        if cls.handles(model):
            return cls(model, **kwargs)
    families = ", ".join(c.family for c in _REGISTRY)
    classes = ", ".join(n for c in _REGISTRY for n in c.model_classes)
    raise ModelError(
        f"model class {type(model).__name__} is not a supported family (supported: {families}).",
        hint=f"Use a model of one of these classes: {classes}.",
    )


class ModelAdapter(ABC):
    """Uniform access to one Hugging Face model of a supported family.

    The adapter wraps (does not copy) ``model``; methods that change structure return a copy.
    Batches are dicts of tensors as the family's forward takes them (``input_ids`` /
    ``attention_mask`` / ``token_type_ids`` for text, ``pixel_values`` for images).
    """

    # ------------------------------------------------------------- family facts
    #: the family's name (recipes' ``model.family``; the registry's key)
    family: ClassVar[str]
    #: Hugging Face ``config.json`` ``model_type`` values of this family's checkpoints
    model_types: ClassVar[tuple[str, ...]]
    #: transformers classes: for classification, for a bare encoder, the config
    classifier_class: ClassVar[str]
    encoder_class: ClassVar[str]
    config_class: ClassVar[str]
    #: model classes (by ``type(model).__name__``) this adapter handles
    model_classes: ClassVar[tuple[str, ...]]
    #: the batch tensors the forward takes, in order (names, dtypes, dynamic axes)
    inputs: ClassVar[tuple[InputSpec, ...]]
    #: names of the batch tensors the forward takes, in order (from ``inputs``)
    input_names: ClassVar[tuple[str, ...]]
    #: the data the family reads
    modality: ClassVar[Literal["text", "image"]]
    #: what the family needs a tokenizer for: ``"inputs"`` (text), ``"prompts"`` (class prompts), None
    tokenizer_use: ClassVar[TokenizerUse] = None
    #: LayerNorm placement of its blocks (the fused Hydra block follows it; see :class:`LayerView`)
    norm_style: ClassVar[NormStyle]
    #: state-dict keys of the classification head's output weight ``[labels, features]`` in a
    #: checkpoint (the first one present gives the checkpoint's label count); empty: no such head
    classifier_weights: ClassVar[tuple[str, ...]] = ("classifier.weight",)

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        if "inputs" in cls.__dict__:
            cls.input_names = tuple(spec.name for spec in cls.inputs)

    def __init__(self, model: nn.Module) -> None:
        self.model = model

    # --------------------------------------------------------- building (class level)
    @classmethod
    def checkpoint_class(cls, config: Any, encoder_only: bool = False) -> str:
        """The transformers class a checkpoint with ``config`` loads as (default: the family's classifier)."""
        del config
        return cls.encoder_class if encoder_only else cls.classifier_class

    @classmethod
    def from_config(cls, config: Mapping[str, Any], num_labels: int) -> nn.Module:
        """An untrained classifier (eval mode) from a Hugging Face config dict, for ``num_labels`` classes."""
        import transformers

        cfg = getattr(transformers, cls.config_class)(**{**dict(config), "num_labels": num_labels})
        return getattr(transformers, cls.classifier_class)(cfg).eval()

    @classmethod
    def relabel(cls, config: Any, num_labels: int) -> None:
        """Give a checkpoint's config a new classification head of ``num_labels`` (default: keep the config's)."""
        del config, num_labels

    @classmethod
    def construction_kwargs(cls, tokenizer: Any, class_names: Sequence[str], prompt_template: str) -> dict:
        """Adapter arguments that come from the data (e.g. tokenised class prompts); default none."""
        return {}

    @classmethod
    @abstractmethod
    def example_inputs(cls, batch: int, *, sequence: int, image_size: int, num_channels: int,
                       seed: int = 0) -> dict[str, torch.Tensor]:
        """Generated inputs named and typed as ``inputs`` (export, parity and engine feeds).

        ``sequence`` is the token count (text), ``image_size`` / ``num_channels`` the image shape.
        """

    @classmethod
    def input_specs(cls) -> dict[str, InputSpec]:
        """``inputs`` by name."""
        return {spec.name: spec for spec in cls.inputs}

    # ----------------------------------------------------------------- family hooks
    @classmethod
    def handles(cls, model: nn.Module) -> bool:
        """True when this adapter knows ``model``'s class."""
        return type(model).__name__ in cls.model_classes

    @abstractmethod
    def layers(self) -> list[LayerView]:
        """The prunable transformer layers, in order."""

    @abstractmethod
    def logits(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """Run the model; return the classification (or zero-shot) logits ``[batch, classes]``."""

    @abstractmethod
    def token_mask(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """``[batch, tokens]`` bool: the real (non-padding) tokens seen by the prunable layers."""

    @abstractmethod
    def input_modules(self) -> tuple[nn.Module | None, ...]:
        """The live modules of the input stage, in the order :meth:`embeddings` takes copies of them.

        The fused Hydra model runs this stage once for all its members: the embeddings, an
        embedding projection (ELECTRA's ``embeddings_project``), a norm before the first layer
        (CLIP's ``pre_layrnorm``), the token table (LLaMA's ``embed_tokens``). Members must keep
        it equal, so recovery fine-tuning freezes it (:meth:`freeze_shared`). ``None`` stands for
        an optional module the model lacks.
        """

    @abstractmethod
    def embeddings(self) -> nn.Module:
        """A copy of the input stage: ``module(**batch) -> (hidden [B, T, D], attn_bias | None)``.

        Built from copies of :meth:`input_modules`. ``attn_bias`` is additive, broadcastable to
        ``[B, heads, T, T]`` (``-inf``-like for masked keys).
        """

    def shared_parameters(self) -> dict[str, nn.Parameter]:
        """``name -> parameter`` of :meth:`input_modules` (what the fused members share), named as in the model."""
        ids = {id(p) for module in self.input_modules() if module is not None for p in module.parameters()}
        return {name: p for name, p in self.model.named_parameters() if id(p) in ids}

    def freeze_shared(self) -> list[str]:
        """Stop gradients to :meth:`shared_parameters` (a member's recovery fine-tuning); their names, sorted."""
        shared = self.shared_parameters()
        for param in shared.values():
            param.requires_grad_(False)
        return sorted(shared)

    def freeze_layers(self, count: int) -> list[str]:
        """Stop gradients to every parameter of the first ``count`` prunable layers; their names, sorted.

        A late fork's shared trunk: members keep the source's first layers during recovery.
        The layers are :meth:`layer_modules` (the parts of each :class:`LayerView` where that is None).
        """
        if isinstance(count, bool) or not isinstance(count, int) or not 0 <= count <= self.num_layers:
            raise ValueError(f"count={count!r} is out of range; it must be an integer in [0, {self.num_layers}]")
        modules = self.layer_modules() or [nn.ModuleList(m for m in (lv.attention, lv.ln_attn, lv.ln_mlp, lv.fc1,
                                           lv.fc2, lv.fc_up) if m is not None) for lv in self.layers()]
        ids = {id(p) for module in modules[:count] for p in module.parameters()}
        frozen = {name: p for name, p in self.model.named_parameters() if id(p) in ids}
        for param in frozen.values():
            param.requires_grad_(False)
        return sorted(frozen)

    @abstractmethod
    def head(self) -> nn.Module:
        """A copy of the output stage: ``module(hidden [B, T, D]) -> logits [B, classes]``."""

    @abstractmethod
    def config_dict(self) -> dict:
        """The family-specific facts the fused model needs (hidden size, eps, activation...)."""

    # ---------------------------------------------------------------- structure
    @property
    def num_layers(self) -> int:
        """Number of prunable layers."""
        return len(self.layers())

    def heads_per_layer(self) -> list[int]:
        """Current head count of every prunable layer (unequal after pruning)."""
        return [lv.num_heads for lv in self.layers()]

    @property
    def max_heads(self) -> int:
        """Largest head count over layers: the second axis of a gate tensor."""
        return max(self.heads_per_layer())

    def head_dims(self) -> list[int]:
        """Head size of every prunable layer."""
        return [lv.head_dim for lv in self.layers()]

    def mlp_per_layer(self) -> list[int]:
        """MLP intermediate width (neurons, the input size of ``fc2``) of every prunable layer."""
        return [lv.fc2.in_features for lv in self.layers()]

    def original_heads(self) -> int:
        """Heads per layer of the unpruned architecture (from the config)."""
        return int(self._layer_config().num_attention_heads)

    def _layer_config(self):
        return self.model.config

    # ------------------------------------------------------------------- gating
    @contextlib.contextmanager
    def gated(self, gates: torch.Tensor) -> Iterator[None]:
        """Multiply every head's context output by its gate inside the ``with`` block.

        Args:
            gates: ``[layers, max_heads]`` or ``[batch, layers, max_heads]``; entries past a
                layer's head count are ignored. May require grad.
        """
        layers = self.layers()
        if gates.dim() not in (2, 3) or gates.shape[-2] != len(layers):
            raise ValueError(
                f"gates must be [layers={len(layers)}, heads] or [batch, layers, heads]; got {tuple(gates.shape)}"
            )
        if gates.shape[-1] < max(lv.num_heads for lv in layers):
            raise ValueError(f"gates has {gates.shape[-1]} heads per layer; the model has up to {self.max_heads}")
        handles = []
        for idx, lv in enumerate(layers):
            handles.append(lv.o.register_forward_pre_hook(_gate_hook(gates, idx, lv.num_heads, lv.head_dim)))
        try:
            yield
        finally:
            for h in handles:
                h.remove()

    def gated_logits(self, batch: dict[str, torch.Tensor], gates: torch.Tensor) -> torch.Tensor:
        """Logits with heads gated by ``gates`` (see :meth:`gated`)."""
        with self.gated(gates):
            return self.logits(batch)

    # -------------------------------------------------------------- layer stack
    def layer_modules(self) -> list[nn.Module] | None:
        """The module of each prunable layer, as the model's stack calls it; ``None`` where that is unclear.

        Each is the innermost module holding both the layer's attention block and its ``fc2``
        (``bert.encoder.layer.3``), accepted only when the layers are consecutive entries, in
        order, of one ``nn.ModuleList`` (a stack that calls each layer once, in order).
        """
        names = {id(m): n for n, m in self.model.named_modules()}
        found: list[tuple[str, int]] = []
        for lv in self.layers():
            a, f = names.get(id(lv.attention), "").split("."), names.get(id(lv.fc2), "").split(".")
            common = [x for x, _ in itertools.takewhile(lambda xy: xy[0] == xy[1], zip(a, f))]  # shared parts
            if len(common) < 2 or not common[-1].isdigit():
                return None
            found.append((".".join(common[:-1]), int(common[-1])))
        parents = {p for p, _ in found}
        if len(parents) != 1:
            return None
        stack = self.model.get_submodule(parents.pop())
        idx = [i for _, i in found]
        if not isinstance(stack, nn.ModuleList) or idx != list(range(idx[0], idx[0] + len(idx))):
            return None
        return [stack[i] for i in idx]

    def layer_output(self, batch: dict[str, torch.Tensor], gates: torch.Tensor, index: int) -> torch.Tensor | None:
        """What prunable layer ``index`` returns for ``batch`` under ``gates``; the layers after it do not run.

        ``None`` when :meth:`layer_modules` is ``None`` or the layer returns something other than a tensor.
        """
        modules = self.layer_modules()
        if modules is None:
            return None
        got: list[Any] = []

        def stop(_module: nn.Module, _args: tuple, output: Any) -> None:
            got.append(output)
            raise _StopForward

        handle = modules[index].register_forward_hook(stop)
        try:
            with self.gated(gates):
                self.logits(batch)
        except _StopForward:
            pass
        finally:
            handle.remove()
        return got[0] if got and isinstance(got[0], torch.Tensor) else None

    @contextlib.contextmanager
    def resumed(self, count: int, output: torch.Tensor) -> Iterator[None]:
        """Inside the block the first ``count`` prunable layers compute nothing: each returns ``output``.

        The model then runs from layer ``count`` on ``output`` (what :meth:`layer_output` gave for
        layer ``count - 1``, repeated to the batch): the circuit search's masks share their first
        layers' gates, so those layers run once per batch, not once per mask.
        """
        modules = self.layer_modules()
        if modules is None or not 0 < count <= len(modules):
            raise ValueError(f"cannot resume this model after {count} of its prunable layers")
        own = [m.__dict__.get("forward") for m in modules[:count]]
        for m in modules[:count]:
            m.forward = lambda *_a, **_k: output  # instance attribute: nn.Module.__call__ calls it
        try:
            yield
        finally:
            for m, f in zip(modules[:count], own, strict=True):
                del m.forward
                if f is not None:
                    m.forward = f

    # ---------------------------------------------------------------- attention
    @contextlib.contextmanager
    def capture_attentions(self) -> Iterator[list[torch.Tensor]]:
        """Collect attention probabilities ``[batch, heads, query, key]`` per layer.

        Yields a list that fills with one tensor per prunable layer during each forward inside
        the block (cleared by the caller between forwards if needed). Padded keys get exactly 0.
        """
        store: list[torch.Tensor] = []
        layers = self.layers()
        previous = self._set_attn_impl("eager")
        handles = [lv.probs_module.register_forward_hook(_capture_hook(store)) for lv in layers]
        try:
            yield store
        finally:
            for h in handles:
                h.remove()
            self._set_attn_impl(previous)

    def attentions(self, batch: dict[str, torch.Tensor]) -> list[torch.Tensor]:
        """Attention probabilities of one forward, per prunable layer."""
        with torch.no_grad(), self.capture_attentions() as store:
            self.logits(batch)
        return list(store)

    def _attn_configs(self) -> list:
        """Every distinct config object the model's modules read ``_attn_implementation`` from."""
        seen: dict[int, object] = {}
        for mod in self.model.modules():
            cfg = getattr(mod, "config", None)
            if cfg is not None and hasattr(cfg, "_attn_implementation"):
                seen[id(cfg)] = cfg
        return list(seen.values())

    def _set_attn_impl(self, impl: str | dict | None) -> dict:
        """Set (``str``) or restore (``dict`` from a previous call) the attention implementation.

        All values are read before any is written: setting a composite config (CLIP) also sets
        its sub-configs.
        """
        configs = self._attn_configs()
        previous = {id(cfg): cfg._attn_implementation for cfg in configs}
        for cfg in configs:
            cfg._attn_implementation = impl[id(cfg)] if isinstance(impl, dict) else impl
        return previous

    # ------------------------------------------------------------------ pruning
    def prune(self, keep: torch.Tensor | Sequence[Sequence[bool]],
              neurons: Sequence[Sequence[int]] | None = None) -> nn.Module:
        """Return a pruned deep copy that keeps the heads where ``keep`` is true (and the MLP ``neurons``).

        Args:
            keep: ``[layers, max_heads]`` bool; every layer must keep at least one head.
            neurons: per layer, the MLP intermediate neurons to keep (distinct indices, at least
                one); None keeps every neuron. A layer whose list covers every neuron is unchanged.
        """
        keep = torch.as_tensor(keep, dtype=torch.bool)
        if keep.dim() != 2 or keep.shape[0] != self.num_layers:
            raise ValueError(f"keep mask must be [layers={self.num_layers}, heads]; got {tuple(keep.shape)}")
        if neurons is not None and len(neurons) != self.num_layers:
            raise ValueError(f"neurons must have one list per layer ({self.num_layers}); got {len(neurons)}")
        new_model = copy.deepcopy(self.model)
        new_adapter = type(self)(new_model, **self.clone_kwargs())
        sliced = False
        for idx, lv in enumerate(new_adapter.layers()):
            row = keep[idx, : lv.num_heads]
            if not bool(row.any()):
                raise ValueError(f"layer {idx} would keep no head; keep at least one head per layer")
            kept = torch.nonzero(row).flatten()
            _prune_layer(lv, kept)
            if neurons is not None:
                sliced |= _prune_mlp(new_model, lv, _neuron_index(neurons[idx], lv.fc2.in_features, idx))
        new_adapter._record_heads()
        if sliced:
            setattr(new_adapter._layer_config(), MLP_ATTR, new_adapter.mlp_per_layer())
        return new_model

    def clone_kwargs(self) -> dict:
        """Keyword arguments that rebuild this adapter around another model (e.g. a pruned copy)."""
        return {}

    def _record_heads(self) -> None:
        setattr(self._layer_config(), HEADS_ATTR, self.heads_per_layer())

    def restructure(self, heads_per_layer: Sequence[int], mlp_per_layer: Sequence[int] | None = None) -> None:
        """Shrink layers in place to ``heads_per_layer`` and ``mlp_per_layer`` (None: unchanged): reloading.

        The first heads and the first MLP neurons are kept (a saved pruned model stores them so).
        """
        widths = list(mlp_per_layer) if mlp_per_layer is not None else self.mlp_per_layer()
        for lv, n, w in zip(self.layers(), heads_per_layer, widths, strict=True):
            if n < lv.num_heads:
                _prune_layer(lv, torch.arange(n))
            if w < lv.fc2.in_features:
                _prune_mlp(self.model, lv, torch.arange(w))
        self._record_heads()
        if mlp_per_layer is not None:
            setattr(self._layer_config(), MLP_ATTR, self.mlp_per_layer())


def _gate_hook(gates: torch.Tensor, layer: int, heads: int, head_dim: int):
    def hook(_module: nn.Module, args: tuple) -> tuple:
        x = args[0]  # [B, T, H*d]
        if gates.dim() == 2:
            g = gates[layer, :heads].to(x.dtype)
            scale = g.repeat_interleave(head_dim)  # [H*d]
            return (x * scale, *args[1:])
        g = gates[:, layer, :heads].to(x.dtype)  # [B, H]
        if g.shape[0] != x.shape[0]:
            raise ValueError(f"per-sample gates have batch {g.shape[0]}, the input has batch {x.shape[0]}")
        scale = g.repeat_interleave(head_dim, dim=1)  # [B, H*d]
        shape = (x.shape[0],) + (1,) * (x.dim() - 2) + (x.shape[-1],)
        return (x * scale.reshape(shape), *args[1:])

    return hook


def _capture_hook(store: list[torch.Tensor]):
    def hook(_module: nn.Module, _args: tuple, output: tuple) -> None:
        probs = output[1] if isinstance(output, tuple) and len(output) > 1 else None
        if probs is None:
            raise RuntimeError("attention module returned no probabilities; eager attention is required")
        store.append(probs.detach())

    return hook


class _StopForward(Exception):
    """Raised by :meth:`ModelAdapter.layer_output`'s hook once the layer it reads has run."""
