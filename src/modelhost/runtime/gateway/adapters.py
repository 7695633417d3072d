"""Adapter deployments reach their base's replicas: the runtime as every caller sees it.

An adapter deployment has no replicas of its own. Its requests run on its base's, each naming the
adapter (`adapter` in the request: its deployment ID, which is vLLM's adapter name, and its files), so
that one replica serves the base and every adapter attached to it, many in one batch (docs/adapters.md).
`AdapterRouting` wraps the runtime of a gateway process (the supervisor's `ReplicaManager` or another
process's `RemoteRuntime`): routes, the Responses service and the agent runner call it with the
deployment the client named, and never need to know which kind it is.

It is also where a generation handed off by a draining replica goes on (`MovedAway`, issue 73): sent
again to the deployment itself, not to the version it ran on, so that a rollout's old version hands
its generations to the version that serves now.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, Callable
from dataclasses import replace
from typing import Any

import msgspec

from modelhost.errors import DeploymentUnavailable
from modelhost.generation.contract import Adapter, GenerationEvent, GenerationRequest, StreamRequest
from modelhost.routing import split_key
from modelhost.runtime.gateway.dispatch import MovedAway
from modelhost.runtime.gateway.interface import Runtime
from modelhost.runtime.spec import AdapterTarget, LiveStatus

Payload = dict[str, Any]
MAX_MOVES = 4  # hand-offs one generation follows (drains one after another); more: 503


class AdapterRouting:
    """A `Runtime` that sends an adapter deployment's work to its base, and anything else through."""

    def __init__(self, inner: Runtime, target_of: Callable[[str], AdapterTarget | None]) -> None:
        self._inner = inner
        self._target_of = target_of
        # A deployment's target never changes (an adapter's base and files are fixed at its creation), so
        # it is read once per deployment and process: "not an adapter" included, the common case.
        self._targets: dict[str, AdapterTarget | None] = {}

    async def _target(self, deployment_id: str) -> AdapterTarget | None:
        try:
            return self._targets[deployment_id]
        except KeyError:
            target = await asyncio.to_thread(self._target_of, deployment_id)
            if len(self._targets) > 100_000:  # deleted deployments' entries: forget all now and then
                self._targets.clear()
            self._targets[deployment_id] = target
            return target

    async def infer(self, deployment_id: str, item: Payload) -> Payload:
        target = await self._target(deployment_id)
        if target is None:
            return await self._inner.infer(deployment_id, item)
        return await self._inner.infer(target.base_id, _item_with_adapter(item, target))

    async def stream(self, deployment_id: str, item: StreamRequest) -> AsyncGenerator[GenerationEvent, None]:
        target = await self._target(deployment_id)
        if target is not None:
            deployment_id, item = target.base_id, _with_adapter(item, target)
        for _ in range(MAX_MOVES + 1):
            try:
                async with contextlib.aclosing(self._inner.stream(deployment_id, item)) as events:
                    async for event in events:
                        yield event
                return
            except MovedAway as moved:  # a drain: on to whatever serves the deployment now
                deployment_id, item = split_key(deployment_id)[0], moved.request
        raise DeploymentUnavailable(
            "The deployment's replicas kept handing this generation off; retry shortly."
        )

    async def status(self, deployment_id: str) -> LiveStatus:
        """An adapter is as loaded as its base; the memory it holds is its own weights' in each of the
        base's replicas (what its bill counts), not the base's."""
        target = await self._target(deployment_id)
        if target is None:
            return await self._inner.status(deployment_id)
        base = await self._inner.status(target.base_id)
        return replace(base, memory_gb=round(target.bytes * base.replicas / 1e9, 6))

    async def apply(self, deployment_id: str) -> None:
        """An adapter created: its base is applied again (the first adapter reloads it with LoRA on)."""
        target = await self._target(deployment_id)
        await self._inner.apply(deployment_id if target is None else target.base_id)

    async def load(self, deployment_id: str) -> None:
        target = await self._target(deployment_id)
        await self._inner.load(deployment_id if target is None else target.base_id)

    async def remove(self, deployment_id: str) -> None:
        """A deleted adapter has no replicas to stop (its base's engine drops its weights by LRU); the
        runtime forgets any other deployment (one it never loaded included)."""
        if self._targets.pop(deployment_id, None) is None:
            await self._inner.remove(deployment_id)

    async def resume_account(self, account_id: str) -> None:
        await self._inner.resume_account(account_id)

    async def capacity(self) -> dict[str, Any]:
        return await self._inner.capacity()


def _with_adapter(item: StreamRequest, target: AdapterTarget) -> StreamRequest:
    """The request run on the base with the adapter (only text generation serves adapters)."""
    if not isinstance(item, GenerationRequest):
        return item  # a video on an adapter: the base's engine refuses it
    return msgspec.structs.replace(item, adapter=Adapter(target.adapter_id, str(target.adapter_dir)))


def _item_with_adapter(item: Payload, target: AdapterTarget) -> Payload:
    """A batch task's item run on the base with the adapter (the base's handler refuses it)."""
    return {**item, "adapter": {"name": target.adapter_id, "path": str(target.adapter_dir)}}
