"""A gateway process's view of its server: the supervisor over the control socket, replicas directly.

`SupervisorLink` is the process's one connection to its supervisor (calls and their answers, pushes).
`RemoteRuntime` is the runtime the routes see in this process: it sends requests straight to the
replicas (one `ReplicaConnection` per replica, opened on first use), learns where they are from the
supervisor (`Acquire` when none is known, `Replicas` pushes when they change), and tells the supervisor
every second which deployments it used, so the idle reaper does not unload them under it.
`RemoteRuns` and `RemoteVideos` hand agent runs and video cancellations to the supervisor's runners;
`LineRunner` runs the batch lines the supervisor's batch runner sends, through this process's own app.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec
from starlette.types import ASGIApp

from modelhost import tracing
from modelhost.agents.store import RunJob
from modelhost.api.batch_lines import run_line
from modelhost.cache import TTLCache
from modelhost.config import Settings
from modelhost.errors import ModelhostError, ServiceUnavailable, rebuild
from modelhost.generation.contract import GenerationEvent, StreamRequest
from modelhost.routing import split_key
from modelhost.runtime.gateway.client import ReplicaConnection
from modelhost.runtime.gateway.dispatch import Dispatcher
from modelhost.runtime.replica import ReplicaDied
from modelhost.runtime.spec import LiveStatus
from modelhost.server.control import (
    Acquire,
    Apply,
    CancelVideo,
    Done,
    Forget,
    FrameReader,
    FromSupervisor,
    GetCapacity,
    GetStatus,
    Hello,
    LineAnswered,
    Refused,
    Remove,
    Replicas,
    ResumeAccount,
    RunLine,
    StartRun,
    StopRuns,
    Touch,
    Welcome,
    decode_from_supervisor,
    encode,
)

log = logging.getLogger("modelhost.server")
Payload = dict[str, Any]
TOUCH_SECONDS = 1.0
# How often a request tries again to reach a replica the supervisor listed and this process could not
# connect to yet (one that just started, or one on its way out)
CONNECT_RETRY_SECONDS = 1.0


class SupervisorLink(asyncio.Protocol):
    """This gateway process's connection to its supervisor. `on_lost` runs once if it ends (the
    supervisor is gone: the process has nothing left to serve)."""

    def __init__(self, on_lost: Callable[[], None]) -> None:
        self._on_lost = on_lost
        self._transport: asyncio.Transport | None = None
        self._reader = FrameReader()
        self._calls: dict[int, asyncio.Future[Any]] = {}
        self._numbers = itertools.count(1)
        self.on_replicas: Callable[[str, list[str]], None] = lambda _deployment, _addresses: None
        self.on_forget: Callable[[str, str | None], None] = lambda _cache, _key: None
        self.on_line: Callable[[RunLine], None] = lambda _line: None

    @classmethod
    async def open(cls, path: str, on_lost: Callable[[], None]) -> SupervisorLink:
        _, link = await asyncio.get_running_loop().create_unix_connection(lambda: cls(on_lost), path)
        assert isinstance(link, SupervisorLink)
        return link

    async def call(self, make: Callable[[int], msgspec.Struct]) -> Any:
        """Send the call `make(number)` and wait for its answer; a `Refused` is raised as its error."""
        if self._transport is None or self._transport.is_closing():
            raise ServiceUnavailable("The server is shutting down.")
        number = next(self._numbers)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._calls[number] = future
        self._transport.write(encode(make(number)))
        try:
            return await future
        finally:
            self._calls.pop(number, None)

    def tell(self, message: msgspec.Struct) -> None:
        """A message that needs no answer (`Touch`, `Forget`)."""
        if self._transport is not None and not self._transport.is_closing():
            self._transport.write(encode(message))

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        for body in self._reader.feed(data):
            self._dispatch(decode_from_supervisor(body))

    def connection_lost(self, exc: Exception | None) -> None:
        for future in self._calls.values():
            if not future.done():
                future.set_exception(ServiceUnavailable("The server is shutting down."))
        self._on_lost()

    def _dispatch(self, message: FromSupervisor) -> None:
        if isinstance(message, Done | Refused):
            future = self._calls.get(message.call)
            if future is None or future.done():
                return
            if isinstance(message, Done):
                future.set_result(message.value)
            else:
                error = rebuild(
                    message.error,
                    message.message,
                    param=message.param,
                    code=message.code,
                    headers=message.headers,
                )
                future.set_exception(error)
        elif isinstance(message, Replicas):
            self.on_replicas(message.deployment_id, message.addresses)
        elif isinstance(message, Forget):
            self.on_forget(message.cache, message.key)
        elif isinstance(message, RunLine):
            self.on_line(message)

    async def hello(self, pid: int) -> Welcome:
        return msgspec.convert(await self.call(lambda n: Hello(n, pid)), Welcome)


@dataclass
class _Deployment:
    """One deployment as this process sees it: where its replicas are, and what it has in flight."""

    dispatcher: Dispatcher
    addresses: list[str] = field(default_factory=list)
    connections: list[ReplicaConnection] = field(default_factory=list)
    next_connect: float = 0.0  # when a replica this process has no connection to is tried again


class RemoteRuntime:
    """The runtime of a gateway process other than the supervisor (see the module docstring)."""

    def __init__(self, link: SupervisorLink, settings: Settings) -> None:
        self._link = link
        self._settings = settings
        self._deployments: dict[str, _Deployment] = {}
        self._connections: dict[str, ReplicaConnection] = {}
        self._connecting: dict[str, asyncio.Future[ReplicaConnection]] = {}
        self._acquiring: dict[str, asyncio.Future[list[str]]] = {}
        self._used: dict[str, float] = {}  # deployment → when this process last sent it a request
        self._toucher: asyncio.Task[None] | None = None
        link.on_replicas = self.replicas_changed

    def start(self, known: dict[str, list[str]]) -> None:
        for deployment_id, addresses in known.items():
            self.replicas_changed(deployment_id, addresses)
        self._toucher = asyncio.create_task(self._touch_forever())

    async def close(self) -> None:
        if self._toucher is not None:
            self._toucher.cancel()
        for connection in list(self._connections.values()):
            connection.close()

    # ---------------------------------------------------------------- requests

    async def infer(self, deployment_id: str, item: Payload) -> Payload:
        deployment = self._deployment(deployment_id)
        self._used[deployment_id] = time.monotonic()
        return await deployment.dispatcher.infer(self._targets(deployment_id), item)

    async def stream(self, deployment_id: str, item: StreamRequest) -> AsyncGenerator[GenerationEvent, None]:
        with tracing.step("wait for replica"):
            deployment = await self._ready(deployment_id)
        self._used[deployment_id] = time.monotonic()
        events = deployment.dispatcher.stream(self._targets(deployment_id), item)
        async with contextlib.aclosing(events):
            async for event in events:
                yield event

    def _targets(self, deployment_id: str) -> Callable[[], Awaitable[list[ReplicaConnection]]]:
        """The deployment's live connections, asked for again by a request whose replica died."""

        async def connections() -> list[ReplicaConnection]:
            return (await self._ready(deployment_id)).connections

        return connections

    async def _ready(self, deployment_id: str) -> _Deployment:
        """The deployment with a live connection to each of its replicas, loading it first if need be."""
        deployment = self._deployment(deployment_id)
        if any(c.alive for c in deployment.connections):
            # a replica added since (autoscaling, a replacement) joins this process's routing set: every
            # gateway process must see the same replicas to route a prefix alike (runtime.gateway.routing)
            missing = len(deployment.connections) < len(deployment.addresses)
            if missing and time.monotonic() >= deployment.next_connect:
                deployment.next_connect = time.monotonic() + CONNECT_RETRY_SECONDS
                await self._connect(deployment)
            return deployment
        flight = self._acquiring.get(deployment_id)
        if flight is None:  # concurrent requests of a cold deployment share one `Acquire`
            flight = asyncio.ensure_future(self._link.call(lambda n: Acquire(n, deployment_id)))
            self._acquiring[deployment_id] = flight
            flight.add_done_callback(lambda _: self._acquiring.pop(deployment_id, None))
        with tracing.step("acquire replicas"):  # the supervisor loads it (a cold start) or says where
            addresses: list[str] = await asyncio.shield(flight)
        self.replicas_changed(deployment_id, addresses)
        await self._connect(deployment)
        return deployment

    def _deployment(self, deployment_id: str) -> _Deployment:
        deployment = self._deployments.get(deployment_id)
        if deployment is None:
            settings = self._settings
            # a version's requests are the deployment's in the metrics (`routing.split_key`)
            labelled, version = split_key(deployment_id)
            dispatcher = Dispatcher(
                labelled,
                settings.max_queue_size,
                settings.request_timeout_seconds,
                settings.routing_max_imbalance,
                settings.routing_policy == "prefix",
                version,
            )
            deployment = self._deployments[deployment_id] = _Deployment(dispatcher)
        return deployment

    def replicas_changed(self, deployment_id: str, addresses: list[str]) -> None:
        """The supervisor says where the deployment's replicas are now: use those, connect lazily."""
        deployment = self._deployment(deployment_id)
        deployment.addresses = list(addresses)
        deployment.connections = [c for a, c in self._connections.items() if a in addresses and c.alive]

    async def _connect(self, deployment: _Deployment) -> None:
        missing = [a for a in deployment.addresses if a not in self._connections]
        opened = await asyncio.gather(*(self._open(a) for a in missing), return_exceptions=True)
        for address, connection in zip(missing, opened, strict=True):
            if isinstance(connection, BaseException):
                log.warning("cannot reach replica %s: %s", address, connection)
        deployment.connections = [
            self._connections[a] for a in deployment.addresses if a in self._connections
        ]

    async def _open(self, address: str) -> ReplicaConnection:
        flight = self._connecting.get(address)
        if flight is None:
            flight = asyncio.ensure_future(ReplicaConnection.open(address, self._lost))
            self._connecting[address] = flight
            flight.add_done_callback(lambda _: self._connecting.pop(address, None))
        connection = await asyncio.shield(flight)
        self._connections[address] = connection
        return connection

    def _lost(self, connection: ReplicaConnection) -> None:
        """A replica went away (unloaded, or died: the supervisor replaces it and says where)."""
        for address, known in list(self._connections.items()):
            if known is connection:
                del self._connections[address]
        for deployment in self._deployments.values():
            if connection in deployment.connections:
                deployment.connections = [c for c in deployment.connections if c is not connection]

    async def _touch_forever(self) -> None:
        while True:
            await asyncio.sleep(TOUCH_SECONDS)
            now = time.monotonic()
            used, self._used = self._used, {}
            for deployment_id, deployment in self._deployments.items():
                if deployment.dispatcher.outstanding:  # still in use
                    used[deployment_id] = now
            if used:
                self._link.tell(Touch({d: round(now - at, 3) for d, at in used.items()}))

    # ---------------------------------------------------------------- asked of the supervisor

    async def status(self, deployment_id: str) -> LiveStatus:
        return msgspec.convert(await self._link.call(lambda n: GetStatus(n, deployment_id)), LiveStatus)

    async def apply(self, deployment_id: str) -> None:
        await self._link.call(lambda n: Apply(n, deployment_id))

    async def load(self, deployment_id: str) -> None:
        await self._ready(deployment_id)

    async def remove(self, deployment_id: str) -> None:
        await self._link.call(lambda n: Remove(n, deployment_id))

    async def resume_account(self, account_id: str) -> None:
        await self._link.call(lambda n: ResumeAccount(n, account_id))

    async def capacity(self) -> dict[str, Any]:
        answer: dict[str, Any] = await self._link.call(GetCapacity)
        return answer


class RemoteRuns:
    """Agent runs execute in the supervisor: this process hands them over and asks it to stop them."""

    def __init__(self, link: SupervisorLink, name: str) -> None:
        self._link = link
        self.name = name

    async def submit(self, job: RunJob) -> None:
        await self._link.call(lambda n: StartRun(n, job))

    async def stop_runs(self, run_ids: list[str]) -> None:
        await self._link.call(lambda n: StopRuns(n, run_ids))


class RemoteVideos:
    """Video jobs run in the supervisor: a deleted one is stopped there."""

    def __init__(self, link: SupervisorLink) -> None:
        self._link = link

    async def cancel(self, job_id: str) -> None:
        await self._link.call(lambda n: CancelVideo(n, job_id))


class LineRunner:
    """Runs the batch lines the supervisor sends (`RunLine`) through this process's app, as the batch's
    key (`api.batch_lines.run_line`), and answers each (`LineAnswered`); lines that arrive before the
    app has started wait for it (`start`)."""

    def __init__(self, link: SupervisorLink) -> None:
        self._link = link
        self._app: ASGIApp | None = None
        self._started = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()
        link.on_line = self.received

    def start(self, app: ASGIApp) -> None:
        self._app = app
        self._started.set()

    def received(self, line: RunLine) -> None:
        task = asyncio.create_task(self._answer(line))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _answer(self, line: RunLine) -> None:
        await self._started.wait()
        assert self._app is not None
        principal = line.caller.principal()
        answer = await run_line(
            self._app, principal, line.endpoint, line.body, line.traceparent, line.pinned or None
        )
        self._link.tell(LineAnswered(line.line, *answer))

    def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()


def share_caches(caches: dict[str, TTLCache[Any]], tell: Callable[[Forget], None]) -> None:
    """What this process forgets on purpose (a revoked key, a changed deployment, a top-up), every
    process forgets: announce it."""
    for name, cache in caches.items():
        cache.on_forget = lambda key, name=name: tell(Forget(name, key))


__all__ = [
    "ModelhostError",
    "RemoteRuns",
    "RemoteRuntime",
    "RemoteVideos",
    "ReplicaDied",
    "SupervisorLink",
]
