"""Resident memory of a process, measured (memory-based billing and the replica memory limit need a real
number)."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterable
from pathlib import Path

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


def parents() -> dict[int, int]:
    """Every live process's parent, from /proc (empty where there is none). The kernel here need not
    offer `/proc/<pid>/task/<tid>/children`, so the whole table is read."""
    table: dict[int, int] = {}
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            # the command name may hold spaces and parentheses: the fields after its last ")" are fixed
            fields = entry.joinpath("stat").read_text().rsplit(")", 1)[1].split()
            table[int(entry.name)] = int(fields[1])
        except (OSError, ValueError, IndexError):
            continue  # ended while the table was read
    return table


def descendants(pid: int, table: dict[int, int]) -> list[int]:
    """`pid`'s children, their children, and so on, from a `parents()` table."""
    children: dict[int, list[int]] = {}
    for child, parent in table.items():
        children.setdefault(parent, []).append(child)
    found, todo = [], list(children.get(pid, []))
    while todo:
        child = todo.pop()
        found.append(child)
        todo.extend(children.get(child, []))
    return found


def tree_rss_bytes(pid: int | None, table: dict[int, int] | None = None) -> int:
    """RSS of `pid` and of every process it started (a model's helper processes count against its
    replica). Pages shared with the worker template count in each process that touched them, as RSS
    always counts them."""
    if pid is None:
        return 0
    return sum(rss_bytes(p) for p in _tree(pid, table))


def tree_memory_bytes(pid: int | None) -> int:
    """`tree_rss_bytes` plus the GPU memory the tree's processes hold (vLLM's weights and KV cache live
    in its worker processes' GPU memory, which RSS does not count)."""
    if pid is None:
        return 0
    tree = _tree(pid, None)
    return sum(rss_bytes(p) for p in tree) + gpu_memory_bytes(tree)


def _tree(pid: int, table: dict[int, int] | None) -> list[int]:
    return [pid, *descendants(pid, parents() if table is None else table)]


def gpu_memory_bytes(pids: Iterable[int]) -> int:
    """GPU memory the processes `pids` hold, from `nvidia-smi` (0 where there is none: no GPU, no driver
    tool, or it failed). vLLM allocates its weights and KV cache on the GPU from its worker processes,
    which RSS does not count."""
    tool = shutil.which("nvidia-smi")
    if tool is None:
        return 0
    try:
        listing = subprocess.run(
            [tool, "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return 0
    wanted, total = set(pids), 0
    for line in listing.splitlines():
        pid, _, used = line.partition(",")
        try:
            if int(pid) in wanted:
                total += int(float(used)) << 20  # MiB
        except ValueError:
            continue  # "[N/A]" and the like
    return total
