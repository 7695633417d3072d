"""One deployment's requests in one gateway process: admission, the choice of replica, the answer.

The supervisor's own requests go through it (to its `Replica` objects) as do every other gateway
process's (to their connections to the same replicas). It bounds what this process has in flight for
the deployment (429 beyond `max_in_flight`), picks the replica this process has the least in flight
with, waits at most `timeout` (504; the replica drops a request whose caller left) and turns what
comes back into the answer or the error the client sees.

A replica that dies (killed, out of memory, crashed) takes its requests with it. The requests still
waiting for it never reached the model: they go to another replica or the replacement (the supervisor
starts one at once), as often as that happens within their deadline. The batch it was running may have
caused the death, but most of it is innocent, and no request of `infer` has a side effect (embeddings,
classification, reranking, every batch task: the same input gives the same answer, and nothing of it
has gone to the client yet), so each of its requests is sent once more, to another replica or the
replacement: a request that its replica dies under a second time is answered 503 naming the crash, so
a request that kills every replica it reaches (a poison input) costs two replicas, not all of them. A
generation is sent once more on the same terms while its caller has had none of its events: a
stream's client until its first event, and a non-streamed answer (marked `WHOLE`: its events are held
here until the generation ends) at any point before its end. After a stream's first event, its death
is a 503 (or an error event of the stream already under way). The client sees only the delay.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import weakref
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from typing import Any, Protocol

from modelhost import tracing
from modelhost.auth.limits import count_tokens
from modelhost.errors import DeploymentUnavailable, GatewayTimeout, InvalidRequest, ModelhostError, Overloaded
from modelhost.runtime import metrics
from modelhost.runtime.replica import ReplicaDied, ReplicaDiedBeforeStart, ReplicaFailed

Payload = dict[str, Any]


class Target(Protocol):
    """A replica as one gateway process reaches it: a `Replica` or a `ReplicaConnection`."""

    @property
    def alive(self) -> bool: ...
    @property
    def in_flight(self) -> int: ...
    async def submit(self, item: Payload, trace: str = "") -> Payload: ...
    def stream(self, request: Payload, trace: str = "") -> AsyncGenerator[Payload, None]: ...


# The live replicas of the deployment now, loading it (or waiting for a replacement) first if need be.
Targets = Callable[[], Awaitable[Sequence[Target]]]
# How long a request that lost its replica waits before looking again for the replacement.
REQUEUE_POLL_SECONDS = 0.05
# Times a request is sent again after its replica died while running it (see the module docstring)
RETRIES_AFTER_CRASH = 1
# The mark of a generation whose caller reads its answer only once it has ended (a non-streamed chat
# completion or completion): `Dispatcher.stream` holds its events until then, and takes the mark off.
WHOLE = "modelhost.whole"


class NoLiveReplica(DeploymentUnavailable):
    """None of the deployment's replicas is running at this moment (one died; its replacement is on its
    way)."""


def item_failure(error: Payload) -> ModelhostError:
    """An item's or event's `error`: the request's own fault (400) unless the replica itself failed."""
    if error.get("internal"):
        return DeploymentUnavailable(f"Inference failed: {error.get('message')}")
    return InvalidRequest(str(error.get("message")), param=error.get("param"), code=error.get("code"))


class Dispatcher:
    def __init__(self, deployment_id: str, max_in_flight: int, timeout: float) -> None:
        self.deployment_id = deployment_id
        self.max_in_flight = max_in_flight
        self.timeout = timeout
        self.outstanding = 0  # requests and generations of this process on the deployment
        self.published = -1  # what the in-flight gauge says
        self._first_token = metrics.TIME_TO_FIRST_TOKEN.labels(deployment_id)
        self._per_token = metrics.TIME_PER_OUTPUT_TOKEN.labels(deployment_id)
        _dispatchers.add(self)
        _ensure_publisher()

    def _admit(self) -> None:
        if self.outstanding >= self.max_in_flight:
            raise Overloaded(
                "The deployment has too many requests in flight; retry shortly.", headers={"Retry-After": "1"}
            )
        self.outstanding += 1

    def _release(self) -> None:
        self.outstanding -= 1

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
                            lost.died(exc)  # raises DeploymentUnavailable the second time it ran
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
        if "error" in output:
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

    async def stream(self, targets: Targets, request: Payload) -> AsyncGenerator[Payload, None]:
        """A generation's events from the least busy live replica; an `error` event is raised. Sent again
        when its replica dies before the first event reached the caller (see the module docstring). A
        request marked `WHOLE` (a non-streamed answer, which its caller reads only once it has ended) has
        its events held here until the generation ends, so that it is sent again whenever it dies."""
        target = _pick(await targets())
        whole = bool(request.get(WHOLE))
        if whole:
            request = {name: value for name, value in request.items() if name != WHOLE}
        self._admit()
        prompt = completion = 0  # its tokens, for rate limits: the prompt's, and those generated so far
        # a span of its own, never the current one: a stream's steps may run in different tasks
        span = tracing.started("dispatch")
        started, first = time.perf_counter(), 0.0  # its dispatch, its first token
        lost, began = Losses(self.deployment_id), False
        held: list[Payload] = []  # a whole answer's events, until its generation ends
        try:
            while True:
                try:
                    events = target.stream(request, tracing.traceparent(span))
                    async with contextlib.aclosing(events):
                        async for event in events:
                            if "error" in event:
                                raise item_failure(event["error"])
                            prompt = int(event.get("prompt_tokens", prompt))
                            completion = int(event.get("completion_tokens", completion))
                            if not first and completion:
                                first = time.perf_counter()
                                self._first_token.observe(first - started)
                            if whole:
                                held.append(event)
                                continue
                            began = True
                            yield event
                    for event in held:
                        yield event
                    return
                except ReplicaDied as exc:
                    if began:  # its first events are the caller's already
                        message = f"The replica serving this request stopped: {exc}."
                        raise DeploymentUnavailable(message) from exc
                    lost.died(exc)
                    held.clear()
                    async with asyncio.timeout(self.timeout):  # the replacement's start, within a bound
                        target = await self._live(await targets(), targets)
        except TimeoutError as exc:
            raise DeploymentUnavailable(
                "The replica serving this request stopped and no replacement was ready within "
                f"{self.timeout:g} seconds; retry shortly."
            ) from exc
        finally:
            self._release()
            count_tokens(prompt, completion)
            if completion > 1:
                self._per_token.observe((time.perf_counter() - first) / (completion - 1))
            if span is not None:
                tracing.span_ended(span, prompt, completion)


class Losses:
    """The replicas one request lost (see the module docstring): those that died before running it, any
    number of times; one that died while running it, once."""

    def __init__(self, deployment_id: str) -> None:
        self.deployment_id = deployment_id
        self.requeued = 0  # times it was sent again
        self.crashed = 0  # replicas that died while running it

    def died(self, exc: ReplicaDied) -> None:
        """Its replica died: it may be sent again (counted), else DeploymentUnavailable naming the crash."""
        if not isinstance(exc, ReplicaDiedBeforeStart):
            self.crashed += 1
            if self.crashed > RETRIES_AFTER_CRASH:
                raise DeploymentUnavailable(
                    f"The replica serving this request stopped while running it ({exc}), and so did the "
                    "replica it was sent to again: it is not sent a third time, since it may be what "
                    "stops them."
                ) from exc
        self.requeued += 1
        metrics.REQUESTS_REQUEUED.labels(self.deployment_id).inc()
        tracing.current_attributes({"modelhost.requeued": True})


# The in-flight gauge is written by one task per process every PUBLISH_SECONDS, not per request: in
# multiprocess mode every write of a metric costs a lock and a pid check (about 5 % of a request).
PUBLISH_SECONDS = 0.05
_dispatchers: weakref.WeakSet[Dispatcher] = weakref.WeakSet()
_publisher: asyncio.Task[None] | None = None


def _ensure_publisher() -> None:
    global _publisher
    if _publisher is None or _publisher.done():
        with contextlib.suppress(RuntimeError):  # no running loop (built outside one): next time
            _publisher = asyncio.get_running_loop().create_task(_publish_forever())


async def _publish_forever() -> None:
    while True:
        for dispatcher in list(_dispatchers):
            if dispatcher.published != dispatcher.outstanding:
                dispatcher.published = dispatcher.outstanding
                metrics.IN_FLIGHT.labels(dispatcher.deployment_id).set(dispatcher.outstanding)
        await asyncio.sleep(PUBLISH_SECONDS)


def _pick(targets: Sequence[Target]) -> Target:
    live = [t for t in targets if t.alive]
    if not live:
        raise NoLiveReplica("The deployment has no running replica; retry shortly.")
    return live[0] if len(live) == 1 else min(live, key=lambda t: t.in_flight)
