"""Realtime sessions open at once, per key (`MODELHOST_REALTIME_MAX_SESSIONS_PER_KEY`).

A session holds a socket, a conversation in memory and, while it answers, a generation: a key that opens
sessions without end would hold the gateway's memory and file descriptors. Counted in this gateway
process (a session lives in the process that accepted its socket); the key's and account's concurrency
limits (`auth.limits`, shared by every process) count each session as one request in flight too.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager

from modelhost.errors import ConcurrencyLimitReached


class Seats:
    """The sessions each key holds open in this process."""

    def __init__(self) -> None:
        self._held: Counter[str] = Counter()

    @contextmanager
    def taken(self, key_id: str, limit: int) -> Iterator[None]:
        """One of `key_id`'s seats while the block runs; ConcurrencyLimitReached (429) when it holds
        `limit` already."""
        if self._held[key_id] >= limit:
            raise ConcurrencyLimitReached(
                f"This key already holds {limit} realtime sessions open "
                "(MODELHOST_REALTIME_MAX_SESSIONS_PER_KEY); close one first.",
                code="too_many_sessions",
            )
        self._held[key_id] += 1
        try:
            yield
        finally:
            self._held[key_id] -= 1
            if self._held[key_id] <= 0:
                del self._held[key_id]

    def held(self, key_id: str) -> int:
        return self._held[key_id]
