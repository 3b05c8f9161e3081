"""The declarative description of a fused Hydra model: enough to rebuild it without the source.

:class:`HydraConfig` is what ``save_hydra`` writes as JSON. It holds the source family, its
model class and Hugging Face config (to rebuild the embeddings and head stages), the adapter's
JSON-able construction arguments, and one :class:`LayerSpec` per layer (head counts per member,
head size, MLP size, activation, LayerNorm eps, residual style). Every field is validated where
it enters (:meth:`HydraConfig.from_dict`), with errors naming the field and the value received.
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

    def to_dict(self) -> dict[str, Any]:
        """JSON-able dict (inverse of :meth:`from_dict`)."""
        out = asdict(self)
        out["input_names"] = list(self.input_names)
        out["layers"] = [{**asdict(s), "heads": list(s.heads)} for s in self.layers]
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
