"""The declarative description of a fused Hydra model: enough to rebuild it without the source.

:class:`HydraConfig` is what ``save_hydra`` writes as JSON. It holds the source family, its
model class and Hugging Face config (to rebuild the embeddings and head stages), the adapter's
JSON-able construction arguments, and one :class:`LayerSpec` per layer (head counts per member,
head size, MLP size, activation, LayerNorm eps, residual style). Every field is validated where
it enters (:meth:`HydraConfig.from_dict`), with errors naming the field and the value received.

Two cost levers (issue 45), both absent from the JSON at their defaults so older folders read and
write byte-identically:

* ``fork``: the first ``fork`` layers are the source's own blocks, run once on one stream; the
  stream is copied into the M members at layer ``fork``. Their specs list the source's head count
  for every member (all equal) and keep the full MLP.
* ``LayerSpec.neurons``: the MLP intermediate neurons each member keeps (its own slice of the
  source's ``source_intermediate`` neurons). The fused MLP is then per member (``mlp="grouped"``),
  padded to ``intermediate_size = max(neurons)`` with zero neurons, as heads are padded.
"""

from __future__ import annotations

import dataclasses
from dataclasses import asdict, dataclass
from typing import Any, Literal

from toolchain.hydra.gfc import LOWERINGS

#: how the members' MLPs and LayerNorm affines are merged (see :mod:`toolchain.hydra.block`)
MergeMode = Literal["average", "grouped"]
MERGE_MODES: tuple[str, ...] = ("average", "grouped")

FORMAT_VERSION = 1
HEAD_MODES: tuple[str, ...] = ("shared", "member")


def _positive_int(name: str, value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name} must be a positive int; got {value!r}")
    return value


def _choice(name: str, value: object, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise ValueError(f"{name} must be one of {choices}; got {value!r}")
    return str(value)


@dataclass(frozen=True)
class LayerSpec:
    """Structure of one fused layer.

    ``heads[m]`` is the number of real heads member ``m`` keeps; every member is padded to
    :attr:`padded_heads` with zero heads (see :mod:`toolchain.hydra.attention`).
    """

    heads: tuple[int, ...]
    head_dim: int
    intermediate_size: int
    act_name: str
    norm_style: str
    scaling: float  #: score scaling of the source (folded into the Q weights and bias)
    ln_attn_eps: float
    ln_mlp_eps: float
    norm: str = "layer"  #: ``layer`` (LayerNorm) | ``rms`` (RMSNorm: no mean, no bias)
    mlp_gated: bool = False  #: ``fc2(act(gate(x)) * up(x))`` (SwiGLU); fc1 holds gate and up
    rope: bool = False  #: Q and K rotated by the input stage's RoPE angles
    #: MLP neurons each member keeps (None: every member the full ``intermediate_size``)
    neurons: tuple[int, ...] | None = None
    #: the source's MLP width when the layer is sliced (None: ``intermediate_size`` is the source's)
    source_intermediate: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "heads", tuple(self.heads))
        if not self.heads:
            raise ValueError("LayerSpec.heads must list one head count per member; got an empty list")
        for m, n in enumerate(self.heads):
            _positive_int(f"LayerSpec.heads[{m}]", n)
        _positive_int("LayerSpec.head_dim", self.head_dim)
        _positive_int("LayerSpec.intermediate_size", self.intermediate_size)
        _choice("LayerSpec.norm_style", self.norm_style, ("post", "pre"))
        _choice("LayerSpec.norm", self.norm, ("layer", "rms"))
        if self.neurons is not None:
            object.__setattr__(self, "neurons", tuple(self.neurons))
            if len(self.neurons) != len(self.heads):
                raise ValueError(f"LayerSpec.neurons has {len(self.neurons)} entries; expected one per member "
                                 f"({len(self.heads)})")
            for m, n in enumerate(self.neurons):
                _positive_int(f"LayerSpec.neurons[{m}]", n)
            if max(self.neurons) != self.intermediate_size:
                raise ValueError(f"LayerSpec.intermediate_size must be the widest member's neurons "
                                 f"({max(self.neurons)}); got {self.intermediate_size}")
        if self.source_intermediate is not None:
            _positive_int("LayerSpec.source_intermediate", self.source_intermediate)
            if self.source_intermediate < self.intermediate_size:
                raise ValueError(f"LayerSpec.source_intermediate ({self.source_intermediate}) is below "
                                 f"intermediate_size ({self.intermediate_size})")

    @property
    def sliced(self) -> bool:
        """Whether the members keep their own slices of the MLP neurons."""
        return self.neurons is not None

    @property
    def member_neurons(self) -> tuple[int, ...]:
        """Real MLP neurons per member (the full width when the layer is not sliced)."""
        return self.neurons if self.neurons is not None else (self.intermediate_size,) * len(self.heads)

    @property
    def source_width(self) -> int:
        """The source model's MLP width."""
        return self.source_intermediate or self.intermediate_size

    @property
    def padded_heads(self) -> int:
        """Head slots per member: the largest kept count in the layer."""
        return max(self.heads)

    @property
    def zero_heads(self) -> int:
        """Padding heads in the layer, summed over members."""
        return sum(self.padded_heads - n for n in self.heads)


@dataclass(frozen=True)
class HydraConfig:
    """Everything that defines a fused model except its weights.

    Attributes:
        family: adapter family (``bert``, ``vit``, ``clip``...).
        model_class: Hugging Face class of the source model (rebuilds the stages on load).
        hf_config: the source model's ``config.to_dict()``.
        adapter_kwargs: JSON-encoded adapter construction arguments (CLIP prompts, tower).
        input_names: the forward's input names, in order.
        members: M.
        hidden_size: D.
        original_heads: heads per layer of the unpruned source architecture.
        layers: one :class:`LayerSpec` per layer.
        mlp, layernorm: ``average`` | ``grouped``.
        head: ``shared`` (one head stage on all streams) | ``member`` (one per member).
        lowering: ``conv`` | ``matmul``.
        fork: layers run once on one stream before the members split (0: from the input stage on).
        keep_masks: ``[M][L][H]`` bools when fused from one model with masks, else ``None``.
        source: ``masks`` (``fuse``) or ``members`` (``fuse_members``).
    """

    family: str
    model_class: str
    hf_config: dict[str, Any]
    adapter_kwargs: dict[str, Any]
    input_names: tuple[str, ...]
    members: int
    hidden_size: int
    original_heads: int
    layers: tuple[LayerSpec, ...]
    mlp: str = "average"
    layernorm: str = "grouped"
    head: str = "shared"
    lowering: str = "conv"
    keep_masks: list | None = None
    source: str = "masks"
    format_version: int = FORMAT_VERSION
    fork: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "input_names", tuple(self.input_names))
        object.__setattr__(self, "layers", tuple(self.layers))
        _positive_int("members", self.members)
        _positive_int("hidden_size", self.hidden_size)
        _positive_int("original_heads", self.original_heads)
        _choice("mlp", self.mlp, MERGE_MODES)
        _choice("layernorm", self.layernorm, MERGE_MODES)
        _choice("head", self.head, HEAD_MODES)
        _choice("lowering", self.lowering, LOWERINGS)
        _choice("source", self.source, ("masks", "members"))
        if not self.layers:
            raise ValueError("layers must hold at least one LayerSpec; got none")
        if not self.input_names:
            raise ValueError("input_names must name at least one input; got none")
        if not isinstance(self.fork, int) or isinstance(self.fork, bool) or not 0 <= self.fork < len(self.layers):
            raise ValueError(f"fork must be an int in [0, {len(self.layers) - 1}] (layers before the members split); "
                             f"got {self.fork!r}")
        layers = list(self.layers)
        for idx, spec in enumerate(layers[: self.fork]):  # the trunk: one stream, the source's layer
            if len(spec.heads) == 1 and self.members > 1:
                layers[idx] = spec = dataclasses.replace(spec, heads=spec.heads * self.members)
            if len(set(spec.heads)) != 1 or spec.neurons is not None:
                raise ValueError(f"layers[{idx}] is before the fork ({self.fork}): every member must list the same "
                                 f"heads and no MLP slice; got heads={list(spec.heads)}, neurons={spec.neurons}")
        object.__setattr__(self, "layers", tuple(layers))
        if self.mlp == "average" and any(spec.neurons is not None for spec in self.layers):
            raise ValueError("mlp='average' cannot merge members that keep their own MLP neurons (LayerSpec.neurons); "
                             "use mlp='grouped'")
        for idx, spec in enumerate(self.layers):
            if len(spec.heads) != self.members:
                raise ValueError(
                    f"layers[{idx}].heads has {len(spec.heads)} entries; expected one per member ({self.members})"
                )
        if self.format_version != FORMAT_VERSION:
            raise ValueError(f"format_version {self.format_version!r} is not supported (expected {FORMAT_VERSION})")

    @property
    def num_layers(self) -> int:
        """L."""
        return len(self.layers)

    def heads_per_member(self) -> list[list[int]]:
        """``[M][L]`` real heads kept by each member in each layer."""
        return [[spec.heads[m] for spec in self.layers] for m in range(self.members)]

    def neurons_per_member(self) -> list[list[int]]:
        """``[M][L]`` real MLP neurons kept by each member in each layer (full widths where not sliced)."""
        return [[spec.member_neurons[m] for spec in self.layers] for m in range(self.members)]

    @property
    def sliced(self) -> bool:
        """Whether any layer's members keep their own MLP neurons."""
        return any(spec.sliced for spec in self.layers)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able dict (inverse of :meth:`from_dict`); the cost levers only where set."""
        out = asdict(self)
        out["input_names"] = list(self.input_names)
        out["layers"] = [_layer_dict(s) for s in self.layers]
        if not self.fork:
            out.pop("fork")
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> HydraConfig:
        """Validate and build; unknown or missing keys raise ``ValueError`` naming them."""
        if not isinstance(data, dict):
            raise ValueError(f"a Hydra config must be a JSON object; got {type(data).__name__}")
        names = set(cls.__dataclass_fields__)
        unknown = sorted(set(data) - names)
        if unknown:
            raise ValueError(f"unknown Hydra config keys: {unknown}")
        layer_fields = LayerSpec.__dataclass_fields__
        layer_names = set(layer_fields)
        required = {n for n, f in layer_fields.items() if f.default is dataclasses.MISSING}
        layers = []
        for idx, raw in enumerate(data.get("layers") or []):
            if not isinstance(raw, dict) or not required <= set(raw) <= layer_names:
                got = sorted(raw) if isinstance(raw, dict) else type(raw).__name__
                raise ValueError(f"layers[{idx}] must have the keys {sorted(required)} (optional: "
                                 f"{sorted(layer_names - required)}); got {got}")
            layers.append(LayerSpec(**raw))
        try:
            return cls(**{**data, "layers": tuple(layers)})
        except TypeError as exc:  # a missing required key
            raise ValueError(f"invalid Hydra config: {exc}") from exc


def _layer_dict(spec: LayerSpec) -> dict[str, Any]:
    out = {**asdict(spec), "heads": list(spec.heads)}
    for name in ("neurons", "source_intermediate"):
        if out[name] is None:
            out.pop(name)
    if spec.neurons is not None:
        out["neurons"] = list(spec.neurons)
    return out
