"""Save, load and describe fused Hydra models.

A saved model is a folder with two files:

* ``hydra_config.json`` - the :class:`~toolchain.hydra.config.HydraConfig`: structure, options,
  the source family, its Hugging Face model class and config, and the adapter's construction
  arguments (tensors such as CLIP's tokenised prompts are stored as lists with their dtype);
* ``model.safetensors`` - every tensor of the fused model's ``state_dict``.

:func:`load_hydra` needs neither the source checkpoint nor the members: it builds an untrained
source model from the stored config (``ModelClass(ConfigClass.from_dict(...))``, inside a forked
RNG so the caller's random state is untouched), asks the family's adapter for its embeddings and
head stages (the generic stage modules, with the right shapes), builds the empty
:class:`~toolchain.hydra.model.HydraModel` and loads the weights with ``strict=True``.
Writes are atomic: a temporary sibling folder, renamed over the target.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from toolchain.artifacts import atomic_folder
from toolchain.errors import ModelError
from toolchain.hydra.config import HydraConfig
from toolchain.hydra.cost import hydra_cost_of, members_cost, single_cost, spec_from_hydra, stage_size
from toolchain.hydra.model import HydraModel
from toolchain.models.base import ModelAdapter, registered_adapters

CONFIG_FILE = "hydra_config.json"
WEIGHTS_FILE = "model.safetensors"


# ------------------------------------------------------------------ adapter arguments
def encode_adapter_kwargs(adapter: ModelAdapter) -> dict[str, Any]:
    """The adapter's construction arguments (beyond the model) as JSON-able data."""
    # ``clone_kwargs`` is the adapters' own way to rebuild themselves around another model.
    return _encode(adapter.clone_kwargs(), "adapter_kwargs")


def _encode(value: Any, where: str) -> Any:
    if isinstance(value, torch.Tensor):
        return {"__tensor__": value.detach().cpu().tolist(), "dtype": str(value.dtype).removeprefix("torch.")}
    if isinstance(value, dict):
        if not all(isinstance(k, str) for k in value):
            raise TypeError(f"{where} has non-string keys; it cannot be saved as JSON")
        return {k: _encode(v, f"{where}.{k}") for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_encode(v, f"{where}[{i}]") for i, v in enumerate(value)]
    if value is None or isinstance(value, str | int | float | bool):
        return value
    raise TypeError(f"{where} is a {type(value).__name__}, which cannot be saved with a Hydra model")


def decode_adapter_kwargs(data: Any) -> Any:
    """Inverse of :func:`encode_adapter_kwargs`."""
    if isinstance(data, dict):
        if "__tensor__" in data:
            return torch.tensor(data["__tensor__"], dtype=getattr(torch, data["dtype"]))
        return {k: decode_adapter_kwargs(v) for k, v in data.items()}
    if isinstance(data, list):
        return [decode_adapter_kwargs(v) for v in data]
    return data


# ------------------------------------------------------------------------- save / load
def save_hydra(model: HydraModel, folder: str | Path, tokenizer: Any = None) -> Path:
    """Write ``hydra_config.json`` + ``model.safetensors`` (+ the tokenizer's files) into ``folder`` atomically.

    With the tokenizer the folder is self-contained for ``parity --data`` (texts are tokenised with it).
    """
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(model.config.to_dict(), indent=1)  # fails loudly on a non-JSON value
    with atomic_folder(folder) as tmp:
        state = {k: v.detach().cpu().contiguous().clone() for k, v in model.state_dict().items()}
        # one metadata key: safetensors writes several in a random order (the family is in the config)
        save_file(state, str(tmp / WEIGHTS_FILE), metadata={"format": "pt"})
        (tmp / CONFIG_FILE).write_text(text)
        if tokenizer is not None:
            tokenizer.save_pretrained(str(tmp))
    return folder


def rebuild_source(config: HydraConfig) -> ModelAdapter:
    """An untrained source model of the stored class and config, wrapped in its family's adapter."""
    import transformers

    adapters = {cls.family: cls for cls in registered_adapters()}
    if config.family not in adapters:
        raise ModelError(f"Hydra model family {config.family!r} has no registered adapter "
                         f"(registered: {', '.join(sorted(adapters))}).")
    model_cls = getattr(transformers, config.model_class, None)
    if model_cls is None:
        raise ModelError(f"transformers has no class {config.model_class!r} (the Hydra model's source).")
    hf_config = model_cls.config_class.from_dict(dict(config.hf_config))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = model_cls(hf_config).eval()
    return adapters[config.family](model, **decode_adapter_kwargs(config.adapter_kwargs))


def load_hydra(folder: str | Path) -> HydraModel:
    """Load a folder written by :func:`save_hydra` (no source checkpoint needed); eval mode."""
    from safetensors.torch import load_file

    folder = Path(folder)
    for name in (CONFIG_FILE, WEIGHTS_FILE):
        if not (folder / name).is_file():
            raise ModelError(f"Hydra model folder '{folder}' has no {name}.",
                             hint="Write it with toolchain.hydra.save_hydra (hydra-toolchain fuse).")
    try:
        config = HydraConfig.from_dict(json.loads((folder / CONFIG_FILE).read_text()))
    except (json.JSONDecodeError, ValueError) as exc:
        raise ModelError(f"'{folder / CONFIG_FILE}' is not a valid Hydra config: {exc}") from exc
    source = rebuild_source(config)
    copies = 1 if config.head == "shared" else config.members
    with torch.random.fork_rng(devices=[]):
        model = HydraModel(config, source.embeddings(), [source.head() for _ in range(copies)])
    try:
        model.load_state_dict(load_file(str(folder / WEIGHTS_FILE)), strict=True)
    except (RuntimeError, OSError) as exc:
        raise ModelError(f"cannot load the weights in '{folder / WEIGHTS_FILE}': "
                         f"{str(exc).splitlines()[0]}") from exc
    return model.eval()


# ------------------------------------------------------------------------------ summary
def summary(model: HydraModel) -> dict[str, Any]:
    """Structure and size of a fused model against the single model and M separate members.

    Returns a JSON-able dict: options, ``heads_kept`` ``[M][L]``, ``padded_heads`` ``[L]``,
    ``zero_heads``, ``kept_head_indices`` ``[M][L][...]`` (when fused from masks), and
    ``params`` / ``weight_bytes`` for ``hydra`` (counted), ``single``, ``members`` and
    ``deep_ensemble`` (analytic, :mod:`toolchain.hydra.cost`) with ratios to the single model.
    """
    cfg = model.config
    spec = spec_from_hydra(model)
    heads = cfg.heads_per_member()
    dtype_bytes = next(model.parameters()).element_size()
    kw = {"batch": 1, "seq": 1, "dtype_bytes": dtype_bytes}
    single = single_cost(spec, **kw)
    members = members_cost(spec, heads, fork=cfg.fork,
                           neurons_per_member=cfg.neurons_per_member() if cfg.sliced else None, **kw)
    counted = stage_size(model)
    analytic = hydra_cost_of(model, **kw)
    params = {"hydra": counted, "single": single.params, "members": members.params,
              "deep_ensemble": cfg.members * single.params}
    out: dict[str, Any] = {
        "family": cfg.family,
        "model_class": cfg.model_class,
        "members": cfg.members,
        "layers": cfg.num_layers,
        "original_heads": cfg.original_heads,
        "mlp": cfg.mlp,
        "layernorm": cfg.layernorm,
        "head": cfg.head,
        "lowering": cfg.lowering,
        "source": cfg.source,
        "heads_kept": heads,
        "padded_heads": [s.padded_heads for s in cfg.layers],
        "zero_heads": sum(s.zero_heads for s in cfg.layers),
        "fork": cfg.fork,
        "mlp_neurons": cfg.neurons_per_member(),  # [M][L] kept neurons (the full width where not sliced)
        "mlp_source_width": [s.source_width for s in cfg.layers],
        "params": params,
        "params_analytic_hydra": analytic.params,
        "weight_bytes": {k: v * dtype_bytes for k, v in params.items()},
        "ratio_vs_single": {k: v / params["single"] for k, v in params.items()},
        "hydra_vs_members": params["hydra"] / params["members"],
    }
    if cfg.keep_masks is not None:
        out["kept_head_indices"] = [[[h for h, keep in enumerate(row) if keep] for row in member]
                                    for member in cfg.keep_masks]
    return out


def format_summary(info: dict[str, Any]) -> str:
    """Plain-text view of :func:`summary`'s dict."""
    lines = [
        f"Hydra {info['family']} ({info['model_class']}): {info['members']} members x {info['layers']} layers "
        f"(source: {info['source']}, {info['original_heads']} heads per layer)",
        f"  mlp={info['mlp']}  layernorm={info['layernorm']}  head={info['head']}  lowering={info['lowering']}",
        "  heads kept per layer:",
    ]
    for m, row in enumerate(info["heads_kept"]):
        lines.append(f"    member {m}: {' '.join(f'{n:>2}' for n in row)}  (total {sum(row)})")
    lines.append(f"    padded: {' '.join(f'{n:>2}' for n in info['padded_heads'])}  "
                 f"({info['zero_heads']} zero heads)")
    fork = info.get("fork", 0)
    if fork:
        lines.append(f"  fork after layer {fork}: layers 0-{fork - 1} are the source's, run once on one stream")
    widths = info.get("mlp_neurons")
    if widths and any(n != w for row in widths for n, w in zip(row, info["mlp_source_width"], strict=True)):
        lines.append(f"  MLP neurons kept per layer (of {' '.join(str(w) for w in info['mlp_source_width'])}):")
        for m, row in enumerate(widths):
            lines.append(f"    member {m}: {' '.join(str(n) for n in row)}")
    lines.append(f"  {'':<14}{'params':>14}{'MB':>10}{'x single':>10}")
    for key, label in (("single", "single model"), ("hydra", "hydra"), ("members", "M members"),
                       ("deep_ensemble", "deep ensemble")):
        n = info["params"][key]
        lines.append(f"  {label:<14}{n:>14,}{info['weight_bytes'][key] / 1e6:>10.2f}"
                     f"{info['ratio_vs_single'][key]:>10.3f}")
    lines.append(f"  hydra / M separate members: {info['hydra_vs_members']:.3f}")
    return "\n".join(lines)
