"""Capacity: the memory budget that a server's replicas share, what each deployment holds of it, and
which idle deployments make room for a load (docs/runtime.md, "Capacity").

Plain accounting, no processes and no event loop: the replica manager (`runtime.supervisor.manager`) reserves
a deployment's footprint here before its processes start, replaces the prediction by the measured
footprint once they run, keeps it reserved while they are being stopped, and releases it once they
have exited. Eviction chooses from a list of candidates the manager describes, weighing whose each one
is: an account's share of the budget is an equal part of it among the accounts that hold memory.

The budget: `MODELHOST_MEMORY_BUDGET_MB` of host memory, else 80 % of the smaller of the machine's
memory and the memory limit of the cgroup the server runs in, less what the server's own processes (its
gateways and the worker template) hold; per GPU, `MODELHOST_GPU_MEMORY_FRACTION` of its memory.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

MB = 1024 * 1024
# Of the machine's (or the cgroup's) memory, what replicas may take together by default; the rest is
# the kernel's, the page cache's and the server's own.
DEFAULT_BUDGET_SHARE = 0.8
# A cgroup v1 "no limit" is the largest page-aligned 64-bit number; anything above this is no limit.
_NO_LIMIT = 1 << 60


@dataclass(frozen=True, slots=True)
class Footprint:
    """Memory one deployment takes: host bytes, and bytes on the GPU it is placed on (0 on a CPU)."""

    host: int
    gpu: int = 0

    def __add__(self, other: Footprint) -> Footprint:
        return Footprint(self.host + other.host, self.gpu + other.gpu)

    def times(self, count: int) -> Footprint:
        return Footprint(self.host * count, self.gpu * count)


@dataclass(eq=False, slots=True)
class Holding:
    """One load's reservation: made before its processes start, measured once they run, given back once
    they have exited. A deployment loaded again while its old processes are still stopping holds two."""

    deployment_id: str
    account_id: str  # who pays for it: shares of the budget are per account
    footprint: Footprint
    gpu: int | None  # the GPU its memory is on; None: host memory only
    measured: bool = False
    unloading: bool = False
    number: int = field(default_factory=itertools.count(1).__next__)


@dataclass(frozen=True, slots=True)
class Candidate:
    """A loaded deployment as eviction sees it (the manager fills these in)."""

    deployment_id: str
    readiness: str
    idle: bool  # nothing in flight or queued, from any gateway process
    last_used: float  # monotonic seconds
    loaded_at: float  # monotonic seconds
    footprint: Footprint
    gpu: int | None
    account_id: str  # who pays for it


@dataclass(frozen=True, slots=True)
class Load:
    """The load that needs room, as eviction weighs it: whose it is, its readiness, what each account holds
    now (host bytes, and bytes on the GPU the load would go to), the share of the budget of an account of
    weight 1 (`share`; an account's is that × its weight: `share_of`), the accounts' `weights` (1 where
    absent) and what the load itself `needs`."""

    account_id: str
    readiness: str
    held: dict[str, Footprint]
    share: Footprint
    weights: dict[str, float] = field(default_factory=dict)
    needs: Footprint = field(default_factory=lambda: Footprint(0))

    def share_of(self, account_id: str) -> Footprint:
        """An account's share of the budget (and of the load's GPU's): its weight's part of it."""
        weight = self.weights.get(account_id, 1.0)
        return Footprint(int(self.share.host * weight), int(self.share.gpu * weight))

    def over_share(self, account_id: str, held: Footprint) -> bool:
        """Whether `account_id`, holding `held`, holds more than its share (host memory or the GPU's)."""
        share = self.share_of(account_id)
        return held.host > share.host or held.gpu > share.gpu

    def loader_over_share(self) -> bool:
        """Whether the loading account would hold more than its share once this load is in."""
        after = self.held.get(self.account_id, Footprint(0)) + self.needs
        return self.over_share(self.account_id, after)

    def may_evict(self, candidate: Candidate, held: Footprint) -> bool:
        """Whether this load may evict `candidate` (already idle, not hot, old enough), whose account holds
        `held` now: its own account's deployments and other accounts' cold ones always; another account's
        warm one never for a cold load (cold means "load me when asked", not "take another's room"), nor
        while the loading account would be over its own share, and for a warm or hot load only while that
        account holds more than its share."""
        if candidate.account_id == self.account_id or candidate.readiness == "cold":
            return True
        if self.readiness == "cold" or self.loader_over_share():
            return False
        return self.over_share(candidate.account_id, held)


class Capacity:
    """The budget and the holdings against it."""

    def __init__(self, budget: int, gpu_budgets: Iterable[int] = ()) -> None:
        self.budget = budget
        self.gpu_budgets = list(gpu_budgets)
        self._holdings: list[Holding] = []
        # each account's weight (its share of the budget), as its latest load said; 1 where unknown
        self.weights: dict[str, float] = {}

    # ---------------------------------------------------------------- what is held

    @property
    def holdings(self) -> list[Holding]:
        return list(self._holdings)

    @property
    def reserved(self) -> int:
        return sum(h.footprint.host for h in self._holdings)

    @property
    def free(self) -> int:
        return self.budget - self.reserved

    def gpu_reserved(self, gpu: int) -> int:
        return sum(h.footprint.gpu for h in self._holdings if h.gpu == gpu)

    def gpu_free(self, gpu: int) -> int:
        return self.gpu_budgets[gpu] - self.gpu_reserved(gpu)

    # ---------------------------------------------------------------- reserving

    def short(self, footprint: Footprint, gpu: int | None) -> Footprint:
        """What is missing for `footprint` to fit now (on `gpu`): host bytes and GPU bytes, 0 where none."""
        gpu_short = 0 if gpu is None else footprint.gpu - self.gpu_free(gpu)
        return Footprint(max(0, footprint.host - self.free), max(0, gpu_short))

    def fits(self, footprint: Footprint, gpu: int | None) -> bool:
        """Whether `footprint` fits beside what is held now (on `gpu`, for its GPU part)."""
        if footprint.host > self.free:
            return False
        return gpu is None or footprint.gpu <= self.gpu_free(gpu)

    def never_fits(self, footprint: Footprint) -> str | None:
        """Why `footprint` cannot fit even with nothing else loaded; None when it can."""
        if footprint.host > self.budget:
            return (
                f"it needs {describe(footprint.host)} of host memory, more than the whole budget of "
                f"{describe(self.budget)}"
            )
        if footprint.gpu and not any(footprint.gpu <= b for b in self.gpu_budgets):
            if not self.gpu_budgets:
                return f"it needs {describe(footprint.gpu)} of GPU memory and this server has no GPU"
            largest = max(self.gpu_budgets)
            return (
                f"it needs {describe(footprint.gpu)} of GPU memory, more than the budget of the largest GPU "
                f"({describe(largest)})"
            )
        return None

    def gpu_order(self, footprint: Footprint) -> list[int | None]:
        """Where a load may go, best first: no GPU for a host-only footprint; else the GPUs whose budget
        could hold it, the one with the most free budget first (placement: most free that fits)."""
        if not footprint.gpu:
            return [None]
        able = [i for i, budget in enumerate(self.gpu_budgets) if footprint.gpu <= budget]
        able.sort(key=lambda i: (-self.gpu_free(i), i))
        return [*able]

    def hold(
        self, deployment_id: str, account_id: str, footprint: Footprint, gpu: int | None, weight: float = 1.0
    ) -> Holding:
        self.weights[account_id] = weight
        holding = Holding(deployment_id, account_id, footprint, gpu)
        self._holdings.append(holding)
        return holding

    def measure(self, holding: Holding, footprint: Footprint) -> None:
        """The holding's processes were measured: the reservation is what they take now."""
        holding.footprint, holding.measured = footprint, True

    def release(self, holding: Holding | None) -> None:
        """The holding's processes have exited (idempotent)."""
        if holding is not None and holding in self._holdings:
            self._holdings.remove(holding)

    def load(
        self,
        account_id: str,
        readiness: str,
        gpu: int | None,
        weight: float = 1.0,
        needs: Footprint | None = None,
    ) -> Load:
        """A load of `account_id`'s (of `weight`; its deployment's `readiness`; `needs` that much) going
        to `gpu`, with what every account holds now (stopping replicas included: their memory is not free
        yet) and the shares of the budget (and of that GPU's) among the accounts holding memory, this one
        counted, in the ratio of their weights."""
        self.weights[account_id] = weight
        held: dict[str, Footprint] = {account_id: Footprint(0)}
        for h in self._holdings:
            on_gpu = h.footprint.gpu if gpu is not None and h.gpu == gpu else 0
            held[h.account_id] = held.get(h.account_id, Footprint(0)) + Footprint(h.footprint.host, on_gpu)
        weights = {account: self.weights.get(account, 1.0) for account in held}
        total = sum(weights.values())
        gpu_share = self.gpu_budgets[gpu] / total if gpu is not None else 0
        share = Footprint(int(self.budget / total), int(gpu_share))
        return Load(account_id, readiness, held, share, weights, needs or Footprint(0))

    def fits_beside_pinned(self, footprint: Footprint, pinned: list[Footprint]) -> bool:
        """Whether `footprint` fits in the budget beside the `pinned` (hot) deployments, whatever else is
        loaded (eviction makes room for pinned ones): their host memory together, and their GPU parts
        packed onto the GPUs (the largest first, each onto the GPU with the most budget left)."""
        everything = [footprint, *pinned]
        if sum(f.host for f in everything) > self.budget:
            return False
        left = list(self.gpu_budgets)
        for size in sorted((f.gpu for f in everything if f.gpu), reverse=True):
            best = max(range(len(left)), key=left.__getitem__, default=None)
            if best is None or left[best] < size:
                return False
            left[best] -= size
        return True


def evictions(
    short: Footprint,
    gpu: int | None,
    candidates: list[Candidate],
    now: float,
    min_residency: float,
    load: Load | None = None,
) -> list[Candidate] | None:
    """The deployments to unload to free `short` (host memory, and memory on `gpu`) for `load`, fewest in
    order; None when even every evictable one would not free it (the load waits).

    Evictable: idle (nothing in flight or queued), not hot (pinned), loaded at least `min_residency`
    seconds ago (waiting beats thrashing), and allowed by `load`'s account rules (`Load.may_evict`:
    another account's warm deployment only for a warm or hot load of an account within its share, and
    only while that account holds more than its share, counted down as its deployments are chosen);
    without `load` (measured memory above the budget) whoever's. Order: the loading account's own first,
    then cold before warm, least recently used first. A candidate that frees nothing of what is short
    (host memory when only the GPU is short, another GPU's memory) is passed over."""
    short_host, short_gpu = short.host, short.gpu if gpu is not None else 0
    if short_host <= 0 and short_gpu <= 0:
        return []
    evictable = [
        c for c in candidates if c.idle and c.readiness != "hot" and now - c.loaded_at >= min_residency
    ]
    own = load.account_id if load is not None else None
    evictable.sort(key=lambda c: (c.account_id != own, c.readiness != "cold", c.last_used))
    held = dict(load.held) if load is not None else {}
    chosen: list[Candidate] = []
    for candidate in evictable:
        frees_gpu = gpu is not None and candidate.gpu == gpu and candidate.footprint.gpu > 0
        if not (short_host > 0 and candidate.footprint.host > 0) and not (short_gpu > 0 and frees_gpu):
            continue
        if load is not None:
            theirs = held.get(candidate.account_id, Footprint(0))
            if not load.may_evict(candidate, theirs):
                continue
            freed = Footprint(candidate.footprint.host, candidate.footprint.gpu if frees_gpu else 0)
            held[candidate.account_id] = Footprint(theirs.host - freed.host, theirs.gpu - freed.gpu)
        chosen.append(candidate)
        short_host -= candidate.footprint.host
        if frees_gpu:
            short_gpu -= candidate.footprint.gpu
        if short_host <= 0 and short_gpu <= 0:
            return chosen
    return None


# ---------------------------------------------------------------- the default budget


def memory_limit(cgroup_root: Path, proc_cgroup: str, meminfo: str) -> int:
    """The memory this server may use: the machine's (`MemTotal`), or the limit of the cgroup it runs in
    (v2 `memory.max`, v1 `memory.limit_in_bytes`, the smallest along its path) when that is smaller.

    `proc_cgroup` is `/proc/self/cgroup`'s text; the cgroup's folders are read below `cgroup_root`
    (`/sys/fs/cgroup`; v1's memory controller under `memory/`). Inside a container the cgroup
    namespace may make the container's own cgroup the root: every folder from the process's cgroup up
    to the root is read, as far as it exists."""
    total = _meminfo_total(meminfo)
    limits = [total]
    for version, path in _cgroup_paths(proc_cgroup):
        base = cgroup_root if version == 2 else cgroup_root / "memory"
        name = "memory.max" if version == 2 else "memory.limit_in_bytes"
        for folder in _ancestors(path):
            limit = _read_limit(base / folder / name)
            if limit is not None:
                limits.append(limit)
    return min(limits)


def default_budget(limit: int, server_bytes: int) -> int:
    """80 % of `limit`, less what the server's own processes hold (never below nothing)."""
    return max(0, int(limit * DEFAULT_BUDGET_SHARE) - server_bytes)


def _meminfo_total(meminfo: str) -> int:
    match = re.search(r"^MemTotal:\s+(\d+) kB", meminfo, re.M)
    return int(match.group(1)) * 1024 if match else _NO_LIMIT


def _cgroup_paths(proc_cgroup: str) -> list[tuple[int, str]]:
    """(version, path) of the memory cgroups in `/proc/self/cgroup`: v2's `0::/path`, v1's
    `N:...memory...:/path`."""
    found = []
    for line in proc_cgroup.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        number, controllers, path = parts
        if number == "0" and controllers == "":
            found.append((2, path))
        elif "memory" in controllers.split(","):
            found.append((1, path))
    return found


def _ancestors(path: str) -> list[str]:
    """`/a/b` → `a/b`, `a`, `` (relative folders, the deepest first)."""
    parts = [p for p in path.split("/") if p and p not in (".", "..")]
    return ["/".join(parts[:n]) for n in range(len(parts), -1, -1)]


def _read_limit(file: Path) -> int | None:
    try:
        text = file.read_text().strip()
    except OSError:
        return None
    if not text.isdigit():  # v2's "max"
        return None
    value = int(text)
    return value if value < _NO_LIMIT else None


def describe(size: int) -> str:
    """A byte count as messages show it."""
    return f"{size / MB:,.0f} MiB"
