"""A tiny two-input model for the runner contract tests (imported by conftest.py and tests).

``TinyScorer``: x float32 [B, 6] and mask int64 [B, 6] -> {"scores": [B, 4], "probs": [B, 4]};
dynamic batch, static feature dim (so static-dim checks have something to catch).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

FEATURES, CLASSES = 6, 4


class TinyScorer(nn.Module):
    """Masked linear scorer with a softmax head."""

    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.proj = nn.Linear(FEATURES, CLASSES)
        self.eval()

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> dict[str, torch.Tensor]:
        scores = self.proj(x * mask.to(x.dtype))
        return {"scores": scores, "probs": torch.softmax(scores, dim=-1)}


INPUT_SPECS = {"x": (np.float32, ("batch", FEATURES)), "mask": (np.int64, ("batch", FEATURES))}


def feed(batch: int = 3, seed: int = 0) -> dict[str, np.ndarray]:
    """A valid feed of ``batch`` rows."""
    rng = np.random.default_rng(seed)
    mask = np.ones((batch, FEATURES), np.int64)
    mask[0, -2:] = 0
    return {"x": rng.standard_normal((batch, FEATURES)).astype(np.float32), "mask": mask}
