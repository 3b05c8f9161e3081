"""Small file helpers shared by export and engine building: atomic writes and content hashes.

An artifact is either complete or absent: every writer here writes into a temporary file in the
destination folder (same filesystem) and renames it into place with :func:`os.replace`.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any


def _umask() -> int:
    current = os.umask(0)
    os.umask(current)
    return current


def publish(src: Path, dst: Path) -> Path:
    """Move a finished file from a temporary folder onto ``dst`` atomically, with the usual mode."""
    os.chmod(src, 0o666 & ~_umask())
    os.replace(src, dst)
    return Path(dst)


def atomic_write_bytes(path: Path, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically (temp file in the same folder, then rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp creates 0600; give the usual file mode
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def atomic_write_json(path: Path, payload: Any) -> Path:
    """Write ``payload`` as indented, key-sorted JSON to ``path`` atomically."""
    text = json.dumps(payload, indent=2, sort_keys=True) + "\n"
    return atomic_write_bytes(path, text.encode("utf-8"))


def sha256_file(path: Path, chunk_bytes: int = 1 << 20) -> str:
    """Hex sha256 of a file's bytes, read in chunks (works for multi-GB weights files)."""
    digest = hashlib.sha256()
    with Path(path).open("rb") as fh:
        while chunk := fh.read(chunk_bytes):
            digest.update(chunk)
    return digest.hexdigest()
