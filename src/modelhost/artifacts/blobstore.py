"""Blob storage behind a small interface: a local directory now, S3-compatible later.

Keys are `/`-separated. Writes are streamed through a `BlobWriter` that hashes as it goes and only
becomes visible at `commit()`, so a crash mid-write never leaves a half file under a real key. A write
into a full disk removes its partial file and raises `InsufficientStorage` (507) naming the store.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import secrets
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, NoReturn, Protocol

from modelhost.errors import InsufficientStorage, is_disk_full

log = logging.getLogger("modelhost.artifacts")

PARTIAL_DIR = ".modelhost-partial"
# what a write under each top-level prefix keeps, for the message of a full disk
KEPT_UNDER = {
    "staging": "uploaded file",
    "generated": "generated file",
    "videos": "video file",
    "files": "file",
    "batches": "batch file",
}


@dataclass(frozen=True, slots=True)
class BlobInfo:
    key: str
    size: int


class BlobWriter(Protocol):
    size: int

    def write(self, chunk: bytes) -> None: ...
    def hexdigest(self) -> str: ...
    def commit(self) -> None: ...
    def abort(self) -> None: ...


class BlobStore(Protocol):
    def writer(self, key: str) -> BlobWriter: ...
    def list(self, prefix: str) -> list[BlobInfo]: ...
    def exists(self, prefix: str) -> bool: ...
    def read_range(self, key: str, start: int, length: int) -> bytes: ...
    def open(self, key: str) -> BinaryIO: ...
    def move_prefix(self, source: str, target: str) -> None: ...
    def delete_prefix(self, prefix: str) -> None: ...
    def local_dir(self, prefix: str) -> Path: ...


class SpoolWriter:
    """Writes to a hidden temp file while hashing; only `commit` publishes it (`_publish`), so a crash
    mid-write never leaves a half file under a real key. Stores differ only in how they publish.

    A full disk (ENOSPC, EDQUOT) at any step removes the temp file and raises `InsufficientStorage`:
    nothing half-written is left behind, and the same write succeeds once space is freed."""

    store_name = "the blob store in the data directory"

    def __init__(self, temp: Path, key: str) -> None:
        self._temp = temp
        self._key = key
        try:
            temp.parent.mkdir(parents=True, exist_ok=True)
            self._file: BinaryIO = open(temp, "wb")  # noqa: SIM115 - closed in commit/abort
        except OSError as exc:
            self._failed(exc)
        self._hash = hashlib.sha256()
        self.size = 0

    def write(self, chunk: bytes) -> None:
        try:
            self._file.write(chunk)
        except OSError as exc:
            self._failed(exc)
        self._hash.update(chunk)
        self.size += len(chunk)

    def hexdigest(self) -> str:
        return self._hash.hexdigest()

    def commit(self) -> None:
        try:
            self._file.flush()
            os.fsync(self._file.fileno())
            self._file.close()
        except OSError as exc:
            self._failed(exc)
        try:
            self._publish(self._temp)
        finally:
            self._temp.unlink(missing_ok=True)

    def abort(self) -> None:
        with contextlib.suppress(OSError):  # a full disk fails the flush of `close`; the file still closes
            if hasattr(self, "_file"):
                self._file.close()
        self._temp.unlink(missing_ok=True)

    def _failed(self, exc: OSError) -> NoReturn:
        """Remove the partial file; a full disk becomes a 507 naming the store, anything else propagates."""
        self.abort()
        if not is_disk_full(exc):
            raise exc
        what = KEPT_UNDER.get(self._key.split("/", 1)[0], "file")
        log.warning("%s is full: writing %s failed (%s)", self.store_name, self._key, exc.strerror)
        raise InsufficientStorage(
            f"Insufficient storage: {self.store_name} is full, so the {what} was not kept. "
            "Nothing was half-written; retry once space has been freed."
        ) from exc

    def _publish(self, spooled: Path) -> None:
        raise NotImplementedError


class _LocalWriter(SpoolWriter):
    """The temp file sits beside the target; publishing is one rename."""

    def __init__(self, target: Path, temp: Path, key: str) -> None:
        super().__init__(temp, key)
        self._target = target

    def _publish(self, spooled: Path) -> None:
        self._target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(spooled, self._target)


class LocalBlobStore:
    """A directory tree. `move_prefix` is one `rename`, so publishing a folder is atomic."""

    def __init__(self, root: Path) -> None:
        self.root = root.resolve()
        self.root.mkdir(parents=True, exist_ok=True)

    def _path(self, key: str) -> Path:
        path = (self.root / key).resolve()
        if path != self.root and self.root not in path.parents:
            raise ValueError(f"blob key escapes the store: {key!r}")
        return path

    def writer(self, key: str) -> BlobWriter:
        target = self._path(key)
        top = key.split("/", 2)
        temp_root = self._path("/".join(top[:2])) if len(top) > 2 else target.parent
        return _LocalWriter(target, temp_root / PARTIAL_DIR / secrets.token_hex(8), key)

    def list(self, prefix: str) -> list[BlobInfo]:
        base = self._path(prefix)
        if not base.is_dir():
            return []
        found = []
        for dirpath, dirnames, filenames in os.walk(base):
            dirnames[:] = [d for d in dirnames if d != PARTIAL_DIR]
            for name in filenames:
                full = Path(dirpath) / name
                found.append(BlobInfo(key=full.relative_to(self.root).as_posix(), size=full.stat().st_size))
        return sorted(found, key=lambda b: b.key)

    def exists(self, prefix: str) -> bool:
        return self._path(prefix).exists()

    def read_range(self, key: str, start: int, length: int) -> bytes:
        with open(self._path(key), "rb") as handle:
            handle.seek(start)
            return handle.read(length)

    def open(self, key: str) -> BinaryIO:
        return open(self._path(key), "rb")

    def move_prefix(self, source: str, target: str) -> None:
        destination = self._path(target)
        destination.parent.mkdir(parents=True, exist_ok=True)
        os.replace(self._path(source), destination)

    def delete_prefix(self, prefix: str) -> None:
        path = self._path(prefix)
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)

    def local_dir(self, prefix: str) -> Path:
        return self._path(prefix)
