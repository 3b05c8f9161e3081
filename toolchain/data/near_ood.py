"""Near-OOD rows held out of the in-distribution data set (recipe ``data.near_ood``).

A near-OOD set is close to the training distribution, closer than the far-OOD set (``data.ood``):
same source, same format, same length, but something the model never saw. It is carved out of
the ID data set itself *before* the ID splits are drawn, so no training, scoring, circuit
objective or model selection sees a held-out row; only ``evaluate`` scores them.

Two ways to hold rows out:

* ``classes``: every row of the named classes leaves the ID set, and the ID label space drops
  those classes (labels are renumbered in the order of the classes kept). The held-out rows are a
  *semantic* shift: an unseen class of the same kind of input (e.g. Fashion-MNIST shirts and ankle
  boots when the model learns the other 8 garments).
* ``match``: every text row that the regular expression matches (``re.search``) leaves the ID
  set; the labels are kept. The held-out rows are a *topic* shift: the same task and label space
  on a subject the model never saw (e.g. the Coachella festival tweets of the tweet corpus).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TypeVar

import numpy as np

from toolchain.data.containers import ImageData, TextData
from toolchain.errors import DataError

__all__ = ["hold_out"]

D = TypeVar("D", TextData, ImageData)


def hold_out(data: D, *, classes: Sequence[str] | None = None, match: str | None = None,
             field: str = "data.near_ood") -> tuple[D, D]:
    """Split ``data`` into ``(kept, held)`` rows by held-out classes or a text pattern (module doc).

    ``kept`` is named like ``data``; with ``classes`` its class names lose the held-out ones and
    its labels are renumbered. ``held`` is named ``<name>/near-ood`` and keeps the original
    labels and class names (near-OOD labels are not used).

    Raises:
        DataError: naming ``field``: neither or both of ``classes`` and ``match``, an unknown class
            (listing the known ones), a pattern for image data or one that does not compile, or a
            hold-out that leaves no held rows or fewer than two ID classes.
    """
    if (classes is None) == (match is None):
        raise DataError(f"{field}: give exactly one of 'classes' (held-out class names) or 'match' (a text pattern)")
    if classes is not None:
        unknown = [c for c in classes if c not in data.class_names]
        if unknown or not classes:
            raise DataError(f"{field}.classes: {unknown or 'an empty list'} "
                            f"{'are not classes of' if unknown else 'holds no class of'} '{data.name}'; "
                            f"its classes: {', '.join(data.class_names)}")
        drop = [data.class_names.index(c) for c in classes]
        keep_classes = [c for i, c in enumerate(data.class_names) if i not in drop]
        if len(keep_classes) < 2:
            raise DataError(f"{field}.classes: holding out {list(classes)} leaves {len(keep_classes)} class(es) of "
                            f"'{data.name}'; the ID set needs at least 2")
        held_mask = np.isin(data.labels, drop)
    else:
        if not isinstance(data, TextData):
            raise DataError(f"{field}.match: a text pattern needs text data; '{data.name}' holds images "
                            "(hold out classes instead)")
        try:
            pattern = re.compile(str(match))
        except re.error as exc:
            raise DataError(f"{field}.match: {match!r} is not a regular expression ({exc})") from None
        held_mask = np.array([pattern.search(t) is not None for t in data.texts], dtype=bool)
        keep_classes = list(data.class_names)
    if not held_mask.any():
        raise DataError(f"{field}: no row of '{data.name}' is held out by "
                        f"{'classes ' + str(list(classes)) if classes is not None else 'match ' + repr(match)}")
    if held_mask.all():
        raise DataError(f"{field}: every row of '{data.name}' would be held out; nothing is left in distribution")
    held = data.subset(np.flatnonzero(held_mask), name=f"{data.name}/near-ood")
    kept = data.subset(np.flatnonzero(~held_mask), name=data.name)
    if classes is not None:
        old_to_new = np.full(len(data.class_names), -1, dtype=np.int64)
        for new, name in enumerate(keep_classes):
            old_to_new[data.class_names.index(name)] = new
        labels = old_to_new[kept.labels]
        if isinstance(kept, TextData):
            kept = TextData(kept.texts, labels, keep_classes, kept.name)
        else:
            kept = ImageData(kept.images, labels, keep_classes, kept.name)
    return kept, held
