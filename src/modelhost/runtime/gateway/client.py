"""A gateway's connection to one replica: send requests, get their answers and events back.

Every gateway process (and the supervisor, over the replica's lifeline) holds one connection per
replica it uses. Requests are written without waiting (frames written in one event-loop turn go out
in one system call) and answers are matched to their callers by ID. A caller that gives up (timeout,
client gone) sends `Cancel`, so the replica drops the request before it reaches the model. When the
replica's process dies, every caller waiting on it gets `ReplicaDied`: `ReplicaDiedBeforeStart` for a
request (or generation) the replica had not yet begun (it never announced it `Started`), which may be
sent elsewhere; a request it had begun is not (`runtime.gateway.dispatch`).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections import deque
from collections.abc import AsyncGenerator, Callable
from typing import Any, cast

import msgspec

from modelhost.auth.principal import current_tenant, current_weights, low_priority
from modelhost.generation.contract import GenerationEvent, StreamRequest, is_last
from modelhost.runtime.replica import ReplicaDied, ReplicaDiedBeforeStart, ReplicaFailed
from modelhost.runtime.replica_protocol import (
    Cancel,
    Events,
    Failed,
    FrameReader,
    FromReplica,
    Generate,
    LoadFailed,
    Payload,
    Ready,
    Results,
    Run,
    Started,
    Stats,
    StatsRequest,
    decode_from_replica,
    encode,
)


class EventChannel:
    """A stream's events on their way from the replica's connection to the stream's one reader.

    `asyncio.Queue` does the same with a dozen calls per item (its waiters' list, its size checks, its
    loop's lookup): about a tenth of a gateway's CPU per output token (issue 71). Here an item is
    appended, and the reader's one future, when it waits, is set."""

    __slots__ = ("_items", "_waiter")

    def __init__(self) -> None:
        self._items: deque[GenerationEvent | BaseException] = deque()
        self._waiter: asyncio.Future[None] | None = None

    def put_nowait(self, item: GenerationEvent | BaseException) -> None:
        self._items.append(item)
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():  # cancelled: its reader has gone
                waiter.set_result(None)

    async def get(self) -> GenerationEvent | BaseException:
        while not self._items:
            self._waiter = asyncio.get_running_loop().create_future()
            await self._waiter
        return self._items.popleft()


class Waiters:
    """Callers waiting for a replica's answers, by request ID: a future per call, a queue per stream.
    Both sides of a replica's conversation use it: a gateway's connection, and a Serve replica's own
    event loop answering its callers from its host."""

    def __init__(self) -> None:
        self.calls: dict[int, asyncio.Future[Any]] = {}
        self.streams: dict[int, EventChannel] = {}
        self.started: set[int] = set()  # calls and streams the replica has begun (`Started`), until answered

    def __len__(self) -> int:
        return len(self.calls) + len(self.streams)

    def answer(self, message: FromReplica) -> bool:
        """Hand a replica's message to its callers; False for a message that is no answer."""
        if isinstance(message, Started):
            self.started.update(i for i in message.ids if i in self.calls or i in self.streams)
        elif isinstance(message, Results):
            for result in message.results:
                self.resolve(result.id, result.output)
        elif isinstance(message, Events):
            for event in message.events:
                queue = self.streams.get(event.id)
                if queue is not None:
                    queue.put_nowait(event.event)
        elif isinstance(message, Failed):
            for request_id in message.ids:
                self.started.discard(request_id)
                future = self.calls.pop(request_id, None)
                if future is not None and not future.done():
                    future.set_exception(ReplicaFailed(message.message))
        elif isinstance(message, Stats):
            self.resolve(message.id, message)
        else:
            return False
        return True

    def resolve(self, request_id: int, value: Any) -> None:
        """Answer a waiting caller; one that is no longer waiting (it sent `Cancel`) is ignored."""
        self.started.discard(request_id)
        future = self.calls.pop(request_id, None)
        if future is not None and not future.done():
            future.set_result(value)

    async def stream(
        self, request_id: int, send: Callable[[Generate | Cancel], None], request: StreamRequest, trace: str
    ) -> AsyncGenerator[GenerationEvent, None]:
        """Send `Generate` and yield the stream's events until its last. Closing the iterator early
        (the caller left) sends `Cancel`: the replica drops the sequence before its next step."""
        queue = self.streams[request_id] = EventChannel()
        try:
            send(Generate(request_id, request, low_priority(), trace, current_tenant(), current_weights()))
        except ReplicaDied as exc:  # never sent: free to go to another replica
            self.streams.pop(request_id, None)
            raise ReplicaDiedBeforeStart(str(exc)) from exc
        finished = False
        try:
            while not finished:
                event = await queue.get()
                if isinstance(event, BaseException):
                    raise event
                finished = is_last(event)
                yield event
        finally:
            self.streams.pop(request_id, None)
            self.started.discard(request_id)
            if not finished:
                with contextlib.suppress(ReplicaDied):  # gone: nothing is left to cancel
                    send(Cancel(request_id))

    def fail_all(self, error: ReplicaDied) -> None:
        """The replica is gone: the calls and streams it had begun fail with `error`, the others with
        `ReplicaDiedBeforeStart` (free to run elsewhere)."""
        waiting = ReplicaDiedBeforeStart(str(error))
        for request_id, future in self.calls.items():
            if not future.done():
                future.set_exception(error if request_id in self.started else waiting)
        for request_id, queue in self.streams.items():
            queue.put_nowait(error if request_id in self.started else waiting)
        self.started.clear()


class ReplicaConnection(asyncio.Protocol):
    """One connection to a replica (see the module docstring). `on_lost` is called once when it ends."""

    def __init__(self, on_lost: Callable[[ReplicaConnection], None] | None = None) -> None:
        self.route = ""  # the replica's socket path, set by `open`: its name for routing
        self._on_lost = on_lost
        self._transport: asyncio.Transport | None = None
        self._reader = FrameReader()
        self._ids = itertools.count(1)
        self._waiting = Waiters()
        self._unsent: list[bytes] = []
        self._lost: BaseException | None = None
        # The lifeline's first message: whether the model loaded (`Ready` / `LoadFailed`).
        self.hello: asyncio.Future[Ready | LoadFailed] = asyncio.get_running_loop().create_future()

    @classmethod
    async def open(
        cls, path: str, on_lost: Callable[[ReplicaConnection], None] | None = None
    ) -> ReplicaConnection:
        """Connect to a replica's published socket."""
        _, connection = await asyncio.get_running_loop().create_unix_connection(lambda: cls(on_lost), path)
        assert isinstance(connection, ReplicaConnection)
        connection.route = path
        return connection

    @property
    def alive(self) -> bool:
        return self._transport is not None and self._lost is None

    @property
    def in_flight(self) -> int:
        return len(self._waiting)

    # ---------------------------------------------------------------- requests

    async def submit(self, item: Payload, trace: str = "") -> Payload:
        """One request of a batch task: the replica batches it; its output (or an item error dict).
        `trace`: the `traceparent` the replica's spans join."""
        request_id = next(self._ids)
        future: asyncio.Future[Payload] = asyncio.get_running_loop().create_future()
        self._waiting.calls[request_id] = future
        try:
            self._write(Run(request_id, item, current_tenant(), low_priority(), trace))
        except ReplicaDied as exc:  # never sent: free to go to another replica
            del self._waiting.calls[request_id]
            raise ReplicaDiedBeforeStart(str(exc)) from exc
        try:
            return await future
        finally:  # still registered: the caller gave up before the answer; the replica drops it
            self._waiting.started.discard(request_id)
            if self._waiting.calls.pop(request_id, None) is not None and self.alive:
                self._write(Cancel(request_id))

    def stream(self, request: StreamRequest, trace: str = "") -> AsyncGenerator[GenerationEvent, None]:
        """A generation's events until its last; closing the iterator early (client gone) cancels it
        in the replica at its next step. The waiters' own generator, not one around it: a layer less
        for every token."""
        return self._waiting.stream(next(self._ids), self._write, request, trace)

    async def stats(self) -> Stats:
        request_id = next(self._ids)
        future: asyncio.Future[Stats] = asyncio.get_running_loop().create_future()
        self._waiting.calls[request_id] = future
        self._write(StatsRequest(request_id))
        try:
            return await future
        finally:
            self._waiting.calls.pop(request_id, None)

    def send(self, message: msgspec.Struct) -> None:
        """A message that expects no answer (`Stop`, `Handoff`)."""
        self._write(message)

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()

    # ---------------------------------------------------------------- asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's are not asyncio's subclasses

    def data_received(self, data: bytes) -> None:
        for body in self._reader.feed(data):
            self._dispatch(decode_from_replica(body))

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost = ReplicaDied("the replica's worker process exited")
        self._waiting.fail_all(self._lost)
        if not self.hello.done():
            self.hello.set_exception(self._lost)
            self.hello.exception()  # marked read: only the supervisor's lifeline ever awaits a hello
        if self._on_lost is not None:
            self._on_lost(self)

    # ---------------------------------------------------------------- internals

    def _dispatch(self, message: FromReplica) -> None:
        if isinstance(message, Ready | LoadFailed):  # on the lifeline, once
            if not self.hello.done():
                self.hello.set_result(message)
        else:
            self._waiting.answer(message)

    def _write(self, message: msgspec.Struct) -> None:
        """Queue a frame; every frame queued in this event-loop turn goes out in one write."""
        if self._lost is not None or self._transport is None:
            raise self._lost or ReplicaDied("the replica is not connected")
        if not self._unsent:
            asyncio.get_running_loop().call_soon(self._flush)
        self._unsent.append(encode(message))

    def _flush(self) -> None:
        frames, self._unsent = self._unsent, []
        if self._transport is not None and not self._transport.is_closing():
            self._transport.write(b"".join(frames) if len(frames) > 1 else frames[0])


async def connect_pair(sock: Any, on_lost: Callable[[ReplicaConnection], None]) -> ReplicaConnection:
    """A connection over an already connected socket (the supervisor's end of a replica's lifeline)."""
    _, connection = await asyncio.get_running_loop().create_unix_connection(
        lambda: ReplicaConnection(on_lost), sock=sock
    )
    assert isinstance(connection, ReplicaConnection)
    return connection
