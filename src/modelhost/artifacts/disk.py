"""Free space on the data directory's disk, against the floor the operator keeps free.

The data directory holds the blob store (or its S3 spool and cache), generated files, video outputs
and the SQLite file: when its disk fills, every write fails. Uploads, by far the biggest writes, are
refused up front below the floor (`MODELHOST_MIN_FREE_DISK_MB`) so that the rest keeps its room;
/ready and the `modelhost_data_dir_free_bytes` gauge show it to the operator.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from modelhost.config import Settings
from modelhost.errors import InsufficientStorage
from modelhost.metrics import Gauge

MB = 1024 * 1024

DATA_DIR_FREE_BYTES = Gauge(
    "modelhost_data_dir_free_bytes",
    "Free bytes on the data directory's disk (blobs, generated files, the SQLite file), as last measured "
    "by a gateway (on every /ready and /metrics).",
    multiprocess_mode="livemostrecent",
)


@dataclass(frozen=True, slots=True)
class DiskSpace:
    free_bytes: int
    floor_bytes: int

    @property
    def low(self) -> bool:
        return self.free_bytes < self.floor_bytes


def data_dir_space(settings: Settings) -> DiskSpace:
    """Measure (and publish to the gauge) the free space where the data directory lives."""
    folder = _existing(settings.data_dir)
    free = shutil.disk_usage(folder).free
    DATA_DIR_FREE_BYTES.set(free)
    return DiskSpace(free_bytes=free, floor_bytes=settings.min_free_disk_mb * MB)


def require_room_for_upload(settings: Settings, declared_bytes: int | None) -> None:
    """Refuse an upload before reading its body when the disk is below the floor, or when the size the
    client declared (`Content-Length`) would take it there: better a clear 507 now than a disk filled
    for everyone and a 507 at the end of a long transfer."""
    space = data_dir_space(settings)
    after = space.free_bytes - (declared_bytes or 0)
    if after >= space.floor_bytes:
        return
    needs = f" and this file needs {_mb(declared_bytes)}" if declared_bytes else ""
    raise InsufficientStorage(
        f"Insufficient storage: the data directory has {_mb(space.free_bytes)} free{needs}; uploads must "
        f"leave {_mb(space.floor_bytes)} free (MODELHOST_MIN_FREE_DISK_MB). Retry once space has been freed."
    )


def _mb(size: int) -> str:
    return f"{size / MB:.1f} MB"


def _existing(folder: Path) -> Path:
    """The data directory, or its nearest existing parent (same disk) before it is first created."""
    folder = folder.resolve()
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    return folder
