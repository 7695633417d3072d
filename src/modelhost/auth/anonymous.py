"""The throttle of anonymous requests: every request no key checks (the public routes: health, metrics,
the console's files, sign-in, signed file links; and paths that match no route) is counted against its
client address (docs/security.md, "Anonymous routes").

A key costs its account credits and counts against its limits; a request without one costs nothing to
whoever sends it, so without a bound one address could keep a gateway busy for every tenant (S3: a
sign-in start cost 0.2 s of CPU, and 5 a second stalled everyone). Two rules together bound it: each
public route does no more per request than a database row, and each client address may send at most
`per_minute` requests' worth a minute, in bursts of `burst`, here. A route that costs more than a page
(a sign-in writes a row or asks the identity provider) declares its cost in units of a plain request
(`COST`, read from the route's OpenAPI extension, so the document shows it).

A token bucket per address: `burst` units at most, refilled at `per_minute` a minute; a request that
finds fewer units than it costs is answered 429 with `Retry-After` (when it would fit). The client
address is the one the HTTP server reports, which is the forwarded client's where the operator named
its proxies (`MODELHOST_TRUSTED_PROXIES`): a proxy's own address never shares one bucket among
everyone behind it unless the operator forgot to say it is a proxy.

Counted per gateway process, in memory, for at most `max_addresses` addresses at once (the least
recently seen forgotten first): bounded whatever the traffic. `per_minute` 0 turns it off."""

from __future__ import annotations

import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable

# The OpenAPI extension where a public route declares what one of its requests costs (default 1)
COST = "x-modelhost-anonymous-cost"
SIGN_IN_COST = 20  # a sign-in's step: a database row, an exchange with the identity provider


class AnonymousThrottle:
    """Units of anonymous requests left per client address (the module docstring)."""

    def __init__(
        self,
        per_minute: int,
        burst: int,
        max_addresses: int = 10_000,
        now: Callable[[], float] = time.monotonic,
    ) -> None:
        self.per_second = per_minute / 60
        self.burst = max(burst, 1)
        self._max_addresses = max_addresses
        self._now = now
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()  # address: (units, when)
        self._lock = threading.Lock()

    def charge(self, address: str, cost: int = 1) -> int | None:
        """Take `cost` units from `address`'s bucket: None when they were there, else the seconds until
        they will be (the request is refused and nothing is taken)."""
        if self.per_second <= 0:
            return None
        cost = min(cost, self.burst)  # a route dearer than a whole burst still passes once a burst
        with self._lock:
            now = self._now()
            units, when = self._buckets.pop(address, (float(self.burst), now))
            units = min(float(self.burst), units + (now - when) * self.per_second)
            if units < cost:
                self._keep(address, units, now)
                return max(1, math.ceil((cost - units) / self.per_second))
            self._keep(address, units - cost, now)
            return None

    def _keep(self, address: str, units: float, now: float) -> None:
        self._buckets[address] = (units, now)  # the most recent last
        while len(self._buckets) > self._max_addresses:
            self._buckets.popitem(last=False)
