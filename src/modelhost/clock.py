"""Time, injectable: billing and idle unloading read the clock through this, so tests can move it."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Protocol

from modelhost.errors import DatabaseUnavailable


class Clock(Protocol):
    def now_ms(self) -> int:
        """Wall-clock time in Unix milliseconds (what the ledger records)."""
        ...

    def monotonic(self) -> float:
        """Seconds that only move forward (what idle windows are measured in)."""
        ...


class SystemClock:
    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000

    def monotonic(self) -> float:
        return time.monotonic()


def heartbeat_seconds(stale_seconds: float) -> float:
    """How often a worker beats so that a `stale_seconds` window never sees it silent, scheduling delays
    included: a quarter of the window, at most every 2 s (a beat is one UPDATE)."""
    return min(2.0, stale_seconds / 4)


async def beat(write: Callable[[], bool]) -> bool:
    """Run a heartbeat's write (off the event loop): False when the work was stopped elsewhere. A beat
    that meets an unavailable database counts as beaten: the work goes on, and the next beat, once the
    database is back, tells (a window of several beats passes before anyone calls the work stale)."""
    try:
        return await asyncio.to_thread(write)
    except DatabaseUnavailable:
        return True
