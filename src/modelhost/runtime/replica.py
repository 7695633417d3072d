"""The replica interface. Local worker processes implement it now; a Ray Serve backend can later,
without touching callers: `load`, `submit(batch)`, `stream(request)`, `cancel`, `unload`, `stats`."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol


@dataclass(frozen=True, slots=True)
class ReplicaSpec:
    """Everything a replica needs to load one deployment's model."""

    deployment_id: str
    pipeline: str
    model_dir: Path
    threads: int
    device: str


@dataclass(frozen=True, slots=True)
class ReplicaStats:
    pid: int | None
    rss_bytes: int  # resident memory of the model processes that could be measured
    load_seconds: float | None
    in_flight: int
    processes: int = 1  # model processes behind this replica (Ray Serve: 0 when scaled to zero)


class ReplicaDied(Exception):
    """The replica's process ended while work was in flight (killed, out of memory, crashed)."""


class ReplicaLoadFailed(Exception):
    """The model could not be loaded; the message is the loader's reason."""


class Replica(Protocol):
    """What the manager uses of a replica, whichever backend runs it."""

    spec: ReplicaSpec

    async def load(self) -> None: ...
    async def submit(self, batch: list[Any]) -> list[Any]: ...
    def stream(self, request: Any) -> AsyncGenerator[dict[str, Any], None]: ...
    async def cancel(self, request_id: int) -> None: ...
    async def unload(self) -> None: ...
    def stats(self) -> ReplicaStats: ...
    @property
    def alive(self) -> bool: ...
    @property
    def in_flight(self) -> int: ...
    @property
    def pid(self) -> int | None: ...
    @property
    def generating(self) -> int:
        """Sequences its generation engines hold, as last reported."""
        ...
