"""Memory of processes, measured: what a replica adds to the machine (its footprint: capacity, billing and
the replica memory limit read it), and plain resident memory.

**The footprint measure.** A replica worker forked from the worker template shares most of its pages
with it (torch, transformers: about 300 MB), and maps the model's safetensors files rather than copying
them (transformers loads weights zero-copy from the mmap). RSS counts every shared page in every
process, so ten replicas would count ten copies of torch; PSS splits shared pages among their users, so a
replica's PSS moves whenever another replica starts or stops. What a replica adds is what it wrote and
what it maps of its own: per mapping in `/proc/<pid>/smaps`,
- anonymous memory (heap, stacks, tensors, pages copied from the template on write): its private pages;
- a data file (the model's weights, an ONNX export, shared memory between the processes of a vLLM
  replica): its proportional share, so that two replicas of one artifact count its pages once between
  them;
- a shared library or the interpreter: only the pages it wrote (relocations); their code is shared by
  every process on the machine and is the server's own cost;
- plus its share of what is swapped out.
Summed over the replica's process tree. Measured here: a tiny model's worker 34 MB of 382 MB RSS,
whichever replicas run beside it.
"""

from __future__ import annotations

import os
import re
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


# A shared object (`libtorch_cpu.so`, `foo.cpython-311-x86_64-linux-gnu.so`, `libc.so.6`) or the
# interpreter: code every process maps.
_LIBRARY = re.compile(r"\.so(\.[\d.]+)?$|/python[\d.]*$")
# A mapping's header line in smaps: address range, permissions, offset, device, inode, then the path
_MAPPING = re.compile(rb"^[0-9a-f]+-[0-9a-f]+ \S+ \S+ \S+ (\d+) *(.*)$")


def footprint_bytes(pid: int | None) -> int:
    """What `pid` adds to the machine's memory (the module docstring says what is counted and why); 0
    when it is gone or `/proc` cannot tell."""
    if pid is None:
        return 0
    try:
        with open(f"/proc/{pid}/smaps", "rb") as handle:
            text = handle.read()
    except OSError:
        return 0
    return _footprint_of(text)


def _footprint_of(smaps: bytes) -> int:
    """The footprint from the text of `/proc/<pid>/smaps` (its figures are kB), in bytes."""
    total_kb, kind = 0, "anonymous"
    for line in smaps.splitlines():
        name, _, rest = line.partition(b" ")
        if not name.endswith(b":"):  # a mapping's header: its figures follow
            header = _MAPPING.match(line)
            if header is not None:
                kind = _kind(int(header.group(1)), header.group(2).decode(errors="replace").strip())
            continue
        counted = _COUNTED.get(name)
        if counted is not None and kind in counted:
            total_kb += int(rest.split()[0])
    return total_kb * 1024


# Which figure of a mapping counts, by the mapping's kind (see the module docstring).
_COUNTED = {
    b"Private_Clean:": ("anonymous",),
    b"Private_Dirty:": ("anonymous", "library"),
    b"Pss:": ("data",),
    b"SwapPss:": ("anonymous", "library", "data"),
}


def _kind(inode: int, path: str) -> str:
    """`anonymous` (heap, stacks, anonymous mappings), `library` (code every process maps) or `data` (a
    file or shared memory: model weights, exports, buffers between a replica's processes)."""
    if path.startswith("/dev/shm/") or path.startswith("/memfd:") or path.startswith("/SYSV"):
        return "data"
    if inode == 0:
        return "anonymous"  # [heap], [stack], [anon:...] and unnamed mappings
    return "library" if _LIBRARY.search(path.removesuffix(" (deleted)")) else "data"


def tree_footprint_bytes(pid: int | None, table: dict[int, int] | None = None) -> int:
    """`footprint_bytes` of `pid` and of every process it started (vLLM's engine processes, a model's
    helpers). GPU memory is not in it: `gpu_memory_bytes` measures that."""
    if pid is None:
        return 0
    return sum(footprint_bytes(p) for p in tree(pid, table))


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


def tree(pid: int, table: dict[int, int] | None = None) -> list[int]:
    """`pid` and its descendants."""
    return [pid, *descendants(pid, parents() if table is None else table)]


def _nvidia_smi(query: str) -> str:
    """`nvidia-smi`'s CSV answer to `query` (empty: no GPU, no driver tool, or it failed)."""
    tool = shutil.which("nvidia-smi")
    if tool is None:
        return ""
    try:
        return subprocess.run(
            [tool, query, "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


def gpu_memory_bytes(pids: Iterable[int]) -> int:
    """GPU memory the processes `pids` hold, from `nvidia-smi` (0 where there is none). vLLM and torch
    allocate weights and KV caches on the GPU, which no figure of /proc counts."""
    wanted, total = set(pids), 0
    for line in _nvidia_smi("--query-compute-apps=pid,used_memory").splitlines():
        pid, _, used = line.partition(",")
        try:
            if int(pid) in wanted:
                total += int(float(used)) << 20  # MiB
        except ValueError:
            continue  # "[N/A]" and the like
    return total


def gpu_totals() -> list[int]:
    """Each visible GPU's memory in bytes, by index, from `nvidia-smi` (empty: no GPU, or no driver tool)."""
    totals = []
    for line in _nvidia_smi("--query-gpu=memory.total").splitlines():
        try:
            totals.append(int(float(line.strip())) << 20)  # MiB
        except ValueError:
            continue
    return totals
