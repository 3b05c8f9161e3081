"""Export-friendly wrappers: a single model as ``forward(**inputs) -> {"logits", "probs"}``.

Every engine (PyTorch, ONNX Runtime, TensorRT) sees the same input and output names. The
single model and each deep-ensemble member are exported through :class:`SingleModel`; the fused
Hydra model has its own module with outputs ``probs`` and ``member_logits``.
"""

from __future__ import annotations

import torch
from torch import nn

from toolchain.models.base import ModelAdapter


class SingleModel(nn.Module):
    """Wrap an adapter's model: embeddings -> layers -> head, named outputs ``logits``/``probs``.

    It runs the original Hugging Face forward (through the adapter), so it is the reference the
    fused model's ``M = 1`` invariant is checked against.
    """

    def __init__(self, adapter: ModelAdapter) -> None:
        super().__init__()
        self.adapter = adapter
        self.model = adapter.model
        self.input_names = tuple(adapter.input_names)

    def forward(self, *args: torch.Tensor, **kwargs: torch.Tensor) -> dict[str, torch.Tensor]:
        """Run the model: inputs by position (``input_names`` order) or by name.

        Returns ``logits [B, C]`` and ``probs [B, C]``. The ONNX exporter passes positions.
        """
        inputs = dict(zip(self.input_names, args))
        inputs.update(kwargs)
        logits = self.adapter.logits(inputs)
        return {"logits": logits, "probs": torch.softmax(logits, dim=-1)}
