"""One deployment's requests in one gateway process: admission, the choice of replica, the answer.

The supervisor's own requests go through it (to its `Replica` objects) as do every other gateway
process's (to their connections to the same replicas). It bounds what this process has in flight for
the deployment (429 beyond `max_in_flight`), picks the replica this process has the least in flight
with, waits at most `timeout` (504; the replica drops a request whose caller left) and turns what
comes back into the answer or the error the client sees.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, Sequence
from typing import Any, Protocol

from modelhost.errors import DeploymentUnavailable, GatewayTimeout, InvalidRequest, ModelhostError, Overloaded
from modelhost.runtime import metrics
from modelhost.runtime.replica import ReplicaDied, ReplicaFailed

Payload = dict[str, Any]


class Target(Protocol):
    """A replica as one gateway process reaches it: a `Replica` or a `ReplicaConnection`."""

    @property
    def alive(self) -> bool: ...
    @property
    def in_flight(self) -> int: ...
    async def submit(self, item: Payload) -> Payload: ...
    def stream(self, request: Payload) -> AsyncGenerator[Payload, None]: ...


def item_failure(error: Payload) -> ModelhostError:
    """An item's or event's `error`: the request's own fault (400) unless the replica itself failed."""
    if error.get("internal"):
        return DeploymentUnavailable(f"Inference failed: {error.get('message')}")
    return InvalidRequest(str(error.get("message")), param=error.get("param"), code=error.get("code"))


class Dispatcher:
    def __init__(self, deployment_id: str, max_in_flight: int, timeout: float) -> None:
        self.max_in_flight = max_in_flight
        self.timeout = timeout
        self.outstanding = 0  # requests and generations of this process on the deployment
        self._gauge = metrics.IN_FLIGHT.labels(deployment_id)

    def _admit(self) -> None:
        if self.outstanding >= self.max_in_flight:
            raise Overloaded(
                "The deployment has too many requests in flight; retry shortly.", headers={"Retry-After": "1"}
            )
        self.outstanding += 1
        self._gauge.set(self.outstanding)

    def _release(self) -> None:
        self.outstanding -= 1
        self._gauge.set(self.outstanding)

    async def infer(self, targets: Sequence[Target], item: Payload) -> Payload:
        """One request of a batch task, answered by the least busy live replica."""
        target = _pick(targets)
        self._admit()
        try:
            output = await asyncio.wait_for(target.submit(item), self.timeout)
        except TimeoutError as exc:
            raise GatewayTimeout(f"The request did not finish within {self.timeout:g} seconds.") from exc
        except ReplicaDied as exc:
            raise DeploymentUnavailable(f"The replica serving this request stopped: {exc}.") from exc
        except ReplicaFailed as exc:
            raise DeploymentUnavailable(f"Inference failed: {exc}") from exc
        finally:
            self._release()
        if "error" in output:
            raise item_failure(output["error"])
        return output

    async def stream(self, targets: Sequence[Target], request: Payload) -> AsyncGenerator[Payload, None]:
        """A generation's events from the least busy live replica; an `error` event is raised."""
        target = _pick(targets)
        self._admit()
        try:
            async with contextlib.aclosing(target.stream(request)) as events:
                async for event in events:
                    if "error" in event:
                        raise item_failure(event["error"])
                    yield event
        except ReplicaDied as exc:
            raise DeploymentUnavailable(f"The replica serving this request stopped: {exc}.") from exc
        finally:
            self._release()


def _pick(targets: Sequence[Target]) -> Target:
    live = [t for t in targets if t.alive]
    if not live:
        raise DeploymentUnavailable("The deployment has no running replica; retry shortly.")
    return live[0] if len(live) == 1 else min(live, key=lambda t: t.in_flight)
