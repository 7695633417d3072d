"""Fair shares inside vLLM's scheduler (`engines.vllm_shares`), as plain Python: the mixin over a small
scheduler that keeps vLLM 0.32's interface and rules (a running request decodes one token a step unless
`next_decode_eligible_step` says to skip it; waiting requests are admitted lowest number first while
there is room, their whole prompt in one step). The real one runs it in tests/test_vllm.py and
bench/fair_generation.py."""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from modelhost.engines.vllm_shares import FairShares
from modelhost.generation.fairness import FAIR_ARGS, LINGER_SECONDS, FairArgs

_ids = itertools.count()


@dataclass(eq=False)
class Request:
    """What vLLM's scheduler reads of a request, here."""

    tenant: str
    prompt: int = 4
    weights: tuple[float, float] = (1.0, 1.0)
    max_tokens: int = 1000
    request_id: str = field(default_factory=lambda: f"r{next(_ids)}")
    priority: int = 0
    num_computed_tokens: int = 0
    next_decode_eligible_step: int = 0
    sampling_params: Any = None

    def __post_init__(self) -> None:
        args = FairArgs(self.tenant, self.weights).write()
        self.sampling_params = type("Params", (), {"extra_args": {FAIR_ARGS: args}})()

    @property
    def num_prompt_tokens(self) -> int:
        return self.prompt

    def __lt__(self, other: Request) -> bool:
        return (self.priority, self.request_id) < (other.priority, other.request_id)


class Queue:
    """vLLM's `PriorityRequestQueue`: a heap, lowest number first."""

    def __init__(self) -> None:
        self._heap: list[Request] = []

    def add_request(self, request: Request) -> None:
        heapq.heappush(self._heap, request)

    def remove_requests(self, requests: list[Request]) -> None:
        gone = set(requests)
        self._heap = [r for r in self._heap if r not in gone]
        heapq.heapify(self._heap)

    def peek_request(self) -> Request:
        return self._heap[0]

    def pop_request(self) -> Request:
        return heapq.heappop(self._heap)

    def __iter__(self) -> Iterator[Request]:
        return iter(sorted(self._heap))  # vLLM's pops a copy of the heap

    def __bool__(self) -> bool:
        return bool(self._heap)


@dataclass
class Output:
    num_scheduled_tokens: dict[str, int]


class Scheduler:
    """vLLM's scheduler, reduced to what decides who runs in a step."""

    def __init__(self, max_running: int = 64) -> None:
        self.running: list[Request] = []
        self.waiting = Queue()
        self.requests: dict[str, Request] = {}
        self.current_step = 0
        self.max_num_running_reqs = max_running

    def add_request(self, request: Request) -> None:
        self.waiting.add_request(request)
        self.requests[request.request_id] = request

    def schedule(self) -> Output:
        self.current_step += 1
        scheduled = {}
        for request in self.running:
            if self.current_step >= request.next_decode_eligible_step:
                scheduled[request.request_id] = 1
        while self.waiting and len(self.running) < self.max_num_running_reqs:
            request = self.waiting.pop_request()
            self.running.append(request)
            scheduled[request.request_id] = request.prompt
        for request_id, tokens in scheduled.items():
            self.requests[request_id].num_computed_tokens += tokens
        return Output(scheduled)

    def update_from_output(self, output: Output, runner_output: object) -> None:
        for request in list(self.running):
            if request.num_computed_tokens >= request.prompt + request.max_tokens - 1:  # 1 with the prompt
                self.running.remove(request)
                del self.requests[request.request_id]


class Fair(FairShares, Scheduler):
    """The mixin over the scheduler above, on a clock its steps move: a step of n sequences takes
    10 ms + 2.5 ms a sequence (a CPU's: 13 take 4 x one)."""

    def __init__(self, max_running: int = 64) -> None:
        super().__init__(max_running)
        self.now = 0.0
        self.clock = lambda: self.now


def _step(scheduler: Fair) -> dict[str, int]:
    """One step: who ran (request ID: tokens)."""
    output = scheduler.schedule()
    scheduler.now += 0.0075 + 0.0025 * len(output.num_scheduled_tokens)
    scheduler.update_from_output(output, None)
    return output.num_scheduled_tokens


def _tenants(scheduler: Fair, scheduled: dict[str, int]) -> list[str]:
    return sorted(scheduler.fair[request_id].tenant for request_id in scheduled)


def test_the_least_served_tenant_is_admitted_next_by_its_counter_now_not_at_its_arrival() -> None:
    scheduler = Fair(max_running=1)
    first = Request("acct/a", max_tokens=3)
    scheduler.add_request(first)
    waiting_a = [Request("acct/a", max_tokens=3) for _ in range(3)]
    for request in waiting_a:
        scheduler.add_request(request)
    late_b = Request("acct/b", max_tokens=3)
    scheduler.add_request(late_b)  # arrives last, its counter lifted to a's (a has only just begun)
    order = []
    while scheduler.requests:
        for request_id in _step(scheduler):
            if request_id not in order:
                order.append(request_id)
    # a's first ran; b, served less by then, goes before a's others, which had come before it
    assert order[:2] == [first.request_id, late_b.request_id]


def test_a_tenants_first_request_prefills_in_a_step_of_its_own() -> None:
    scheduler = Fair()
    heavy = [Request("acct/a") for _ in range(4)]
    for request in heavy:
        scheduler.add_request(request)
    _step(scheduler)  # a's prompts
    assert _tenants(scheduler, _step(scheduler)) == ["acct/a"] * 4  # a decodes
    light = Request("acct/b")
    scheduler.add_request(light)
    assert _step(scheduler) == {light.request_id: light.prompt}  # b's prompt alone: a skips one step
    assert _tenants(scheduler, _step(scheduler)) == ["acct/a"] * 4 + ["acct/b"]  # then all decode again


def test_a_light_tenant_decodes_every_step_in_a_small_batch_and_the_heavy_ones_pause_by_turns() -> None:
    scheduler = Fair()
    for size in (1, 13):  # a step of 13 takes 4 x a step of one: FAIR_SLOWDOWN's 3 x is a batch of 9
        scheduler.step_costs.record(size, 0.01 + 0.0025 * (size - 1))
    heavy = [Request("acct/a") for _ in range(12)]
    for request in heavy:
        scheduler.add_request(request)
    _step(scheduler)
    light = Request("acct/b")
    scheduler.add_request(light)
    _step(scheduler)  # b's prompt alone
    ran: dict[str, int] = {}
    for _ in range(64):  # two turns of the heavy ones' share (`ROTATE_STEPS`)
        scheduled = _step(scheduler)
        assert light.request_id in scheduled and len(scheduled) == 9  # b every step, 8 of a's
        for request_id in scheduled:
            ran[request_id] = ran.get(request_id, 0) + 1
    assert all(ran.get(request.request_id, 0) >= 16 for request in heavy)  # none of a's starved


def test_tenants_that_are_all_heavy_decode_in_the_full_batch() -> None:
    scheduler = Fair()
    scheduler.step_costs.record(1, 0.01)
    scheduler.step_costs.record(13, 0.04)  # a cap of 9
    for tenant in ("acct/a", "acct/b"):
        for _ in range(8):
            scheduler.add_request(Request(tenant))
    _step(scheduler)
    assert len(_step(scheduler)) == 16


def test_each_step_charges_its_prompt_and_output_tokens_divided_by_the_weights() -> None:
    scheduler = Fair()
    scheduler.add_request(Request("acct/a", prompt=10, max_tokens=5))
    scheduler.add_request(Request("other/b", prompt=10, max_tokens=5, weights=(2.0, 1.0)))
    while scheduler.requests:
        _step(scheduler)
    # a: 10 prompt tokens at 1 and 5 output tokens at 2 (the first sampled with the prompt's last step)
    assert scheduler.served.counters("acct/a") == (20.0, 20.0)
    assert scheduler.served.counters("other/b") == (10.0, 20.0)  # its account's weight 2


def test_backlogged_tenants_of_weights_two_and_one_are_served_two_to_one() -> None:
    scheduler = Fair(max_running=4)
    tenant_of = {}
    for _ in range(200):
        for request in (Request("acct/a", 1, (1.0, 2.0), 8), Request("acct/b", 1, (1.0, 1.0), 8)):
            scheduler.add_request(request)
            tenant_of[request.request_id] = request.tenant
    tokens = {"acct/a": 0, "acct/b": 0}
    for _ in range(600):
        for request_id in _step(scheduler):
            tokens[tenant_of[request_id]] += 1
    assert 1.8 <= tokens["acct/a"] / tokens["acct/b"] <= 2.2


def test_a_request_from_elsewhere_is_an_anonymous_tenants() -> None:
    assert FairArgs.read(None) == FairArgs() == FairArgs.read(["x", "not a number", 1, 0, False])
    assert FairArgs.read(FairArgs("a/b", (2.0, 3.0), -5, True).write()) == FairArgs(
        "a/b", (2.0, 3.0), -5, True
    )


def test_the_batch_stays_small_a_moment_after_a_light_tenants_request_ends() -> None:
    scheduler = Fair()
    for size in (1, 13):
        scheduler.step_costs.record(size, 0.01 + 0.0025 * (size - 1))
    for _ in range(12):
        scheduler.add_request(Request("acct/a"))
    _step(scheduler)
    scheduler.add_request(Request("acct/b", max_tokens=3))
    for _ in range(3):  # b's prompt alone, then its two decoding steps
        _step(scheduler)
    assert _tenants(scheduler, _step(scheduler)) == ["acct/a"] * 9  # b has ended: a keeps the small batch
    scheduler.now += LINGER_SECONDS
    assert len(_step(scheduler)) == 12  # b has not come back: the whole batch is a's again
