"""The hosting loop of a replica, whatever carries its messages: requests in, batches and steps out.

Every gateway process sends its requests straight to the replica, so this is where they meet: a batch
task's requests from all of them wait in one queue and go to the model together, a streaming task's
requests join one engine. Both transports use it, the local worker process (`runtime.worker.sync_worker`, over
Unix sockets) and the Ray Serve replica (`runtime.supervisor.ray_backend`): they feed it messages (`receive`),
run it when it is due (`work`) and send what it has for each connection (`take_outgoing`).

Batching: when the model is free the waiting requests (up to `max_batch`) go in one call. A replica
that was idle starts at once, as waiting would only add latency; right after a batch it waits up to
`max_wait` for as many requests as that batch carried, because under load the callers it just
answered come back within moments and the next call is then as full as the last.

Fair queuing: a batch task's requests wait in one queue per key (the `tenant` of `Run`), and a batch
is filled one request per key in turn, the turn going on from batch to batch (round-robin), so that a
key with many requests waiting does not hold back a key with few; each key's requests keep their order.
Generation is left to its engine's own scheduler.

Priority: a `low` request (a line of a batch job, `modelhost.batches`) waits in queues of its own and
only takes the room in a batch that the interactive requests waiting leave, so that a batch fills a
replica's idle capacity without holding interactive callers back. A model call cannot be interrupted,
so while interactive requests keep arriving (one in the last `BUSY_SECONDS`) a batch carries at most
`LOW_WHILE_BUSY` low requests: an interactive request then never waits behind more than that many
lines' compute, and batch lines go at full batch size again once interactive traffic stops. A
streaming task's `low` requests are handed to its engine marked (`"low": true` in the request): it
admits them after the others.

Traces: a request that carries its gateway's `traceparent` (`Run.trace`, `Generate.trace`; only while
tracing is on) gets the replica's spans in the same trace (`modelhost.tracing`): a batch request's
`replica` span holds its `queue` wait and the `model call` of its batch (with the batch's size); a
generation's `generate` span runs from its start to its last event, with its `prefill` and `decode`,
its time to first token and its tokens. Without one nothing is made.

A connection (`peer`) that closes takes its requests with it: its waiting requests are dropped and its
generations stopped, so a gateway process that dies loses only its own work.
"""

from __future__ import annotations

import itertools
import logging
import math
import time
import traceback
from collections import deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any

import msgspec

from modelhost import tracing
from modelhost.errors import ModelhostError
from modelhost.generation.contract import (
    GenerationEvent,
    GenerationFailed,
    GenerationRequest,
    GenerationStarted,
    Moved,
    StreamRequest,
    Text,
    failed,
    is_last,
)
from modelhost.generation.priority import applied_tier
from modelhost.generation.requests import error_event
from modelhost.runtime import metrics
from modelhost.runtime.replica_protocol import (
    Cancel,
    Event,
    Events,
    Failed,
    Generate,
    Handoff,
    Payload,
    Result,
    Results,
    Run,
    Started,
    Stats,
    StatsRequest,
    ToReplica,
)
from modelhost.tasks.base import AnyTaskHandler, is_streaming

log = logging.getLogger("modelhost.replica")
Peer = Hashable
BUSY_SECONDS = 0.5  # an interactive request this recent means interactive traffic is going on
HANDOFF_SECONDS = 2.0  # after a `Handoff`, generations that arrive are handed off too (`_handoff`)
LOW_WHILE_BUSY = 1  # the low requests a batch may carry meanwhile (module docstring)


@dataclass(eq=False, slots=True)
class _Waiting:
    peer: Peer
    id: int
    item: Payload
    tenant: str = ""
    low: bool = False
    trace: str = ""  # the gateway span's traceparent, "" untraced
    arrived: int = 0  # when it arrived (epoch ns), for a traced request's queue time


@dataclass(eq=False, slots=True)
class _Stream:
    """A generation the streaming handler runs: whose it is, its completion tokens counted so far, and
    its span while traced."""

    peer: Peer
    id: int
    tokens: int = 0
    trace: tracing.GenerationTrace | None = None


def trace_event(trace: tracing.GenerationTrace, event: GenerationEvent) -> None:
    """What a generation's event tells its trace: the prompt prefilled, the tokens so far, the end."""
    if isinstance(event, GenerationStarted):
        trace.prefilled(event.prompt_tokens, event.cached_tokens)
    elif isinstance(event, Text):
        trace.generated(event.completion_tokens)
    if is_last(event):
        trace.end(
            event.finish if isinstance(event, Text) else None, failed=isinstance(event, GenerationFailed)
        )


def with_priority(message: Generate) -> StreamRequest:
    """A generation's request as its engine takes it: marked `low` for a batch line, with the key it
    runs for (`generation.priority`: its number orders that key's requests only) and that tenant's
    weights (`generation.fairness`)."""
    request = message.request
    if message.low:
        request = msgspec.structs.replace(request, low=True)
    if isinstance(request, GenerationRequest) and message.tenant:
        request = msgspec.structs.replace(request, tenant=message.tenant, weights=message.weights)
    return request


def count_generation(deployment: str, request: StreamRequest) -> None:
    """A generation starts: counted by its tier in `modelhost_generation_requests_total` (a tokenizer
    question generates nothing, a video job has no tier)."""
    if isinstance(request, GenerationRequest) and not request.asks_tokenizer:
        metrics.GENERATION_REQUESTS.labels(deployment, applied_tier(request.priority, request.low)).inc()


class ReplicaHost:
    """One replica's model and the work waiting for it (see the module docstring)."""

    def __init__(
        self,
        handler: AnyTaskHandler,
        state: Any,
        *,
        deployment: str,
        max_batch: int,
        max_wait: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._handler = handler
        self._state = state
        self._deployment = deployment
        self._max_batch = max(1, max_batch)
        self._max_wait = max_wait
        self._clock = clock
        self.streaming = is_streaming(handler)
        self._handing_off_until = -math.inf  # a drain's `Handoff`: new generations go elsewhere until then
        self._queues: dict[str, deque[_Waiting]] = {}  # per tenant, in the order of their turns
        self._low_queues: dict[str, deque[_Waiting]] = {}  # the same for `low` requests
        self._queued = 0
        self._waiting: dict[tuple[Peer, int], _Waiting] = {}
        self._last_batch = 1
        self._freed_at: float | None = None  # when the last batch ended (None: idle since)
        self._interactive_at = -BUSY_SECONDS  # when the last interactive request arrived
        self._keys = itertools.count(1)
        self._streams: dict[int, _Stream] = {}  # by the handler's request id
        self._stream_keys: dict[tuple[Peer, int], int] = {}
        self._results: dict[Peer, list[Result]] = {}
        self._events: dict[Peer, list[Event]] = {}
        self._other: list[tuple[Peer, msgspec.Struct]] = []
        self._published: tuple[int, int, float | None] = (-1, -1, None)
        # Sends what is outgoing now (the worker's transport sets it): a generation's `Started` goes out
        # before the handler prepares it, which is where a poisoned request kills a replica
        self.announce: Callable[[], None] = lambda: None
        self._queue_depth = metrics.QUEUE_DEPTH.labels(deployment)
        self._generating = metrics.GENERATING.labels(deployment)
        self._generated_tokens = metrics.GENERATION_TOKENS.labels(deployment)
        self._cache_usage = metrics.KV_CACHE_USAGE.labels(deployment)
        self._prefix_queries = metrics.PREFIX_CACHE_QUERIES.labels(deployment)
        self._prefix_hits = metrics.PREFIX_CACHE_HITS.labels(deployment)
        self._batch_size = metrics.BATCH_SIZE.labels(deployment)
        self._inference_seconds = metrics.INFERENCE_SECONDS.labels(deployment)
        self._publish()  # from the start: a scrape before the first request sees an idle replica

    # ---------------------------------------------------------------- messages in

    def receive(self, peer: Peer, message: ToReplica) -> None:
        if isinstance(message, Run):
            self._run(peer, message)
        elif isinstance(message, Generate):
            self._generate(peer, message)
        elif isinstance(message, Cancel):
            self._cancel(peer, message.id)
        elif isinstance(message, StatsRequest):
            self._other.append((peer, Stats(message.id, self._queued, self.running)))
        elif isinstance(message, Handoff):
            self._handoff()

    def _handoff(self) -> None:
        """A drain: every generation ends with `Moved` (its gateway continues it elsewhere), and so does
        each that arrives in the next `HANDOFF_SECONDS` (from a gateway process that has not heard of the
        drain yet; later, a rollback may have made it serve again); nothing where the engine cannot
        continue another's."""
        if not is_streaming(self._handler) or (keys := self._handler.handoff(self._state)) is None:
            return
        self._handing_off_until = self._clock() + HANDOFF_SECONDS
        for key in keys:
            stream = self._streams.pop(key, None)
            if stream is None:
                continue
            self._stream_keys.pop((stream.peer, stream.id), None)
            if stream.trace is not None:
                stream.trace.end()
            self._event(stream.peer, stream.id, Moved())

    def drop(self, peer: Peer) -> None:
        """The connection closed: forget its waiting requests, stop its generations."""
        for key in [key for key in self._waiting if key[0] == peer]:
            self._cancel(*key)
        for key in [key for key in self._stream_keys if key[0] == peer]:
            self._cancel(*key)
        self._results.pop(peer, None)
        self._events.pop(peer, None)
        self._other = [(p, m) for p, m in self._other if p != peer]

    def _run(self, peer: Peer, message: Run) -> None:
        if self.streaming:
            self._other.append((peer, Failed([message.id], "this replica serves a streaming task")))
            return
        if not message.low:
            self._interactive_at = self._clock()
        waiting = _Waiting(peer, message.id, message.item, message.tenant, message.low)
        if message.trace and tracing.ENABLED:
            waiting.trace, waiting.arrived = message.trace, time.time_ns()
        queues = self._low_queues if message.low else self._queues
        queues.setdefault(message.tenant, deque()).append(waiting)
        self._queued += 1
        self._waiting[peer, message.id] = waiting

    def _generate(self, peer: Peer, message: Generate) -> None:
        if not is_streaming(self._handler):
            self._event(peer, message.id, failed("this replica serves a batch task", internal=True))
            return
        if self._clock() < self._handing_off_until:  # a drain: it runs elsewhere
            self._event(peer, message.id, Moved())
            return
        key = next(self._keys)
        # begun from here on (its template rendered, its grammar compiled): if that kills the replica,
        # its gateway knows not to send it to another (`runtime.gateway.dispatch`)
        self._other.append((peer, Started([message.id])))
        self.announce()
        request = with_priority(message)
        count_generation(self._deployment, request)
        try:
            self._handler.start(self._state, key, request)
        except ModelhostError as exc:  # the request's own fault: its caller gets a 400
            self._event(peer, message.id, error_event(exc))
            return
        traced = tracing.generation_trace(message.trace, self._deployment, "transformers")
        self._streams[key] = _Stream(peer, message.id, trace=traced)
        self._stream_keys[peer, message.id] = key

    def _cancel(self, peer: Peer, request_id: int) -> None:
        waiting = self._waiting.pop((peer, request_id), None)
        if waiting is not None:
            queues = self._low_queues if waiting.low else self._queues
            queue = queues[waiting.tenant]
            queue.remove(waiting)
            self._queued -= 1
            if not queue:
                del queues[waiting.tenant]
            return
        key = self._stream_keys.pop((peer, request_id), None)
        if key is not None and is_streaming(self._handler):
            stream = self._streams.pop(key, None)
            if stream is not None and stream.trace is not None:
                stream.trace.end()
            self._handler.cancel(self._state, key)

    # ---------------------------------------------------------------- work

    @property
    def running(self) -> int:
        """Sequences the streaming handler holds (0 for a batch task)."""
        return self._handler.running(self._state) if is_streaming(self._handler) else 0

    def due(self) -> float | None:
        """Seconds until `work` should run: 0 now, None when there is nothing to do."""
        self._publish()
        if is_streaming(self._handler):
            return None if self._handler.idle(self._state) else 0.0
        if not self._queued:
            return None
        if self._freed_at is not None and self._queued < min(self._max_batch, self._last_batch):
            remaining = self._freed_at + self._max_wait - self._clock()
            if remaining > 0:
                return remaining
        return 0.0

    def work(self, announce: Callable[[], None] | None = None) -> None:
        """One model call: the next batch, or one step of the streaming handler. `announce` is called
        once a batch is chosen, before the model runs: a transport sends what is outgoing then (the
        batch's `Started`), so that a replica that dies in the call leaves its gateways knowing which
        requests it had begun."""
        if is_streaming(self._handler):
            self._step()
        elif self._queued:
            self._batch(announce)

    def _batch(self, announce: Callable[[], None] | None) -> None:
        batch = self._take(min(self._max_batch, self._queued))
        begun: dict[Peer, list[int]] = {}  # the batch's requests, by connection
        for waiting in batch:
            del self._waiting[waiting.peer, waiting.id]
            begun.setdefault(waiting.peer, []).append(waiting.id)
        self._other.extend((peer, Started(ids)) for peer, ids in begun.items())
        if announce is not None:
            announce()
        self._publish()
        started = time.perf_counter()
        started_ns = time.time_ns() if tracing.ENABLED else 0
        try:
            assert not is_streaming(self._handler)  # narrows the handler for the type checker
            outputs = self._handler.run(self._state, [w.item for w in batch])
        except Exception as exc:  # the batch fails, the replica carries on
            traceback.print_exc()
            message = f"{type(exc).__name__}: {exc}"
            self._other.extend((peer, Failed(ids, message)) for peer, ids in begun.items())
        else:
            for waiting, output in zip(batch, outputs, strict=True):
                self._results.setdefault(waiting.peer, []).append(Result(waiting.id, output))
        self._batch_size.observe(len(batch))
        self._inference_seconds.observe(time.perf_counter() - started)
        if started_ns:
            self._trace_batch(batch, started_ns)
        self._last_batch, self._freed_at = len(batch), self._clock()

    def _trace_batch(self, batch: list[_Waiting], started_ns: int) -> None:
        """The spans of each traced request of the batch just run: its wait, its model call."""
        ended_ns = time.time_ns()
        for waiting in batch:
            if waiting.trace:
                tracing.replica_request_spans(
                    waiting.trace, self._deployment, waiting.arrived, started_ns, ended_ns, len(batch)
                )

    def _take(self, count: int) -> list[_Waiting]:
        """Up to `count` waiting requests, interactive ones first, then `low` ones (only
        `LOW_WHILE_BUSY` in all while interactive traffic goes on); within each, one per tenant in
        turn: the tenant whose turn it is gives its oldest and goes to the back of the line (or leaves
        it, having none left)."""
        batch: list[_Waiting] = []
        for queues in (self._queues, self._low_queues):
            if queues is self._low_queues and self._clock() - self._interactive_at < BUSY_SECONDS:
                count = min(count, max(len(batch), LOW_WHILE_BUSY))  # lines add no wait to callers
            while len(batch) < count and queues:
                tenant, queue = next(iter(queues.items()))
                batch.append(queue.popleft())
                del queues[tenant]
                if queue:
                    queues[tenant] = queue
        self._queued -= len(batch)
        return batch

    def _step(self) -> None:
        assert is_streaming(self._handler)
        try:
            events = self._handler.step(self._state)
        except Exception as exc:  # a failed step fails the requests in it, not the replica
            traceback.print_exc()
            failure = failed(f"{type(exc).__name__}: {exc}", internal=True)
            events = [(key, failure) for key in self._handler.abort(self._state)]
        tokens = queried = hits = 0
        for key, event in events:
            if isinstance(event, GenerationStarted):  # its prompt looked up in the prefix cache
                queried, hits = queried + event.prompt_tokens, hits + event.cached_tokens
            stream = self._streams.get(key)
            if stream is None:
                continue  # cancelled meanwhile
            if stream.trace is not None:
                trace_event(stream.trace, event)
            if isinstance(event, Text):
                tokens += event.completion_tokens - stream.tokens
                stream.tokens = event.completion_tokens
            if is_last(event):
                del self._streams[key]
                self._stream_keys.pop((stream.peer, stream.id), None)
            self._event(stream.peer, stream.id, event)
        if tokens:
            self._generated_tokens.inc(tokens)  # once a step: each write of a metric costs a lock
        if queried:
            self._prefix_queries.inc(queried)
            self._prefix_hits.inc(hits)

    def _event(self, peer: Peer, request_id: int, event: GenerationEvent) -> None:
        self._events.setdefault(peer, []).append(Event(request_id, event))

    def _publish(self) -> None:
        """Queue depth, held sequences and the KV cache's use as gauges, written only when they change."""
        usage = self._handler.cache_usage(self._state) if is_streaming(self._handler) else None
        now = (self._queued, self.running, usage)
        if now != self._published:
            self._published = now
            self._queue_depth.set(self._queued)
            self._generating.set(self.running)
            if usage is not None:
                self._cache_usage.set(usage)

    # ---------------------------------------------------------------- messages out

    def take_outgoing(self) -> list[tuple[Peer, msgspec.Struct]]:
        """What to send, per connection: at most one `Results` and one `Events` each, then the rest."""
        outgoing: list[tuple[Peer, msgspec.Struct]] = [(p, Results(r)) for p, r in self._results.items()]
        outgoing += [(p, Events(e)) for p, e in self._events.items()]
        outgoing += self._other
        self._results, self._events, self._other = {}, {}, []
        return outgoing
