"""Failed keys by client address: a client that keeps presenting wrong keys is slowed down.

A key is 256 random bits, so guessing one is hopeless; what a stream of wrong keys does cost is a
database lookup each (a miss is cached only for its own token) and a line of noise in the logs. After
`limit` wrong keys from one address within a minute, keys from that address are answered 429 with
`Retry-After` without being looked up, until the oldest of those failures is a minute old. A key this
gateway has already found valid still passes (`Authenticator.cached`): the other users behind the
same address (a NAT, a proxy) are not locked out by one client's guessing.

Counted per gateway process (each of a server's N processes counts its own clients), in memory, for at
most `max_addresses` addresses at once (the oldest forgotten first): bounded whatever the traffic.
"""

from __future__ import annotations

import math
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable

WINDOW_SECONDS = 60.0


class FailedKeys:
    """Wrong keys per client address over the last minute."""

    def __init__(
        self, limit: int, max_addresses: int = 10_000, now: Callable[[], float] = time.monotonic
    ) -> None:
        self.limit = limit
        self._max_addresses = max_addresses
        self._now = now
        self._failures: OrderedDict[str, deque[float]] = OrderedDict()
        self._lock = threading.Lock()

    def retry_after(self, address: str) -> int | None:
        """Seconds until `address` may present unknown keys again; None while it may."""
        if self.limit <= 0:
            return None
        with self._lock:
            times = self._recent(address)
            if times is None or len(times) < self.limit:
                return None
            return max(1, math.ceil(times[0] + WINDOW_SECONDS - self._now()))

    def failed(self, address: str) -> None:
        """`address` presented a wrong key."""
        if self.limit <= 0:
            return
        with self._lock:
            times = self._recent(address)
            if times is None:
                times = self._failures[address] = deque(maxlen=self.limit)
                while len(self._failures) > self._max_addresses:
                    self._failures.popitem(last=False)
            self._failures.move_to_end(address)
            times.append(self._now())

    def _recent(self, address: str) -> deque[float] | None:
        """The failures of `address` within the window (older ones dropped), or None."""
        times = self._failures.get(address)
        if times is None:
            return None
        horizon = self._now() - WINDOW_SECONDS
        while times and times[0] <= horizon:
            times.popleft()
        if not times:
            del self._failures[address]
            return None
        return times
