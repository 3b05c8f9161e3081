"""Export a checkpoint folder or a fused Hydra folder to ONNX, and validate every graph against PyTorch.

:func:`export_module` is the one export path: ONNX export with the family's dynamic axes, the
dynamic-shape check against PyTorch at shapes other than the export's, the TensorRT lint with
the optimisation profile, node counts. The ``export`` stage calls it with the recipe's shapes;
:func:`export_graphs` (``hydra-toolchain export SRC -o OUT``) with the command line's. Low-precision
variants (FP16/BF16) are validated against PyTorch on a generated batch with the measured default
tolerances of their precision (:mod:`toolchain.parity.tolerances`), run by the engine kind that
runs that precision on the CPU (BF16 through the exact-rounding emulation).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from toolchain.errors import DataError, RecipeError

#: a generated feed of a given batch and sequence length: ``make_feed(batch, sequence, seed)``
FeedMaker = Callable[[int, int, int], dict[str, torch.Tensor]]


@dataclass(frozen=True)
class Range:
    """``MIN:OPT:MAX`` of one dynamic axis (the TensorRT optimisation profile's three shapes)."""

    min: int
    opt: int
    max: int

    @classmethod
    def parse(cls, text: str, what: str) -> Range:
        """``"1:8:32"`` -> ``Range(1, 8, 32)``; a clear error naming ``what`` otherwise."""
        parts = str(text).split(":")
        try:
            lo, opt, hi = (int(p) for p in parts)
        except ValueError:
            raise RecipeError(f"{what} '{text}' is not MIN:OPT:MAX (three integers, e.g. 1:8:32).") from None
        if not 1 <= lo <= opt <= hi:
            raise RecipeError(f"{what} '{text}': need 1 <= MIN <= OPT <= MAX.")
        return cls(lo, opt, hi)


@dataclass
class ExportOptions:
    """What ``export`` writes: lowerings (Hydra only), precisions, shapes, opset."""

    lowerings: Sequence[str] = ("conv", "matmul")
    precisions: Sequence[str] = ("fp32", "fp16")
    batch: Range = field(default_factory=lambda: Range(1, 8, 32))
    sequence: Range = field(default_factory=lambda: Range(8, 64, 128))
    opset: int = 17
    trt_version: str = "10"
    #: engine kinds to build from the exported graphs (kinds that need a build: openvino-cpu compiles each
    #: FP32 graph at each of ``precisions``; tensorrt builds where it can); written to ``engines.json``
    engines: Sequence[str] = ()
    #: INT8 calibration rows (``int8`` in ``precisions``): a labelled text CSV or an ``.npz`` of named arrays
    data: Path | None = None
    tokenizer: Path | None = None  #: the tokenizer folder for ``data`` (default: the source folder's)
    calibration_rows: int = 256  #: at most this many rows of ``data`` calibrate (a seeded sample)


def tensorrt_profile(specs: Mapping[str, Any], example: Mapping[str, torch.Tensor], names: Sequence[str],
                     batch: Any, sequence: Any) -> dict[str, tuple]:
    """Min/opt/max shape per input (the TensorRT optimisation profile) from ``batch`` / ``sequence`` ranges.

    ``specs``: the family's :class:`~toolchain.models.InputSpec` by name; ``example``: a generated feed
    (static dimensions are read from it); the ranges have ``min``/``opt``/``max`` attributes.
    """
    sizes = [{"batch": getattr(batch, k), "sequence": getattr(sequence, k)} for k in ("min", "opt", "max")]
    return {n: tuple(specs[n].shape(example[n].shape, s) for s in sizes) for n in names}


def export_module(module: torch.nn.Module, outputs: list[str], path: Path, *, make_feed: FeedMaker,
                  names: list[str], axes: Mapping[str, Mapping[int, str]], profile: Mapping[str, tuple] | None,
                  opset: int, sequence: Any, trt_version: str = "10",
                  raise_on_failure: bool = True) -> dict[str, Any]:
    """Export ``module`` to ``path``, check it against PyTorch at other shapes, lint it; return the facts.

    ``make_feed(batch, sequence, seed)`` generates inputs; ``sequence`` (``opt``/``max``) sets the
    traced shape ``(2, min(opt, 32))`` and the checked ones ``(3, min(max, 21))``, ``(1, min(max, 40))``
    where ONNX Runtime is compared with PyTorch (atol 1e-4; a mismatch raises unless
    ``raise_on_failure`` is False, then it is in ``dynamic_check``).
    """
    export_shape = (2, min(sequence.opt, 32))
    check_shapes = [(3, min(sequence.max, 21)), (1, min(sequence.max, 40))]
    from toolchain import interrupts
    from toolchain.engines.onnxrt.dynamic import check_dynamic
    from toolchain.export.lint import lint_tensorrt
    from toolchain.export.onnx_export import export_onnx
    from toolchain.export.stats import graph_stats

    interrupts.check()  # a graceful SIGTERM stops between graphs, not inside the ONNX exporter
    feed = make_feed(*export_shape, 0)
    names = [n for n in names if n in feed]
    module.eval()
    res = export_onnx(module, {n: feed[n] for n in names}, outputs, path,
                      dynamic_axes={n: dict(axes[n]) for n in names} | {o: {0: "batch"} for o in outputs}, opset=opset)
    report = check_dynamic(path, module, lambda s: {n: v for n, v in make_feed(s[0], s[1], 5).items() if n in names},
                           list(check_shapes), atol=1e-4, raise_on_failure=raise_on_failure)
    lint = lint_tensorrt(path, trt_version=trt_version, profile=dict(profile) if profile else None)
    return {"path": path.name, "outputs": outputs, "inputs": names, "summary": res.summary,
            "dynamic_check": {"ok": report.ok, "shapes": [list(s) for s in check_shapes],
                              "failures": list(report.failures)[:5]},
            "lint_ok": lint.ok, "lint": [str(f) for f in lint.findings], "stats": graph_stats(path)}


def validate_precision(path: Path, module: torch.nn.Module, feed: Mapping[str, torch.Tensor],
                       precision: str) -> dict[str, Any]:
    """A low-precision graph against PyTorch on ``feed``, with the precision's default tolerances."""
    from toolchain.engines import default_engines, engine_kind, make_runner
    from toolchain.parity.tolerances import default_tolerances, evaluate_rule, resolve_tolerance

    kind = engine_kind(next(k for k in default_engines() if engine_kind(k).runs_files))  # the CPU kind every recipe has
    name = kind.substitutes.get(precision, kind.name)
    with torch.no_grad():
        want = {k: v.float().numpy() for k, v in module(**feed).items()}
    with make_runner(name, path=path) as run:
        got = run.infer({k: v.numpy() for k, v in feed.items()})
    tols = default_tolerances(precision)
    checks = {}
    for out, ref in want.items():
        if out not in got:
            continue
        rule = evaluate_rule(np.asarray(got[out], dtype=np.float32), ref, resolve_tolerance(tols, out))
        checks[out] = {"passed": bool(rule.passed), "normalised_error": float(rule.value),
                       "max_normalised_error": float(rule.max_value), "nonfinite": rule.nonfinite is not None}
    return {"engine": name, "ok": all(c["passed"] for c in checks.values()), "outputs": checks}


# --------------------------------------------------------------------------- sources on disk
@dataclass
class Source:
    """A folder to export: a Hugging Face checkpoint or a fused Hydra model."""

    path: Path
    kind: str  #: ``checkpoint`` | ``hydra``
    family: Any  #: the adapter class
    hf_config: dict[str, Any]
    build: Callable[[str | None], tuple[torch.nn.Module, list[str]]]  #: lowering -> (module, outputs)

    def make_feed(self, batch: int, sequence: int, seed: int) -> dict[str, torch.Tensor]:
        """Generated inputs of the family; token ids kept inside the model's vocabulary."""
        cfg = self.hf_config
        vision = cfg.get("vision_config") or {}
        feed = self.family.example_inputs(batch, sequence=sequence,
                                          image_size=int(cfg.get("image_size") or vision.get("image_size") or 224),
                                          num_channels=int(cfg.get("num_channels") or vision.get("num_channels") or 3),
                                          seed=seed)
        vocab = cfg.get("vocab_size")
        if "input_ids" in feed and vocab:
            feed["input_ids"] = feed["input_ids"] % int(vocab)
        return feed


def open_source(path: str | Path) -> Source:
    """Tell a Hydra folder (``hydra_config.json``) from a checkpoint folder (``config.json``) and open it."""
    from toolchain.errors import ModelError
    from toolchain.hydra.io import CONFIG_FILE, load_hydra
    from toolchain.models import family, load_model
    from toolchain.models.wrappers import SingleModel

    path = Path(path)
    if (path / CONFIG_FILE).is_file():
        first = load_hydra(path)
        fam = family(first.config.family)

        def hydra(lowering: str | None) -> tuple[torch.nn.Module, list[str]]:
            return (first.set_lowering(lowering) if lowering else first), ["probs", "member_logits"]

        return Source(path, "hydra", fam, dict(first.config.hf_config), hydra)
    if not (path / "config.json").is_file():
        raise ModelError(f"'{path}' is neither a Hugging Face checkpoint folder (config.json) nor a Hydra folder "
                         f"({CONFIG_FILE}).",
                         hint="Pass a folder written by save_pretrained or by hydra-toolchain fuse.")
    loaded = load_model(path, tokenizer=False)

    def single(_lowering: str | None) -> tuple[torch.nn.Module, list[str]]:
        return SingleModel(loaded.adapter), ["logits", "probs"]

    return Source(path, "checkpoint", type(loaded.adapter), loaded.model.config.to_dict(), single)


def export_graphs(src: str | Path, out: str | Path, options: ExportOptions | None = None,
                  say: Callable[[str], None] = lambda _line: None) -> dict[str, Any]:
    """``hydra-toolchain export SRC -o OUT``: every graph of ``src`` into ``out``, validated; returns graphs.json.

    A checkpoint gives ``single.onnx``; a Hydra folder ``hydra-<lowering>.onnx`` per lowering. Each
    FP32 graph is checked against PyTorch at shapes other than the export's and linted for
    TensorRT; each FP16/BF16 variant is checked against PyTorch with its precision's default
    tolerances. ``graphs.json`` records every result; ``ok`` is False when any check failed. With
    ``options.engines``, the kinds among them that need a build build their engine files into ``out``
    (:func:`toolchain.verbs.build.build_engines`; ``engines.json``).
    """
    from toolchain.artifacts import atomic_write_json
    from toolchain.export.precision import write_precision_variant
    from toolchain.export.stats import graph_stats

    o = options or ExportOptions()
    if "int8" in o.precisions and o.data is None:
        raise DataError("--precision int8 needs calibration rows: pass --data FILE (a labelled CSV, text,label; or "
                        "an .npz of the graph's inputs for image models).")
    source = open_source(src)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    specs = source.family.input_specs()
    example = source.make_feed(1, o.sequence.opt, 0)
    graphs: dict[str, Any] = {}
    bases = [f"hydra-{low}" for low in o.lowerings] if source.kind == "hydra" else ["single"]
    calib_for: dict[tuple[str, ...], list[dict[str, np.ndarray]]] = {}  # INT8 calibration feeds per input set
    for base in bases:
        module, outputs = source.build(base.split("-", 1)[1] if source.kind == "hydra" else None)
        names = [n for n in getattr(module, "input_names", ()) or source.family.input_names if n in specs]
        facts = export_module(module, outputs, out / f"{base}.onnx", make_feed=source.make_feed, names=names,
                              axes={n: specs[n].dynamic_axes() for n in names},
                              profile=tensorrt_profile(specs, example, names, o.batch, o.sequence), opset=o.opset,
                              sequence=o.sequence, trt_version=o.trt_version, raise_on_failure=False)
        graphs[base] = {"kind": source.kind if source.kind == "hydra" else "single", "precision": "fp32", **facts}
        ok = facts["dynamic_check"]["ok"] and facts["lint_ok"]
        nodes = facts["stats"]["nodes_excluding_constant"]
        say(f"{base}.onnx (fp32): PyTorch check {'ok' if facts['dynamic_check']['ok'] else 'FAILED'}, "
            f"TensorRT lint {'ok' if facts['lint_ok'] else 'FAILED'}, {nodes} nodes")
        feed = {n: v for n, v in source.make_feed(o.batch.opt, min(o.sequence.opt, 64), 7).items() if n in names}
        for prec in [p for p in o.precisions if p != "fp32"]:
            name = f"{base}.{prec}"
            if prec == "int8":
                from toolchain.engines.onnxrt.quantize import write_int8_variant
                from toolchain.verbs.rows import data_feeds

                if calib_for.get(tuple(names)) is None:  # tokenised once per set of inputs, not per lowering
                    calib_for[tuple(names)] = data_feeds(source, names, o.data, tokenizer=o.tokenizer,
                                                         max_length=o.sequence.max, max_rows=o.calibration_rows)
                calib = calib_for[tuple(names)]
                res = write_int8_variant(out / f"{base}.onnx", out / f"{name}.onnx", calib)
                # checked on calibration rows: generated token ids lie outside the calibrated ranges
                check = validate_precision(out / f"{name}.onnx", module,
                                           {k: torch.as_tensor(v) for k, v in calib[0].items()}, prec)
            else:
                res = write_precision_variant(out / f"{base}.onnx", out / f"{name}.onnx", prec)
                check = validate_precision(out / f"{name}.onnx", module, feed, prec)
            graphs[name] = {"kind": graphs[base]["kind"], "precision": prec, "path": f"{name}.onnx",
                            "inputs": names, "outputs": outputs, "precision_report": res.report(),
                            "pytorch_check": check, "stats": graph_stats(out / f"{name}.onnx")}
            ok = ok and check["ok"]
            say(f"{name}.onnx ({prec}): PyTorch check {'ok' if check['ok'] else 'FAILED'} on {check['engine']}")
        graphs[base]["ok"] = ok
    result = {"source": str(source.path), "source_kind": source.kind, "family": source.family.family,
              "ok": all(g.get("ok", True) and g.get("pytorch_check", {"ok": True})["ok"] for g in graphs.values()),
              "graphs": graphs}
    atomic_write_json(out / "graphs.json", result)
    if o.engines:
        from toolchain.verbs.build import build_engines

        records = build_engines(o.engines, graphs, out, out, precisions=o.precisions, say=say,
                                profile=lambda names: tensorrt_profile(specs, example, names, o.batch, o.sequence))
        atomic_write_json(out / "engines.json", records)
        result["engines"] = records
    return result


def read_graphs(path: str | Path) -> dict[str, Any]:
    """``graphs.json`` of an export folder."""
    return json.loads(Path(path).read_text())
