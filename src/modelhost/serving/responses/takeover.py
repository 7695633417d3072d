"""Taking over background responses (issue 73): every gateway process (and the embedded server) looks,
every heartbeat, for a background response whose owner went silent past the stale window or handed it
back, claims it (`ResponseStore.claim`: of several processes looking, one takes it) and goes on with it
(`Responses.take_over`). It is `ClaimLoop`, as batches, imports and video jobs are claimed: the claim
names this process, which is also the owner of the responses it takes itself (`Responses.owner`).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from modelhost.claims import ClaimLoop
from modelhost.clock import heartbeat_seconds
from modelhost.serving.responses.store import Claimed, ResponseStore

log = logging.getLogger("modelhost.responses")

# Taken-over responses one process runs at once: each is one generation, admitted by the deployment's
# dispatcher as any other (`max_in_flight`), so this only bounds a process taking a whole server's at once.
CONCURRENCY = 256


class Takeovers(ClaimLoop[Claimed]):
    what = "background response"

    def __init__(
        self, store: ResponseStore, stale_seconds: float, go_on: Callable[[Claimed], Awaitable[None]]
    ) -> None:
        super().__init__(log)
        self.store = store
        self._poll = heartbeat_seconds(stale_seconds)  # a death is seen within the window and a beat
        self._go_on = go_on

    def concurrency(self) -> int:
        return CONCURRENCY

    def poll_seconds(self) -> float:
        return self._poll

    def claim(self) -> Claimed | None:
        return self.store.claim(self.name)

    def release(self, claim_id: str) -> None:
        """This process stops: the next claim, here after a restart or in another process, goes on."""
        self.store.release(claim_id, self.name)

    async def run(self, claimed: Claimed) -> None:
        await self._go_on(claimed)
