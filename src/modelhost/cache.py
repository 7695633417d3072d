"""A small TTL + LRU cache, so hot paths (key lookups, routing) do not hit the database per request.

While the database is unavailable, a cache also answers with what it last read (`fresh_or_stale`): a
key, a deployment list or a balance this gateway already knew keeps serving inference through a
database restart. What was forgotten on purpose (a revoked key, a changed deployment) is not kept.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Generic, TypeVar

from modelhost.errors import DatabaseUnavailable

V = TypeVar("V")
log = logging.getLogger("modelhost.cache")

_MISSING = object()


class TTLCache(Generic[V]):
    """Thread-safe; entries expire after `ttl` seconds; the oldest are evicted beyond `max_entries`.

    A cached `None` is a remembered miss: a flood of wrong keys costs no database queries either. An
    expired entry is no longer found by `get` but is kept (until evicted or forgotten) as the value to
    fall back on while the database is unavailable.
    """

    def __init__(self, ttl: float, max_entries: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl = ttl
        self.max_entries = max_entries
        self._clock = clock
        self._entries: OrderedDict[str, tuple[float, V | None]] = OrderedDict()
        self._lock = threading.Lock()
        # Counts what was forgotten on purpose: a load that began before a forget (it may have read the
        # rows as they were before the change) does not keep its value, and is not shared with loads
        # that begin after it (`SingleFlight`)
        self._generation = 0
        # Told when an entry (a key) or everything (None) is forgotten on purpose, so that the server's
        # other gateway processes forget it too (`modelhost.server`); expiry is not announced.
        self.on_forget: Callable[[str | None], None] | None = None

    def get(self, key: str) -> tuple[bool, V | None]:
        """(found, value). `found` is False when absent or expired."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return False, None
            expires, value = entry
            if expires <= self._clock():
                return False, None
            self._entries.move_to_end(key)
            return True, value

    def fresh_or_stale(self, key: str, load: Callable[[], V | None]) -> V | None:
        """`load()` and keep what it read; while the database is unavailable, the last value read for
        `key`, however old, when there is one (else `DatabaseUnavailable` goes on to the caller). What
        was read is not kept when something was forgotten meanwhile: the change that forgot it may
        have committed after `load` read."""
        began = self._generation
        try:
            value = load()
        except DatabaseUnavailable:
            with self._lock:
                entry = self._entries.get(key)
            if entry is None:
                raise
            log.warning("database unavailable: serving a cached entry read %.0fs ago", self._age(entry[0]))
            return entry[1]
        self.put(key, value, began=began)
        return value

    @property
    def generation(self) -> int:
        """How many times an entry or everything was forgotten on purpose, here or announced."""
        return self._generation

    def _age(self, expires: float) -> float:
        return max(0.0, self._clock() - (expires - self.ttl))

    def put(self, key: str, value: V | None, *, began: int | None = None) -> None:
        """Keep `value`; not when it was read by a load that `began` before the last forget."""
        if self.ttl <= 0:
            return
        with self._lock:
            if began is not None and began != self._generation:
                return
            self._entries[key] = (self._clock() + self.ttl, value)
            self._entries.move_to_end(key)
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)

    def discard(self, key: str) -> None:
        self.forget_here(key)
        if self.on_forget is not None:
            self.on_forget(key)

    def clear(self) -> None:
        self.forget_here(None)
        if self.on_forget is not None:
            self.on_forget(None)

    def forget_here(self, key: str | None) -> None:
        """Forget `key` (None: everything) in this process only: another process announced it."""
        with self._lock:
            self._generation += 1
            if key is None:
                self._entries.clear()
            else:
                self._entries.pop(key, None)

    def __len__(self) -> int:
        return len(self._entries)


class SingleFlight(Generic[V]):
    """Concurrent cache misses of one key share one load, run off the event loop.

    Without it, the moment a hot entry expires every request in flight misses together and each
    runs the same database query (a stampede that also exhausts the connection pool). A load is
    shared only among misses of one `generation` of its cache: a request that arrives after a change
    forgot the entry (a revoked key, a new version of a deployment) never waits for a load that began
    before it, whose rows may predate the change.
    """

    def __init__(self, generation: Callable[[], int] = lambda: 0) -> None:
        self._generation = generation
        self._loading: dict[tuple[str, int], asyncio.Future[V]] = {}

    async def load(self, key: str, loader: Callable[[], V]) -> V:
        flight = (key, self._generation())
        future = self._loading.get(flight)
        if future is None:
            future = asyncio.ensure_future(asyncio.to_thread(loader))
            self._loading[flight] = future
            future.add_done_callback(lambda _: self._loading.pop(flight, None))
        # Shielded: one caller giving up (disconnect, timeout) must not cancel the others' load.
        return await asyncio.shield(future)
