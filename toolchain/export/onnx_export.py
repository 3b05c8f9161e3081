"""Export a torch module to ONNX for TensorRT 10/11 and ONNX Runtime, then prove the graph is sound.

Exporter choice
---------------
torch 2.13 offers two exporters. :func:`export_onnx` uses the **TorchScript exporter**
(``torch.onnx.export(..., dynamo=False)``) by default, for these reasons, each checked on this
project's tiny BERT and grouped-Conv models:

* It translates *directly* at the requested opset (default 17, fine for TensorRT 10.x and ORT).
  The dynamo exporter only has opset >= 18 translations and down-converts afterwards; asked for
  opset 17 on a grouped-Conv + LayerNorm module, its down-conversion failed and it silently
  returned an opset-18 file.
* ``dynamic_axes`` become named ``dim_param`` dims, and the traced graph computes shapes with
  ``Shape``/``Gather`` ops, so batch and sequence stay dynamic; :func:`check_dynamic` proves it at
  shapes other than the export shapes (the dynamo exporter is known to specialise dims silently,
  e.g. a dim of size 1 or one it can prove equal to another).
* ``nn.Conv1d(groups=M)`` becomes one ``Conv`` node with ``group=M`` (the Hydra grouped
  fully-connected lowering); LayerNorm becomes one ``LayerNormalization`` node at opset >= 17
  (decomposed into ReduceMean/Sub/Pow/Sqrt/Div below 17); exact GELU becomes Div/Erf/Add/Mul.
* It writes one self-contained file; weights go to an external ``<name>.onnx.data`` file only
  when asked or when the weights exceed 1.5 GB (protobuf's hard limit is 2 GB).

Its DeprecationWarning is expected and suppressed, and so is its warning on advanced indexing
with negative indices (every such index in these graphs is non-negative: see :func:`_run_exporter`);
TracerWarnings (a Python ``bool``/``int`` taken from a tensor may freeze a shape) are logged and
returned, and :func:`check_dynamic` is the test that decides. ``exporter="dynamo"`` remains
available for opset >= 18 (for example opset 23, where SDPA becomes one ``Attention`` node); it
is refused below 18.

Every export is atomic: it is written into a temporary folder next to the target, checked
(``onnx.checker`` with ``full_check=True`` and strict shape inference), then renamed into place
with its weights file; a ``<stem>.summary.json`` (:func:`graph_summary`) is written beside it.
"""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import onnx
import torch
from torch import nn

from toolchain.artifacts import publish
from toolchain.errors import GraphError
from toolchain.export.graph import (
    EXPORT_SHAPES_KEY,
    graph_summary,
    load_checked,
    write_summary,
)

__all__ = [
    "ExportResult",
    "export_onnx",
    "graph_summary",
    "load_checked",
]

log = logging.getLogger(__name__)

#: Weights above this size go to an external ``.onnx.data`` file (protobuf cannot exceed 2 GB).
LARGE_MODEL_BYTES = int(1.5 * 2**30)
_TORCHSCRIPT_MAX_OPSET = 20
#: the start of the TorchScript exporter's warning on advanced indexing (see :func:`_run_exporter`)
_ADVANCED_INDEX_WARNING = r"Exporting aten::index operator of advanced indexing"
_DYNAMO_MIN_OPSET = 18


@dataclass(frozen=True)
class ExportResult:
    """What :func:`export_onnx` wrote: the graph, its weights file (or None) and its summary."""

    path: Path
    summary_path: Path
    summary: dict[str, Any]
    external_data: Path | None
    exporter: str
    opset: int
    warnings: tuple[str, ...]


class _OrderedOutputs(nn.Module):
    """Positional-in, tuple-out adapter: keyword inputs in dict order, outputs in ``output_names`` order."""

    def __init__(self, module: nn.Module, input_names: Sequence[str], output_names: Sequence[str]) -> None:
        super().__init__()
        self.module = module
        self.input_names = list(input_names)
        self.output_names = list(output_names)

    def forward(self, *args: torch.Tensor) -> tuple[torch.Tensor, ...]:
        out = self.module(**dict(zip(self.input_names, args)))
        if isinstance(out, Mapping):
            missing = [n for n in self.output_names if n not in out]
            if missing:
                raise GraphError(
                    f"the module returned outputs {sorted(out)} but output_names asks for {missing}; "
                    "fix output_names or the module's returned dict keys."
                )
            return tuple(out[n] for n in self.output_names)
        if isinstance(out, torch.Tensor):
            out = (out,)
        if isinstance(out, list | tuple) and len(out) == len(self.output_names):
            return tuple(out)
        count = len(out) if isinstance(out, list | tuple) else type(out).__name__
        raise GraphError(
            f"the module returned {count} outputs but output_names has {len(self.output_names)}; "
            "return a dict keyed by output_names or a tuple of that length."
        )


def _validate(
    example_inputs: Mapping[str, torch.Tensor],
    output_names: Sequence[str],
    dynamic_axes: Mapping[str, Mapping[int, str]],
    opset: int,
    exporter: str,
) -> None:
    if not example_inputs:
        raise GraphError("export_onnx: example_inputs is empty; pass {input name: example tensor}.")
    for name, value in example_inputs.items():
        if not isinstance(value, torch.Tensor):
            raise GraphError(f"export_onnx: example input '{name}' is a {type(value).__name__}, not a tensor.")
    if not output_names or len(set(output_names)) != len(output_names):
        raise GraphError(f"export_onnx: output_names must be non-empty and unique, got {list(output_names)}.")
    known = set(example_inputs) | set(output_names)
    for name, axes in dynamic_axes.items():
        if name not in known:
            raise GraphError(f"export_onnx: dynamic_axes names '{name}', which is neither an input nor an output.")
        if name in example_inputs:
            rank = example_inputs[name].dim()
            bad = [a for a in axes if not -rank <= a < rank]
            if bad:
                raise GraphError(f"export_onnx: dynamic_axes['{name}'] has axes {bad} outside rank {rank}.")
    if exporter == "torchscript" and not 9 <= opset <= _TORCHSCRIPT_MAX_OPSET:
        raise GraphError(
            f"export_onnx: opset {opset} is outside the TorchScript exporter's range 9..{_TORCHSCRIPT_MAX_OPSET}; "
            "use exporter='dynamo' for opset >= 18."
        )
    if exporter == "dynamo" and opset < _DYNAMO_MIN_OPSET:
        raise GraphError(
            f"export_onnx: the dynamo exporter cannot translate at opset {opset} (it down-converts from 18 "
            "and may silently keep 18); use exporter='torchscript' or opset >= 18."
        )
    if exporter not in ("torchscript", "dynamo"):
        raise GraphError(f"export_onnx: exporter must be 'torchscript' or 'dynamo', got '{exporter}'.")


def _training_modes(module: nn.Module) -> list[tuple[nn.Module, bool]]:
    """Every submodule's ``training`` flag, to restore exactly (``train(flag)`` would overwrite them all)."""
    return [(m, m.training) for m in module.modules()]


def _restore_modes(modes: list[tuple[nn.Module, bool]]) -> None:
    for m, flag in modes:
        m.training = flag


def _weights_bytes(module: nn.Module) -> int:
    tensors = list(module.parameters()) + list(module.buffers())
    return sum(t.numel() * t.element_size() for t in tensors)


def _dynamo_shapes(
    example_inputs: Mapping[str, torch.Tensor], dynamic_axes: Mapping[str, Mapping[int, str]]
) -> tuple[dict[int, Any], ...]:
    dims: dict[str, Any] = {}
    shapes = []
    for name, value in example_inputs.items():
        axes = dynamic_axes.get(name, {})
        shapes.append({a % value.dim(): dims.setdefault(label, torch.export.Dim(label)) for a, label in axes.items()})
    return tuple(shapes)


def _run_exporter(
    wrapper: _OrderedOutputs,
    example_inputs: Mapping[str, torch.Tensor],
    output_names: Sequence[str],
    target: Path,
    dynamic_axes: Mapping[str, Mapping[int, str]],
    opset: int,
    exporter: str,
    external: bool,
) -> list[str]:
    """Run the chosen exporter into ``target``; return the warnings worth showing a person."""
    args = tuple(example_inputs.values())
    modes = _training_modes(wrapper)  # the exporters flip train/eval on the whole tree; restore each flag after
    wrapper.eval()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        # The TorchScript exporter warns on every multi-tensor advanced index (``x[rows, cols]``) that
        # "if indices include negative values, the exported graph will produce incorrect results" (it
        # flattens the tensor and Gathers ``rows * n_cols + cols``). Every such index in the graphs of
        # this project's families is non-negative by construction: transformers' padding-mask builder
        # (``padding_mask[arange(B), arange(T)]``, masking_utils.padding_mask_function), CLIP's pooling
        # at the EOS token (``hidden[arange(B), argmax(ids)]``) and Llama's at the last real token
        # (``hidden[arange(B), last_token_index(...)]``, an argmax: 0 for an all-padding row). So the
        # warning is noise here; tests/export/test_index_warning.py checks those graphs against PyTorch
        # at the extreme indices (0 and T - 1) and that the warning stays silent. Any other warning is kept.
        warnings.filterwarnings("ignore", message=_ADVANCED_INDEX_WARNING, category=UserWarning,
                                module=r"torch\.onnx\.")
        try:
            if exporter == "torchscript":
                torch.onnx.export(
                    wrapper, args, str(target), input_names=list(example_inputs),
                    output_names=list(output_names), dynamic_axes={k: dict(v) for k, v in dynamic_axes.items()},
                    opset_version=opset, do_constant_folding=True, export_params=True, dynamo=False,
                )
            else:
                torch.onnx.export(
                    wrapper, args, str(target), input_names=list(example_inputs),
                    output_names=list(output_names), opset_version=opset, dynamo=True,
                    dynamic_shapes=(_dynamo_shapes(example_inputs, dynamic_axes),),  # one entry: the *args
                    external_data=external, optimize=True, verbose=False,
                )
        except GraphError:
            raise
        except Exception as exc:  # the exporters raise many unrelated types; report them as one
            raise GraphError(f"the {exporter} ONNX exporter failed for {target.name}: {exc}") from exc
        finally:
            _restore_modes(modes)
    kept = []
    for item in caught:
        text = str(item.message).splitlines()[0]
        if issubclass(item.category, DeprecationWarning) or text in kept:
            continue  # the TorchScript deprecation notice is expected; keep the rest once each
        kept.append(text)
        log.warning("export %s: %s: %s", target.name, item.category.__name__, text)
    return kept


def _finalise(tmp_file: Path, data_name: str, external: bool, export_shapes: dict[str, list[int]]) -> None:
    """Consolidate weights, stamp metadata, infer shapes and run the full checker on ``tmp_file``."""
    has_external = any(p.name != tmp_file.name for p in tmp_file.parent.iterdir())
    model = onnx.load_model(str(tmp_file), load_external_data=has_external)
    meta = {e.key: e.value for e in model.metadata_props}
    meta[EXPORT_SHAPES_KEY] = json.dumps(export_shapes, sort_keys=True)
    onnx.helper.set_model_props(model, meta)
    for other in tmp_file.parent.iterdir():
        other.unlink()
    if external or has_external:
        onnx.save_model(
            model, str(tmp_file), save_as_external_data=True, all_tensors_to_one_file=True,
            location=data_name, size_threshold=1024,
        )
    else:
        onnx.save_model(model, str(tmp_file))
    try:
        onnx.shape_inference.infer_shapes_path(str(tmp_file), str(tmp_file), check_type=True, strict_mode=True)
        onnx.checker.check_model(str(tmp_file), full_check=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as exc:
        first = str(exc).strip().splitlines()[0]
        raise GraphError(f"exported graph {tmp_file.name} fails the ONNX checks: {first}") from exc


def export_onnx(
    module: nn.Module,
    example_inputs: dict[str, torch.Tensor],
    output_names: list[str],
    path: Path,
    *,
    dynamic_axes: dict[str, dict[int, str]],
    opset: int = 17,
    external_data: bool | None = None,
    exporter: Literal["torchscript", "dynamo"] = "torchscript",
) -> ExportResult:
    """Export ``module`` to ``path`` atomically and check the result.

    Args:
        module: its ``forward`` takes the inputs as keyword arguments (in ``example_inputs``
            order) and returns a dict (or a tuple in ``output_names`` order) of tensors.
        example_inputs: name -> example tensor, e.g. ``input_ids`` int64 ``[B, S]``.
        output_names: graph output names, e.g. ``["logits", "probs"]`` for ``[B, K]`` outputs.
        path: destination ``.onnx`` file; its folder is created.
        dynamic_axes: name -> {axis: dim name}, e.g. ``{"input_ids": {0: "batch", 1: "seq"}}``.
            Outputs may be listed too (TorchScript exporter).
        opset: default-domain opset (17: TensorRT 10.x and ORT).
        external_data: weights in ``<name>.data`` next to the file; None: only above 1.5 GB.
        exporter: ``"torchscript"`` (default, see the module docstring) or ``"dynamo"`` (opset >= 18).

    Returns:
        :class:`ExportResult` with the summary dict also written as ``<stem>.summary.json``.
    """
    path = Path(path)
    _validate(example_inputs, output_names, dynamic_axes, opset, exporter)
    external = external_data if external_data is not None else _weights_bytes(module) > LARGE_MODEL_BYTES
    data_name = f"{path.name}.data"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp_dir = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}.tmp-"))
    try:
        tmp_file = tmp_dir / path.name
        wrapper = _OrderedOutputs(module, list(example_inputs), output_names)
        kept = _run_exporter(wrapper, example_inputs, output_names, tmp_file, dynamic_axes, opset, exporter, external)
        shapes = {name: list(t.shape) for name, t in example_inputs.items()}
        _finalise(tmp_file, data_name, external, shapes)
        tmp_data = tmp_dir / data_name
        if tmp_data.exists():
            publish(tmp_data, path.parent / data_name)
        else:
            (path.parent / data_name).unlink(missing_ok=True)  # a stale weights file would mislead
        publish(tmp_file, path)
    finally:
        shutil.rmtree(tmp_dir, ignore_errors=True)
    summary_path = write_summary(path)
    summary = json.loads(summary_path.read_text())
    weights = path.parent / data_name
    log.info(
        "exported %s (%s, opset %d): %d nodes, %d grouped Conv, %d parameters",
        path, exporter, opset, summary["nodes"], summary["grouped_conv"], summary["parameters"],
    )
    return ExportResult(
        path=path, summary_path=summary_path, summary=summary,
        external_data=weights if weights.exists() else None, exporter=exporter, opset=opset,
        warnings=tuple(kept),
    )


# ----------------------------------------------------------------------------- dynamic-shape check
