"""Calibration data: validation, a stable content hash, sample subsets and model-mode helpers.

Calibration data is an iterable of ``(batch, labels)`` pairs: ``batch`` is a dict of tensors as
the adapter's family takes them (every tensor whose first axis equals the batch size is a
per-sample tensor), ``labels`` an integer tensor ``[batch]``. Label :data:`OOD_LABEL` (``-1``)
marks an out-of-distribution sample (only the circuit search's ``ood_auroc`` objective uses
such rows; the gradient criteria reject them).

The iterable is read once into a list (:func:`as_calibration`): criteria that need several
passes (the circuit search) can then iterate it again.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Iterable, Iterator, Sequence

import numpy as np
import torch
from torch import nn

__all__ = [
    "OOD_LABEL",
    "Calibration",
    "as_calibration",
    "data_hash",
    "eval_mode",
    "layers_see_batch",
    "num_samples",
    "subset",
]

#: label of an out-of-distribution calibration sample
OOD_LABEL = -1

Calibration = list[tuple[dict[str, torch.Tensor], torch.Tensor]]


def as_calibration(calib: Iterable | None, *, what: str = "calib", allow_empty: bool = False) -> Calibration:
    """Read ``calib`` into a validated list of ``(batch dict, int64 labels [B])`` pairs.

    Raises:
        ValueError: ``calib`` is not an iterable of pairs, a batch is not a dict of tensors,
            labels are not 1-D integers matching the batch, or (unless ``allow_empty``) it is empty.
    """
    if calib is None:
        if allow_empty:
            return []
        raise ValueError(f"{what} is required: give an iterable of (batch dict, labels) pairs, got None")
    if isinstance(calib, dict):
        raise ValueError(f"{what} must be an iterable of (batch dict, labels) pairs, got a single dict")
    out: Calibration = []
    for i, item in enumerate(calib):
        if not isinstance(item, tuple | list) or len(item) != 2:
            raise ValueError(f"{what}[{i}] must be a (batch dict, labels) pair, got {type(item).__name__}")
        batch, labels = item
        if (
            not isinstance(batch, dict)
            or not batch
            or not all(isinstance(v, torch.Tensor) for v in batch.values())
        ):
            raise ValueError(
                f"{what}[{i}]: the batch must be a non-empty dict of tensors, got {type(batch).__name__}"
            )
        labels = torch.as_tensor(labels)
        if (
            labels.dim() != 1
            or labels.numel() == 0
            or labels.is_floating_point()
            or labels.dtype == torch.bool
        ):
            raise ValueError(
                f"{what}[{i}]: labels must be a non-empty 1-D integer tensor, got {labels.dtype} {tuple(labels.shape)}"
            )
        n = labels.shape[0]
        if not any(v.dim() > 0 and v.shape[0] == n for v in batch.values()):
            shapes = {k: tuple(v.shape) for k, v in batch.items()}
            raise ValueError(f"{what}[{i}]: {n} labels but no batch tensor has {n} rows: {shapes}")
        out.append((batch, labels.to(torch.int64)))
    if not out and not allow_empty:
        raise ValueError(f"{what} is empty: give at least one (batch dict, labels) pair")
    return out


def num_samples(calib: Calibration) -> int:
    """Total number of samples over all batches."""
    return sum(int(labels.shape[0]) for _, labels in calib)


def _hash_tensor(h: hashlib._Hash, t: torch.Tensor) -> None:
    t = t.detach().cpu().contiguous()
    h.update(f"{t.dtype}|{tuple(t.shape)}|".encode())
    h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")


def data_hash(calib: Calibration) -> str:
    """SHA-256 over every batch's tensors (keys sorted, dtype, shape, bytes) and labels, in order.

    Stable across runs and processes; ``""`` for no data (criteria that read no data).
    """
    if not calib:
        return ""
    h = hashlib.sha256()
    for batch, labels in calib:
        for key in sorted(batch):
            h.update(f"key:{key}|".encode())
            _hash_tensor(h, batch[key])
        h.update(b"labels|")
        _hash_tensor(h, labels)
    return h.hexdigest()


def _index_batch(batch: dict[str, torch.Tensor], n: int, rows: torch.Tensor) -> dict[str, torch.Tensor]:
    """Rows ``rows`` of every per-sample tensor (first axis ``n``); other tensors unchanged."""
    return {k: (v.index_select(0, rows) if v.dim() > 0 and v.shape[0] == n else v) for k, v in batch.items()}


def subset(calib: Calibration, indices: Sequence[int] | np.ndarray) -> Calibration:
    """The samples ``indices`` (flat positions over all batches, repeats allowed), kept in their batches.

    Each new batch holds the chosen rows of one original batch (so its padding shape is the
    original's); batches that lose every row are dropped. Rows keep the order of ``indices``
    within a batch.

    Raises:
        ValueError: an index outside ``[0, num_samples)``, or no index at all.
    """
    idx = np.asarray(indices, dtype=np.int64).reshape(-1)
    total = num_samples(calib)
    if idx.size == 0:
        raise ValueError("indices is empty: a calibration subset needs at least one sample")
    if idx.min() < 0 or idx.max() >= total:
        raise ValueError(f"indices must lie in [0, {total}); got range [{idx.min()}, {idx.max()}]")
    out: Calibration = []
    start = 0
    for batch, labels in calib:
        n = int(labels.shape[0])
        mine = idx[(idx >= start) & (idx < start + n)] - start
        if mine.size:
            rows = torch.from_numpy(mine)
            out.append((_index_batch(batch, n, rows), labels.index_select(0, rows)))
        start += n
    return out


def layers_see_batch(adapter: object, batch: dict[str, torch.Tensor], n: int) -> bool:
    """True when the prunable layers process the ``n`` samples of ``batch`` (one row each).

    Read from ``adapter.token_mask`` (its rows are the sequences the prunable layers process):
    the rows must number ``n`` and follow the batch (one row for the batch's first sample).
    False e.g. for a CLIP adapter pruning the text tower, whose layers see the class prompts
    whatever the batch: per-sample gates are then impossible and criteria fall back to one
    sample per forward.
    """
    if int(adapter.token_mask(batch).shape[0]) != n:
        return False
    if n == 1:  # one sample: per-sample gates equal batch gates whatever the layers see
        return True
    first = _index_batch(batch, n, torch.zeros(1, dtype=torch.long))
    return int(adapter.token_mask(first).shape[0]) == 1  # the rows follow the batch, not fixed inputs


@contextlib.contextmanager
def eval_mode(model: nn.Module) -> Iterator[None]:
    """Put ``model`` in eval mode inside the block and restore its previous mode afterwards."""
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)


def gate_dtype(model: nn.Module) -> torch.dtype:
    """The floating dtype of the model's parameters (gates are created in it)."""
    for p in model.parameters():
        if p.is_floating_point():
            return p.dtype
    return torch.float32


def check_labels(labels: torch.Tensor, num_classes: int, *, criterion: str, allow_ood: bool = False) -> None:
    """Labels must index the logits' classes (or be :data:`OOD_LABEL` where ``allow_ood``).

    Raises:
        ValueError: naming the criterion and the offending label values.
    """
    lo = OOD_LABEL if allow_ood else 0
    bad = (labels < lo) | (labels >= num_classes)
    if allow_ood:
        bad |= (labels < 0) & (labels != OOD_LABEL)
    if bool(bad.any()):
        values = sorted({int(v) for v in labels[bad].tolist()})[:5]
        allowed = f"0..{num_classes - 1}" + (f" or {OOD_LABEL} (OOD)" if allow_ood else "")
        raise ValueError(
            f"calib labels {values} are invalid for criterion '{criterion}': labels must be {allowed}"
        )
