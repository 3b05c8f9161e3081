"""Artifacts: stage folders, manifests with hashes, atomic writes, a lock per artifacts folder.

Layout: ``artifacts/<recipe name>/<stage>/`` holds the stage's files and a ``manifest.json``
(the stage's cache key, input hashes, every output file's sha256, package versions, seed,
timings). A stage is complete only when its manifest exists and every hash matches; the manifest
is written last, so an interrupted stage is simply incomplete and reruns.

Writes are atomic: temporary file in the same folder, flush + fsync, ``os.replace``. A stage
builds its outputs in ``.<stage>.tmp-<pid>/`` and swaps the folder in when done, so a killed
stage leaves the previous complete output in place. What a killed run leaves behind (those
``.tmp-<pid>`` / ``.old-<pid>`` folders) is reported by :func:`verify_tree` and removed by the next
run once it holds the lock (:func:`remove_stale_temporaries`).

Publishing a stage records it, with its cache key, in ``<root>/pipeline.json``
(:func:`record_stage`), so :func:`verify_tree` also notices a stage folder
or a manifest that was deleted.

The lock (:func:`locked`) is an operating-system file lock (``filelock``: ``flock`` on POSIX),
held by the open file, so the kernel releases it when the holder exits in any way (kill -9, an
OOM kill): a lock is never stale. On a shared file system the lock is as good as the file
system's lock support (NFSv4 and Lustre/GPFS with locking enabled propagate it between machines);
where ``flock`` is unavailable, filelock falls back to a lock file whose existence is the lock, and
a run that dies leaves it behind: the error names the file to delete once its holder is gone.

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
import re
import shutil
import socket
import tempfile
import time
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path
from typing import Any

from toolchain.errors import ArtifactError

MANIFEST = "manifest.json"
LOCK = ".lock"
#: who holds the lock (pid, host, start time), for the message a second run gets
LOCK_HOLDER = ".lock.holder"
#: the stages a run ran or found up to date, with their keys (read by :func:`verify_tree`)
RUN_INDEX = "pipeline.json"
#: content hashes of model folders, reused while a file's size and mtime are unchanged
DIGEST_CACHE = ".source-digests.json"
#: temporary entries of a writer: ``.<name>.tmp-<pid>...`` and ``.<name>.old-<pid>``
_TEMP = re.compile(r"^\..+\.(tmp|old)-\d+")


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    """Hex sha256 of a file's bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


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
    """Write ``data`` to ``path`` atomically (a unique temporary file in the same folder, fsync, rename).

    The temporary name ``.<name>.tmp-<pid>-<random>`` is one that :func:`stale_temporaries` recognises
    if the writer is killed.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.tmp-{os.getpid()}-")
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
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp-{os.getpid()}-", dir=path.parent))
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
        record_stage(self.root, self.stage, self.key, self.final)
        return self.final

    def abort(self) -> None:
        """Drop the work folder (the previous output stays)."""
        shutil.rmtree(self.work, ignore_errors=True)


def read_json(path: Path) -> Any:
    """Parse a JSON file."""
    return json.loads(Path(path).read_text())


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


def record_stage(root: Path, stage: str, key: str, folder: Path) -> None:
    """Add ``stage`` (its key and folder, relative to ``root``) to the run index ``<root>/pipeline.json``."""
    root = Path(root)
    index = read_run_index(root) or {"stages": {}}
    index["stages"][stage] = {"key": key, "folder": os.path.relpath(folder, root)}
    atomic_write_json(root / RUN_INDEX, index)


def read_run_index(root: Path) -> dict[str, Any] | None:
    """The run index of ``root``, or ``None`` when absent or unreadable."""
    try:
        index = json.loads((Path(root) / RUN_INDEX).read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return index if isinstance(index, dict) and isinstance(index.get("stages"), dict) else None


def stale_temporaries(root: Path, recursive: bool = True) -> list[Path]:
    """Temporary files and folders a writer leaves when it is killed (``.<name>.tmp-<pid>``, ``.old-<pid>``)."""
    root = Path(root)
    if not root.is_dir():
        return []
    found: list[Path] = []
    entries = root.rglob(".*") if recursive else root.glob(".*")
    for p in sorted(entries):
        if _TEMP.match(p.name) and not any(_TEMP.match(part) for part in p.relative_to(root).parts[:-1]):
            found.append(p)
    return found


def remove_stale_temporaries(root: Path) -> tuple[list[str], int]:
    """Delete the temporaries directly in ``root`` (call with the lock held); returns (names, bytes freed)."""
    names, freed = [], 0
    for p in stale_temporaries(root, recursive=False):
        freed += _size(p)
        if p.is_dir():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)
        names.append(p.name)
    return names, freed


def _size(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(q.stat().st_size for q in path.rglob("*") if q.is_file())


def verify_tree(root: Path) -> list[str]:
    """Problems under ``root``: every stage folder's files, the stages each run index expects, leftovers.

    A run root (a folder with ``pipeline.json``) must hold every stage it lists, with a manifest of
    the listed key and intact files; a stage folder whose root has no index is reported (a deleted
    ``pipeline.json``); temporary files of a killed run are reported until the next run removes them.
    """
    root = Path(root)
    if not root.is_dir():
        raise ArtifactError(f"artifacts folder '{root}' does not exist.")
    problems = []
    hidden = [p for p in root.rglob("*") if any(part.startswith(".") for part in p.relative_to(root).parts)]
    hidden_set = set(hidden)
    stages = sorted(p.parent for p in root.rglob(MANIFEST) if p not in hidden_set)
    indexed = sorted(p.parent for p in root.rglob(RUN_INDEX) if p not in hidden_set)
    if (root / RUN_INDEX).is_file() and root not in indexed:
        indexed.insert(0, root)
    if not stages and not indexed:
        problems.append(f"{root}: no stage manifests found")
    listed: set[Path] = set()
    for run_root in indexed:
        index = read_run_index(run_root)
        if index is None:
            problems.append(f"{run_root / RUN_INDEX}: unreadable run index")
            continue
        for name, entry in sorted(index["stages"].items()):
            folder = (run_root / entry.get("folder", name)).resolve()
            listed.add(folder)
            manifest = read_manifest(folder)
            if not folder.is_dir():
                problems.append(f"{folder}: stage '{name}' is missing (listed in {run_root / RUN_INDEX})")
            elif manifest is None:
                problems.append(f"{folder}/{MANIFEST}: missing or unreadable (stage '{name}')")
            elif manifest.get("key") != entry.get("key"):
                problems.append(f"{folder}: stage '{name}' has key {manifest.get('key')}, the run index says "
                                f"{entry.get('key')}")
            else:
                problems += verify_folder(folder, manifest)
    for folder in stages:
        if folder.resolve() in listed:
            continue
        if not (folder.parent / RUN_INDEX).is_file():
            problems.append(f"{folder}: its run folder has no {RUN_INDEX}, so deleted stages cannot be detected "
                            "(rerun the recipe to write it)")
        problems += verify_folder(folder)
    problems += [f"{p}: left over from an interrupted run (the next run removes it)"
                 for p in stale_temporaries(root)]
    return problems


@contextlib.contextmanager
def locked(root: Path) -> Iterator[None]:
    """Hold the artifacts folder's lock for the block; another holder makes this raise ArtifactError at once.

    See the module docstring for the rule: an OS lock released by the kernel when its holder exits.
    """
    from filelock import FileLock, Timeout

    root = Path(root)
    created = next((p for p in reversed([root, *root.parents]) if not p.exists()), None)
    root.mkdir(parents=True, exist_ok=True)
    lock = FileLock(root / LOCK, timeout=0)
    try:
        lock.acquire()
    except Timeout:
        holder = _read_holder(root)
        who = (f"process {holder.get('pid')} on host {holder.get('host')} (since {holder.get('since')})"
               if holder else "another process")
        raise ArtifactError(
            f"artifacts folder '{root}' is in use by {who}: lock file {root / LOCK}.",
            hint="Wait for that run to finish, or use another artifacts_dir. The lock is released when its holder "
            "exits, even after kill -9; only on a file system without file locks can it outlive its holder: then "
            f"delete {root / LOCK} once that process is gone.",
        ) from None
    try:
        atomic_write_json(root / LOCK_HOLDER, {"pid": os.getpid(), "host": socket.gethostname(),
                                                "since": time.strftime("%Y-%m-%dT%H:%M:%S%z")})
        yield
    finally:
        (root / LOCK_HOLDER).unlink(missing_ok=True)
        unused = created is not None and not (root / RUN_INDEX).exists()
        if unused:  # a first run that published nothing leaves no folder behind
            for p in root.iterdir():
                if p.name != LOCK:
                    shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)
        lock.release()
        if unused:
            (root / LOCK).unlink(missing_ok=True)
            for folder in [root, *root.parents]:
                with contextlib.suppress(OSError):
                    folder.rmdir()  # only empty folders go; another run's files stop it
                if folder == created:
                    break


def _read_holder(root: Path) -> dict[str, Any] | None:
    try:
        holder = json.loads((root / LOCK_HOLDER).read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return holder if isinstance(holder, dict) else None


def folder_digest(folder: Path, cache: dict[str, Any] | None = None) -> str:
    """Content hash of every file under ``folder`` (names and bytes; hidden entries and caches skipped).

    A multi-GB checkpoint is read once: ``cache`` maps a file's absolute path to ``[size, mtime_ns,
    sha256]`` and is reused while size and mtime are unchanged (new entries are added to it), so a
    later key costs a ``stat`` per file. The pipeline keeps it in ``<root>/.source-digests.json``
    (:func:`read_digest_cache`, :func:`write_digest_cache`). A file rewritten with the same size
    within the file system's mtime resolution would be missed: touch it (or delete the cache file).
    """
    folder = Path(folder).resolve()
    cache = {} if cache is None else cache
    h = hashlib.sha256()
    for p in sorted(folder.rglob("*")):
        rel = p.relative_to(folder)
        if not p.is_file() or any(part.startswith(".") or part == "__pycache__" for part in rel.parts):
            continue
        st = p.stat()
        stamp = [st.st_size, st.st_mtime_ns]
        entry = cache.get(str(p))
        if isinstance(entry, list) and entry[:2] == stamp:
            digest = entry[2]
        else:
            digest = sha256_file(p)
            cache[str(p)] = [*stamp, digest]
        h.update(f"{rel.as_posix()}\0{digest}\n".encode())
    return h.hexdigest()


def read_digest_cache(root: Path) -> dict[str, Any]:
    """The file-digest cache of an artifacts folder (empty when absent or unreadable)."""
    try:
        cache = json.loads((Path(root) / DIGEST_CACHE).read_text())
    except (OSError, json.JSONDecodeError):
        return {}
    return cache if isinstance(cache, dict) else {}


def write_digest_cache(root: Path, cache: dict[str, Any]) -> None:
    """Keep the digest cache beside the artifacts (written with a stage, never by a failed run)."""
    if cache and cache != read_digest_cache(root):
        atomic_write_json(Path(root) / DIGEST_CACHE, cache)
