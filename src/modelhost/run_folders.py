"""A server's private folders under the temporary directory, and what is left of servers that died.

A server keeps its run folder (control socket, metrics, rate-limit table: `modelhost.server`) and its
replicas' sockets (`runtime.supervisor.local`) in folders it makes under the temporary directory and removes
when it stops. A server killed outright (SIGKILL, the kernel's OOM killer, a power cut) never gets to: its
folders stay, and the metrics files in them grow with every process it ran. So each folder names the
process that owns it (a `pid` file), and a server that starts removes the folders whose owner is gone.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from pathlib import Path

log = logging.getLogger("modelhost.server")
PREFIX = "modelhost-"
OWNER = "pid"


def new_folder(kind: str = "") -> Path:
    """A private folder (mode 0700) of this process, `modelhost-<kind>-…` (short: Unix socket paths
    in it have at most 107 bytes), with this process named as its owner."""
    folder = Path(tempfile.mkdtemp(prefix=f"{PREFIX}{kind}-" if kind else PREFIX))
    (folder / OWNER).write_text(str(os.getpid()))
    return folder


def remove_orphans(root: Path | None = None) -> int:
    """Remove the folders of `new_folder` under `root` (the temporary directory) whose owner is no
    longer running; how many went. A folder without an owner's name (made by an older version) or of
    another user is left alone."""
    removed = 0
    for folder in (root or Path(tempfile.gettempdir())).glob(f"{PREFIX}*"):
        owner = _owner(folder)
        if owner is not None and not _running(owner):
            shutil.rmtree(folder, ignore_errors=True)
            removed += 1
    if removed:
        log.info("removed %d folders left by servers that were killed", removed)
    return removed


def _owner(folder: Path) -> int | None:
    try:
        if folder.lstat().st_uid != os.getuid() or not folder.is_dir():
            return None
        return int((folder / OWNER).read_text())
    except (OSError, ValueError):
        return None


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process holds the number now
        return True
    return True
