"""The replica interface, which the manager uses whichever backend runs the models: local worker
processes (`local`, the default) or Ray Serve applications (`ray_backend`). A backend makes replicas;
a replica loads, serves requests (batched inside the replica) and generations, and unloads."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from modelhost.generation.contract import GenerationEvent, StreamRequest
from modelhost.generation.deployment_settings import GenerationSettings
from modelhost.runtime.capacity import Footprint

if TYPE_CHECKING:
    from modelhost.runtime.spec import DeploymentSpec


@dataclass(frozen=True, slots=True)
class ReplicaSpec:
    """Everything a replica needs to load one deployment's model."""

    deployment_id: str
    pipeline: str
    model_dir: Path
    threads: int
    device: str
    engine: str = "transformers"
    precision: str = "float32"
    kv_cache_mb: int | None = None  # a generation engine's KV cache, as its footprint reserved it
    lora_rank: int | None = None  # a base with adapters: vLLM's LoRA on, its slots of this rank
    generation: GenerationSettings = field(default_factory=GenerationSettings)  # a generation task's own

    @classmethod
    def of(cls, deployment: DeploymentSpec, threads: int, device: str) -> ReplicaSpec:
        """What a replica of `deployment` loads, with `threads` torch threads, on the device the manager
        placed it on (a GPU), else on `device` (the server's setting)."""
        return cls(
            deployment.id,
            deployment.pipeline,
            deployment.model_dir,
            threads,
            deployment.device or device,
            deployment.engine,
            deployment.precision,
            deployment.kv_cache_mb,
            deployment.lora_rank,
            deployment.generation,
        )


@dataclass(frozen=True, slots=True)
class ReplicaStats:
    pid: int | None
    # What the replica's processes add to the machine's memory, host and GPU, as last measured
    # (`Replica.measure`; `runtime.memory` says what is counted): what capacity reserves and billing bills
    memory_bytes: int
    load_seconds: float | None
    in_flight: int
    processes: int = 1  # model processes behind this replica (Ray Serve: 0 when scaled to zero)


class ReplicaDied(Exception):
    """The replica's process ended while work was in flight (killed, out of memory, crashed)."""


class ReplicaDiedBeforeStart(ReplicaDied):
    """The replica died while this request was still waiting for it: the model never saw it, so it may
    run on the replacement as often as that happens (a request of the batch the replica was running,
    which may have killed it, runs once more at most: `runtime.gateway.dispatch`)."""


class ReplicaLoadFailed(Exception):
    """The model could not be loaded; the message is the loader's reason."""


class ReplicaFailed(Exception):
    """The replica's handler raised on the batch that carried this request; the message is why."""


class Replica(Protocol):
    """What the manager uses of a replica, whichever backend runs it."""

    spec: ReplicaSpec
    name: str  # how logs and the deployment's reason name it (`ps` shows a local worker's too)
    # Why the replica cannot run any more (its model no longer loads), when it exits for that reason;
    # None when it merely died (killed, out of memory) and a replacement may well start.
    failure: str | None
    # (engine, reason) when the replica chose its engine at load (an encoder's runtime), else None
    engine_choice: tuple[str, str, str | None] | None  # engine, reason, int8 quality

    async def load(self) -> None: ...
    async def submit(self, item: dict[str, Any], trace: str = "") -> dict[str, Any]:
        """One request of a batch task; the replica batches it with everyone else's. `trace`: the
        `traceparent` its spans join ("" untraced)."""
        ...

    def stream(self, request: StreamRequest, trace: str = "") -> AsyncGenerator[GenerationEvent, None]: ...
    async def unload(self) -> None:
        """Stop serving the deployment for good: its processes (or Serve application) go away."""
        ...

    async def detach(self) -> None:
        """This gateway is shutting down: stop what belongs to it alone (a local worker process), leave
        what other gateways share (a Serve application) running."""
        ...

    async def rescale(self, deployment: DeploymentSpec) -> None:
        """The deployment's readiness or replica bounds changed while loaded (nothing to do locally)."""
        ...

    def stats(self) -> ReplicaStats: ...
    def measure(self, table: dict[int, int]) -> Footprint:
        """Measure what the replica's processes take now (blocking: the manager calls it off the event
        loop, with one `memory.parents()` table for all replicas); `stats` reports it from then on."""
        ...

    async def held(self) -> int:
        """Requests and sequences the replica holds now, whichever gateway process sent them (-1: it
        cannot tell, which counts as busy)."""
        ...

    def handoff(self) -> None:
        """A drain (issue 73): ask the replica to hand its generations off, each to continue elsewhere
        (`replica_protocol.Handoff`). A replica whose engine cannot keeps them until they end."""
        ...

    @property
    def shared_meter(self) -> str | None:
        """The billing meter key every gateway uses for this replica when gateways share it (a Serve
        application); None when this gateway alone runs it and bills it on a meter of its own."""
        ...

    @property
    def alive(self) -> bool: ...
    @property
    def in_flight(self) -> int: ...
    @property
    def route(self) -> str:
        """Its name for routing, the same in every gateway process (`address` where it has one)."""
        ...

    @property
    def pid(self) -> int | None: ...
    @property
    def address(self) -> str | None:
        """Where this server's other gateway processes reach the replica (a Unix socket path); None when
        only this process can (a Serve application: every gateway joins the Ray cluster instead)."""
        ...


class ReplicaBackend(Protocol):
    """Makes the replicas of deployments, and knows how many a deployment needs in this gateway."""

    # True when one replica object stands for all of a deployment's processes and the backend scales
    # and idles them itself (Ray Serve); False when the manager runs `min_replicas` processes and
    # unloads a cold deployment after its idle window.
    scales_itself: bool

    def new_replica(
        self, deployment: DeploymentSpec, on_exit: Callable[[Replica], None], replicas: int
    ) -> Replica:
        """One replica of `deployment` (one of `replicas` the manager starts); `on_exit` is called if it
        dies on its own."""
        ...

    async def close(self) -> None:
        """The gateway stops: release what the backend holds (a Ray connection)."""
        ...
