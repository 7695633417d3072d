"""Background work that the database queues and one server at a time runs: batches, imports, video jobs.

A runner claims a row (a guarded UPDATE naming the runner, in the work's own store), runs it as a task,
and hands every running claim back when it stops, so that another server, or this one restarted, takes
it over where it stood. A crashed server's claims are taken over once they go stale (the stores decide
when). `ClaimLoop` is that loop, once: a runner says how to claim, release and run one claim.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from typing import Generic, Protocol, TypeVar


class Claim(Protocol):
    @property
    def id(self) -> str: ...


ClaimT = TypeVar("ClaimT", bound=Claim)


class ClaimLoop(Generic[ClaimT]):
    """Claims up to `concurrency()` rows at a time, polling every `poll_seconds()` (or at once when
    `wake` says new work was created in this process), and runs each with `run`."""

    what = "work"  # how the log names one claim

    def __init__(self, log: logging.Logger) -> None:
        self.name = f"gw-{secrets.token_hex(6)}"  # the claimant its stores record
        self.log = log
        self.running: dict[str, asyncio.Task[None]] = {}
        self._loop: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()

    # ---------------------------------------------------------------- what a runner says

    def concurrency(self) -> int:
        raise NotImplementedError

    def poll_seconds(self) -> float:
        raise NotImplementedError

    def claim(self) -> ClaimT | None:
        """The next claim for this runner, or None (blocking: run in a thread)."""
        raise NotImplementedError

    def release(self, claim_id: str) -> None:
        """Hand a claim back, as it stands (blocking: run in a thread)."""
        raise NotImplementedError

    async def run(self, claimed: ClaimT) -> None:
        raise NotImplementedError

    async def turn(self) -> None:
        """Each turn of the loop, before it claims, whether or not a slot is free: a runner's own
        housekeeping (the video runner's stale jobs and expired files). Nothing by default."""

    # ---------------------------------------------------------------- the loop

    def start_claiming(self) -> None:
        self._loop = asyncio.create_task(self._claim_forever())

    def wake(self) -> None:
        """Work was created in this process: look now rather than at the next poll."""
        self._wake.set()

    async def stop(self) -> None:
        """Stop claiming; hand running claims back, to be resumed by the next claim of them."""
        if self._loop is not None:
            self._loop.cancel()
        running = list(self.running.items())
        for _, task in running:
            task.cancel()
        await asyncio.gather(*(task for _, task in running), return_exceptions=True)
        for claim_id, _ in running:
            await asyncio.to_thread(self.release, claim_id)

    async def _claim_forever(self) -> None:
        while True:
            try:
                await self.turn()
                claimed = None
                if len(self.running) < self.concurrency():
                    claimed = await asyncio.to_thread(self.claim)
                if claimed is None:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._wake.wait(), self.poll_seconds())
                    self._wake.clear()
                    continue
                self.running[claimed.id] = asyncio.create_task(self._run(claimed))
            except asyncio.CancelledError:
                raise
            except Exception:
                self.log.exception("%s runner", self.what)
                await asyncio.sleep(self.poll_seconds())

    async def _run(self, claimed: ClaimT) -> None:
        try:
            await self.run(claimed)
        except asyncio.CancelledError:
            raise
        except Exception:  # a bug here: hand it back (to be taken over) rather than leave it claimed
            self.log.exception("%s %s", self.what, claimed.id)
            await asyncio.to_thread(self.release, claimed.id)
        finally:
            self.running.pop(claimed.id, None)
            self._wake.set()
