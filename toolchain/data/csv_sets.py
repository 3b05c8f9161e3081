"""A user's own text data set: a local CSV file named in a recipe as ``data.id: csv:PATH``.

Format: UTF-8 (a byte-order mark is fine), a header line naming the columns ``text`` and
``label`` (case and surrounding spaces ignored, other columns ignored), one example per row.
Labels are strings (``positive``) or integers (``0``, ``1``...). Class names are the distinct
labels, sorted (numerically when every label is an integer), and label ``i`` of the container is
``class_names[i]``; so ``0, 1, 2`` keep their meaning and ``neg, pos`` become classes 0 and 1.

Blank lines are skipped; a row with an empty text or label is an error naming its line. Exact
duplicate texts follow the packaged sets' policy (:func:`~toolchain.data.text_sets.drop_duplicate_texts`):
one copy is kept when all copies agree on the label, every copy is dropped when they conflict.

Relative paths: :func:`resolve_csv_id` makes a relative ``csv:`` path absolute against a base
folder (the CLI passes the recipe file's folder); :func:`load_csv` resolves what is still
relative against the current directory. :func:`source_digest` hashes the file's bytes, for
cache keys that must change when the file does.
"""

from __future__ import annotations

import csv
import functools
import io
from pathlib import Path

import numpy as np

from toolchain.data.containers import TextData
from toolchain.data.text_sets import drop_duplicate_texts
from toolchain.errors import DataError

__all__ = ["CSV_PREFIX", "is_csv_id", "load_csv", "resolve_csv_id", "source_digest"]

#: ``data.id`` / ``data.ood`` prefix of a local CSV file.
CSV_PREFIX = "csv:"
_COLUMNS = ("text", "label")
_HOW = "The file needs a header line with the columns text,label and one example per row."
#: Largest field the reader accepts: csv's default (128 KiB) rejects a long document with "field
#: larger than field limit"; 2**31 - 1 is the largest value every platform's C long holds.
FIELD_LIMIT = 2**31 - 1


def is_csv_id(name: object) -> bool:
    """True for a ``csv:PATH`` data set id."""
    return isinstance(name, str) and name.strip().lower().startswith(CSV_PREFIX)


def _path_of(name: str) -> str:
    return name.strip()[len(CSV_PREFIX):].strip()


def resolve_csv_id(name: str, base: str | Path) -> str:
    """``csv:rel/x.csv`` -> ``csv:<base>/rel/x.csv`` (absolute ids and other ids are returned unchanged)."""
    if not is_csv_id(name):
        return name
    raw = _path_of(name)
    path = Path(raw).expanduser()
    if not raw or path.is_absolute():
        return f"{CSV_PREFIX}{path}" if raw else name
    return f"{CSV_PREFIX}{(Path(base) / path).resolve()}"


def _file(name: str) -> Path:
    raw = _path_of(name)
    if not raw:
        raise DataError(f"data set '{name}': no file after 'csv:'; write data.id: csv:PATH/TO/FILE.csv. {_HOW}")
    path = Path(raw).expanduser()
    path = path if path.is_absolute() else Path.cwd() / path
    if not path.exists():
        raise DataError(
            f"data set '{name}': the file {path} does not exist. Check the path (a relative path is resolved "
            f"against the recipe file's folder). {_HOW}"
        )
    if not path.is_file():
        raise DataError(f"data set '{name}': {path} is not a file. Point data.id at a CSV file. {_HOW}")
    return path


def source_digest(name: str) -> str | None:
    """SHA-256 of a ``csv:`` data set's file (None for other ids): for cache keys."""
    if not is_csv_id(name):
        return None
    from toolchain.artifacts import sha256_file

    return sha256_file(_file(name))


def _sort_classes(values: set[str]) -> list[str]:
    try:
        return sorted(values, key=int)
    except ValueError:
        return sorted(values)


def _check_label_spellings(path: str, labels: list[str], classes: list[str]) -> None:
    """Labels that are one number spelled two ways (``1`` and ``1.0``) would silently become two classes."""
    by_value: dict[float, list[str]] = {}
    for c in classes:
        try:
            by_value.setdefault(float(c), []).append(c)
        except ValueError:
            continue
    clash = next((sorted(v) for v in by_value.values() if len(v) > 1), None)
    if clash:
        counts = ", ".join(f"'{c}' ({labels.count(c)} rows)" for c in clash)
        raise DataError(
            f"CSV data set {path}: the labels {counts} are one number spelled differently, so they would be "
            f"{len(clash)} separate classes ({len(classes)} in all: {', '.join(classes)}).",
            hint="Write each label one way in the label column (e.g. 1, not 1.0).",
        )


@functools.lru_cache(maxsize=4)
def _parse(path: str, _size: int, _mtime_ns: int) -> tuple[tuple[str, ...], tuple[str, ...], int]:
    """Texts, raw label strings and the number of duplicate rows dropped."""
    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        raise DataError(f"cannot read the CSV data set {path}: {exc.strerror or exc}.") from exc
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise DataError(f"CSV data set {path} is not UTF-8 text (line {line}, byte {exc.start}); "
                        "save it as UTF-8 and run again.") from exc
    if not text.strip():
        raise DataError(f"CSV data set {path} is empty. {_HOW}")
    if csv.field_size_limit() < FIELD_LIMIT:
        csv.field_size_limit(FIELD_LIMIT)  # process-wide; only ever raised
    rows = csv.reader(io.StringIO(text, newline=""))
    try:
        header = next(rows)
        names = [h.strip().lower() for h in header]
        missing = [c for c in _COLUMNS if c not in names]
        if missing:
            raise DataError(
                f"CSV data set {path} has no column {' or '.join(repr(m) for m in missing)} in its header "
                f"(found {header}). {_HOW}"
            )
        col = {c: names.index(c) for c in _COLUMNS}
        width = max(col.values()) + 1
        texts: list[str] = []
        labels: list[str] = []
        for row in rows:
            if not any(cell.strip() for cell in row):
                continue  # blank line
            if len(row) < width:
                raise DataError(f"CSV data set {path}, line {rows.line_num}: {len(row)} field(s), but the header "
                                f"has {len(header)}; quote texts that contain commas.")
            item, label = row[col["text"]], row[col["label"]].strip()
            if not label:
                raise DataError(f"CSV data set {path}, line {rows.line_num}: the label is empty; "
                                "give every row a label.")
            if not item.strip():
                raise DataError(f"CSV data set {path}, line {rows.line_num}: the text is empty; "
                                "remove the row or fill in its text.")
            texts.append(item)
            labels.append(label)
    except csv.Error as exc:
        raise DataError(f"CSV data set {path}, line {rows.line_num}: {exc}.") from exc
    if not texts:
        raise DataError(f"CSV data set {path} has a header but no rows. {_HOW}")
    classes = _sort_classes(set(labels))
    _check_label_spellings(path, labels, classes)
    index = {c: i for i, c in enumerate(classes)}
    kept, kept_labels = drop_duplicate_texts(texts, [index[lab] for lab in labels])
    return tuple(kept), tuple(classes[i] for i in kept_labels), len(texts) - len(kept)


def load_csv(name: str, *, min_classes: int = 2) -> TextData:
    """Load ``csv:PATH`` (see the module docstring) as :class:`TextData` named ``csv:<file name>``.

    Args:
        name: ``csv:PATH``.
        min_classes: fewest distinct labels the file must hold (1 for an OOD set, whose labels are unused).

    Raises:
        DataError: the file is missing, empty, not UTF-8, lacks the ``text``/``label`` columns,
            has a malformed row, or holds fewer than ``min_classes`` classes.
    """
    path = _file(name)
    st = path.stat()
    texts, labels, dropped = _parse(str(path.resolve()), st.st_size, st.st_mtime_ns)
    classes = _sort_classes(set(labels))
    if len(classes) < min_classes:
        after = f" after dropping {dropped} duplicate row(s)" if dropped else ""
        raise DataError(
            f"data set '{name}' needs at least {min_classes} classes: found only '{classes[0]}' in {path} "
            f"({len(texts)} rows{after}).",
            hint="Add examples of the other classes to the label column (a classifier needs two or more).",
        )
    index = {c: i for i, c in enumerate(classes)}
    return TextData(list(texts), np.asarray([index[lab] for lab in labels], dtype=np.int64), classes,
                    f"{CSV_PREFIX}{path.name}")
