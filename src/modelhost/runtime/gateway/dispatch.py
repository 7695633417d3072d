"""One deployment's requests in one gateway process: admission, the choice of replica, the answer.

The supervisor's own requests go through it (to its `Replica` objects) as do every other gateway
process's (to their connections to the same replicas). It bounds what this process has in flight for
the deployment (429 beyond `max_in_flight`), picks the replica this process has the least in flight
with, waits at most `timeout` (504; the replica drops a request whose caller left) and turns what
comes back into the answer or the error the client sees.

A replica that dies (killed, out of memory, crashed) takes its requests with it. The requests still
waiting for it never reached the model: they go to another replica or the replacement (the supervisor
starts one at once), as often as that happens within their deadline. A request the replica had begun
(`Started`: a batch it was running, a generation it had taken, its prompt rendered and its grammar
compiled) is never sent again, whatever killed the replica: it may be what killed it, and a poisoned
request must cost one replica, not every replica it reaches (on a shared base, other accounts'). Its
caller gets a 502 `replica_crashed` (`errors.Crashed`, with `x-should-retry: false` so that the OpenAI
and Anthropic SDKs do not send it again either), or that error as the last event of a stream already
under way. A vLLM replica whose engine died says so in the request's error event (`crashed`), which is
the same 502. The replica itself is replaced as for any death.

A generation is the exception, once (issue 73): one that has sent its client at least one token, from an
engine that says which tokens (`Text.token_ids`), continues on another replica (or the replacement) as
a continuation, its prompt followed by the tokens already sent (`GenerationRequest.continued`); the
client's stream goes on with no token repeated or missing. If that replica dies too, the request fails
as above: a poisoned request costs at most two replicas.

A replica that drains (a rollout's old version, a scale-down) hands its generations off instead of
finishing them: each ends with a `Moved` event, and the dispatcher raises `MovedAway` with the request
that continues it (the one sent, if it had not begun). The runtime as callers see it
(`runtime.gateway.adapters`) sends that on to the deployment's serving replicas, whichever version
they are now.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from typing import Any, Protocol

import msgspec

from modelhost import tracing
from modelhost.auth.limits import count_tokens
from modelhost.errors import (
    Crashed,
    DeploymentUnavailable,
    GatewayTimeout,
    InvalidRequest,
    ModelhostError,
    Overloaded,
    is_item_error,
)
from modelhost.generation.contract import (
    GenerationEvent,
    GenerationFailed,
    GenerationRequest,
    GenerationStarted,
    Moved,
    StreamRequest,
    Text,
    failed,
)
from modelhost.metrics import TALLY
from modelhost.runtime import metrics
from modelhost.runtime.gateway import routing
from modelhost.runtime.replica import ReplicaDied, ReplicaDiedBeforeStart, ReplicaFailed

Payload = dict[str, Any]


class Target(Protocol):
    """A replica as one gateway process reaches it: a `Replica` or a `ReplicaConnection`."""

    @property
    def alive(self) -> bool: ...
    @property
    def in_flight(self) -> int: ...
    @property
    def route(self) -> str:
        """The replica's name for routing, the same in every gateway process (`routing`)."""
        ...

    async def submit(self, item: Payload, trace: str = "") -> Payload: ...
    def stream(self, request: StreamRequest, trace: str = "") -> AsyncGenerator[GenerationEvent, None]: ...


# The live replicas of the deployment now, loading it (or waiting for a replacement) first if need be.
Targets = Callable[[], Awaitable[Sequence[Target]]]
# How long a request that lost its replica waits before looking again for the replacement.
REQUEUE_POLL_SECONDS = 0.05
# The mark of a generation whose caller reads its answer only once it has ended (a non-streamed chat
# completion or completion): `Dispatcher.stream` holds its events until then, and takes the mark off.


class NoLiveReplica(DeploymentUnavailable):
    """None of the deployment's replicas is running at this moment (one died; its replacement is on its
    way)."""


def item_failure(error: Payload | GenerationFailed) -> ModelhostError:
    """A batch item's `error` or a generation's `GenerationFailed`: the request's own fault (400) unless
    the replica itself failed (`crashed`: its engine died while running it, see the module docstring)."""
    if isinstance(error, dict):
        error = failed(
            str(error.get("message")),
            error.get("param"),
            error.get("code"),
            internal=bool(error.get("internal")),
            crashed=bool(error.get("crashed")),
        )
    if error.crashed:
        return _crashed(error.message)
    if error.internal:
        return DeploymentUnavailable(f"Inference failed: {error.message}")
    return InvalidRequest(error.message, param=error.param, code=error.code)


class Dispatcher:
    def __init__(
        self,
        deployment_id: str,
        max_in_flight: int,
        timeout: float,
        max_imbalance: int = 2,
        by_prefix: bool = True,
        artifact_id: str | None = None,
    ) -> None:
        self.deployment_id = deployment_id
        self.max_in_flight = max_in_flight
        self.timeout = timeout
        self.max_imbalance = max_imbalance  # routing: how much busier a request's own replica may be
        self.by_prefix = by_prefix  # False: the least busy replica, blind to caches
        self.outstanding = 0  # requests and generations of this process on the deployment
        # Every time to first token observed here, summed, and how many: the supervisor's autoscaler
        # reads what changed since its last sample (totals: nothing grows where no one reads them)
        self.first_token_seconds = 0.0
        self.first_tokens = 0
        self._labels = (deployment_id,)  # of its metrics, written with the process's others (`TALLY`)
        # a version's (`artifact_id`): its time to first token is also counted as that version's
        self._version_labels = None if artifact_id is None else (deployment_id, artifact_id)
        self._publish()

    def _admit(self) -> None:
        if self.outstanding >= self.max_in_flight:
            raise Overloaded(
                "The deployment has too many requests in flight; retry shortly.", headers={"Retry-After": "1"}
            )
        self.outstanding += 1
        self._publish()

    def _release(self) -> None:
        self.outstanding -= 1
        self._publish()

    def _publish(self) -> None:
        """The in-flight gauge, written with the process's other metrics within `FLUSH_SECONDS`."""
        TALLY.set(metrics.IN_FLIGHT, self._labels, self.outstanding)

    async def infer(self, targets: Targets, item: Payload) -> Payload:
        """One request of a batch task, answered by the least busy live replica; sent again, within its
        deadline, when its replica dies (see the module docstring)."""
        with tracing.step("wait for replica"):  # a cold start happens here, before the deadline runs
            live = await targets()
        self._admit()
        lost = Losses(self.deployment_id)
        try:
            async with asyncio.timeout(self.timeout):  # no task of its own, unlike `wait_for`
                with tracing.step("dispatch", kind=tracing.CLIENT):  # the replica's spans join it
                    while True:
                        target = await self._live(live, targets)
                        try:
                            output = await target.submit(item, tracing.parent())
                            break
                        except ReplicaDied as exc:
                            lost.died(exc)  # raises `Crashed` where the replica had begun it
                            live = await targets()  # the others, or the replacement's start
        except TimeoutError as exc:
            if lost.requeued:
                raise DeploymentUnavailable(
                    "The replica serving this request stopped and no replacement was ready within "
                    f"{self.timeout:g} seconds; retry shortly."
                ) from exc
            raise GatewayTimeout(f"The request did not finish within {self.timeout:g} seconds.") from exc
        except ReplicaFailed as exc:
            raise DeploymentUnavailable(f"Inference failed: {exc}") from exc
        finally:
            self._release()
        if is_item_error(output):
            raise item_failure(output["error"])
        tokens = output.get("tokens")
        if isinstance(tokens, int):  # the input tokens of embeddings and reranking (rate limits)
            count_tokens(tokens)
        return output

    @staticmethod
    async def _live(live: Sequence[Target], targets: Targets) -> Target:
        """The least busy of `live`; while none of them runs (one died, its replacement is on its way),
        `targets` is asked again every moment until the caller's deadline."""
        while True:
            try:
                return _pick(live)
            except NoLiveReplica:
                await asyncio.sleep(REQUEUE_POLL_SECONDS)
                live = await targets()

    async def stream(self, targets: Targets, request: StreamRequest) -> AsyncGenerator[GenerationEvent, None]:
        """A generation's events from the live replica most likely to hold its prompt's prefix, unless
        that one is much busier than the least busy (`routing`); an `error` event is raised. Sent again,
        to the least busy, when its replica dies before it had begun it (see the module docstring). A
        request marked `whole` (a non-streamed answer, which its caller reads only once it has ended)
        has its events held here until the generation ends."""
        affinity = routing.affinity_of(request) if self.by_prefix else ""
        target = _pick(await targets(), affinity, self.max_imbalance)
        whole = request.whole
        if whole:  # the mark is the gateway's
            request = msgspec.structs.replace(request, whole=False)
        self._admit()
        prompt = completion = 0  # its tokens, for rate limits: the prompt's, and those generated so far
        # a span of its own, never the current one: a stream's steps may run in different tasks
        span = tracing.started("dispatch")
        started, first = time.perf_counter(), 0.0  # its dispatch, its first token
        lost = Losses(self.deployment_id)
        sent = Sent(request)
        held: list[GenerationEvent] = []  # a whole answer's events, until its generation ends
        try:
            while True:
                try:
                    events = target.stream(request, tracing.traceparent(span))
                    async with contextlib.aclosing(events):
                        async for event in events:
                            if isinstance(event, GenerationFailed):
                                raise item_failure(event)
                            if isinstance(event, GenerationStarted):
                                if sent.started:  # its client has had the first replica's
                                    continue
                                sent.started, prompt = True, event.prompt_tokens
                            elif isinstance(event, Text):
                                completion = event.completion_tokens
                                sent.add(event)
                            elif isinstance(event, Moved):
                                for held_event in held:  # what it sent so far, before it goes on
                                    yield held_event
                                metrics.GENERATIONS_MIGRATED.labels(self.deployment_id, "drained").inc()
                                raise MovedAway(sent.moved(request))
                            if not first and completion and not sent.carried_in:  # a continuation: none
                                first = time.perf_counter()
                                TALLY.observe(metrics.TIME_TO_FIRST_TOKEN, self._labels, first - started)
                                if self._version_labels is not None:
                                    TALLY.observe(
                                        metrics.VERSION_TIME_TO_FIRST_TOKEN,
                                        self._version_labels,
                                        first - started,
                                    )
                                self.first_token_seconds += first - started
                                self.first_tokens += 1
                            if whole:
                                held.append(event)
                                continue
                            yield event
                    for event in held:
                        yield event
                    return
                except ReplicaDied as exc:
                    continuation = sent.continuation(request, completion, exc)
                    if continuation is not None:
                        request = continuation
                        metrics.GENERATIONS_MIGRATED.labels(self.deployment_id, "died").inc()
                        tracing.current_attributes({"modelhost.migrated": True})
                    else:
                        lost.died(exc)  # raises `Crashed` where the replica had begun it
                    async with asyncio.timeout(self.timeout):  # the replacement's start, within a bound
                        target = await self._live(await targets(), targets)
        except TimeoutError as exc:
            raise DeploymentUnavailable(
                "The replica serving this request stopped and no replacement was ready within "
                f"{self.timeout:g} seconds; retry shortly."
            ) from exc
        finally:
            self._release()
            count_tokens(prompt, max(0, completion - sent.carried))  # a continuation's carried: counted
            if completion > 1 and first:
                per_token = (time.perf_counter() - first) / (completion - 1)
                TALLY.observe(metrics.TIME_PER_OUTPUT_TOKEN, self._labels, per_token)
            if span is not None:
                tracing.span_ended(span, prompt, completion)


class Losses:
    """The replicas one request lost before they began it (see the module docstring)."""

    def __init__(self, deployment_id: str) -> None:
        self.deployment_id = deployment_id
        self.requeued = 0  # times it was sent again

    def died(self, exc: ReplicaDied) -> None:
        """Its replica died: sent again (counted) if the replica had not begun it, else `Crashed`."""
        if not isinstance(exc, ReplicaDiedBeforeStart):
            raise _crashed(str(exc)) from exc
        self.requeued += 1
        metrics.REQUESTS_REQUEUED.labels(self.deployment_id).inc()
        tracing.current_attributes({"modelhost.requeued": True})


class MovedAway(Exception):
    """The replica handed the generation off (a drain): `request` continues it elsewhere."""

    def __init__(self, request: StreamRequest) -> None:
        super().__init__("the replica handed the generation off")
        self.request = request


class Sent:
    """What one generation has sent its client, as far as a continuation needs it: its output tokens'
    IDs, while every event has said them (see the module docstring). A continuation starts with the
    tokens it carries: its client has had their text and the first replica's `Started`."""

    def __init__(self, request: StreamRequest) -> None:
        carried = request.continued if isinstance(request, GenerationRequest) else None
        self.tokens: list[int] = list(carried or ())
        # the tokens up to the last whose event had text: a continuation starts there, so that text an
        # engine held back (a character's first bytes) is not lost; the tokens after it come again
        self.clean = len(self.tokens)
        self.carried = len(self.tokens)  # counted where they were generated
        self.carried_in = carried is not None
        self.started = carried is not None  # its client has had a `Started`
        self.known = True  # every token sent so far came with its ID
        self.migrated = carried is not None  # moved once: a death then fails it (at most two replicas)

    def add(self, event: Text) -> None:
        if event.token_ids is None:
            self.known = False
        else:
            self.tokens += event.token_ids
            if event.text:
                self.clean = len(self.tokens)

    def continuation(self, request: StreamRequest, completion: int, exc: ReplicaDied) -> StreamRequest | None:
        """The request that carries on where its dead replica stopped; None where it cannot: nothing
        sent yet (the rules of `Losses` apply), an engine that does not say its tokens, or moved once
        already."""
        if not isinstance(request, GenerationRequest) or isinstance(exc, ReplicaDiedBeforeStart):
            return None
        if self.migrated or not completion or not self.known or len(self.tokens) != completion:
            return None
        self.migrated = True
        return self._continued(request)

    def moved(self, request: StreamRequest) -> StreamRequest:
        """The request that continues a generation its replica handed off: the one sent, where it had
        not begun; else a continuation from the tokens sent (none yet, maybe)."""
        if not self.started or not isinstance(request, GenerationRequest):
            return request
        if not self.known:  # an engine that hands off says its tokens: never reached
            raise _crashed("it was handed off without its tokens")
        return self._continued(request)

    def _continued(self, request: GenerationRequest) -> GenerationRequest:
        """`request` going on after the last token whose text was sent (those after it come again)."""
        del self.tokens[self.clean :]
        return msgspec.structs.replace(request, continued=list(self.tokens))


def _crashed(why: str) -> Crashed:
    return Crashed(
        f"The replica running this request stopped while running it ({why}). It is not sent to another "
        "replica, since it may be what stopped it; a replacement is starting."
    )


def _pick(targets: Sequence[Target], affinity: str = "", max_imbalance: int = 0) -> Target:
    live = [t for t in targets if t.alive]
    if not live:
        raise NoLiveReplica("The deployment has no running replica; retry shortly.")
    return routing.choose(live, affinity, max_imbalance)
