"""Artifacts: stage folders, manifests with hashes, atomic writes, a lock per artifacts folder.

Layout: ``artifacts/<recipe name>/<stage>/`` holds the stage's files and a ``manifest.json``
(the stage's cache key, input hashes, every output file's sha256, package versions, seed,
timings). A stage is complete only when its manifest exists and every hash matches; the manifest
is written last, so an interrupted stage is simply incomplete and reruns.

Writes are atomic: temporary file in the same folder, flush + fsync, ``os.replace``. A stage
builds its outputs in ``<stage>.tmp-<pid>/`` and swaps the folder in when done, so a killed
stage leaves the previous complete output in place.

Under torch.distributed only rank 0 takes the lock and publishes; the other ranks build into a
private :func:`scratch_folder` outside the artifacts, which is discarded (see
:mod:`toolchain.pipeline`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
import shutil
import tempfile
import time
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path
from typing import Any

from toolchain.errors import ArtifactError

MANIFEST = "manifest.json"
LOCK = ".lock"


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    """Hex sha256 of a file's bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def atomic_write_bytes(path: Path, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically (tmp in the same folder, fsync, rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    return path


def atomic_write_text(path: Path, text: str) -> Path:
    """Atomic UTF-8 text write."""
    return atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: Path, obj: Any) -> Path:
    """Atomic JSON write (sorted keys, indented)."""
    return atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")


@contextlib.contextmanager
def atomic_folder(path: Path) -> Iterator[Path]:
    """Yield a temporary sibling folder; on success swap it in for ``path`` (else delete it)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    try:
        yield tmp
        if path.exists():
            old = path.with_name(f".{path.name}.old-{os.getpid()}")
            shutil.rmtree(old, ignore_errors=True)
            path.rename(old)
            tmp.rename(path)
            shutil.rmtree(old, ignore_errors=True)
        else:
            tmp.rename(path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


@contextlib.contextmanager
def scratch_folder(stage: str, rank: int = 0) -> Iterator[Path]:
    """A private temporary folder outside the artifacts for a stage's throw-away outputs, deleted afterwards.

    The work folder of a non-main rank under torch.distributed: it runs the stage's code (its
    share of the collective work) but publishes nothing.
    """
    tmp = Path(tempfile.mkdtemp(prefix=f"hydra-{stage}-rank{rank}-"))
    try:
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def package_versions() -> dict[str, str]:
    """Versions of the packages whose behaviour the artifacts depend on."""
    out = {"python": platform.python_version()}
    for name in ("hydra-toolchain", "torch", "transformers", "onnx", "onnxruntime", "numpy", "scikit-learn"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            out[name] = metadata.version(name)
    return out


def file_hashes(folder: Path) -> dict[str, str]:
    """sha256 of every file under ``folder`` except the manifest (relative POSIX paths)."""
    out = {}
    for p in sorted(folder.rglob("*")):
        if p.is_file() and p.name != MANIFEST and not p.name.startswith("."):
            out[p.relative_to(folder).as_posix()] = sha256_file(p)
    return out


class StageDir:
    """Builds one stage's outputs in a temporary folder and publishes them atomically."""

    def __init__(self, root: Path, stage: str, key: str) -> None:
        self.root = Path(root)
        self.stage = stage
        self.key = key
        self.final = self.root / stage
        self.work = self.root / f".{stage}.tmp-{os.getpid()}"

    def is_complete(self) -> bool:
        """True when the published folder has a manifest with this key and intact files."""
        manifest = read_manifest(self.final)
        if manifest is None or manifest.get("key") != self.key:
            return False
        return not verify_folder(self.final, manifest)

    def begin(self) -> Path:
        """Create (empty) the temporary work folder and return it."""
        shutil.rmtree(self.work, ignore_errors=True)
        self.work.mkdir(parents=True)
        return self.work

    def publish(self, info: dict[str, Any]) -> Path:
        """Write the manifest into the work folder, then swap it in for the old output."""
        manifest = {
            "stage": self.stage,
            "key": self.key,
            "files": file_hashes(self.work),
            "versions": package_versions(),
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            **info,
        }
        atomic_write_json(self.work / MANIFEST, manifest)
        old = self.root / f".{self.stage}.old-{os.getpid()}"
        if self.final.exists():
            self.final.rename(old)
        self.work.rename(self.final)
        shutil.rmtree(old, ignore_errors=True)
        return self.final

    def abort(self) -> None:
        """Drop the work folder (the previous output stays)."""
        shutil.rmtree(self.work, ignore_errors=True)


def read_manifest(folder: Path) -> dict[str, Any] | None:
    """The folder's manifest, or ``None`` when absent or unreadable."""
    path = Path(folder) / MANIFEST
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None


def verify_folder(folder: Path, manifest: dict[str, Any] | None = None) -> list[str]:
    """Problems of one stage folder: missing, changed and extra files (empty list = intact)."""
    manifest = manifest if manifest is not None else read_manifest(folder)
    if manifest is None:
        return [f"{folder}: no readable {MANIFEST}"]
    expected: dict[str, str] = manifest.get("files", {})
    actual = file_hashes(Path(folder))
    problems = []
    for name, digest in expected.items():
        if name not in actual:
            problems.append(f"{folder}/{name}: missing")
        elif actual[name] != digest:
            problems.append(f"{folder}/{name}: changed (sha256 differs from the manifest)")
    problems += [f"{folder}/{name}: extra (not in the manifest)" for name in actual if name not in expected]
    return problems


def verify_tree(root: Path) -> list[str]:
    """Verify every stage folder (a folder with a manifest) under ``root``."""
    root = Path(root)
    if not root.is_dir():
        raise ArtifactError(f"artifacts folder '{root}' does not exist.")
    problems = []
    stages = sorted(p.parent for p in root.rglob(MANIFEST) if not p.parent.name.startswith("."))
    if not stages:
        problems.append(f"{root}: no stage manifests found")
    for folder in stages:
        problems += verify_folder(folder)
    return problems


@contextlib.contextmanager
def locked(root: Path) -> Iterator[None]:
    """Hold ``<root>/.lock`` (O_EXCL) for the block; a live holder makes this raise ArtifactError."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    lock = root / LOCK
    for _ in range(2):
        try:
            fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            break
        except FileExistsError:
            holder = _lock_holder(lock)
            if holder is not None and _alive(holder):
                raise ArtifactError(
                    f"artifacts folder '{root}' is in use by process {holder} (lock file {lock}).",
                    hint="Wait for that run to finish, or use another artifacts_dir.",
                ) from None
            lock.unlink(missing_ok=True)  # stale lock of a dead process
    else:  # pragma: no cover - lost a race twice
        raise ArtifactError(f"could not take the lock {lock}; try again.")
    try:
        os.write(fd, str(os.getpid()).encode())
        os.close(fd)
        yield
    finally:
        lock.unlink(missing_ok=True)


def _lock_holder(lock: Path) -> int | None:
    try:
        return int(lock.read_text().strip() or "0") or None
    except (OSError, ValueError):
        return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
