"""A small TTL + LRU cache, so hot paths (key lookups, routing) do not hit the database per request."""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Generic, TypeVar

V = TypeVar("V")

_MISSING = object()


class TTLCache(Generic[V]):
    """Thread-safe; entries expire after `ttl` seconds; the oldest are evicted beyond `max_entries`.

    A cached `None` is a remembered miss: a flood of wrong keys costs no database queries either.
    """

    def __init__(self, ttl: float, max_entries: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl = ttl
        self.max_entries = max_entries
        self._clock = clock
        self._entries: OrderedDict[str, tuple[float, V | None]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: str) -> tuple[bool, V | None]:
        """(found, value). `found` is False when absent or expired."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return False, None
            expires, value = entry
            if expires <= self._clock():
                del self._entries[key]
                return False, None
            self._entries.move_to_end(key)
            return True, value

    def put(self, key: str, value: V | None) -> None:
        if self.ttl <= 0:
            return
        with self._lock:
            self._entries[key] = (self._clock() + self.ttl, value)
            self._entries.move_to_end(key)
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)
