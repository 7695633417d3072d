"""The runtime as a gateway process uses it, whichever process owns the replicas.

The supervisor implements it with the `ReplicaManager`, which starts and stops replicas; every other
gateway process with a `RemoteRuntime` (`modelhost.server.remote`), which asks the supervisor to load
and reports what it used, but sends its requests straight to the replicas. Routes, the agent runner and
the video runner see only this.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Any, Protocol

from modelhost.generation.contract import GenerationEvent, StreamRequest
from modelhost.runtime.spec import LiveStatus

Payload = dict[str, Any]


class Runtime(Protocol):
    async def infer(self, deployment_id: str, item: Payload) -> Payload:
        """One request of a batch task on the deployment (loaded first if it is not)."""
        ...

    def stream(self, deployment_id: str, item: StreamRequest) -> AsyncGenerator[GenerationEvent, None]:
        """A streaming request's events; closing the iterator early cancels it in the replica."""
        ...

    async def status(self, deployment_id: str) -> LiveStatus: ...
    async def apply(self, deployment_id: str) -> None:
        """The deployment was created or changed: act on its readiness now."""
        ...

    async def load(self, deployment_id: str) -> None:
        """Load the deployment now and wait for it; DeploymentUnavailable says why it cannot."""
        ...

    async def remove(self, deployment_id: str) -> None:
        """The deployment was deleted: unload it."""
        ...

    async def resume_account(self, account_id: str) -> None:
        """The account was topped up: load its warm and hot deployments again."""
        ...

    async def capacity(self) -> dict[str, Any]:
        """The memory budget and every deployment holding memory
        (`runtime.supervisor.placement.Placement.view`)."""
        ...
