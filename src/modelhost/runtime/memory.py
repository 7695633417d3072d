"""Resident memory of a process, measured (memory-based billing needs a real number)."""

from __future__ import annotations

import os

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def rss_bytes(pid: int | None) -> int:
    """RSS of `pid` from /proc (0 when the process is gone or /proc is unavailable)."""
    if pid is None:
        return 0
    try:
        with open(f"/proc/{pid}/statm", encoding="ascii") as handle:
            return int(handle.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return 0
