"""Blob storage behind a small interface: a local directory now, S3-compatible later.

Keys are `/`-separated. Writes are streamed through a `BlobWriter` that hashes as it goes and only
becomes visible at `commit()`, so a crash mid-write never leaves a half file under a real key.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Protocol

PARTIAL_DIR = ".modelhost-partial"


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
    mid-write never leaves a half file under a real key. Stores differ only in how they publish."""

    def __init__(self, temp: Path) -> None:
        self._temp = temp
        temp.parent.mkdir(parents=True, exist_ok=True)
        self._file: BinaryIO = open(temp, "wb")  # noqa: SIM115 - closed in commit/abort
        self._hash = hashlib.sha256()
        self.size = 0

    def write(self, chunk: bytes) -> None:
        self._file.write(chunk)
        self._hash.update(chunk)
        self.size += len(chunk)

    def hexdigest(self) -> str:
        return self._hash.hexdigest()

    def commit(self) -> None:
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        try:
            self._publish(self._temp)
        finally:
            self._temp.unlink(missing_ok=True)

    def abort(self) -> None:
        self._file.close()
        self._temp.unlink(missing_ok=True)

    def _publish(self, spooled: Path) -> None:
        raise NotImplementedError


class _LocalWriter(SpoolWriter):
    """The temp file sits beside the target; publishing is one rename."""

    def __init__(self, target: Path, temp: Path) -> None:
        super().__init__(temp)
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
        return _LocalWriter(target, temp_root / PARTIAL_DIR / secrets.token_hex(8))

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
