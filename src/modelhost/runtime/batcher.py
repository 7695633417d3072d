"""Dynamic batching: one bounded queue per deployment, drained into model calls.

Requests wait in a queue; whenever a replica slot is free, the loop takes up to `max_batch`
waiting items and dispatches them as one batch. When nothing is running it sends at once (waiting
would only add latency); while other batches run it waits at most `max_wait` for more. Results
come back in order to each caller's future. A full queue refuses at once (429), a caller that gives
up (timeout, disconnect) has its queued item dropped before it reaches a model.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from modelhost.errors import GatewayTimeout, Overloaded

Dispatch = Callable[[list[Any]], Awaitable[list[Any]]]


@dataclass(eq=False)
class _Waiting:
    item: Any
    future: asyncio.Future[Any]
    enqueued: float = field(default_factory=time.perf_counter)


class Batcher:
    def __init__(
        self,
        dispatch: Dispatch,
        max_batch: int,
        max_wait: float,
        max_queue: int,
        slots: int,
        on_batch: Callable[[int, float], None] | None = None,
    ) -> None:
        self._dispatch = dispatch
        self.max_batch = max_batch
        self.max_wait = max_wait
        self.max_queue = max_queue
        self._slots = asyncio.Semaphore(slots)
        self._queue: deque[_Waiting] = deque()
        self._arrived = asyncio.Event()
        self._on_batch = on_batch
        self._loop_task: asyncio.Task[None] | None = None
        self._running: set[asyncio.Task[None]] = set()

    @property
    def depth(self) -> int:
        return len(self._queue)

    @property
    def busy(self) -> bool:
        return bool(self._queue or self._running)

    def resize(self, slots: int) -> None:
        """Replicas changed: allow `slots` batches in flight (only growth needs to wake the loop)."""
        self._slots = asyncio.Semaphore(max(1, slots))

    async def submit(self, item: Any, timeout: float) -> Any:
        """Queue `item` and wait for its output; 429 when the queue is full, 504 after `timeout`."""
        if len(self._queue) >= self.max_queue:
            raise Overloaded("The deployment's queue is full; retry shortly.", headers={"Retry-After": "1"})
        self._ensure_loop()
        waiting = _Waiting(item, asyncio.get_running_loop().create_future())
        self._queue.append(waiting)
        self._arrived.set()
        try:
            return await asyncio.wait_for(asyncio.shield(waiting.future), timeout)
        except TimeoutError as exc:
            raise GatewayTimeout(f"The request did not finish within {timeout:g} seconds.") from exc
        finally:
            # Timed out or the caller went away: drop the item if no model has taken it yet.
            if not waiting.future.done():
                waiting.future.cancel()
                with contextlib.suppress(ValueError):
                    self._queue.remove(waiting)

    async def drain(self, timeout: float) -> None:
        """Wait until queued and running batches are done (used at shutdown)."""
        deadline = time.monotonic() + timeout
        while self.busy and time.monotonic() < deadline:
            await asyncio.sleep(0.05)

    def close(self) -> None:
        if self._loop_task is not None:
            self._loop_task.cancel()
            self._loop_task = None

    def _ensure_loop(self) -> None:
        if self._loop_task is None or self._loop_task.done():
            self._loop_task = asyncio.create_task(self._loop())

    async def _loop(self) -> None:
        while True:
            slots = self._slots
            await slots.acquire()
            batch = await self._next_batch()
            if not batch:
                slots.release()
                continue
            task = asyncio.create_task(self._run(batch, slots))
            self._running.add(task)
            task.add_done_callback(self._running.discard)

    async def _next_batch(self) -> list[_Waiting]:
        while not self._queue:
            self._arrived.clear()
            await self._arrived.wait()
        # An idle replica gains nothing from waiting: send at once. While batches are running,
        # gather up to `max_wait` more so the next model call is a full one.
        if self._running and len(self._queue) < self.max_batch and self.max_wait > 0:
            deadline = time.perf_counter() + self.max_wait
            while len(self._queue) < self.max_batch:
                remaining = deadline - time.perf_counter()
                if remaining <= 0:
                    break
                self._arrived.clear()
                try:
                    await asyncio.wait_for(self._arrived.wait(), remaining)
                except TimeoutError:
                    break
        batch: list[_Waiting] = []
        while self._queue and len(batch) < self.max_batch:
            waiting = self._queue.popleft()
            if not waiting.future.done():
                batch.append(waiting)
        return batch

    async def _run(self, batch: list[_Waiting], slots: asyncio.Semaphore) -> None:
        started = time.perf_counter()
        try:
            outputs = await self._dispatch([w.item for w in batch])
        except Exception as exc:
            for waiting in batch:
                if not waiting.future.done():
                    waiting.future.set_exception(exc)
            return
        finally:
            slots.release()
        if self._on_batch is not None:
            self._on_batch(len(batch), time.perf_counter() - started)
        for waiting, output in zip(batch, outputs, strict=True):
            if not waiting.future.done():
                waiting.future.set_result(output)
