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
import time
from collections.abc import AsyncGenerator, Callable
from dataclasses import replace
from typing import Any

import msgspec

from modelhost.errors import DeploymentUnavailable
from modelhost.generation.contract import Adapter, GenerationEvent, GenerationRequest, StreamRequest, Text
from modelhost.metrics import TALLY
from modelhost.routing import split_key
from modelhost.runtime import metrics
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
        # A version's target never changes (an adapter's base is fixed at its creation, a version's files
        # with its artifact), so it is read once per runtime key and process: "not an adapter" included,
        # the common case. A plain deployment ID (status, apply) names its current version: forgotten when
        # the deployment is applied again (a rollout of its adapters).
        self._targets: dict[str, AdapterTarget | None] = {}

    async def _target(self, key: str) -> AdapterTarget | None:
        try:
            return self._targets[key]
        except KeyError:
            target = await asyncio.to_thread(self._target_of, key)
            if len(self._targets) > 100_000:  # deleted deployments' entries: forget all now and then
                self._targets.clear()
            self._targets[key] = target
            return target

    def _forget(self, deployment_id: str) -> bool:
        """Forget every target of the deployment's versions; whether one was an adapter's."""
        keys = [key for key in self._targets if split_key(key)[0] == deployment_id]
        return any([self._targets.pop(key) is not None for key in keys])

    async def infer(self, deployment_id: str, item: Payload) -> Payload:
        target = await self._target(deployment_id)
        if target is None:
            return await self._inner.infer(deployment_id, item)
        return await self._inner.infer(target.base_id, _item_with_adapter(item, target))

    async def stream(self, deployment_id: str, item: StreamRequest) -> AsyncGenerator[GenerationEvent, None]:
        target = await self._target(deployment_id)
        # an adapter's version: its time to first token is its own (the base's dispatch counts the base's),
        # as a gated canary between two adapters judges it
        version = split_key(deployment_id) if target is not None else (deployment_id, None)
        started, first = time.perf_counter(), version[1] is None
        if target is not None:
            deployment_id, item = target.base_id, _with_adapter(item, target)
        for _ in range(MAX_MOVES + 1):
            try:
                async with contextlib.aclosing(self._inner.stream(deployment_id, item)) as events:
                    async for event in events:
                        if not first and isinstance(event, Text) and event.completion_tokens:
                            first = True
                            labels = (version[0], str(version[1]))
                            TALLY.observe(
                                metrics.VERSION_TIME_TO_FIRST_TOKEN, labels, time.perf_counter() - started
                            )
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
        """An adapter created or rolled out: its base is applied again (the first adapter reloads it with
        LoRA on; a version of a higher rank, with larger LoRA slots)."""
        self._forget(deployment_id)
        target = await self._target(deployment_id)
        await self._inner.apply(deployment_id if target is None else target.base_id)

    async def load(self, deployment_id: str) -> None:
        target = await self._target(deployment_id)
        await self._inner.load(deployment_id if target is None else target.base_id)

    async def remove(self, deployment_id: str) -> None:
        """A deleted adapter has no replicas to stop (its base's engine drops its weights by LRU); the
        runtime forgets any other deployment (one it never loaded included)."""
        if not self._forget(deployment_id):
            await self._inner.remove(deployment_id)

    async def resume_account(self, account_id: str) -> None:
        await self._inner.resume_account(account_id)

    async def capacity(self) -> dict[str, Any]:
        return await self._inner.capacity()


def _with_adapter(item: StreamRequest, target: AdapterTarget) -> StreamRequest:
    """The request run on the base with the adapter (only text generation serves adapters)."""
    if not isinstance(item, GenerationRequest):
        return item  # a video on an adapter: the base's engine refuses it
    return msgspec.structs.replace(item, adapter=Adapter(target.adapter_name, str(target.adapter_dir)))


def _item_with_adapter(item: Payload, target: AdapterTarget) -> Payload:
    """A batch task's item run on the base with the adapter (the base's handler refuses it)."""
    return {**item, "adapter": {"name": target.adapter_name, "path": str(target.adapter_dir)}}
