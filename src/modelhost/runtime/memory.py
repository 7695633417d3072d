"""Memory of processes, measured: what a replica adds to the machine (its footprint: capacity, billing and
the replica memory limit read it), and plain resident memory.

**The footprint measure.** A replica worker forked from the worker template shares most of its pages
with it (torch, transformers: about 300 MB), and maps the model's safetensors files rather than copying
them (transformers loads weights zero-copy from the mmap). RSS counts every shared page in every
process, so ten replicas would count ten copies of torch; PSS splits shared pages among their users, so a
replica's PSS moves whenever another replica starts or stops. What a replica adds is what it wrote and
what it maps of its own: per mapping in `/proc/<pid>/smaps`,
- anonymous memory (heap, stacks, tensors, pages copied from the template on write): its private pages;
- the model's own files (its folder's safetensors, mapped): their whole mapped size, once per replica
  (the same part of a file mapped twice, or by two of its processes, counts once), not only the pages
  read so far, since requests fault the rest in (measured right after a load, all-MiniLM-L6-v2's
  worker had touched 43 of its 90 MB of weights, and took the rest with its first requests). Replicas of one
  artifact share those pages, yet each counts them whole: a replica's footprint is what it holds
  alone, whoever runs beside it. A share (the proportion of the pages it shares, as PSS splits them)
  moved whenever a neighbour of the artifact started or stopped, and was stale in between: evicting
  one of two replicas of an artifact freed its share in the books but nothing of the weights in
  memory, and the other's share doubled without anyone measuring it (issue 49: two hot MiniLMs of one
  artifact held 85 and 76 of their 141 MiB, and a third was admitted in a budget for two);
- another data file (an export, shared memory between the processes of a vLLM replica): its
  proportional share of the pages resident (PSS), so that replicas mapping one file count it once;
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
_MAPPING = re.compile(rb"^[0-9a-f]+-[0-9a-f]+ \S+ ([0-9a-f]+) \S+ (\d+) *(.*)$")
# A part of a model file: its path and the offset its mapping starts at
FilePart = tuple[bytes, bytes]


def footprint_bytes(pid: int | None, model_dir: Path | None = None) -> int:
    """What `pid` adds to the machine's memory (the module docstring says what is counted and why); the
    files below `model_dir` are the model's own. 0 when it is gone or `/proc` cannot tell."""
    return tree_footprint_bytes(pid, {}, model_dir)


def _smaps(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/smaps", "rb") as handle:
            return handle.read()
    except OSError:
        return b""


def _model_prefix(model_dir: Path | None) -> bytes | None:
    return os.fsencode(os.path.realpath(model_dir)) + b"/" if model_dir else None


def _footprint_of(smaps: bytes, model_prefix: bytes | None = None) -> int:
    """The footprint from the text of `/proc/<pid>/smaps` (its figures are kB), in bytes; mappings of
    files whose path starts with `model_prefix` are the model's own."""
    counted, model_files = _parts(smaps, model_prefix)
    return (counted + sum(model_files.values())) * 1024


def _parts(smaps: bytes, model_prefix: bytes | None) -> tuple[int, dict[FilePart, int]]:
    """What one process's mappings count, in kB: everything but the model's own files, and the mapped
    size of each part of those files (a part mapped twice, or by two processes of the replica, counts
    once)."""
    total_kb, model_files = 0, dict[FilePart, int]()
    kind, part, figures = "anonymous", (b"", b""), dict[bytes, int]()
    for line in [*smaps.splitlines(), b"00000000-00000000 ---p 00000000 00:00 0"]:  # a last header ends
        name, _, rest = line.partition(b" ")
        if name.endswith(b":"):
            if name in _FIGURES:
                figures[name] = int(rest.split()[0])
            continue
        header = _MAPPING.match(line)
        if header is None:
            continue
        if kind == "model":  # the mapping before this one
            model_files[part] = max(model_files.get(part, 0), figures.get(b"Size:", 0))
        else:
            total_kb += _counted(kind, figures)
        path = header.group(3).strip()
        part = (path, header.group(1))
        kind = _kind(int(header.group(2)), path.decode(errors="replace"))
        if kind == "data" and model_prefix is not None and path.startswith(model_prefix):
            kind = "model"
        figures = {}
    return total_kb, model_files


_FIGURES = frozenset({b"Size:", b"Pss:", b"Private_Clean:", b"Private_Dirty:", b"SwapPss:"})


def _counted(kind: str, figures: dict[bytes, int]) -> int:
    """What one mapping other than the model's files counts, in kB (see the module docstring)."""
    swapped = figures.get(b"SwapPss:", 0)
    if kind == "anonymous":
        return figures.get(b"Private_Clean:", 0) + figures.get(b"Private_Dirty:", 0) + swapped
    if kind == "library":
        return figures.get(b"Private_Dirty:", 0) + swapped
    return figures.get(b"Pss:", 0) + swapped


def _kind(inode: int, path: str) -> str:
    """`anonymous` (heap, stacks, anonymous mappings), `library` (code every process maps) or `data` (a
    file or shared memory: exports, buffers between a replica's processes, the model's own files)."""
    if path.startswith("/dev/shm/") or path.startswith("/memfd:") or path.startswith("/SYSV"):
        return "data"
    if inode == 0:
        return "anonymous"  # [heap], [stack], [anon:...] and unnamed mappings
    return "library" if _LIBRARY.search(path.removesuffix(" (deleted)")) else "data"


def tree_footprint_bytes(
    pid: int | None, table: dict[int, int] | None = None, model_dir: Path | None = None
) -> int:
    """`footprint_bytes` of `pid` and of every process it started (vLLM's engine processes, a model's
    helpers), `model_dir` holding the model's own files (each counted once for the whole tree). GPU
    memory is not in it: `gpu_memory_bytes` measures that."""
    if pid is None:
        return 0
    prefix, total_kb, model_files = _model_prefix(model_dir), 0, dict[FilePart, int]()
    for process in tree(pid, table):
        counted, files = _parts(_smaps(process), prefix)
        total_kb += counted
        for part, size in files.items():
            model_files[part] = max(model_files.get(part, 0), size)
    return (total_kb + sum(model_files.values())) * 1024


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
