"""Billing of adapter deployments: each pays for its own bytes while its base's replicas hold it.

A base's replica is billed to the base's account as any replica is (its measured memory × time). Each
adapter attached to it is billed to the adapter's account for the adapter's weights × the same time:
one meter per adapter and replica, opened when the replica starts (or the adapter is attached to a
running one) and closed when the replica stops (or the adapter is deleted). The meters are billing's
own (`ReplicaMeter`): an adapter's hold on a replica reads as a replica whose memory is the adapter's.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from modelhost.runtime.replica import ReplicaStats
from modelhost.runtime.spec import AttachedAdapter, DeploymentSpec, adapter_spec


class Metered(Protocol):
    """What billing's meters read of what they bill (a replica, or an adapter's hold on one)."""

    def stats(self) -> ReplicaStats: ...
    @property
    def shared_meter(self) -> str | None: ...


class Meter(Protocol):
    def replica_started(self, replica: Metered, spec: DeploymentSpec) -> None: ...
    def replica_stopped(self, replica: Metered, *, close: bool = True) -> object: ...


@dataclass(eq=False)
class AdapterHold:
    """An adapter on one replica of its base: its bytes for as long as the replica has a process."""

    replica: Metered
    adapter: AttachedAdapter
    shared_meter: str | None = None

    def stats(self) -> ReplicaStats:
        replica = self.replica.stats()
        held = self.adapter.bytes if replica.processes else 0
        return ReplicaStats(replica.pid, held, None, 0, replica.processes)


class AdapterMeters:
    """The adapters' meters of every replica of this gateway's bases."""

    def __init__(self, meter: Meter) -> None:
        self._meter = meter
        self._holds: dict[int, dict[str, AdapterHold]] = {}  # by replica (its id()), then adapter

    async def started(self, replica: Metered, spec: DeploymentSpec) -> None:
        """A replica of a base starts: its adapters cost from now on."""
        await self._open(replica, spec, spec.adapters)

    async def stopped(self, replica: Metered) -> None:
        """The replica is stopping: its adapters' last period is billed and their meters closed."""
        holds = self._holds.pop(id(replica), {})
        for hold in holds.values():
            await asyncio.to_thread(self._meter.replica_stopped, hold)

    async def changed(self, replicas: Iterable[Metered], old: DeploymentSpec, new: DeploymentSpec) -> None:
        """Adapters attached to or deleted from a running base (one that did not reload for it)."""
        before, after = {a.id for a in old.adapters}, {a.id for a in new.adapters}
        added = [a for a in new.adapters if a.id not in before]
        for replica in replicas:
            await self._open(replica, new, added)
            holds = self._holds.get(id(replica), {})
            for gone in before - after:
                hold = holds.pop(gone, None)
                if hold is not None:
                    await asyncio.to_thread(self._meter.replica_stopped, hold)

    async def _open(
        self, replica: Metered, base: DeploymentSpec, adapters: Iterable[AttachedAdapter]
    ) -> None:
        for adapter in adapters:
            hold = AdapterHold(replica, adapter)
            self._holds.setdefault(id(replica), {})[adapter.id] = hold
            await asyncio.to_thread(self._meter.replica_started, hold, adapter_spec(base, adapter))
