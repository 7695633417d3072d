"""The rate limiter's counts, in memory that every gateway process of a server maps (issue 31;
docs/limits.md, "Across processes and servers").

Why shared memory: the counts must be exact across `serve --workers N`, and a request must not pay a
round trip to another process for them. Asking the supervisor (one call to admit a request, one to give
its place back) cost about 30 µs of gateway CPU per request, a third more than a request of a key with
no limits. nginx keeps its `limit_req` zones in shared memory for the same reason. Here every process
maps one file of the server's private run folder and takes a lock on it (`flock`) for the few
microseconds it reads and writes one request's rows; a process that dies holding it lets it go
(the kernel releases it).

The table is a fixed number of slots, a hash table by subject name (`key:<id>`, `account:<id>`) with
linear probing. A slot holds one subject's two buckets (requests and tokens per minute: level, when it
was last refilled, its capacity then, and what other servers took before it existed), the totals this
server took (what it tells other servers), its requests in flight (here, and on other servers) and, in
one column per gateway process, each process's share of them: what a process that dies had in flight
is given back (`clear_column`). A process remembers where it found each name until the table's
`generation` changes: when the table is half full, slots at rest (buckets full, nothing in flight or
owed) are removed and the others placed anew. A single-process server keeps its table in private
memory and takes no lock.
"""

from __future__ import annotations

import fcntl
import mmap
import os
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from modelhost.errors import ServiceUnavailable

MINUTE = 60.0
NAME_BYTES = 64
DEFAULT_SLOTS = 1 << 14  # subjects at once (compacted past half): ~200 bytes a slot, 3.3 MB in all
_MAGIC = b"mhlimit1"
_HEADER = struct.Struct("<8sIII")  # magic, slots, columns, slot size
_COUNTS = struct.Struct("<QQQ")  # after it: the generation, the slots used, when to compact next
_COUNTS_AT = _HEADER.size
_GENERATION = struct.Struct("<Q")
_HEADER_BYTES = 64
_NUMBERS = struct.Struct("<9d4q")  # a slot after its name: `Row`'s fields, in order
_COLUMN = struct.Struct("<i")


@dataclass(slots=True)
class Bucket:
    """A per-minute bucket: `level` now, as of `at` (0: no bucket yet), its `capacity` when last
    refilled, and what other servers took before it existed (`owed`: it starts that much short)."""

    level: float = 0.0
    at: float = 0.0
    capacity: float = 0.0
    owed: float = 0.0

    def refill(self, capacity: int, now: float, owed_at: float) -> None:
        """Refill to now at `capacity` per minute (never above it), creating it full (less what is
        owed) if it does not exist yet."""
        if self.at == 0.0:
            self.level, self.at = capacity - self.owed, owed_at if self.owed else now
            self.owed = 0.0
        self.level = min(float(capacity), self.level + (now - self.at) * capacity / MINUTE)
        self.at, self.capacity = now, float(capacity)

    def take(self, amount: float) -> None:
        """Take `amount` from it, or owe it while the bucket does not exist yet."""
        if self.at != 0.0:
            self.level -= amount
        else:
            self.owed += amount


@dataclass(slots=True)
class Row:
    """One subject's slot, read under the table's lock and written back (`LimitTable.load`, `store`)."""

    requests: Bucket
    tokens: Bucket
    owed_at: float  # when other servers' takes were first owed (a new bucket refills from then)
    taken_requests: int  # this server's totals: what it tells the others (auth/shared_limits.py)
    taken_tokens: int
    in_flight: int  # here, every gateway process together
    elsewhere: int  # on other servers, as they last said


def _dtype(columns: int, slot_bytes: int) -> np.dtype[np.void]:
    """A slot as numpy reads the whole table at once (the scans: `rows`, `clear_column`, `_compact`)."""
    floats = ["req_level", "req_at", "req_cap", "req_owed", "tok_level", "tok_at", "tok_cap", "tok_owed"]
    counts = ["taken_requests", "taken_tokens", "in_flight", "elsewhere"]
    names = ["name", *floats, "owed_at", *counts, "columns"]
    formats = [f"S{NAME_BYTES}", *["<f8"] * 9, *["<i8"] * 4, ("<i4", (columns,))]
    offsets = [0, *range(NAME_BYTES, NAME_BYTES + 13 * 8, 8), NAME_BYTES + _NUMBERS.size]
    return np.dtype({"names": names, "formats": formats, "offsets": offsets, "itemsize": slot_bytes})


class LimitTable:
    """One server's rate-limit counts (see the module docstring). Every method but `create` and `open`
    is called with the lock held (`with table:`)."""

    def __init__(self, memory: mmap.mmap, fd: int | None, column: int, path: Path | None) -> None:
        self._memory = memory
        self._fd = fd  # None: private memory, one process, no lock
        self.path = path
        magic, slots, columns, slot_bytes = _HEADER.unpack_from(memory, 0)
        self.slots, self.columns, self._slot_bytes = int(slots), int(columns), int(slot_bytes)
        if magic != _MAGIC:
            raise ValueError("not a rate-limit table")
        if not 0 <= column < self.columns:
            raise ValueError(f"column {column} is not one of the table's {self.columns}")
        self.column = column
        self._dtype = _dtype(self.columns, self._slot_bytes)
        self._found: dict[str, int] = {}  # where names were found, as of `_generation`
        self._generation = -1

    @classmethod
    def create(cls, path: Path | None = None, *, columns: int = 1, slots: int = DEFAULT_SLOTS) -> LimitTable:
        """A new empty table with one column per gateway process, at `path` (mapped by the others with
        `open`), or in private memory (None). The creator's column is 0."""
        slot_bytes = -(-(NAME_BYTES + _NUMBERS.size + _COLUMN.size * columns) // 8) * 8
        size = _HEADER_BYTES + slots * slot_bytes
        if path is None:
            memory, fd = mmap.mmap(-1, size), None
        else:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
            os.ftruncate(fd, size)  # sparse: pages are given as slots are used
            memory = mmap.mmap(fd, size)
        _HEADER.pack_into(memory, 0, _MAGIC, slots, columns, slot_bytes)
        _COUNTS.pack_into(memory, _COUNTS_AT, 0, 0, slots // 2)
        return cls(memory, fd, 0, path)

    @classmethod
    def open(cls, path: Path, column: int) -> LimitTable:
        """The table another process created at `path`, counting this process's requests in `column`."""
        fd = os.open(path, os.O_RDWR)
        return cls(mmap.mmap(fd, os.fstat(fd).st_size), fd, column, path)

    def __enter__(self) -> LimitTable:
        """`with table:` holds its lock (a class's own `__enter__`: the hot path pays no generator)."""
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_EX)
        generation = _GENERATION.unpack_from(self._memory, _COUNTS_AT)[0]
        if generation != self._generation:  # slots were placed anew: find names again
            self._found.clear()
            self._generation = generation
        return self

    def __exit__(self, *_: object) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    # ------------------------------------------------------------------ slots

    def find(self, name: str) -> int:
        """The slot of `name`, or -1 where it has none."""
        slot = self._found.get(name)
        if slot is None:
            encoded = _encoded(name)
            slot = self._probe(encoded)
            if self._name_at(slot) != encoded:
                return -1
            self._found[name] = slot
        return slot

    def place(self, name: str, now: float) -> int:
        """The slot of `name`, made if it has none (`now`: what "at rest" is judged by, should the
        table be compacted to make room)."""
        slot = self.find(name)
        if slot >= 0:
            return slot
        encoded = _encoded(name)
        _, used, compact_at = self._counts()
        if used + 1 > compact_at:
            self._compact(now)
            used = self._counts()[1]
            # the next compaction once as many more have come as the table had free, halved
            self._set_counts(used, compact_at=max(self.slots // 2, used + (self.slots - used) // 2))
            if used + 1 >= self.slots:
                raise ServiceUnavailable(
                    "The rate-limit table is full: too many keys and accounts are limited at once."
                )
        slot = self._probe(encoded)
        self._memory[self._offset(slot) : self._offset(slot) + len(encoded)] = encoded
        self._set_counts(used + 1)
        self._found[name] = slot
        return slot

    def load(self, slot: int) -> Row:
        n = _NUMBERS.unpack_from(self._memory, self._offset(slot) + NAME_BYTES)
        return Row(Bucket(*n[0:4]), Bucket(*n[4:8]), n[8], *n[9:13])

    def store(self, slot: int, row: Row, *, own: int = 0) -> None:
        """Write `row` back; `own`: this process has that many more of its requests in flight (its
        column)."""
        requests, tokens = row.requests, row.tokens
        _NUMBERS.pack_into(
            self._memory,
            self._offset(slot) + NAME_BYTES,
            requests.level,
            requests.at,
            requests.capacity,
            requests.owed,
            tokens.level,
            tokens.at,
            tokens.capacity,
            tokens.owed,
            row.owed_at,
            row.taken_requests,
            row.taken_tokens,
            row.in_flight,
            row.elsewhere,
        )
        if own:
            at = self._offset(slot) + NAME_BYTES + _NUMBERS.size + _COLUMN.size * self.column
            _COLUMN.pack_into(self._memory, at, _COLUMN.unpack_from(self._memory, at)[0] + own)

    # ------------------------------------------------------------------ the whole table

    def rows(self) -> dict[str, tuple[int, int, int]]:
        """Every subject's (taken requests, taken tokens, in flight here)."""
        table = self._view()
        used = table[table["name"] != b""]
        columns = (used["name"], used["taken_requests"], used["taken_tokens"], used["in_flight"])
        return {name.decode(): (int(r), int(t), int(f)) for name, r, t, f in zip(*columns, strict=True)}

    def set_elsewhere(self, in_flight: dict[str, int], now: float) -> None:
        """Other servers have `in_flight[name]` requests in flight now; the subjects not named, none."""
        self._view()["elsewhere"] = 0
        for name, count in in_flight.items():
            slot = self.place(name, now)
            row = self.load(slot)
            row.elsewhere = count
            self.store(slot, row)

    def clear_column(self, column: int) -> None:
        """The gateway process of `column` is gone: what it had in flight is no longer."""
        table = self._view()
        table["in_flight"] -= table["columns"][:, column]
        table["columns"][:, column] = 0

    def _compact(self, now: float) -> None:
        """Remove the slots at rest (nothing in flight or owed, buckets full by `now`: the same as no
        slot) and place the others anew, so that many subjects seen once do not fill the table."""
        table = self._view()
        used = table["name"] != b""
        rest = used & (table["in_flight"] == 0) & (table["elsewhere"] == 0)
        for kind in ("req", "tok"):
            level, at, capacity = table[f"{kind}_level"], table[f"{kind}_at"], table[f"{kind}_cap"]
            full = (at == 0.0) | (level + (now - at) * capacity / MINUTE >= capacity)
            rest &= full & (table[f"{kind}_owed"] == 0)
        kept = table[used & ~rest]  # a copy
        table[:] = np.zeros(1, dtype=self._dtype)
        for row in kept:
            table[self._probe(bytes(row["name"]))] = row
        generation = self._counts()[0] + 1
        _COUNTS.pack_into(self._memory, _COUNTS_AT, generation, len(kept), self._counts()[2])
        self._found.clear()
        self._generation = generation

    # ------------------------------------------------------------------ layout

    def _probe(self, encoded: bytes) -> int:
        """The slot holding `encoded`, or the free slot where it would go."""
        slot = zlib.crc32(encoded) % self.slots
        while True:
            held = self._name_at(slot)
            if not held or held == encoded:
                return slot
            slot = (slot + 1) % self.slots

    def _name_at(self, slot: int) -> bytes:
        at = self._offset(slot)
        return self._memory[at : at + NAME_BYTES].rstrip(b"\0")

    def _offset(self, slot: int) -> int:
        return _HEADER_BYTES + slot * self._slot_bytes

    def _counts(self) -> tuple[int, int, int]:
        """The generation, the slots used, and how many used make the next `place` compact."""
        generation, used, compact_at = _COUNTS.unpack_from(self._memory, _COUNTS_AT)
        return generation, used, compact_at

    def _set_counts(self, used: int, *, compact_at: int | None = None) -> None:
        generation, _, before = self._counts()
        compact_at = before if compact_at is None else compact_at
        _COUNTS.pack_into(self._memory, _COUNTS_AT, generation, used, compact_at)

    def _view(self) -> np.ndarray:
        """The slots as one numpy array over the memory, for the scans."""
        return np.frombuffer(self._memory, dtype=self._dtype, count=self.slots, offset=_HEADER_BYTES)


def _encoded(name: str) -> bytes:
    encoded = name.encode()
    if not 0 < len(encoded) <= NAME_BYTES:
        raise ValueError(f"a subject name of 1 to {NAME_BYTES} bytes, not {name!r}")
    return encoded
