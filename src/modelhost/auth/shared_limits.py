"""Rate limits shared by several servers on one database (issue 31; docs/limits.md, "Several servers").

Each server counts in its own `RateLimiter` (exact across its gateway processes), and every sync
interval (`MODELHOST_LIMITS_SYNC_SECONDS`, 1 s by default) it writes what it took to the database and
reads what the others took:

- its rows of `rate_limit_use`, one per subject it counted: the requests and tokens it took since it
  started (totals, so a row missed once is caught up by the next) and its requests in flight;
- the other servers' rows written since it last read them (less a `window` for clocks that differ):
  what they took since then comes off its own buckets, and their requests in flight count towards its
  concurrency limits. Its first read takes every row as it is: what the others took before this server
  started is already in their own buckets.

So a server sees the others' use at most one interval (plus the database's round trip) late: across S
servers a subject can go over a per-minute limit by what the other servers admit in that interval, and
over a concurrency limit by the requests they start in it. A server's requests in flight stop counting
`window` after it last wrote (a server that died). Rows nobody has written for a day are removed.
Writes and reads happen in one short transaction per interval, never on a request's path.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from collections.abc import Callable
from typing import NamedTuple

from sqlalchemy import delete, select
from sqlalchemy.dialects.postgresql import insert as postgresql_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from modelhost.auth.limits import RateLimiter, Taken
from modelhost.store.db import Database
from modelhost.store.models import RateLimitUse
from modelhost.store.types import new_id

log = logging.getLogger("modelhost.limits")

FORGET_AFTER_MS = 24 * 3600 * 1000  # rows written by nobody for this long are removed
SHORTEST_WINDOW_SECONDS = 10.0  # how long a silent server's requests in flight still count, at least


class Counted(NamedTuple):
    """One row of `rate_limit_use`, as read."""

    server: str
    subject: str
    requests: int
    tokens: int
    in_flight: int
    updated_ms: int


class SharedLimits:
    """This server's side of the shared counts (see the module docstring)."""

    def __init__(
        self,
        database: Database,
        limiter: RateLimiter,
        interval: float,
        *,
        server: str | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._database = database
        self._limiter = limiter
        self.interval = interval
        self.window_ms = int(1000 * max(SHORTEST_WINDOW_SECONDS, 5 * interval))
        self.server = server or f"{socket.gethostname()[:40]}/{os.getpid()}/{new_id('s')}"[:80]
        self._clock = clock
        self._unsent: dict[str, Taken] = {}  # counts not written yet (a failed write sends them again)
        # The other servers' totals as last read, per (server, subject); None: nothing read yet.
        self._seen: dict[tuple[str, str], tuple[int, int]] | None = None
        self._read_ms = 0  # when they were last read (this server's clock)
        self._forgot_ms = 0

    async def run_forever(self) -> None:
        """Sync every interval until cancelled; a database that cannot be reached is tried again at the
        next interval (the counts meanwhile are this server's own)."""
        while True:
            await asyncio.sleep(self.interval)
            try:
                await self.sync()
            except Exception as exc:
                log.warning("rate-limit counts not shared this time: %s", exc)

    async def sync(self) -> None:
        """Write this server's counts and merge the others' into the limiter."""
        for taken in self._limiter.taken():
            self._unsent[taken.subject] = taken
        now_ms = int(self._clock() * 1000)
        rows = await asyncio.to_thread(self._exchange, list(self._unsent.values()), now_ms)
        self._unsent.clear()
        self._limiter.merge(*self._merged(rows, now_ms))
        self._read_ms = now_ms

    def _exchange(self, taken: list[Taken], now_ms: int) -> list[Counted]:
        """Write `taken`, read the other servers' rows written since the last read (all of them the
        first time); one transaction of plain statements (it runs every second), in a thread."""
        with self._database.transaction() as session:
            if taken:
                insert = sqlite_insert if self._database.is_sqlite else postgresql_insert
                written = insert(RateLimitUse).values(
                    [
                        {
                            "server": self.server,
                            "subject": counted.subject,
                            "requests": counted.requests,
                            "tokens": counted.tokens,
                            "in_flight": counted.in_flight,
                            "updated_ms": now_ms,
                        }
                        for counted in taken
                    ]
                )
                changed = {
                    name: written.excluded[name] for name in ("requests", "tokens", "in_flight", "updated_ms")
                }
                session.execute(
                    written.on_conflict_do_update(index_elements=["server", "subject"], set_=changed)
                )
            if now_ms - self._forgot_ms > FORGET_AFTER_MS // 24:
                session.execute(
                    delete(RateLimitUse).where(RateLimitUse.updated_ms < now_ms - FORGET_AFTER_MS)
                )
                self._forgot_ms = now_ms
            use = RateLimitUse
            others = select(
                use.server, use.subject, use.requests, use.tokens, use.in_flight, use.updated_ms
            ).where(use.server != self.server)
            if self._seen is not None:
                others = others.where(use.updated_ms >= self._read_ms - self.window_ms)
            return [Counted(*row) for row in session.execute(others)]

    def _merged(self, rows: list[Counted], now_ms: int) -> tuple[dict[str, tuple[int, int]], dict[str, int]]:
        """What the other servers took since the last read (requests, tokens per subject), and what
        those heard from within the window have in flight; the first read only notes their totals."""
        first, seen = self._seen is None, self._seen or {}
        taken: dict[str, tuple[int, int]] = {}
        in_flight: dict[str, int] = {}
        for row in rows:
            before = seen.get((row.server, row.subject), (0, 0))
            seen[(row.server, row.subject)] = (row.requests, row.tokens)
            if row.updated_ms >= now_ms - self.window_ms:
                in_flight[row.subject] = in_flight.get(row.subject, 0) + row.in_flight
            if not first:
                requests, tokens = taken.get(row.subject, (0, 0))
                taken[row.subject] = (requests + row.requests - before[0], tokens + row.tokens - before[1])
        self._seen = seen
        return taken, in_flight

    async def stop(self) -> None:
        """A last write, so the others see this server's requests in flight end at once."""
        try:
            await self.sync()
        except Exception as exc:
            log.warning("rate-limit counts not shared at shutdown: %s", exc)
