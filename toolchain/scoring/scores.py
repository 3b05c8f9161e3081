"""The result of every criterion: :class:`HeadScores` (scores per head, provenance, JSON, heatmap).

Convention for all criteria: a **higher score means a more important head** (kept first by
:func:`toolchain.pruning.keep_mask`). ``scores`` is float64 ``[layers, max_heads]``; entries
past a layer's head count (a pruned model with unequal layers) are NaN.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

__all__ = ["FORMAT", "HeadScores", "atomic_write_bytes", "jsonable", "nan_scores"]

FORMAT = "hydra-head-scores"
_VERSION = 1


def jsonable(value: Any) -> Any:
    """``value`` as plain JSON types: tuples -> lists, numpy/torch scalars -> Python, NaN/inf -> None."""
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if isinstance(value, torch.Tensor):
        return jsonable(value.tolist())
    if isinstance(value, np.ndarray):
        return jsonable(value.tolist())
    if isinstance(value, np.generic):
        return jsonable(value.item())
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if value is None or isinstance(value, bool | int | str):
        return value
    return str(value)


def atomic_write_bytes(path: str | Path, data: bytes) -> Path:
    """Write ``data`` to a temporary file next to ``path``, then ``os.replace`` it over ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o644)  # mkstemp creates 0600; results are meant to be shared
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return path


def nan_scores(heads_per_layer: Sequence[int]) -> torch.Tensor:
    """A float64 ``[layers, max_heads]`` tensor of NaN: fill the existing heads."""
    return torch.full((len(heads_per_layer), max(heads_per_layer)), float("nan"), dtype=torch.float64)


@dataclass
class HeadScores:
    """Importance of every attention head under one criterion.

    Attributes:
        scores: float64 ``[layers, max_heads]``; higher = more important; NaN past a layer's
            head count.
        criterion: registry name (``"his"``, ``"hies"``, ...).
        params: the criterion's resolved parameters (defaults included), JSON-able.
        data_hash: SHA-256 of the calibration data (:func:`toolchain.scoring.calibration.data_hash`),
            ``""`` when the criterion reads no data.
        heads_per_layer: head count of every layer of the scored model.
        extras: criterion-specific diagnostics (HIES: its HIS and AE components; circuit: the
            selected heads in order and the objective values), JSON-able.
    """

    scores: torch.Tensor
    criterion: str
    params: dict[str, Any]
    data_hash: str
    heads_per_layer: list[int]
    extras: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.scores = torch.as_tensor(self.scores, dtype=torch.float64).detach().cpu()
        self.heads_per_layer = [int(h) for h in self.heads_per_layer]
        if self.scores.dim() != 2:
            raise ValueError(f"scores must be [layers, max_heads], got shape {tuple(self.scores.shape)}")
        if not self.heads_per_layer or min(self.heads_per_layer) < 1:
            raise ValueError(f"heads_per_layer must list >= 1 head per layer, got {self.heads_per_layer}")
        expect = (len(self.heads_per_layer), max(self.heads_per_layer))
        if tuple(self.scores.shape) != expect:
            raise ValueError(
                f"scores has shape {tuple(self.scores.shape)} but heads_per_layer={self.heads_per_layer} "
                f"needs {expect}"
            )

    # ------------------------------------------------------------------ views
    @property
    def num_layers(self) -> int:
        """Number of layers."""
        return len(self.heads_per_layer)

    @property
    def max_heads(self) -> int:
        """Second axis of ``scores``."""
        return max(self.heads_per_layer)

    def valid_mask(self) -> torch.Tensor:
        """``[layers, max_heads]`` bool: the heads that exist."""
        cols = torch.arange(self.max_heads)[None, :]
        return cols < torch.tensor(self.heads_per_layer)[:, None]

    def ranking(self) -> list[tuple[int, int]]:
        """Existing heads, most important first; ties by (layer, head) index."""
        heads = [(l, h) for l, n in enumerate(self.heads_per_layer) for h in range(n)]
        return sorted(heads, key=lambda lh: (-float(self.scores[lh]), lh[0], lh[1]))

    # ------------------------------------------------------------------- JSON
    def to_dict(self) -> dict[str, Any]:
        """Plain-JSON form (NaN -> null)."""
        return {
            "format": FORMAT,
            "version": _VERSION,
            "criterion": self.criterion,
            "params": jsonable(self.params),
            "data_hash": self.data_hash,
            "heads_per_layer": list(self.heads_per_layer),
            "scores": jsonable(self.scores.tolist()),
            "extras": jsonable(self.extras),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> HeadScores:
        """Inverse of :meth:`to_dict` (null -> NaN)."""
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            got = data.get("format") if isinstance(data, dict) else type(data).__name__
            raise ValueError(f"not a head-scores file: format is {got!r}, expected {FORMAT!r}")
        if data.get("version") != _VERSION:
            raise ValueError(
                f"head-scores version {data.get('version')!r} is not supported (expected {_VERSION})"
            )
        rows = [[float("nan") if v is None else float(v) for v in row] for row in data["scores"]]
        return cls(
            scores=torch.tensor(rows, dtype=torch.float64),
            criterion=str(data["criterion"]),
            params=dict(data.get("params") or {}),
            data_hash=str(data.get("data_hash", "")),
            heads_per_layer=list(data["heads_per_layer"]),
            extras=dict(data.get("extras") or {}),
        )

    def to_json(self, path: str | Path) -> Path:
        """Write the scores as JSON, atomically (temporary file + ``os.replace``)."""
        text = json.dumps(self.to_dict(), indent=1, allow_nan=False)
        return atomic_write_bytes(path, (text + "\n").encode())

    @classmethod
    def from_json(cls, path: str | Path) -> HeadScores:
        """Read a file written by :meth:`to_json`.

        Raises:
            ValueError: the file is not valid JSON or not a head-scores file.
        """
        path = Path(path)
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            raise ValueError(f"head-scores file '{path}' is not valid JSON: {exc}") from exc
        return cls.from_dict(data)

    # ---------------------------------------------------------------- heatmap
    def plot_heatmap(
        self, path: str | Path, *, title: str | None = None, annotate: bool | None = None
    ) -> Path:
        """Layers x heads heatmap (NaN cells blank), PNG written atomically.

        ``annotate=None`` prints the values when the grid has at most 16 x 16 cells.
        """
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure

        data = np.ma.masked_invalid(self.scores.numpy())
        n_l, n_h = data.shape
        fig = Figure(figsize=(max(4.0, 0.55 * n_h + 2.0), max(2.5, 0.45 * n_l + 1.5)))
        FigureCanvasAgg(fig)
        ax = fig.add_subplot(1, 1, 1)
        im = ax.imshow(data, aspect="auto", cmap="viridis", interpolation="nearest")
        fig.colorbar(im, ax=ax, label="score (higher = more important)")
        ax.set_xlabel("head")
        ax.set_ylabel("layer")
        ax.set_xticks(range(n_h))
        ax.set_yticks(range(n_l))
        ax.set_title(title or f"{self.criterion} head scores")
        if annotate is None:
            annotate = n_l <= 16 and n_h <= 16
        if annotate:
            for l in range(n_l):
                for h in range(n_h):
                    v = self.scores[l, h].item()
                    if math.isfinite(v):
                        ax.text(h, l, f"{v:.2g}", ha="center", va="center", fontsize=6, color="w")
        fig.tight_layout()
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=110)
        return atomic_write_bytes(path, buf.getvalue())
