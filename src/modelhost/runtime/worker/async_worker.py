"""The asyncio replica worker shared by the engines that step themselves: vLLM (`runtime.worker.vllm_worker`)
and llama.cpp (`runtime.worker.llamacpp_worker`).

Started by `LocalProcessReplica` like `runtime.worker.sync_worker`, with the same two sockets (the lifeline
and the listening socket every gateway process connects to), and speaking the same replica protocol:
`Generate` → `Events`, `Cancel` → the engine's abort, `StatsRequest` → `Stats`; and, for an engine that
answers a batch task (llama.cpp's embeddings), `Run` → `Started` as it goes to the engine, then `Results`
(the engine batches concurrent requests itself: each runs as it comes). Each worker module loads
and warms up its engine (its own failures, its own words), then hands it to `serve`; everything after
that (peers, the per-turn flushing of events, metrics, traces, `Ready`, the end) is here, once. The
engine is one object, a `StreamingEngine` or a `BatchEngine` (`engines.interface`: what it serves is
which of the two it is).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import signal
import socket
import sys
import time
import traceback
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

import msgspec

from modelhost import tracing
from modelhost.engines.interface import BatchEngine, SelfSteppingEngine, StreamingEngine
from modelhost.generation.contract import (
    GenerationEvent,
    GenerationRequest,
    GenerationStarted,
    Moved,
    Text,
    failed,
)
from modelhost.runtime import metrics
from modelhost.runtime.lifetime import die_with_parent
from modelhost.runtime.replica_protocol import (
    Cancel,
    Event,
    Events,
    Failed,
    FrameReader,
    Generate,
    Handoff,
    LoadFailed,
    Ready,
    Result,
    Results,
    Run,
    Started,
    Stats,
    StatsRequest,
    Stop,
    decode_to_replica,
    encode,
)
from modelhost.runtime.worker.host import HANDOFF_SECONDS, count_generation, trace_event, with_priority

READ_SIZE = 1 << 18


@dataclass(eq=False)
class _Peer:
    """One gateway's (or the supervisor's) connection and the generations it asked for."""

    number: int
    writer: asyncio.StreamWriter
    generations: dict[int, asyncio.Task[None]] = field(default_factory=dict)
    movable: set[int] = field(default_factory=set)  # generations that can go on elsewhere (issue 73)
    moving: set[int] = field(default_factory=set)  # those a drain stops here: each ends with `Moved`
    runs: dict[int, asyncio.Task[None]] = field(default_factory=dict)
    pending: list[Event] = field(default_factory=list)


class AsyncWorker:
    def __init__(self, engine: SelfSteppingEngine, deployment: str, name: str) -> None:
        self.engine = engine
        # the engine as what it serves: generations, or a batch task's requests (the other is None)
        self.streaming = engine if isinstance(engine, StreamingEngine) else None
        self.batch = engine if isinstance(engine, BatchEngine) else None
        self.deployment = deployment
        self.name = name  # the engine's, on traces
        # the same gauge the transformers engine's replicas keep: sequences held (the engine's running
        # and waiting requests are ours until their last event)
        self._generating = metrics.GENERATING.labels(deployment)
        self._generated_tokens = metrics.GENERATION_TOKENS.labels(deployment)
        # their prefix caches as the transformers engine's: a request's prompt tokens and those its
        # engine reused (vLLM's `num_cached_tokens`, llama.cpp's `cache_n`)
        self._prefix_queries = metrics.PREFIX_CACHE_QUERIES.labels(deployment)
        self._prefix_hits = metrics.PREFIX_CACHE_HITS.labels(deployment)
        self._cache_usage = metrics.KV_CACHE_USAGE.labels(deployment)
        self._published_usage: float | None = None
        self._numbers = itertools.count()
        self._peers: set[_Peer] = set()
        self._flush_scheduled: set[_Peer] = set()
        self._handing_off_until = -1.0  # a drain's `Handoff`: generations that can move go elsewhere
        self.stopped = asyncio.Event()
        self._publish_usage()  # from the start: a scrape before the first request sees an idle replica

    @property
    def running(self) -> int:
        return sum(len(peer.generations) for peer in self._peers)

    async def serve_connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        """Read a connection's messages until it closes; True when it said `Stop`."""
        peer = _Peer(next(self._numbers), writer)
        self._peers.add(peer)
        frames = FrameReader()
        try:
            while data := await reader.read(READ_SIZE):
                for body in frames.feed(data):
                    try:
                        message = decode_to_replica(body)
                    except msgspec.DecodeError:
                        traceback.print_exc()
                        return False
                    if isinstance(message, Stop):
                        return True
                    self._receive(peer, message)
            return False
        except ConnectionError:
            return False
        finally:
            self._peers.discard(peer)
            for task in [*peer.generations.values(), *peer.runs.values()]:
                task.cancel()  # the engine aborts a request whose task is cancelled
            writer.close()

    async def serve_gateway(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await self.serve_connection(reader, writer)

    def _receive(self, peer: _Peer, message: Any) -> None:
        if isinstance(message, Generate) and self.streaming is None:
            self._event(peer, message.id, failed("this replica serves a batch task", internal=True))
        elif (
            isinstance(message, Generate)
            and self._moves(message)
            and time.monotonic() < self._handing_off_until
        ):
            self._event(peer, message.id, Moved())  # a drain: it runs elsewhere
        elif isinstance(message, Generate):
            peer.generations[message.id] = asyncio.create_task(self._generate(peer, message))
        elif isinstance(message, Run) and self.batch is None:
            self._send(peer, Failed([message.id], "this replica serves a streaming task"))
        elif isinstance(message, Run):
            peer.runs[message.id] = asyncio.create_task(self._run(peer, message))
        elif isinstance(message, Cancel):
            cancelled = peer.generations.pop(message.id, None) or peer.runs.pop(message.id, None)
            if cancelled is not None:
                cancelled.cancel()
        elif isinstance(message, StatsRequest):
            # a `Run` is held until answered, whether it waits or runs (the engine batches them itself)
            runs = sum(len(other.runs) for other in self._peers)
            self._send(peer, Stats(message.id, runs, self.running))
        elif isinstance(message, Handoff):
            self._handoff()

    def _moves(self, message: Generate) -> bool:
        """Whether its generation can go on on another replica (the engine continues it)."""
        request = message.request
        return (
            isinstance(request, GenerationRequest)
            and self.streaming is not None
            and self.streaming.continues(request)
        )

    def _handoff(self) -> None:
        """A drain: each generation that can go on elsewhere stops here and ends with `Moved`, and so does
        each such that arrives in the next `HANDOFF_SECONDS` (`runtime.worker.host`); the others run to
        their end."""
        self._handing_off_until = time.monotonic() + HANDOFF_SECONDS
        for peer in self._peers:
            for request_id in peer.movable & set(peer.generations):
                peer.moving.add(request_id)
                peer.generations[request_id].cancel()

    def _publish_usage(self) -> None:
        """The engine's KV-cache use (where it says), written only when it changed (each write of a
        metric costs a lock). Called whenever events go out and as a generation ends: a slot engine's
        (llama.cpp's) moves as generations take and give back their slots, vLLM's at its steps, as a
        sequence's blocks fill."""
        usage = self.streaming.cache_usage() if self.streaming is not None else None
        if usage is not None and usage != self._published_usage:
            self._published_usage = usage
            self._cache_usage.set(usage)

    async def _run(self, peer: _Peer, message: Run) -> None:
        """One batch-task request: `Started` as it goes to the engine (a replica that dies then fails
        it; one still waiting may go to another replica), then its output, or `Failed` where the engine
        raised."""
        assert self.batch is not None
        arrived = time.time_ns() if message.trace and tracing.ENABLED else 0
        began = 0

        def started() -> None:
            nonlocal began
            began = time.time_ns()
            self._send(peer, Started([message.id]))

        try:
            output = await self.batch.run(message.item, message.low, started)
        except Exception as exc:  # the engine failed: this request gets an internal error
            traceback.print_exc()
            self._send(peer, Failed([message.id], f"{type(exc).__name__}: {exc}"))
            if self.engine.errored:
                self.stopped.set()
            return
        finally:
            peer.runs.pop(message.id, None)
        self._send(peer, Results([Result(message.id, output)]))
        if arrived:  # a request refused before it reached the engine spent no time in it
            ended = time.time_ns()
            tracing.replica_request_spans(message.trace, self.deployment, arrived, began or ended, ended, 1)

    async def _generate(self, peer: _Peer, message: Generate) -> None:
        request_id = f"{peer.number}-{message.id}"
        self._generating.inc()
        counted = 0  # of the request's tokens, in `modelhost_generation_tokens_total`
        traced = tracing.generation_trace(message.trace, self.deployment, self.name)

        def emit(event: GenerationEvent) -> None:
            nonlocal counted
            if isinstance(event, GenerationStarted):  # it holds its slot now (published as it goes out)
                self._prefix_queries.inc(event.prompt_tokens)
                self._prefix_hits.inc(event.cached_tokens)
            if isinstance(event, Text):
                if event.completion_tokens > counted:
                    self._generated_tokens.inc(event.completion_tokens - counted)
                    counted = event.completion_tokens
                if event.token_ids is None:  # its gateway cannot continue it: a drain lets it finish
                    peer.movable.discard(message.id)
            if traced is not None:
                trace_event(traced, event)
            self._event(peer, message.id, event)

        assert self.streaming is not None
        request = with_priority(message)
        if self._moves(message):
            peer.movable.add(message.id)
        self._send(peer, Started([message.id]))  # begun: not sent to another replica if this one dies
        count_generation(self.deployment, request)
        try:
            if isinstance(request, GenerationRequest):
                await self.streaming.generate(request_id, request, emit)
            else:  # a video job: these engines generate text only
                emit(failed("This engine generates text only.", "model"))
        except asyncio.CancelledError:
            if traced is not None:
                traced.end()
            await self.streaming.abort(request_id)
            if message.id in peer.moving:  # a drain's: its gateway continues it elsewhere
                emit(Moved())
                return
            raise
        except Exception as exc:  # the engine failed: this request gets an internal error
            traceback.print_exc()
            crashed = self.engine.errored  # its engine died under it: never sent to another replica
            message_text = f"{type(exc).__name__}: {exc}"
            emit(failed(message_text, internal=True, crashed=crashed))
            if crashed:
                self.stopped.set()  # the engine is gone: exit, the supervisor starts a replacement
        finally:
            self._generating.dec()
            peer.generations.pop(message.id, None)
            peer.movable.discard(message.id)
            peer.moving.discard(message.id)
            self._publish_usage()

    def _event(self, peer: _Peer, request_id: int, event: GenerationEvent) -> None:
        """Events go out once per turn of the loop, gathered per connection (one frame for every stream
        that moved in a step)."""
        peer.pending.append(Event(request_id, event))
        if peer not in self._flush_scheduled:
            self._flush_scheduled.add(peer)
            asyncio.get_running_loop().call_soon(self._flush, peer)

    def _flush(self, peer: _Peer) -> None:
        self._flush_scheduled.discard(peer)
        events, peer.pending = peer.pending, []
        if events:
            self._send(peer, Events(events))
            self._publish_usage()  # once a turn that moved streams: the KV cache moved with them

    def _send(self, peer: _Peer, message: msgspec.Struct) -> None:
        if not peer.writer.is_closing():
            peer.writer.write(encode(message))


def load_failed(lifeline: socket.socket, reason: str) -> int:
    """Tell the supervisor why the model could not load (its reason goes to the deployment); exit 1."""
    lifeline.sendall(encode(LoadFailed(reason)))
    return 1


async def serve(lifeline: socket.socket, listener: socket.socket, started: float, worker: AsyncWorker) -> int:
    """Serve a loaded engine: `Ready` on the lifeline, the listening socket open to gateways, until the
    supervisor's connection ends (`Stop`, or end-of-file: it is gone) or the engine dies (exit 1). The
    engine is shut down either way."""
    traced = tracing.start("replica")  # on where the gateway's OTEL_* variables name an endpoint
    try:
        reader, writer = await asyncio.open_connection(sock=lifeline)
        writer.write(encode(Ready(time.perf_counter() - started)))
        server = await asyncio.start_unix_server(worker.serve_gateway, sock=listener)
        supervisor = asyncio.create_task(worker.serve_connection(reader, writer))
        stopped = asyncio.create_task(worker.stopped.wait())
        await asyncio.wait({supervisor, stopped}, return_when=asyncio.FIRST_COMPLETED)
        server.close()
        return 1 if stopped.done() else 0
    finally:
        if traced:
            tracing.stop()  # its last spans go out
        worker.engine.shutdown()


def main(run: Callable[[], Coroutine[Any, Any, int]], uvloop: bool = False) -> int:
    """A worker process's life: it dies with its supervisor, exits on SIGTERM, runs `run` in asyncio, on
    uvloop where asked and installed (its loop and transports cost a fraction of asyncio's per event: the
    llama.cpp worker wakes once per streamed token)."""
    die_with_parent()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    with contextlib.suppress(KeyboardInterrupt), _runner(uvloop) as runner:
        return runner.run(run())
    return 0


def _runner(uvloop: bool) -> asyncio.Runner:
    if uvloop:
        with contextlib.suppress(ImportError):  # uvicorn[standard] brings it
            import uvloop as loops

            return asyncio.Runner(loop_factory=loops.new_event_loop)
    return asyncio.Runner()
