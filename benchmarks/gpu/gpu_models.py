"""Models of the GPU benchmark: BERT-shaped encoders, their deep ensembles and Hydras (M members).

Two implementations, same weights, same numbers (``tests/bench/test_gpu_script.py`` checks both):

* ``project`` (when ``transformers`` and ``toolchain.hydra`` import): the single model and the
  ensemble members are Hugging Face ``BertForSequenceClassification`` models, the Hydra is the
  project's :func:`toolchain.hydra.fuse` of member 0 with keep masks (a real ``HydraModel``).
* ``standalone`` (torch only): :class:`Encoder` (a post-LayerNorm BERT encoder with a pooler and
  a classifier) and :class:`HydraEncoder`, built from the functions below, which are copies of
  ``toolchain/hydra/gfc.py`` (``gfc_conv``, ``gfc_matmul``, ``stream_linear``),
  ``attention.py`` (``grouped_attention``) and ``block.py`` (``stream_layer_norm``). They exist
  because every ``toolchain.hydra`` module imports ``transformers`` through the package
  ``__init__`` (``block.py`` takes its activations from ``transformers.activations``), and the GPU
  machine may not have it. The test asserts they equal the project's functions and models.

Weights are random (seeded; latency does not depend on them): every implementation starts from
the standalone encoders, and the project one loads their weights into the Hugging Face models.
Every model's ``forward(input_ids, attention_mask, token_type_ids)`` returns ``(logits, probs)``:
logits ``[B, C]`` for a single model, ``[B, M, C]`` member logits for a Hydra or an ensemble.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

NUM_LABELS = 3


@dataclass(frozen=True)
class Shape:
    """Encoder sizes."""

    name: str
    hidden: int
    layers: int
    heads: int
    mlp: int
    vocab: int = 30522
    max_positions: int = 512

    @property
    def head_dim(self) -> int:
        """Channels per head."""
        return self.hidden // self.heads


SHAPES = {
    "minilm": Shape("minilm", 384, 6, 12, 1536),
    "bert-base": Shape("bert-base", 768, 12, 12, 3072),
}
#: the dry run's stand-ins: the same head counts (12, so 4 and 6 kept heads make sense), tiny widths
TOY_SHAPES = {
    "minilm": Shape("minilm", 24, 2, 12, 48, vocab=64, max_positions=16),
    "bert-base": Shape("bert-base", 36, 3, 12, 72, vocab=64, max_positions=16),
}


def project_available() -> tuple[bool, str]:
    """Whether the project implementation imports here, and why not."""
    try:
        import transformers  # noqa: F401

        from toolchain.hydra import fuse  # noqa: F401
        from toolchain.models.base import adapter_for  # noqa: F401
    except Exception as exc:  # a missing or broken transformers: fall back to the standalone models
        return False, f"{type(exc).__name__}: {exc}"
    return True, ""


# ---------------------------------------------------------------- copies of toolchain.hydra functions
def split_channels(x: torch.Tensor, groups: int, per_group: int) -> torch.Tensor:
    """``[B, G * C, T] -> [B, G, C, T]`` (copy of ``toolchain.hydra.gfc.split_channels``)."""
    return x.reshape(x.shape[0], groups, per_group, x.shape[-1])


def merge_channels(x: torch.Tensor, channels: int) -> torch.Tensor:
    """``[B, a, b, T] -> [B, channels, T]`` (copy of ``toolchain.hydra.gfc.merge_channels``)."""
    return x.reshape(x.shape[0], channels, x.shape[-1])


def grouped_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, lowering: str) -> torch.Tensor:
    """``gfc_conv`` / ``gfc_matmul`` of ``toolchain.hydra.gfc``: ``[B, M*in, T] -> [B, M*out, T]``."""
    groups, out_f, in_f = (int(v) for v in weight.shape)
    if lowering == "conv":
        return F.conv1d(x, weight.reshape(groups * out_f, in_f, 1), bias.reshape(groups * out_f), groups=groups)
    y = torch.matmul(weight, split_channels(x, groups, in_f)) + bias.unsqueeze(-1)
    return merge_channels(y, groups * out_f)


def stream_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, streams: int,
                  lowering: str) -> torch.Tensor:
    """One ``[out, in]`` map on every stream (copy of ``toolchain.hydra.gfc.stream_linear``)."""
    out_f, in_f = (int(v) for v in weight.shape)
    folded = split_channels(x, streams, in_f).reshape(-1, in_f, x.shape[-1])
    if lowering == "conv":
        y = F.conv1d(folded, weight.unsqueeze(-1), bias)
    else:
        y = torch.matmul(weight, folded) + bias.unsqueeze(-1)
    return y.reshape(-1, streams * out_f, y.shape[-1])


def grouped_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_bias: torch.Tensor | None,
                      heads: int, head_dim: int) -> torch.Tensor:
    """Channels-first attention of independent heads (copy of ``toolchain.hydra.attention``)."""
    qh, kh, vh = (split_channels(t, heads, head_dim) for t in (q, k, v))
    scores = torch.matmul(qh.transpose(-1, -2), kh)
    if key_bias is not None:
        scores = scores + key_bias
    probs = torch.softmax(scores, dim=-1)
    return merge_channels(torch.matmul(vh, probs.transpose(-1, -2)), heads * head_dim)


def stream_layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, streams: int,
                      eps: float) -> torch.Tensor:
    """Per-member LayerNorm of a stream (copy of ``toolchain.hydra.block.stream_layer_norm``)."""
    width = int(weight.shape[-1])
    y = split_channels(x, streams, width)
    centred = y - y.mean(dim=2, keepdim=True)
    var = (centred * centred).mean(dim=2, keepdim=True)
    out = torch.addcmul(bias.unsqueeze(-1), centred * torch.rsqrt(var + eps), weight.unsqueeze(-1))
    return merge_channels(out, streams * width)


def padding_bias(attention_mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Additive key bias ``[B, 1, 1, T]`` (copy of ``toolchain.models.bert.padding_bias``)."""
    mask = attention_mask[:, None, None, :].to(dtype)
    return (1.0 - mask) * torch.finfo(dtype).min


# ---------------------------------------------------------------------------- standalone encoder
EPS = 1e-12  # BERT's LayerNorm eps


class Embeddings(nn.Module):
    """Word + position + token-type embeddings and LayerNorm (BERT)."""

    def __init__(self, shape: Shape) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(shape.vocab, shape.hidden)
        self.position_embeddings = nn.Embedding(shape.max_positions, shape.hidden)
        self.token_type_embeddings = nn.Embedding(2, shape.hidden)
        self.LayerNorm = nn.LayerNorm(shape.hidden, eps=EPS)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor) -> torch.Tensor:
        """``[B, T]`` ids -> ``[B, T, D]``."""
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        x = self.word_embeddings(input_ids) + self.token_type_embeddings(token_type_ids)
        return self.LayerNorm(x + self.position_embeddings(positions))


class Head(nn.Module):
    """Pooler (dense + tanh on the first token) and classifier."""

    def __init__(self, shape: Shape) -> None:
        super().__init__()
        self.pooler = nn.Linear(shape.hidden, shape.hidden)
        self.classifier = nn.Linear(shape.hidden, NUM_LABELS)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """``[N, T, D]`` -> ``[N, C]``."""
        return self.classifier(torch.tanh(self.pooler(hidden[:, 0])))


class Layer(nn.Module):
    """One post-LayerNorm BERT layer, ``[B, T, D]`` layout."""

    def __init__(self, shape: Shape) -> None:
        super().__init__()
        d = shape.hidden
        self.heads, self.head_dim = shape.heads, shape.head_dim
        self.query, self.key, self.value, self.attn_out = (nn.Linear(d, d) for _ in range(4))
        self.attn_ln = nn.LayerNorm(d, eps=EPS)
        self.fc1, self.fc2 = nn.Linear(d, shape.mlp), nn.Linear(shape.mlp, d)
        self.mlp_ln = nn.LayerNorm(d, eps=EPS)

    def forward(self, x: torch.Tensor, bias: torch.Tensor, sdpa: bool) -> torch.Tensor:
        """``x [B, T, D]``, additive key ``bias [B, 1, 1, T]``."""
        b, t, _ = x.shape
        q, k, v = (lin(x).view(b, t, self.heads, self.head_dim).transpose(1, 2)
                   for lin in (self.query, self.key, self.value))
        if sdpa:
            ctx = F.scaled_dot_product_attention(q, k, v, attn_mask=bias.to(q.dtype))
        else:
            scores = torch.matmul(q, k.transpose(-1, -2)) * (1.0 / math.sqrt(self.head_dim)) + bias
            ctx = torch.matmul(torch.softmax(scores, dim=-1).to(v.dtype), v)
        x = self.attn_ln(x + self.attn_out(ctx.transpose(1, 2).reshape(b, t, -1)))
        return self.mlp_ln(x + self.fc2(F.gelu(self.fc1(x))))


class Encoder(nn.Module):
    """A BERT-shaped classifier; ``sdpa`` picks fused attention instead of matmul + softmax."""

    def __init__(self, shape: Shape, *, sdpa: bool = False) -> None:
        super().__init__()
        self.shape, self.sdpa = shape, sdpa
        self.embeddings = Embeddings(shape)
        self.layers = nn.ModuleList(Layer(shape) for _ in range(shape.layers))
        self.head = Head(shape)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                token_type_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """-> ``logits [B, C]``, ``probs [B, C]``."""
        x = self.embeddings(input_ids, token_type_ids)
        bias = padding_bias(attention_mask, x.dtype)
        for layer in self.layers:
            x = layer(x, bias, self.sdpa)
        logits = self.head(x)
        return logits, torch.softmax(logits, dim=-1)


def random_encoder(shape: Shape, seed: int, device: torch.device | str = "cpu") -> Encoder:
    """An :class:`Encoder` with BERT-style random weights (normal 0.02; classifier 0.5, so the
    probabilities are not uniform and the precision parity shows in them)."""
    gen = torch.Generator().manual_seed(seed)
    model = Encoder(shape)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "_ln" in name or "LayerNorm" in name:
                p.fill_(1.0 if name.endswith("weight") else 0.0)
            elif name.endswith("bias"):
                p.normal_(0.0, 0.02, generator=gen)
            else:
                p.normal_(0.0, 0.5 if "classifier" in name else 0.02, generator=gen)
    return model.to(device).eval()


# ---------------------------------------------------------------------------- standalone Hydra
class HydraBlockS(nn.Module):
    """One fused layer (post-LN): GFC attention, per-member LayerNorm affine, averaged (shared) MLP."""

    def __init__(self, members: int, kept: int, shape: Shape, lowering: str) -> None:
        super().__init__()
        d, inner = shape.hidden, kept * shape.head_dim
        self.members, self.heads, self.head_dim, self.lowering = members, kept, shape.head_dim, lowering
        for name, (o, i) in {"q": (inner, d), "k": (inner, d), "v": (inner, d), "o": (d, inner)}.items():
            setattr(self, f"{name}_w", nn.Parameter(torch.zeros(members, o, i)))
            setattr(self, f"{name}_b", nn.Parameter(torch.zeros(members, o)))
        for name in ("ln_attn", "ln_mlp"):
            setattr(self, f"{name}_w", nn.Parameter(torch.ones(members, d)))
            setattr(self, f"{name}_b", nn.Parameter(torch.zeros(members, d)))
        self.fc1_w, self.fc1_b = nn.Parameter(torch.zeros(shape.mlp, d)), nn.Parameter(torch.zeros(shape.mlp))
        self.fc2_w, self.fc2_b = nn.Parameter(torch.zeros(d, shape.mlp)), nn.Parameter(torch.zeros(d))

    def forward(self, x: torch.Tensor, key_bias: torch.Tensor) -> torch.Tensor:
        """``x [B, M * D, T]`` -> ``[B, M * D, T]``."""
        m, low = self.members, self.lowering
        q, k, v = (grouped_linear(x, getattr(self, f"{n}_w"), getattr(self, f"{n}_b"), low) for n in "qkv")
        ctx = grouped_attention(q, k, v, key_bias, m * self.heads, self.head_dim)
        x = stream_layer_norm(x + grouped_linear(ctx, self.o_w, self.o_b, low), self.ln_attn_w, self.ln_attn_b,
                              m, EPS)
        h = F.gelu(stream_linear(x, self.fc1_w, self.fc1_b, m, low))
        return stream_layer_norm(x + stream_linear(h, self.fc2_w, self.fc2_b, m, low), self.ln_mlp_w,
                                 self.ln_mlp_b, m, EPS)


class HydraEncoder(nn.Module):
    """M head subsets of one :class:`Encoder` fused (as ``toolchain.hydra.fuse``: shared head stage)."""

    def __init__(self, shape: Shape, members: int, kept: int, lowering: str) -> None:
        super().__init__()
        self.members, self.hidden = members, shape.hidden
        self.embeddings = Embeddings(shape)
        self.blocks = nn.ModuleList(HydraBlockS(members, kept, shape, lowering) for _ in range(shape.layers))
        self.head = Head(shape)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                token_type_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """-> ``member_logits [B, M, C]``, ``probs [B, C]`` (mean of the members' softmax)."""
        hidden = self.embeddings(input_ids, token_type_ids)
        key_bias = padding_bias(attention_mask, hidden.dtype)
        x = hidden.transpose(1, 2).repeat(1, self.members, 1)
        for block in self.blocks:
            x = block(x, key_bias)
        streams = x.unflatten(1, (self.members, self.hidden)).transpose(2, 3)  # [B, M, T, D]
        logits = self.head(streams.flatten(0, 1)).unflatten(0, (-1, self.members))
        return logits, torch.softmax(logits, dim=-1).mean(dim=1)


def keep_masks(members: int, layers: int, heads: int, kept: int) -> torch.Tensor:
    """``[M, L, H]`` bool: member m keeps heads ``(m * H / M + j) mod H``, j < kept (disjoint when
    ``M * kept <= H``, overlapping by ``M * kept - H`` heads otherwise)."""
    masks = torch.zeros(members, layers, heads, dtype=torch.bool)
    for m in range(members):
        for j in range(kept):
            masks[m, :, (m * heads // members + j) % heads] = True
    return masks


@torch.no_grad()
def hydra_from(encoder: Encoder, masks: torch.Tensor, lowering: str) -> HydraEncoder:
    """Fuse the head subsets ``masks [M, L, H]`` of ``encoder`` (every member keeps as many heads)."""
    shape, members = encoder.shape, int(masks.shape[0])
    kept = int(masks[0, 0].sum())
    hydra = HydraEncoder(shape, members, kept, lowering).to(next(encoder.parameters()).device)
    hydra.embeddings.load_state_dict(encoder.embeddings.state_dict())
    hydra.head.load_state_dict(encoder.head.state_dict())
    d, scale = shape.head_dim, 1.0 / math.sqrt(shape.head_dim)
    for idx, (layer, block) in enumerate(zip(encoder.layers, hydra.blocks, strict=True)):
        for m in range(members):
            heads = torch.nonzero(masks[m, idx]).flatten().tolist()
            rows = torch.cat([torch.arange(h * d, (h + 1) * d) for h in heads]).to(block.q_w.device)
            for n, lin in (("q", layer.query), ("k", layer.key), ("v", layer.value)):
                s = scale if n == "q" else 1.0  # the score scaling is folded into Q, as fuse() does
                getattr(block, f"{n}_w")[m] = lin.weight[rows] * s
                getattr(block, f"{n}_b")[m] = lin.bias[rows] * s
            block.o_w[m] = layer.attn_out.weight[:, rows]
            block.o_b[m] = layer.attn_out.bias
            block.ln_attn_w[m], block.ln_attn_b[m] = layer.attn_ln.weight, layer.attn_ln.bias
            block.ln_mlp_w[m], block.ln_mlp_b[m] = layer.mlp_ln.weight, layer.mlp_ln.bias
        block.fc1_w.copy_(layer.fc1.weight)
        block.fc1_b.copy_(layer.fc1.bias)
        block.fc2_w.copy_(layer.fc2.weight)
        block.fc2_b.copy_(layer.fc2.bias)
    return hydra.eval()


class Ensemble(nn.Module):
    """Deep ensemble: the members run one after another; probs = mean of their softmax."""

    def __init__(self, members: list[nn.Module]) -> None:
        super().__init__()
        self.members = nn.ModuleList(members)

    def forward(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """-> ``member_logits [B, M, C]``, ``probs [B, C]``."""
        outs = [member(*inputs) for member in self.members]
        return torch.stack([o[0] for o in outs], dim=1), torch.stack([o[1] for o in outs], dim=1).mean(dim=1)


# ---------------------------------------------------------------------------- project implementation
def hf_state_dict(encoder: Encoder) -> dict[str, torch.Tensor]:
    """``encoder``'s weights under ``BertForSequenceClassification``'s names."""
    names = {"query": "attention.self.query", "key": "attention.self.key", "value": "attention.self.value",
             "attn_out": "attention.output.dense", "attn_ln": "attention.output.LayerNorm",
             "fc1": "intermediate.dense", "fc2": "output.dense", "mlp_ln": "output.LayerNorm"}
    out = {}
    for key, value in encoder.state_dict().items():
        parts = key.split(".")
        if parts[0] == "embeddings":
            out[f"bert.{key}"] = value
        elif parts[0] == "layers":
            out[f"bert.encoder.layer.{parts[1]}.{names[parts[2]]}.{parts[3]}"] = value
        elif parts[1] == "pooler":
            out[f"bert.pooler.dense.{parts[2]}"] = value
        else:
            out[f"classifier.{parts[2]}"] = value
    return out


class HFClassifier(nn.Module):
    """A Hugging Face sequence classifier as ``(logits, probs)``."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                token_type_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """-> ``logits [B, C]``, ``probs [B, C]``."""
        logits = self.model(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids).logits
        return logits, torch.softmax(logits, dim=-1)


class ProjectHydra(nn.Module):
    """The project's ``HydraModel`` as ``(member_logits, probs)``."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """-> ``member_logits [B, M, C]``, ``probs [B, C]``."""
        out = self.model(*inputs)
        return out["member_logits"], out["probs"]


def hf_from(encoder: Encoder, attention: str) -> nn.Module:
    """``BertForSequenceClassification`` with ``encoder``'s weights (``attention``: eager | sdpa)."""
    from transformers import BertConfig, BertForSequenceClassification

    s = encoder.shape
    config = BertConfig(vocab_size=s.vocab, hidden_size=s.hidden, num_hidden_layers=s.layers,
                        num_attention_heads=s.heads, intermediate_size=s.mlp, max_position_embeddings=s.max_positions,
                        num_labels=NUM_LABELS, hidden_act="gelu", layer_norm_eps=EPS)
    config._attn_implementation = attention
    model = BertForSequenceClassification(config)
    missing, unexpected = model.load_state_dict(hf_state_dict(encoder), strict=False)
    if unexpected or [k for k in missing if not k.endswith(("position_ids", "token_type_ids"))]:
        raise RuntimeError(f"weight transfer to BertForSequenceClassification: missing {missing}, unexpected "
                           f"{unexpected}")
    return model.to(next(encoder.parameters()).device).eval()


# ---------------------------------------------------------------------------- the benchmark's models
def build_models(shape: Shape, *, impl: str, members: int, kept: tuple[int, ...], lowerings: tuple[str, ...],
                 device: torch.device) -> dict[str, nn.Module]:
    """``single``, ``single-sdpa``, ``deep-ensemble`` and ``hydra-k{kept}-{lowering}`` (FP32, eval).

    The single model is ensemble member 0 and the Hydras fuse its head subsets; members i > 0
    are seeded ``1000 * i`` (as ``benchmarks/latency/run.py``).
    """
    encoders = [random_encoder(shape, seed=1000 * i, device=device) for i in range(members)]
    out: dict[str, nn.Module] = {}
    if impl == "project":
        from toolchain.hydra import fuse
        from toolchain.models.base import adapter_for

        hf = [HFClassifier(hf_from(e, "eager")) for e in encoders]
        out["single"] = hf[0]
        out["single-sdpa"] = HFClassifier(hf_from(encoders[0], "sdpa"))
        out["deep-ensemble"] = Ensemble(hf)
        for k in kept:
            masks = keep_masks(members, shape.layers, shape.heads, k)
            for low in lowerings:
                fused = fuse(adapter_for(hf[0].model), masks, mlp="average", layernorm="grouped", lowering=low)
                out[f"hydra-k{k}-{low}"] = ProjectHydra(fused.to(device).eval())
        return out
    if impl != "standalone":
        raise ValueError(f"impl must be 'project' or 'standalone'; got {impl!r}")
    out["single"] = encoders[0]
    sdpa = copy.deepcopy(encoders[0])
    sdpa.sdpa = True
    out["single-sdpa"] = sdpa
    out["deep-ensemble"] = Ensemble(encoders)
    for k in kept:
        masks = keep_masks(members, shape.layers, shape.heads, k)
        for low in lowerings:
            out[f"hydra-k{k}-{low}"] = hydra_from(encoders[0], masks, low)
    return out


def make_inputs(shape: Shape, batch: int, sequence: int, device: torch.device) -> tuple[torch.Tensor, ...]:
    """``input_ids, attention_mask, token_type_ids``; row i keeps ``sequence - i * sequence // 16``
    tokens (the rest padded), so the key bias is exercised."""
    gen = torch.Generator().manual_seed(batch)
    ids = torch.randint(5, shape.vocab, (batch, sequence), generator=gen)
    mask = torch.ones(batch, sequence, dtype=torch.long)
    for i in range(batch):
        mask[i, max(2, sequence - i * max(1, sequence // 16)):] = 0
    return ids.to(device), mask.to(device), torch.zeros_like(ids).to(device)
