"""Measurements behind the default tolerances (``python benchmarks/parity_tolerances/calibrate.py``).

Not imported by the gate. It measures, against the FP32 graph run by ONNX Runtime CPU:

* correct graphs: FP32 ORT vs the torch module; FP16 (``convert_precision`` defaults) on ORT CPU
  and on ``onnx.reference`` (true 16-bit numpy arithmetic); BF16 on ``onnx.reference``;
* wrong graphs: every MatMul/Gemm weight initializer in turn perturbed by 5% relative noise
  (``w * (1 + 0.05 * N(0, 1))``) then converted to FP16 (and kept FP32); LayerNorm forced to
  FP16 with activations x300 (ONNX ``LayerNormalization``, and the ``rsqrt`` form that
  exporters and hand-written models produce, which the precision pass does not recognise);
* the same on all-MiniLM-L6-v2 (correct variants only; skipped when the package is missing);
* UQ deltas and bootstrap standard deviations on a ViT trained here (up to one epoch / 240 s) on
  Fashion-MNIST (1000 test images ID, 500 digits OOD).

Helpers used by the tests too: :func:`perturb_initializer`, :func:`matmul_weights` and
:class:`RsqrtLayerNormNet` (the graph that fails FP16 parity on purpose).

ONNX Runtime CPU note (measured, ORT 1.32, x86): the CPU provider has almost no FP16 kernels; it
inserts ``Cast`` nodes and computes MatMul, LayerNormalization, Softmax ... in FP32, rounding
every intermediate tensor to FP16 between nodes. So on CPU FP16 means FP16 *storage* (weights
and activations rounded, values above 65504 become inf), which is what reveals an overflowing
squared deviation; ``LayerNormalization`` itself computes in FP32 (``stash_type = 1``) on CPU.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import torch
from onnx import numpy_helper
from torch import nn

from toolchain.errors import ToolchainError

__all__ = ["RsqrtLayerNorm", "RsqrtLayerNormNet", "matmul_weights", "perturb_initializer"]

log = logging.getLogger(__name__)

Feed = dict[str, np.ndarray]


# ------------------------------------------------------------------------------- shared helpers


def matmul_weights(model: onnx.ModelProto) -> list[str]:
    """Names of float initializers read as the weight (input 1) of MatMul / Gemm nodes, in graph order."""
    inits = {i.name: i for i in model.graph.initializer}
    names: list[str] = []
    for node in model.graph.node:
        if node.op_type in ("MatMul", "Gemm") and len(node.input) > 1 and node.input[1] in inits:
            init = inits[node.input[1]]
            if init.data_type == onnx.TensorProto.FLOAT and len(init.dims) == 2 and node.input[1] not in names:
                names.append(node.input[1])
    return names


def perturb_initializer(model: onnx.ModelProto, name: str, relative: float = 0.05, seed: int = 0) -> onnx.ModelProto:
    """A copy of ``model`` whose initializer ``name`` is ``w * (1 + relative * N(0, 1))``."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    for init in out.graph.initializer:
        if init.name == name:
            w = numpy_helper.to_array(init)
            noise = np.random.default_rng(seed).standard_normal(w.shape)
            init.CopyFrom(numpy_helper.from_array((w * (1.0 + relative * noise)).astype(w.dtype), name))
            return out
    raise KeyError(f"no initializer named {name!r}")


class RsqrtLayerNorm(nn.Module):
    """LayerNorm written as ``(x - mean) * rsqrt(var + eps) * w + b`` (exports to Mul/ReduceMean/Sqrt/Div)."""

    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x [..., D]`` -> normalised ``[..., D]``."""
        d = x - x.mean(dim=-1, keepdim=True)
        var = (d * d).mean(dim=-1, keepdim=True)
        return d * torch.rsqrt(var + self.eps) * self.weight + self.bias


class RsqrtLayerNormNet(nn.Module):
    """``x [B, D]`` -> LN -> MLP residual -> LN -> head: ``{"logits", "probs"} [B, C]``.

    Fed with activations of a few hundred (``x * 300``), the squared deviations inside each LN
    exceed FP16's 65504. ``ln1``'s overflow (its output collapses to the bias) is hidden by the
    residual ``x + ...``; ``ln2``'s wrecks the logits (argmax agreement 0.34 with true FP16
    arithmetic). Keeping ``ln2``'s ``Mul -> ReduceMean -> Add -> Sqrt`` in FP32 fixes it, which is
    what :func:`toolchain.parity.rescue.rescue_precision` finds.
    """

    def __init__(self, dim: int = 16, hidden: int = 32, classes: int = 4, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.ln1 = RsqrtLayerNorm(dim)
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)
        self.ln2 = RsqrtLayerNorm(dim)
        self.head = nn.Linear(dim, classes)
        with torch.no_grad():
            self.head.weight.mul_(3.0)
        self.eval()

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        """``x [B, D]`` float32."""
        h = x + self.fc2(torch.relu(self.fc1(self.ln1(x))))
        logits = self.head(self.ln2(h))
        return {"logits": logits, "probs": torch.softmax(logits, dim=-1)}


# ------------------------------------------------------------------------------- measurements


def _ort(model: onnx.ModelProto | Path, feeds: Sequence[Feed]) -> list[dict[str, np.ndarray]]:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    options.log_severity_level = 3
    source = str(model) if isinstance(model, Path) else model.SerializeToString()
    session = ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return [dict(zip(names, session.run(names, f))) for f in feeds]


def _reference(model: onnx.ModelProto, feeds: Sequence[Feed]) -> list[dict[str, np.ndarray]]:
    from toolchain.export.reference import reference_run

    return [reference_run(model, f) for f in feeds]


def _errors(ref: Sequence[Mapping[str, np.ndarray]], cand: Sequence[Mapping[str, np.ndarray]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in ref[0]:
        r = np.concatenate([np.asarray(x[name], np.float64).reshape(-1) for x in ref])
        c = np.concatenate([np.asarray(x[name], np.float64).reshape(-1) for x in cand])
        with np.errstate(invalid="ignore"):
            err = np.abs(c - r)
        finite = bool(np.isfinite(c).all())
        ok = err[np.isfinite(err)]
        agree = np.mean([np.mean(np.argmax(a[name], -1) == np.argmax(b[name], -1)) for a, b in zip(ref, cand)])
        out[name] = {
            "max": float(err.max()) if finite else math.inf,
            "mean": float(ok.mean()) if ok.size else math.nan,
            "q99": float(np.quantile(ok, 0.99)) if ok.size else math.nan,
            "ref_absmax": float(np.abs(r).max()),
            "argmax_agreement": float(agree),
            "finite": finite,
        }
    return out


def _export(module: nn.Module, example: Mapping[str, torch.Tensor], path: Path, axes: dict[str, dict[int, str]],
            outputs: Sequence[str] = ("logits", "probs")) -> Path:
    from toolchain.export import export_onnx

    export_onnx(module, dict(example), list(outputs), path, dynamic_axes=axes)
    return path


def _tiny_case(family: str, work: Path) -> tuple[nn.Module, Path, list[Feed], Callable[[float], nn.Module]]:
    """SingleModel of a tiny model, its FP32 export and 2 feeds of 32 samples at 2 shapes."""
    from toolchain.models.tiny import TINY_MODELS
    from toolchain.models.wrappers import SingleModel

    tiny = TINY_MODELS[family]()
    names = list(tiny.adapter.input_names)
    module = SingleModel(tiny.adapter).eval()
    axes = {n: ({0: "batch", 1: "seq"} if family == "bert" else {0: "batch"}) for n in names}
    axes.update({"logits": {0: "batch"}, "probs": {0: "batch"}})
    b = tiny.make_batch(2, seed=0)
    path = _export(module, {n: b[n] for n in names}, work / f"{family}.onnx", axes)
    feeds = []
    for seed, cut in ((1, None), (2, 7)):
        batch = tiny.make_batch(32, seed=seed)
        feed = {n: batch[n].numpy() for n in names}
        if cut is not None and family == "bert":
            feed = {k: v[:, :cut] for k, v in feed.items()}
        feeds.append(feed)

    def scaled(factor: float) -> nn.Module:
        """The same model with the first LayerNorm's input scaled by ``factor``."""
        import copy

        big = copy.deepcopy(module)
        with torch.no_grad():
            if family == "bert":
                big.model.bert.embeddings.word_embeddings.weight.mul_(factor)
            else:
                big.model.vit.embeddings.patch_embeddings.projection.weight.mul_(factor)
        return big

    return module, path, feeds, scaled


def scale_initializer(model: onnx.ModelProto, name: str, factor: float = 1.05) -> onnx.ModelProto:
    """A copy of ``model`` whose initializer ``name`` is multiplied by ``factor`` (a systematic error)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    for init in out.graph.initializer:
        if init.name == name:
            w = numpy_helper.to_array(init)
            init.CopyFrom(numpy_helper.from_array((w * factor).astype(w.dtype), name))
            return out
    raise KeyError(f"no initializer named {name!r}")


def _engine(precision: str, model: onnx.ModelProto, feeds: Sequence[Feed], emulator: str = "reference"):
    """Outputs of ``model`` converted to ``precision``: ORT CPU or onnx.reference (true 16-bit arithmetic)."""
    from toolchain.export import convert_precision

    graph = model if precision == "fp32" else convert_precision(model, precision).model  # type: ignore[arg-type]
    if precision == "fp32" or emulator == "ort":
        return _ort(graph, feeds)
    return _reference(graph, feeds)


def _rules(precision: str, ref: Sequence[Mapping[str, np.ndarray]],
           cand: Sequence[Mapping[str, np.ndarray]]) -> list[Any]:
    """The precision's default rule applied to every output (the feeds pooled into one)."""
    from toolchain.parity.tolerances import default_tolerances, evaluate_rule, resolve_tolerance

    tols = default_tolerances(precision)
    return [evaluate_rule(np.concatenate([o[n].reshape(-1) for o in cand]),
                          np.concatenate([o[n].reshape(-1) for o in ref]), resolve_tolerance(tols, n))
            for n in ref[0]]


def _rule_value(precision: str, ref: Sequence[Mapping[str, np.ndarray]],
                cand: Sequence[Mapping[str, np.ndarray]]) -> float:
    """The default rule's statistic (max for FP32, the 0.999 quantile for FP16/BF16), worst over the outputs.

    Above 1 fails; FP16/BF16 also fail on their other clauses (:func:`_fails_defaults`).
    """
    return max(r.value for r in _rules(precision, ref, cand))


def _fails_defaults(precision: str, ref: Sequence[Mapping[str, np.ndarray]],
                    cand: Sequence[Mapping[str, np.ndarray]]) -> bool:
    """True when any output fails the precision's default rule (any of its clauses)."""
    return not all(r.passed for r in _rules(precision, ref, cand))


def _summarise(runs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Min / median / max over perturbed weights of each output's max and mean error."""
    out: dict[str, Any] = {}
    for name in runs[0]["errors"]:
        for stat in ("max", "mean"):
            vals = sorted(r["errors"][name][stat] for r in runs)
            out[f"{name}_{stat}"] = [vals[0], vals[len(vals) // 2], vals[-1]]
    return out


def measure_graph(model: onnx.ModelProto, feeds: Sequence[Feed], *, per_weight: bool = True) -> dict[str, Any]:
    """Errors vs FP32 ORT of correct FP16/BF16 variants and of single-weight perturbations."""
    ref = _ort(model, feeds)
    case: dict[str, Any] = {
        "fp16_ort": _errors(ref, _engine("fp16", model, feeds, "ort")),
        "fp16_true": _errors(ref, _engine("fp16", model, feeds)),
        "bf16_true": _errors(ref, _engine("bf16", model, feeds)),
    }
    for prec in ("fp16", "bf16"):  # normalised error of the correct engine under each precision's defaults
        outs = _engine(prec, model, feeds)
        case[f"{prec}_true_rule_value"] = {p: _rule_value(p, ref, outs) for p in ("fp16", "bf16")}
    if not per_weight:
        return case
    for kind, make in (("scale1.05", lambda n: scale_initializer(model, n, 1.05)),
                       ("noise5%", lambda n: perturb_initializer(model, n, 0.05))):
        for prec in ("fp32", "fp16", "bf16"):
            runs = []
            for name in matmul_weights(model):
                outs = _engine(prec, make(name), feeds)
                runs.append({"weight": name, "errors": _errors(ref, outs), "caught": _fails_defaults(prec, ref, outs)})
            case[f"wrong_{kind}_{prec}"] = {
                **_summarise(runs), "caught_by_defaults": f"{sum(r['caught'] for r in runs)}/{len(runs)}",
                "missed": [r["weight"] for r in runs if not r["caught"]],
            }
    return case


def measure_numeric(work: Path) -> dict[str, Any]:
    """Errors of correct and wrong FP32/FP16/BF16 graphs of the tiny BERT and ViT and the rsqrt-LN net."""
    from toolchain.export import convert_precision
    from toolchain.export.precision import DEFAULT_KEEP_FP32_OPS

    results: dict[str, Any] = {}
    no_ln = {k: v for k, v in DEFAULT_KEEP_FP32_OPS.items() if k != "LayerNormalization"}
    for family in ("bert", "vit"):
        module, path, feeds, scaled = _tiny_case(family, work)
        with torch.inference_mode():
            torch_out = [{k: v.numpy() for k, v in module(**{n: torch.from_numpy(a) for n, a in f.items()}).items()}
                         for f in feeds]
        case = {"fp32_ort_vs_torch": _errors(torch_out, _ort(path, feeds)),
                **measure_graph(onnx.load(str(path)), feeds)}
        big = scaled(300.0)  # LayerNormalization forced to FP16, its input x300
        axes = {n: {0: "batch", 1: "seq"} if family == "bert" else {0: "batch"} for n in feeds[0]}
        big_path = _export(big, {n: torch.from_numpy(v[:2]) for n, v in feeds[0].items()}, work / f"{family}_big.onnx",
                           axes)
        big_ref = _ort(big_path, feeds)
        forced = convert_precision(big_path, "fp16", keep_fp32_ops=no_ln).model
        case["layernorm_fp16_x300_ort"] = _errors(big_ref, _ort(forced, feeds))
        case["layernorm_fp16_x300_true"] = _errors(big_ref, _reference(forced, feeds))
        results[family] = case
    net = RsqrtLayerNormNet()
    net_path = _export(net, {"x": torch.randn(2, 16)}, work / "rsqrt_ln.onnx", {"x": {0: "batch"}})
    x = [{"x": (np.random.default_rng(s).standard_normal((64, 16)) * 300).astype(np.float32)} for s in (0, 1)]
    net_ref = _ort(net_path, x)
    forced = convert_precision(net_path, "fp16", keep_fp32_ops=()).model
    results["rsqrt_layernorm_x300"] = {
        "fp16_keep_none_ort": _errors(net_ref, _ort(forced, x)),
        "fp16_keep_none_true": _errors(net_ref, _reference(forced, x)),
        "fp16_defaults_true": _errors(net_ref, _reference(convert_precision(net_path, "fp16").model, x)),
    }
    return results


# ----------------------------------------------------------------------------------- UQ deltas


def _train_vit(seconds_budget: float = 240.0) -> tuple[nn.Module, Any]:
    from transformers import ViTConfig, ViTForImageClassification

    from toolchain.data.encoding import to_pixel_values
    from toolchain.data.image_sets import load_fashion_mnist

    torch.manual_seed(0)
    cfg = ViTConfig(image_size=28, patch_size=4, num_channels=1, hidden_size=64, num_hidden_layers=4,
                    num_attention_heads=4, intermediate_size=128, num_labels=10,
                    hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    model = ViTForImageClassification(cfg)
    train = load_fashion_mnist("train")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    order = np.random.default_rng(0).permutation(len(train.labels))
    start = time.time()
    model.train()
    for i in range(0, len(order), 64):
        idx = order[i : i + 64]
        x = to_pixel_values(np.asarray(train.images)[idx], 28, 1)
        y = torch.as_tensor(np.asarray(train.labels)[idx])
        loss = nn.functional.cross_entropy(model(pixel_values=x).logits, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if time.time() - start > seconds_budget:
            break
    return model.eval(), to_pixel_values


def measure_trained(work: Path, n_id: int = 1000, n_ood: int = 500, n_boot: int = 200,
                    n_numeric: int = 256) -> dict[str, Any]:
    """The trained ViT: numeric errors (``n_numeric`` images), UQ deltas and bootstrap stds.

    ID: the first ``n_id`` Fashion-MNIST test images; OOD: the first ``n_ood`` digits. UQ deltas
    are paired (same images through the FP32 ORT reference and the variant).
    """
    from toolchain.data.image_sets import load_digits, load_fashion_mnist
    from toolchain.metrics import uq_report
    from toolchain.models.base import adapter_for
    from toolchain.models.wrappers import SingleModel

    model, to_pixels = _train_vit()
    module = SingleModel(adapter_for(model)).eval()
    test = load_fashion_mnist("test")
    x_id = to_pixels(np.asarray(test.images)[:n_id], 28, 1).numpy()
    y_id = np.asarray(test.labels)[:n_id]
    x_ood = to_pixels(np.asarray(load_digits(28).images)[:n_ood], 28, 1).numpy()
    path = _export(module, {"pixel_values": torch.from_numpy(x_id[:2])}, work / "vit_fmnist.onnx",
                   {"pixel_values": {0: "batch"}, "logits": {0: "batch"}, "probs": {0: "batch"}})
    fp32 = onnx.load(str(path))
    numeric_feeds = [{"pixel_values": x_id[: n_numeric // 2]}, {"pixel_values": x_ood[: n_numeric // 2]}]
    out: dict[str, Any] = {"numeric": measure_graph(fp32, numeric_feeds)}

    Run = Callable[[Sequence[Feed]], list[dict[str, np.ndarray]]]

    def uq(run: Run) -> tuple[dict[str, float], np.ndarray, np.ndarray]:
        pi = np.concatenate([o["probs"] for o in run([{"pixel_values": x_id[i : i + 250]}
                                                      for i in range(0, n_id, 250)])])
        po = np.concatenate([o["probs"] for o in run([{"pixel_values": x_ood[i : i + 250]}
                                                      for i in range(0, n_ood, 250)])])
        return uq_report(pi, y_id, po), pi, po

    ref, p_id, p_ood = uq(lambda f: _ort(fp32, f))
    out["uq_reference"] = ref
    weights = matmul_weights(fp32)
    variants: dict[str, Run] = {
        "fp16_ort": lambda f: _engine("fp16", fp32, f, "ort"),
        "fp16_true": lambda f: _engine("fp16", fp32, f),
        "bf16_true": lambda f: _engine("bf16", fp32, f),
        "fp16_true_classifier_x1.05": lambda f: _engine("fp16", scale_initializer(fp32, weights[-1]), f),
        "fp16_true_last_fc2_x1.05": lambda f: _engine("fp16", scale_initializer(fp32, weights[-2]), f),
        "fp16_true_last_fc2_noise5%": lambda f: _engine("fp16", perturb_initializer(fp32, weights[-2]), f),
    }
    out["uq_delta"] = {}
    for label, run in variants.items():
        rep = uq(run)[0]
        out["uq_delta"][label] = {k: rep[k] - ref[k] for k in ref}
    rng = np.random.default_rng(0)
    boots = []
    for _ in range(n_boot):
        i = rng.integers(0, n_id, n_id)
        o = rng.integers(0, len(p_ood), len(p_ood))
        boots.append(uq_report(p_id[i], y_id[i], p_ood[o]))
    out["uq_bootstrap_std"] = {k: float(np.nanstd([b[k] for b in boots])) for k in boots[0]}
    return out


def measure_minilm(work: Path, samples: int = 32, seq: int = 48) -> dict[str, Any]:
    """all-MiniLM-L6-v2 (the packaged real encoder, random 3-class head x30): correct FP16/BF16 errors."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from toolchain.models.base import adapter_for
    from toolchain.models.loading import resolve_source
    from toolchain.models.wrappers import SingleModel

    folder = resolve_source("packaged:all-MiniLM-L6-v2")
    torch.manual_seed(0)
    model = AutoModelForSequenceClassification.from_pretrained(folder, num_labels=3).eval()
    with torch.no_grad():
        model.classifier.weight.mul_(30.0)
    module = SingleModel(adapter_for(model)).eval()
    texts = ["the market rallied after the earnings report", "i love this phone so much!!",
             "worst service ever, never again", "the match ended in a draw after extra time",
             "new chip doubles battery life", "meh, it was ok i guess", "parliament votes on the budget today",
             "can't wait for the weekend :)"]
    enc = AutoTokenizer.from_pretrained(folder)([texts[i % len(texts)] for i in range(samples)], padding="max_length",
                                                max_length=seq, truncation=True, return_tensors="pt")
    names = list(module.input_names)
    axes = {n: {0: "batch", 1: "seq"} for n in names}
    path = _export(module, {n: enc[n][:2] for n in names}, work / "minilm.onnx",
                   {**axes, "logits": {0: "batch"}, "probs": {0: "batch"}})
    return measure_graph(onnx.load(str(path)), [{n: enc[n].numpy() for n in names}], per_weight=False)


def main(argv: Sequence[str] | None = None) -> None:
    """Run the measurements and print them as JSON (``--skip-uq`` for the numeric part only)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--skip-uq", action="store_true", help="skip training the Fashion-MNIST ViT")
    parser.add_argument("--out", type=Path, help="also write the JSON here")
    args = parser.parse_args(argv)
    torch.set_num_threads(2)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        result: dict[str, Any] = {"numeric": measure_numeric(work)}
        try:
            result["minilm"] = measure_minilm(work)
        except ToolchainError as exc:  # the packaged model is an optional extra
            log.warning("skipping all-MiniLM-L6-v2: %s", exc)
        if not args.skip_uq:
            result["trained_vit"] = measure_trained(work)
    text = json.dumps(result, indent=1, default=float)
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
