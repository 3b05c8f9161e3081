"""Shared builders for the parity tests: a tiny exported ViT with ID/OOD eval data, broken graphs.

* :func:`build_vit_case` - tiny ViT (SingleModel: ``logits``/``probs`` [B, 10]) exported to ONNX,
  feeds at three batch sizes, 2 x 100 ID images with labels (the reference's argmax, every 5th
  label shifted so accuracy is 0.8) and 100 OOD images (uniform noise, another distribution).
* :func:`broken_copy` - the same ONNX file with one MatMul/Gemm weight perturbed by noise.
* :func:`bf16_verdict` - the case's BF16 graph and a broken copy's, gated on the BF16 emulator.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import torch
from onnx import numpy_helper

from toolchain.engines import make_runner
from toolchain.export import export_onnx
from toolchain.models.tiny import tiny_vit
from toolchain.models.wrappers import SingleModel

SPECS = {"pixel_values": (np.float32, ("batch", 1, 16, 16))}


@dataclass
class VitCase:
    module: torch.nn.Module
    onnx_path: Path
    generated: list[dict[str, np.ndarray]]
    id_feeds: list[tuple[dict[str, np.ndarray], np.ndarray]]
    ood_feeds: list[dict[str, np.ndarray]]

    def reference(self, name: str = "torch-fp32"):
        return make_runner("torch", module=self.module, input_specs=SPECS, name=name)


def build_vit_case(folder: Path) -> VitCase:
    tiny = tiny_vit()
    module = SingleModel(tiny.adapter).eval()
    path = folder / "vit.onnx"
    export_onnx(module, {"pixel_values": tiny.make_batch(2)["pixel_values"]}, ["logits", "probs"], path,
                dynamic_axes={"pixel_values": {0: "batch"}, "logits": {0: "batch"}, "probs": {0: "batch"}})
    generated = [{"pixel_values": tiny.make_batch(b, seed=10 + b)["pixel_values"].numpy()} for b in (1, 3, 8)]
    id_feeds = []
    for seed in (1, 2):
        x = tiny.make_batch(100, seed=seed)["pixel_values"]
        with torch.inference_mode():
            pred = module(pixel_values=x)["logits"].argmax(-1).numpy()
        labels = pred.copy()
        labels[::5] = (labels[::5] + 1) % 10
        id_feeds.append(({"pixel_values": x.numpy()}, labels.astype(np.int64)))
    rng = np.random.default_rng(3)
    ood = [{"pixel_values": rng.uniform(-3.0, 3.0, (100, 1, 16, 16)).astype(np.float32)}]
    return VitCase(module, path, generated, id_feeds, ood)


def matmul_weight(model: onnx.ModelProto, last: bool = True) -> str:
    """Name of the last (or first) 2-D float initializer read by a MatMul/Gemm node."""
    inits = {i.name: i for i in model.graph.initializer}
    names = [n.input[1] for n in model.graph.node if n.op_type in ("MatMul", "Gemm") and len(n.input) > 1
             and n.input[1] in inits and len(inits[n.input[1]].dims) == 2]
    return names[-1] if last else names[0]


def bf16_verdict(case: VitCase, folder: Path, relative: float) -> tuple[Any, Path]:
    """``(verdict, BF16 graph)``: ``run_parity`` on ``onnxrt-cpu-bf16emu`` against the PyTorch reference of
    ``emu-bf16`` (the BF16 graph) and ``emu-broken`` (its last MatMul weight given ``relative`` noise, then BF16)."""
    from toolchain.export import write_precision_variant
    from toolchain.parity import run_parity

    bf16 = folder / "vit.bf16.onnx"
    write_precision_variant(case.onnx_path, bf16, "bf16")
    broken, _ = broken_copy(case.onnx_path, folder / "broken.onnx", relative=relative)
    broken16 = folder / "broken.bf16.onnx"
    write_precision_variant(broken, broken16, "bf16")
    candidates = {"emu-bf16": make_runner("onnxrt-cpu-bf16emu", path=bf16, intra_op_threads=1),
                  "emu-broken": make_runner("onnxrt-cpu-bf16emu", path=broken16, intra_op_threads=1)}
    verdict = run_parity(case.reference(), candidates, case.generated, case.id_feeds, case.ood_feeds,
                         out_dir=folder / "out", precisions={"emu-bf16": "bf16", "emu-broken": "bf16"})
    return verdict, bf16


def broken_copy(src: Path, dst: Path, relative: float = 0.5, seed: int = 0, last: bool = True) -> tuple[Path, str]:
    """Copy ``src`` with one MatMul weight ``w + relative * std(w) * N(0, 1)``; return the path and weight name."""
    model = onnx.load(str(src))
    name = matmul_weight(model, last)
    for init in model.graph.initializer:
        if init.name == name:
            w = numpy_helper.to_array(init)
            noise = np.random.default_rng(seed).standard_normal(w.shape).astype(np.float32)
            init.CopyFrom(numpy_helper.from_array((w + relative * w.std() * noise).astype(np.float32), name))
    onnx.save(model, str(dst))
    return dst, name
