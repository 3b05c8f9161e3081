"""Name -> loader registry for the packaged data sets, with a did-you-mean for typos.

``csv:PATH`` names a local CSV file of ``text,label`` rows instead (:mod:`toolchain.data.csv_sets`).
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from typing import Any

from toolchain.data.containers import ImageData, TextData
from toolchain.data.csv_sets import is_csv_id, load_csv
from toolchain.data.image_sets import load_digits, load_fashion_mnist
from toolchain.data.text_sets import load_bbc, load_tweets
from toolchain.errors import DataError

__all__ = ["DATASETS", "load_dataset"]

#: Known data sets; keyword arguments of :func:`load_dataset` go to the loader.
DATASETS: dict[str, Callable[..., TextData | ImageData]] = {
    "bbc": load_bbc,
    "digits": load_digits,
    "fashion-mnist": load_fashion_mnist,
    "tweets": load_tweets,
}


def load_dataset(name: str, **kwargs: Any) -> TextData | ImageData:
    """Load a registered data set by name (``_`` and ``-`` are interchangeable, case ignored).

    ``csv:PATH`` loads a local CSV file with ``text`` and ``label`` columns (keyword: ``min_classes``).

    Raises:
        DataError: unknown name (listing the known ones and the closest match), or the loader's
            own errors; MissingDependencyError when the data package is not installed.
    """
    if is_csv_id(name):
        return load_csv(name, **kwargs)
    key = str(name).strip().lower().replace("_", "-")
    if key not in DATASETS:
        close = difflib.get_close_matches(key, list(DATASETS), n=1, cutoff=0.5)
        suggestion = f"did you mean '{close[0]}'? " if close else ""
        known = ", ".join(sorted(DATASETS))
        raise DataError(f"unknown data set '{name}': {suggestion}known data sets: {known}, "
                        "or csv:PATH for a CSV file with text,label columns")
    return DATASETS[key](**kwargs)
