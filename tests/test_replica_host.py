"""The replica's hosting loop without processes: batching, cancellation, connections that close.

`ReplicaHost` is what a local worker and a Ray Serve replica both run; here a fake handler records the
batches it is given and a fake clock stands in for time.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncGenerator, Awaitable, Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest

from modelhost.errors import Crashed, InvalidRequest
from modelhost.generation.contract import GenerationRequest, GenerationStarted, Moved, Sampling, Text
from modelhost.metrics import sample
from modelhost.runtime.gateway.client import Waiters
from modelhost.runtime.gateway.dispatch import Dispatcher, MovedAway
from modelhost.runtime.replica import ReplicaDied, ReplicaDiedBeforeStart
from modelhost.runtime.replica_protocol import (
    Cancel,
    Event,
    Events,
    Failed,
    FrameReader,
    Generate,
    Handoff,
    Result,
    Results,
    Run,
    Started,
    Stats,
    StatsRequest,
    decode_from_replica,
    decode_to_replica,
    encode,
)
from modelhost.runtime.worker.host import ReplicaHost


class Recorder:
    """A batch task that answers each item with its text upper-cased and remembers every batch."""

    def __init__(self, fail: bool = False) -> None:
        self.batches: list[list[str]] = []
        self.fail = fail

    def load(self, model_dir: Path, device: str) -> None: ...
    def warmup_item(self) -> dict[str, Any]:
        return {"text": ""}

    def run(self, model: Any, batch: list[dict[str, Any]]) -> list[dict[str, Any]]:
        self.batches.append([item["text"] for item in batch])
        if self.fail:
            raise RuntimeError("the model broke")
        return [{"text": item["text"].upper()} for item in batch]


class Counter:
    """A streaming task: each request counts up to its `n`, one number per step, then finishes."""

    streaming = True

    def __init__(self) -> None:
        self.left: dict[int, int] = {}

    def load(self, model_dir: Path, device: str) -> None: ...
    def warmup(self, state: Any) -> None: ...
    def start(self, state: Any, request_id: int, request: Any) -> None:
        n = request.params.max_tokens
        if n < 1:
            raise InvalidRequest("n must be positive", param="n")
        self.left[request_id] = n

    def cancel(self, state: Any, request_id: int) -> None:
        self.left.pop(request_id, None)

    def step(self, state: Any) -> list[tuple[int, Text]]:
        events: list[tuple[int, Text]] = []
        for key in list(self.left):
            self.left[key] -= 1
            done = self.left[key] == 0
            events.append((key, Text(finish="stop") if done else left(self.left[key])))
            if done:
                del self.left[key]
        return events

    def abort(self, state: Any) -> list[int]:
        keys, self.left = list(self.left), {}
        return keys

    def handoff(self, state: Any) -> list[int] | None:
        return self.abort(state)

    def idle(self, state: Any) -> bool:
        return not self.left

    def running(self, state: Any) -> int:
        return len(self.left)

    def cache_usage(self, state: Any) -> None:
        return None


def left(n: int) -> Text:
    """`Counter`'s event for a step that leaves `n` to count."""
    return Text(text=f"{n} left")


def counting(n: int, whole: bool = False) -> GenerationRequest:
    """A request `Counter` counts up to `n` for (as many tokens)."""
    return GenerationRequest(params=Sampling(max_tokens=n), whole=whole)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def host_of(
    handler: Any, clock: Clock | None = None, max_batch: int = 4, max_wait: float = 0.005
) -> ReplicaHost:
    clock = clock or Clock()
    return ReplicaHost(handler, None, deployment="dep_t", max_batch=max_batch, max_wait=max_wait, clock=clock)


def answers(host: ReplicaHost) -> dict[str, list[Any]]:
    """What the host sends, by connection: results as (id, text), events as (id, event), the rest but
    the `Started` announcements (tested on their own)."""
    sent: dict[str, list[Any]] = {}
    for peer, message in host.take_outgoing():
        if isinstance(message, Started):
            continue
        box = sent.setdefault(str(peer), [])
        if isinstance(message, Results):
            box += [(r.id, r.output["text"]) for r in message.results]
        elif isinstance(message, Events):
            box += [(e.id, e.event) for e in message.events]
        else:
            box.append(message)
    return sent


def test_requests_of_every_connection_meet_in_one_batch_in_arrival_order() -> None:
    recorder = Recorder()
    host = host_of(recorder)
    host.receive("gateway-1", Run(1, {"text": "a"}))
    host.receive("gateway-2", Run(1, {"text": "b"}))
    host.receive("gateway-1", Run(2, {"text": "c"}))
    assert host.due() == 0
    host.work()
    assert recorder.batches == [["a", "b", "c"]]
    assert answers(host) == {"gateway-1": [(1, "A"), (2, "C")], "gateway-2": [(1, "B")]}


def test_a_batch_takes_at_most_max_batch_requests_and_the_rest_wait_their_turn() -> None:
    recorder = Recorder()
    host = host_of(recorder, max_batch=4, max_wait=0)
    for i in range(10):
        host.receive("g", Run(i, {"text": str(i)}))
    while host.due() == 0:
        host.work()
    assert recorder.batches == [["0", "1", "2", "3"], ["4", "5", "6", "7"], ["8", "9"]]
    assert host.due() is None  # nothing left to do


def test_a_batch_takes_one_request_per_key_in_turn_so_a_busy_key_does_not_hold_back_another() -> None:
    recorder = Recorder()
    host = host_of(recorder, max_batch=4, max_wait=0)
    for i in range(8):
        host.receive("g", Run(i, {"text": f"a{i}"}, "key_a"))
    host.receive("other-gateway", Run(1, {"text": "b0"}, "key_b"))  # the key, not the connection, counts
    while host.due() == 0:
        host.work()
    assert recorder.batches == [["a0", "b0", "a1", "a2"], ["a3", "a4", "a5", "a6"], ["a7"]]
    assert answers(host)["other-gateway"] == [(1, "B0")]


def test_the_turn_between_keys_carries_on_from_one_batch_to_the_next() -> None:
    recorder = Recorder()
    host = host_of(recorder, max_batch=2, max_wait=0)
    for key in ("a", "b", "c"):
        for i in range(2):
            host.receive("g", Run(ord(key) * 10 + i, {"text": f"{key}{i}"}, key))
    host.receive("g", Run(999, {"text": "gone"}, "c"))
    host.receive("g", Cancel(999))  # a request cancelled while waiting leaves its key's queue
    while host.due() == 0:
        host.work()
    assert recorder.batches == [["a0", "b0"], ["c0", "a1"], ["b1", "c1"]]


def test_batch_lines_only_take_the_room_interactive_requests_leave() -> None:
    recorder, clock = Recorder(), Clock()
    host = host_of(recorder, clock, max_batch=4, max_wait=0)
    for i in range(5):
        host.receive("g", Run(100 + i, {"text": f"low{i}"}, "batch_key", low=True))
    for i in range(3):
        host.receive("g", Run(i, {"text": f"a{i}"}, "key_a"))
    host.receive("g", Run(50, {"text": "b0"}, "key_b"))
    host.receive("g", Run(51, {"text": "b1"}, "key_b"))
    host.receive("g", Cancel(102))  # a cancelled batch line leaves its queue too
    host.work()
    assert recorder.batches == [["a0", "b0", "a1", "b1"]]
    clock.now += 1  # no interactive request for a while: lines fill whole batches
    while host.due() == 0:
        host.work()
    assert recorder.batches[1:] == [["a2", "low0", "low1", "low3"], ["low4"]]


def test_while_interactive_requests_keep_coming_a_batch_carries_one_line_at_most() -> None:
    recorder, clock = Recorder(), Clock()
    host = host_of(recorder, clock, max_batch=4, max_wait=0)
    for i in range(4):
        host.receive("g", Run(100 + i, {"text": f"low{i}"}, "batch_key", low=True))
    host.receive("g", Run(1, {"text": "a0"}, "key_a"))
    host.work()
    host.work()
    clock.now += 0.1  # the interactive caller comes back at once
    host.receive("g", Run(2, {"text": "a1"}, "key_a"))
    host.work()
    host.work()
    assert recorder.batches == [["a0"], ["low0"], ["a1"], ["low1"]]


def test_an_idle_replica_runs_a_request_at_once() -> None:
    host = host_of(Recorder(), max_wait=600)  # a gather window of ten minutes, never waited
    host.receive("g", Run(1, {"text": "alone"}))
    assert host.due() == 0


def test_right_after_a_batch_the_next_waits_briefly_for_as_many_requests_as_the_last_carried() -> None:
    clock, recorder = Clock(), Recorder()
    host = host_of(recorder, clock, max_batch=8, max_wait=0.005)
    for i in range(3):
        host.receive("g", Run(i, {"text": f"first {i}"}))
    host.work()
    host.receive("g", Run(10, {"text": "early"}))
    assert host.due() == pytest.approx(0.005)  # one of three back: wait for the others
    host.receive("g", Run(11, {"text": "second"}))
    clock.now += 0.002
    assert host.due() == pytest.approx(0.003)
    host.receive("g", Run(12, {"text": "third"}))
    assert host.due() == 0  # as many as last time: go
    host.work()
    host.receive("g", Run(13, {"text": "late"}))
    clock.now += 0.006
    assert host.due() == 0  # the window has passed: go with what is there
    host.work()
    assert [len(b) for b in recorder.batches] == [3, 3, 1]


def test_a_cancelled_request_never_reaches_the_model() -> None:
    recorder = Recorder()
    host = host_of(recorder)
    host.receive("g", Run(1, {"text": "kept"}))
    host.receive("g", Run(2, {"text": "abandoned"}))
    host.receive("g", Cancel(2))
    host.receive("g", Cancel(99))  # unknown: ignored
    host.work()
    assert recorder.batches == [["kept"]]
    assert answers(host) == {"g": [(1, "KEPT")]}


def test_a_closed_connection_takes_its_waiting_requests_with_it() -> None:
    recorder = Recorder()
    host = host_of(recorder)
    host.receive("gone", Run(1, {"text": "lost"}))
    host.receive("here", Run(1, {"text": "kept"}))
    host.drop("gone")
    host.work()
    assert recorder.batches == [["kept"]]
    assert answers(host) == {"here": [(1, "KEPT")]}


def test_a_batch_that_raises_fails_its_requests_and_the_replica_carries_on() -> None:
    recorder = Recorder(fail=True)
    host = host_of(recorder)
    host.receive("a", Run(1, {"text": "x"}))
    host.receive("b", Run(7, {"text": "y"}))
    host.work()
    failure = "RuntimeError: the model broke"
    assert answers(host) == {"a": [Failed([1], failure)], "b": [Failed([7], failure)]}
    recorder.fail = False
    host.receive("a", Run(2, {"text": "z"}))
    host.work()
    assert answers(host) == {"a": [(2, "Z")]}


def test_a_batch_is_announced_to_its_connections_before_the_model_runs_it() -> None:
    recorder = Recorder()
    host = host_of(recorder, max_batch=2)
    for request_id, text in ((1, "a"), (2, "b"), (3, "c")):
        host.receive("gateway-1" if request_id != 2 else "gateway-2", Run(request_id, {"text": text}))
    announced: list[tuple[Any, Any]] = []

    def announce() -> None:
        assert recorder.batches == []  # before the model call
        announced.extend(host.take_outgoing())

    host.work(announce=announce)
    assert announced == [("gateway-1", Started([1])), ("gateway-2", Started([2]))]  # 3 waits
    assert recorder.batches == [["a", "b"]]


async def test_a_dead_replica_fails_the_requests_it_had_begun_and_frees_the_others_to_run_elsewhere() -> None:
    waiters = Waiters()
    loop = asyncio.get_running_loop()
    for request_id in (1, 2, 3):
        waiters.calls[request_id] = loop.create_future()
    waiters.answer(Started([1, 2]))
    waiters.answer(Results([Result(2, {"text": "B"})]))  # answered: no longer "begun"
    futures = dict(waiters.calls)
    waiters.fail_all(ReplicaDied("the replica's worker process exited"))
    with pytest.raises(ReplicaDied) as running:
        await futures[1]
    assert not isinstance(running.value, ReplicaDiedBeforeStart)  # it may have killed the replica
    with pytest.raises(ReplicaDiedBeforeStart):
        await futures[3]  # never reached the model: the dispatcher sends it to the replacement
    assert not waiters.started


class Dying:
    """A replica as the dispatcher reaches it that dies under the first `deaths` requests or generations
    sent to it (after `events` of a generation's events), then answers. `begun`: whether it had begun
    them when it died (else they were still waiting in it: `ReplicaDiedBeforeStart`)."""

    def __init__(self, deaths: int, events: int = 0, begun: bool = True) -> None:
        self.deaths, self.events, self.begun, self.runs = deaths, events, begun, 0
        self.alive, self.in_flight = True, 0
        self.requests: list[dict[str, Any]] = []

    def _death(self) -> ReplicaDied | None:
        self.runs += 1
        if self.runs > self.deaths:
            return None
        why = "the replica's worker process exited"
        return ReplicaDied(why) if self.begun else ReplicaDiedBeforeStart(why)

    async def submit(self, item: dict[str, Any], trace: str = "") -> dict[str, Any]:
        if (death := self._death()) is not None:
            raise death
        return {"embedding": [1.0]}

    async def stream(self, request: dict[str, Any], trace: str = "") -> AsyncGenerator[dict[str, Any], None]:
        self.requests.append(request)
        death = self._death()
        for n in range(self.events):
            yield Text(text=str(n))
        if death is not None:
            raise death
        yield Text(finish="stop")


def dispatch_to(replica: Dying) -> tuple[Dispatcher, Callable[[], Awaitable[list[Dying]]]]:
    async def targets() -> list[Dying]:
        return [replica]

    return Dispatcher("dep_dying", 8, 10.0), targets


async def test_a_request_whose_replica_died_while_running_it_is_a_502_and_never_sent_again() -> None:
    replica = Dying(deaths=5)
    dispatcher, targets = dispatch_to(replica)
    with pytest.raises(Crashed) as failed:
        await dispatcher.infer(targets, {"text": "poison"})
    assert replica.runs == 1  # a poison input costs the one replica it reached
    assert failed.value.status_code == 502 and failed.value.code == "replica_crashed"
    assert failed.value.headers == {"x-should-retry": "false"}  # the SDKs do not send it again either
    assert "stopped while running it (the replica's worker process exited)" in failed.value.message
    assert dispatcher.outstanding == 0


async def test_a_request_still_waiting_in_a_dead_replica_runs_on_another_as_often_as_needed() -> None:
    replica = Dying(deaths=3, begun=False)
    dispatcher, targets = dispatch_to(replica)
    assert await dispatcher.infer(targets, {"text": "x"}) == {"embedding": [1.0]}
    assert replica.runs == 4


async def test_a_generation_whose_replica_dies_while_running_it_is_a_502_streamed_or_not() -> None:
    for request in (GenerationRequest(), GenerationRequest(whole=True)):
        for events in (0, 2):
            replica = Dying(deaths=1, events=events)
            dispatcher, targets = dispatch_to(replica)
            seen = []
            with pytest.raises(Crashed, match="worker process exited"):
                async for event in dispatcher.stream(targets, request):
                    seen.append(event)
            assert replica.runs == 1  # never sent to another replica
            assert seen == ([Text(text=str(n)) for n in range(events)] if not request.whole else [])


async def test_a_generation_still_waiting_in_a_replica_that_died_runs_again() -> None:
    replica = Dying(deaths=2, begun=False)
    dispatcher, targets = dispatch_to(replica)
    assert [e async for e in dispatcher.stream(targets, counting(2, whole=True))] == [Text(finish="stop")]
    assert replica.runs == 3 and not replica.requests[0].whole  # the mark is the gateway's


async def test_a_stream_the_replica_began_is_failed_as_begun_when_it_dies_and_a_waiting_one_is_not() -> None:
    waiters = Waiters()
    sent: list[Any] = []
    begun = waiters.stream(1, sent.append, GenerationRequest(), "")
    waiting = waiters.stream(2, sent.append, GenerationRequest(), "")
    first = asyncio.ensure_future(begun.__anext__())
    second = asyncio.ensure_future(waiting.__anext__())
    await asyncio.sleep(0)
    waiters.answer(Started([1]))
    waiters.fail_all(ReplicaDied("the replica's worker process exited"))
    with pytest.raises(ReplicaDied) as running:
        await first
    assert not isinstance(running.value, ReplicaDiedBeforeStart)
    with pytest.raises(ReplicaDiedBeforeStart):
        await second


def test_a_generation_is_announced_begun_before_its_handler_prepares_it() -> None:
    """Its template and grammar are prepared in `start`: a replica that dies there leaves its gateway
    knowing the request had begun, so it is not sent to another replica."""
    host = host_of(Counter())
    outgoing: list[Any] = []

    def announce() -> None:
        outgoing.extend(host.take_outgoing())

    host.announce = announce
    prepared = Counter.start

    def start(self: Counter, state: Any, request_id: int, request: Any) -> None:
        assert outgoing == [("g", Started([7]))]  # out before the handler runs
        prepared(self, state, request_id, request)

    host._handler.start = start.__get__(host._handler)  # type: ignore[attr-defined]
    host.receive("g", Generate(7, counting(1)))
    assert outgoing == [("g", Started([7]))]


def test_streams_step_together_and_each_ends_with_its_finish() -> None:
    host = host_of(Counter())
    host.receive("g1", Generate(1, counting(2)))
    host.receive("g2", Generate(1, counting(1)))
    assert host.running == 2 and host.due() == 0
    host.work()
    assert answers(host) == {"g1": [(1, left(1))], "g2": [(1, Text(finish="stop"))]}
    host.work()
    assert answers(host) == {"g1": [(1, Text(finish="stop"))]}
    assert host.due() is None and host.running == 0


def test_a_stream_that_cannot_start_answers_its_caller_with_an_error_event() -> None:
    host = host_of(Counter())
    host.receive("g", Generate(5, counting(0)))
    [(request_id, event)] = answers(host)["g"]
    assert request_id == 5 and event.param == "n"
    assert host.due() is None


def test_cancelling_a_stream_or_closing_its_connection_stops_it_before_the_next_step() -> None:
    counter = Counter()
    host = host_of(counter)
    host.receive("g1", Generate(1, counting(5)))
    host.receive("g1", Generate(2, counting(5)))
    host.receive("g2", Generate(1, counting(5)))
    host.receive("g1", Cancel(1))
    host.drop("g2")
    host.work()
    assert answers(host) == {"g1": [(2, left(4))]}
    assert host.running == 1


def test_a_handoff_ends_every_stream_with_moved_and_hands_off_those_arriving_for_two_seconds() -> None:
    """A drain (issue 73): every generation's gateway is told to continue it elsewhere, and one that
    arrives from a gateway that has not heard of the drain yet goes there too, for `HANDOFF_SECONDS`;
    after that (a rollback may have made the replica serve again) it runs here."""
    clock = Clock()
    host = host_of(Counter(), clock)
    host.receive("g1", Generate(1, counting(5)))
    host.receive("g2", Generate(1, counting(5)))
    host.work()
    answers(host)
    host.receive("supervisor", Handoff())
    assert answers(host) == {"g1": [(1, Moved())], "g2": [(1, Moved())]}
    assert host.running == 0 and host.due() is None
    clock.now += 1.9
    host.receive("g1", Generate(2, counting(5)))
    assert answers(host) == {"g1": [(2, Moved())]} and host.running == 0
    clock.now += 0.2
    host.receive("g1", Generate(3, counting(5)))
    assert host.running == 1


class Generator(Counter):
    """Counter's streams as a generation engine reports them: each step's event counts the tokens so far."""

    def __init__(self) -> None:
        super().__init__()
        self.asked: dict[int, int] = {}

    def start(self, state: Any, request_id: int, request: Any) -> None:
        super().start(state, request_id, request)
        self.asked[request_id] = request.params.max_tokens

    def step(self, state: Any) -> list[tuple[int, Any]]:
        return [
            (key, msgspec.structs.replace(event, completion_tokens=self.asked[key] - self.left.get(key, 0)))
            for key, event in super().step(state)
        ]


def test_the_replica_publishes_the_streams_it_holds_and_each_token_it_computed_once() -> None:
    deployment = f"dep_{secrets.token_hex(6)}"
    host = ReplicaHost(Generator(), None, deployment=deployment, max_batch=4, max_wait=0.005, clock=Clock())
    held = lambda: sample("modelhost_generation_sequences", {"deployment": deployment})  # noqa: E731
    tokens = lambda: sample("modelhost_generation_tokens_total", {"deployment": deployment})  # noqa: E731
    host.receive("g1", Generate(1, counting(5)))
    host.receive("g2", Generate(1, counting(3)))
    assert host.due() == 0 and held() == 2
    host.work()
    host.receive("g1", Cancel(1))
    assert host.due() == 0 and held() == 1 and tokens() == 2
    host.work()
    host.work()  # g2's third and last token
    assert host.due() is None and held() == 0 and tokens() == 4


def test_a_generation_reaches_its_engine_with_its_key_and_tier_and_is_counted_by_tier() -> None:
    """The engine orders a key's requests by their numbers (`generation.priority`), so each carries the
    key it runs for; a batch job's line runs as flex; `modelhost_generation_requests_total{tier}`."""

    class Recording(Counter):
        def __init__(self) -> None:
            super().__init__()
            self.requests: list[Any] = []

        def start(self, state: Any, request_id: int, request: Any) -> None:
            super().start(state, request_id, request)
            self.requests.append(request)

    deployment = f"dep_{secrets.token_hex(6)}"
    handler = Recording()
    host = ReplicaHost(handler, None, deployment=deployment, max_batch=4, max_wait=0.005, clock=Clock())
    counted = lambda tier: sample(  # noqa: E731
        "modelhost_generation_requests_total", {"deployment": deployment, "tier": tier}
    )
    urgent = msgspec.structs.replace(counting(1), priority=-1)
    host.receive("g", Generate(1, urgent, tenant="key_a"))
    host.receive("g", Generate(2, counting(1), low=True, tenant="key_b"))
    host.receive("g", Generate(3, counting(1)))
    assert [(r.tenant, r.priority, r.low) for r in handler.requests] == [
        ("key_a", -1, False),
        ("key_b", 0, True),
        ("", 0, False),
    ]
    assert (counted("priority"), counted("flex"), counted("default")) == (1, 1, 1)


def test_stats_say_what_the_replica_holds() -> None:
    host = host_of(Recorder())
    host.receive("g", Run(1, {"text": "a"}))
    host.receive("g", StatsRequest(9))
    assert answers(host) == {"g": [Stats(9, queued=1, running=0)]}


def test_every_message_survives_the_wire() -> None:
    for message in (
        Run(1, {"b": b"\x00\xff", "x": [1.5]}),
        Generate(2, GenerationRequest(prompt="hi", params=Sampling(max_tokens=3))),
        Cancel(3),
    ):
        frame = encode(message)
        assert int.from_bytes(frame[:4], "big") == len(frame) - 4
        assert decode_to_replica(frame[4:]) == message
    results = Results([Result(1, {"v": b"\x01"})])
    assert decode_from_replica(encode(results)[4:]) == results
    events = Events([Event(4, Text(text="é", completion_tokens=1, finish="stop"))])
    assert decode_from_replica(encode(events)[4:]) == events
    assert decode_from_replica(encode(Started([5, 6]))[4:]) == Started([5, 6])
    with pytest.raises(msgspec.ValidationError):
        decode_to_replica(msgspec.msgpack.encode(["run", "not an id", {}]))


def test_frames_are_cut_right_however_the_bytes_arrive() -> None:
    frames = [encode(Run(i, {"text": "x" * i})) for i in range(1, 6)]
    stream = b"".join(frames)
    for chunk in (1, 3, 7, len(stream)):
        reader = FrameReader()
        pieces = [stream[start : start + chunk] for start in range(0, len(stream), chunk)]
        bodies = [body for piece in pieces for body in reader.feed(piece)]
        assert [decode_to_replica(b) for b in bodies] == [Run(i, {"text": "x" * i}) for i in range(1, 6)]


class Counting:
    """A replica that generates tokens 100, 101, ... (one `Text` each, with its ID) up to `max_tokens`,
    after those a continuation carries; it dies after `die_after` of its own tokens, or hands the
    generation off (`Moved`) there when `hand_off`. The text of a token in `held` comes with the next
    (an engine holding back a character's first bytes)."""

    def __init__(
        self, die_after: int | None = None, hand_off: bool = False, held: frozenset[int] = frozenset()
    ) -> None:
        self.die_after, self.hand_off, self.held = die_after, hand_off, held
        self.alive, self.in_flight = True, 0
        self.route = secrets.token_hex(4)  # its name for routing
        self.requests: list[GenerationRequest] = []

    async def submit(self, item: dict[str, Any], trace: str = "") -> dict[str, Any]:
        raise AssertionError("a generation only")

    def _text(self, n: int) -> str:
        if n in self.held:
            return ""
        start = n
        while start - 1 in self.held:
            start -= 1
        return "".join(f"<{k}>" for k in range(start, n + 1))

    async def stream(self, request: GenerationRequest, trace: str = "") -> AsyncGenerator[Any, None]:
        self.requests.append(request)
        carried = list(request.continued or ())
        yield GenerationStarted(prompt_tokens=5 + len(carried))
        total = request.params.max_tokens or 0
        for n in range(len(carried), total):
            if self.die_after is not None and n - len(carried) == self.die_after:
                self.alive = False
                raise ReplicaDied("the replica's worker process exited")
            if self.hand_off and n - len(carried) == 3:
                yield Moved()
                return
            yield Text(
                text=self._text(n),
                completion_tokens=n + 1,
                token_ids=[100 + n],
                finish="length" if n + 1 == total else None,
            )


def _request(tokens: int) -> GenerationRequest:
    return GenerationRequest(prompt="p", params=Sampling(max_tokens=tokens))


def _replacing(*replicas: Counting) -> Callable[[], Awaitable[list[Counting]]]:
    """The first of `replicas` alive: each the replacement of the one before."""

    async def targets() -> list[Counting]:
        return [next(r for r in replicas if r.alive)]

    return targets


async def test_a_generation_whose_replica_dies_after_its_first_token_goes_on_on_another_once() -> None:
    dying, replacement = Counting(die_after=4), Counting()
    dispatcher = Dispatcher("dep_moving", 8, 10.0)
    events = [e async for e in dispatcher.stream(_replacing(dying, replacement), _request(10))]
    texts = [e for e in events if isinstance(e, Text)]
    assert "".join(t.text for t in texts) == "".join(f"<{n}>" for n in range(10))  # none repeated or lost
    assert sum(isinstance(e, GenerationStarted) for e in events) == 1  # its client had one
    assert texts[-1].completion_tokens == 10
    assert replacement.requests[0].continued == [100, 101, 102, 103]
    # a second death fails it: a poisoned request costs at most two replicas
    targets = _replacing(Counting(die_after=4), Counting(die_after=2), Counting())
    with pytest.raises(Crashed):
        async for _ in dispatcher.stream(targets, _request(10)):
            pass
    assert dispatcher.outstanding == 0


async def test_a_continuation_starts_after_the_last_token_whose_text_was_sent() -> None:
    """Text an engine held back (vLLM: a character's first bytes) was never sent: its tokens come again."""
    dying, replacement = Counting(die_after=5, held=frozenset({3, 4})), Counting(held=frozenset({3, 4}))
    dispatcher = Dispatcher("dep_moving", 8, 10.0)
    events = [e async for e in dispatcher.stream(_replacing(dying, replacement), _request(8))]
    assert replacement.requests[0].continued == [100, 101, 102]
    assert "".join(e.text for e in events if isinstance(e, Text)) == "".join(f"<{n}>" for n in range(8))
    assert [e.completion_tokens for e in events if isinstance(e, Text)][-1] == 8


async def test_a_generation_without_token_ids_or_without_a_token_fails_as_before_when_its_replica_dies() -> (
    None
):
    dispatcher = Dispatcher("dep_moving", 8, 10.0)
    targets = _replacing(Counting(die_after=0), Counting())
    with pytest.raises(Crashed):  # begun, no token sent: it may be what killed the replica
        async for _ in dispatcher.stream(targets, _request(10)):
            pass
    replica = Dying(deaths=1, events=3)  # its events carry no token IDs (vLLM's, llama.cpp's)
    dispatcher, dying_targets = dispatch_to(replica)
    with pytest.raises(Crashed):
        async for _ in dispatcher.stream(dying_targets, _request(10)):
            pass


async def test_a_handed_off_generation_raises_moved_away_with_its_continuation() -> None:
    dispatcher = Dispatcher("dep_moving", 8, 10.0)
    replica = Counting(hand_off=True)

    async def targets() -> list[Counting]:
        return [replica]

    texts: list[str] = []
    with pytest.raises(MovedAway) as moved:
        async for event in dispatcher.stream(targets, msgspec.structs.replace(_request(10), whole=True)):
            texts += [event.text] if isinstance(event, Text) else []
    assert texts == ["<0>", "<1>", "<2>"]  # a whole answer's held events, before it goes on
    assert isinstance(moved.value.request, GenerationRequest)
    assert moved.value.request.continued == [100, 101, 102]
    assert dispatcher.outstanding == 0
    replica.hand_off = False  # where it goes on (`runtime.gateway.adapters` sends it there)
    continued = [e async for e in dispatcher.stream(targets, moved.value.request)]
    assert not any(isinstance(e, GenerationStarted) for e in continued)  # its client had one
    assert "".join(e.text for e in continued if isinstance(e, Text)) == "".join(
        f"<{n}>" for n in range(3, 10)
    )
