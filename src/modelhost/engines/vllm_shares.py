"""Fair shares inside vLLM's own scheduler (issue 72; docs/limits.md, "Fair shares of a generating model").

vLLM's scheduler sees requests, not tenants: it admits by a number and arrival, and runs every admitted
request at every step. Numbers fixed when a request arrives cannot follow counters that move while it
waits, and running every request every step is what makes a light tenant's tokens slow beside a heavy
tenant's batch on a CPU. So the vLLM engine runs this subclass of vLLM's scheduler, in vLLM's engine
core process, which keeps the tenants' virtual token counters (`generation.fairness`) where the steps
are decided, and before each step:

- **numbers every request from the counters as they are now** (`engine_number`: flex and batch lines
  behind everything, then the account's rank, the key's, the request's own `priority`): vLLM admits the
  lowest first and, when its KV cache runs short, preempts the highest;
- **lets a tenant's first request prefill alone**: when the next request to admit is of a tenant with
  nothing running, the others' running requests skip that one step, so its first token does not wait
  for a step of their whole batch (once per request: if it cannot be admitted, vLLM's own order goes on);
- **keeps a light tenant's batch small** (`decoding_share`, `KeptShare`, `StepCosts` learnt from the
  steps, as on the transformers engine): the heavy tenants' requests beyond the share skip steps in
  turns, their KV blocks kept (vLLM's own way of leaving a running request out of a step when its
  token budget is spent), so a paused request resumes where it was and its greedy answer is unchanged.

It charges each tenant the tokens each step computes for it (prompt tokens by the prefix cache's hit
excluded, as vLLM computes none for them; an output token per decoding step), divided by its weights.
A request says whose it is in `SamplingParams.extra_args` (`FAIR_ARGS`, written by `engines.vllm`).

vLLM calls its scheduler interface "not public": this is written against vLLM 0.32's `Scheduler`
(`schedule`, `add_request`, `update_from_output`, `running`, `waiting`, `current_step`, and a request's
`next_decode_eligible_step`, which vLLM's own pipeline-parallel cadence uses to leave a running request
out of a step). The behaviour is here, plain Python (tested without vLLM: tests/test_vllm_shares.py);
the classes vLLM loads, through `SchedulerConfig.scheduler_cls`, are in `engines.vllm_scheduler`.
"""

from __future__ import annotations

import time
from typing import Any

from modelhost.generation.deployment_settings import GenerationSettings
from modelhost.generation.fairness import (
    FAIR_ARGS,
    FAIR_SLOWDOWN,
    FairArgs,
    KeptShare,
    Lingering,
    StepCosts,
    VirtualTokenCounters,
    engine_number,
)
from modelhost.generation.priority import PRIORITY_BOUND


def _fair_args(request: Any) -> FairArgs:
    """Whose a request is, as `engines.vllm` wrote it (a request from elsewhere: an anonymous tenant)."""
    extra = getattr(request.sampling_params, "extra_args", None) or {}
    return FairArgs.read(extra.get(FAIR_ARGS))


class FairShares:
    """The fair-share behaviour, mixed into vLLM's schedulers (`engines.vllm_scheduler`)."""

    # vLLM's scheduler's, which this reads
    running: list[Any]
    waiting: Any  # a `PriorityRequestQueue`
    requests: dict[str, Any]
    current_step: int
    max_num_running_reqs: int

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.served = VirtualTokenCounters(GenerationSettings.from_environment().token_weights())
        self.step_costs = StepCosts()
        self.share = KeptShare()
        self.decoded_at: dict[str, int] = {}  # the step each request last ran in
        self.fair: dict[str, FairArgs] = {}  # each held request's tenant, weights, priority and tier
        self._alone_for: str | None = None  # the request last given a step alone for its first token
        self._timed: tuple[float, int] | None = None  # a decoding-only step's start and batch size
        self.clock = time.perf_counter  # what times the steps
        self.lingering = Lingering(lambda: self.clock())  # tenants whose last request has just ended

    # ------------------------------------------------------------ vLLM's interface

    def add_request(self, request: Any) -> None:
        fair = self._args(request)
        self.served.arrive(fair.tenant, self._held_tenants(self._waiting()), fair.weights)
        super().add_request(request)  # type: ignore[misc]

    def schedule(self, *args: Any, **kwargs: Any) -> Any:
        waiting = self._waiting()
        held = self._held_tenants(waiting)
        self._renumber(waiting, held)
        paused, hidden = self._plan(waiting, held)
        step = self.current_step + 1  # the step `schedule` is about to make
        for request in paused:
            request.next_decode_eligible_step = max(request.next_decode_eligible_step, step + 1)
        if hidden:
            self.waiting.remove_requests(hidden)
        try:
            output = super().schedule(*args, **kwargs)  # type: ignore[misc]
        finally:
            for request in hidden:
                self.waiting.add_request(request)
        self._charge(output)
        return output

    def update_from_output(self, scheduler_output: Any, model_runner_output: Any) -> Any:
        if self._timed is not None:
            started, size = self._timed
            self.step_costs.record(size, self.clock() - started)
            self._timed = None
        outputs = super().update_from_output(scheduler_output, model_runner_output)  # type: ignore[misc]
        if len(self.fair) > len(self.requests):
            left = {args.tenant for rid, args in self.fair.items() if rid not in self.requests}
            self.fair = {rid: args for rid, args in self.fair.items() if rid in self.requests}
            self.decoded_at = {rid: at for rid, at in self.decoded_at.items() if rid in self.requests}
            for tenant in left - {args.tenant for args in self.fair.values()}:
                self.lingering.ended(tenant)
        return outputs

    # ------------------------------------------------------------ ours

    def _tenant(self, request: Any) -> str:
        return self._args(request).tenant

    def _args(self, request: Any) -> FairArgs:
        fair = self.fair.get(request.request_id)
        if fair is None:
            fair = self.fair[request.request_id] = _fair_args(request)
        return fair

    def _waiting(self) -> list[Any]:
        """The waiting requests, in no order: the priority queue's heap itself where it has one (its
        iterator sorts a copy, a comparison in Python per request and level, at every step)."""
        heap = getattr(self.waiting, "_heap", None)
        return list(heap) if isinstance(heap, list) else list(self.waiting)

    def _held_tenants(self, waiting: list[Any]) -> set[str]:
        """The tenants of the requests vLLM holds, running or `waiting`."""
        return {self._tenant(r) for r in self.running} | {self._tenant(r) for r in waiting}

    def _renumber(self, waiting: list[Any], held: set[str]) -> None:
        """Every held request's number from its tenant's counters now (`engine_number`; `held`: the
        tenants with requests in vLLM); the `waiting` queue rebuilt in that order when a number changed
        (it is a heap over the numbers)."""
        ranks = {tenant: self.served.rank(tenant, held) for tenant in held}

        numbers_of: dict[tuple[str, int, bool], int] = {}

        def number(request: Any) -> int:
            fair = self._args(request)
            key = (fair.tenant, fair.priority, fair.low)
            known = numbers_of.get(key)
            if known is None:
                known = numbers_of[key] = engine_number(
                    ranks[fair.tenant], fair.priority, fair.low, PRIORITY_BOUND
                )
            return known

        for request in self.running:
            request.priority = number(request)
        numbers = [number(request) for request in waiting]
        if any(request.priority != new for request, new in zip(waiting, numbers, strict=True)):
            self.waiting.remove_requests(waiting)
            for request, new in zip(waiting, numbers, strict=True):
                request.priority = new
                self.waiting.add_request(request)

    def _plan(self, waiting: list[Any], held: set[str]) -> tuple[list[Any], list[Any]]:
        """The running requests that skip this step, and the waiting ones kept out of it (module
        docstring): a first request alone, else a light tenant's batch kept small."""
        running = list(self.running)
        if not running:
            return [], []
        running_tenants = {self._tenant(r) for r in running}
        head = self.waiting.peek_request() if self.waiting else None
        if (
            head is not None
            and head.request_id != self._alone_for
            and not self._args(head).low
            and self._tenant(head) not in running_tenants
            and len(running) < self.max_num_running_reqs
        ):
            self._alone_for = head.request_id
            tenant = self._tenant(head)
            hidden = [r for r in waiting if self._tenant(r) != tenant]
            return running, hidden
        decoding = [r for r in running if r.num_computed_tokens >= r.num_prompt_tokens]
        step = self.current_step + 1
        chosen = self.share.choose(
            decoding,
            step,
            self.step_costs.cap(FAIR_SLOWDOWN),
            lambda r: r.request_id,
            self._tenant,
            self.served,
            lambda r: step - self.decoded_at.get(r.request_id, 0),
            self.lingering.tenants(held),
        )
        going = {r.request_id for r in chosen}
        return [r for r in decoding if r.request_id not in going], []

    def _charge(self, output: Any) -> None:
        """Each tenant charged what this step computes for it: prompt tokens, and an output token for
        each request whose prompt is done (its first token, or a decoding step); the step timed when it
        only decodes (`StepCosts`)."""
        scheduled: dict[str, int] = output.num_scheduled_tokens
        for request_id, tokens in scheduled.items():
            request = self.requests[request_id]
            before = request.num_computed_tokens - tokens  # vLLM has counted this step's tokens
            prompt = max(0, min(request.num_prompt_tokens, before + tokens) - before)
            produced = before + tokens >= request.num_prompt_tokens
            self.served.charge(self._tenant(request), prompt=prompt, output=int(produced))
            self.decoded_at[request_id] = self.current_step
        decoding_only = bool(scheduled) and all(tokens == 1 for tokens in scheduled.values())
        self._timed = (self.clock(), len(scheduled)) if decoding_only else None
