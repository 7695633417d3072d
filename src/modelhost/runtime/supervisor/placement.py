"""Placement: the server's memory budget at work in the supervisor (docs/runtime.md, "Capacity").

Before a deployment's processes start, its load asks `Placement.admit` for room: the footprint is
predicted (`runtime.footprint`), placed on the GPU with the most free budget that fits it (on a GPU
machine), and reserved (`runtime.capacity`). A load that does not fit evicts idle deployments (cold
before warm, least recently used first; hot ones pinned; none loaded less than
`MODELHOST_MIN_RESIDENCY_SECONDS` ago; another account's warm one only for a warm or hot load, and only
while that account holds more than its share); when that cannot make room either, it waits its turn in one
first-in-first-out queue until room appears or `MODELHOST_CAPACITY_WAIT_SECONDS` have passed (503
`insufficient_capacity`, with `Retry-After`). A footprint larger than the whole budget is refused at
once. Every few seconds (`measure`) each loaded replica is measured, its reservation becomes what it
takes, the artifact's footprint is remembered for the next load, and the default budget follows what
the server's own processes hold.

The manager's deployments are `Tenant`s here: placement reads what eviction needs of them and asks
them to leave; it knows nothing of replicas or processes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

from modelhost.clock import Clock
from modelhost.config import Settings
from modelhost.errors import CapacityConflict, InsufficientCapacity
from modelhost.runtime import metrics
from modelhost.runtime.capacity import (
    MB,
    Candidate,
    Capacity,
    Footprint,
    Holding,
    default_budget,
    describe,
    evictions,
    memory_limit,
)
from modelhost.runtime.footprint import Prediction, base_cost, predict
from modelhost.runtime.spec import DeploymentSpec

log = logging.getLogger("modelhost.runtime")
# How often a waiting load looks again whether room can be made (deployments become idle, or old enough
# to evict, without telling anyone)
POLL_SECONDS = 0.25
# What a 503 `insufficient_capacity` suggests: a deployment idle by then can be evicted
RETRY_AFTER_SECONDS = 5
# A measured footprint is written back for the next load when it grew by this much (a row per change
# would write on every measurement of a replica whose pages move a little)
REMEMBER_GROWTH = 0.05


class Tenant(Protocol):
    """A deployment as placement sees it (`runtime.supervisor.manager.DeploymentRuntime`)."""

    spec: DeploymentSpec
    state: str
    last_used: float  # monotonic seconds
    loaded_at: float  # monotonic seconds

    async def busy(self) -> bool: ...
    async def held(self) -> int:
        """Requests in flight or queued for it, from every gateway process (-1: cannot tell)."""
        ...

    async def evict(self, reason: str) -> bool:
        """Unload to make room (the reason is shown as its `state_reason`); True once its processes have
        exited and its holding is released; False, unloading nothing, when a request reached it since it
        was found idle."""
        ...


@dataclass(slots=True)
class Reservation:
    """One load's holding, where it was placed, and what it was predicted at."""

    holding: Holding
    spec: DeploymentSpec  # the deployment as its replicas load: placed (`device`), its KV cache given
    prediction: Prediction
    count: int  # replicas
    on_gpu: bool
    remembered: int = 0  # the host footprint written back last (one replica's)


class Placement:
    """See the module docstring. One per replica manager (the supervisor)."""

    def __init__(
        self,
        settings: Settings,
        clock: Clock,
        *,
        gpus: list[int] | None = None,
        remember: Callable[[DeploymentSpec, str, Footprint], None] = lambda *_: None,
    ) -> None:
        """`gpus`: each GPU's memory in bytes (default: what `nvidia-smi` lists where the device setting
        allows a GPU; tests give fakes); `remember(spec, device kind, footprint)` keeps a measured
        footprint for the artifact's next load (the database)."""
        self.settings = settings
        self._clock = clock
        self._remember = remember
        # On Ray Serve the cluster places replicas by the memory they declare
        # (`runtime.supervisor.ray_backend`): loads are measured and shown here, never held back by this
        # machine's budget
        self.enforced = settings.runtime == "local"
        if gpus is None:
            from modelhost.runtime.memory import gpu_totals

            gpus = [] if settings.device == "cpu" else gpu_totals()
        self.gpu_totals = gpus
        self.limit = 0  # the machine's or cgroup's memory (the default budget's base)
        self.server_bytes = 0  # what the server's own processes hold (the default budget leaves it)
        self.capacity = Capacity(self._budget(server_bytes=0), self._gpu_budgets())
        self.base_costs: dict[str, int] = {}  # an engine's most measured cost above weights and cache
        self._reservations: dict[int, tuple[Reservation, Tenant]] = {}  # by holding number
        self._queue: deque[object] = deque()  # loads waiting for room, first in first out
        self._changed = asyncio.Event()
        self._admitting = asyncio.Lock()
        self.refill: Callable[[], None] = lambda: None  # room appeared: the manager reloads evicted ones
        self._publish()

    # ---------------------------------------------------------------- the budget

    def _budget(self, server_bytes: int) -> int:
        settings = self.settings
        if settings.memory_budget_mb is not None:
            return settings.memory_budget_mb * MB
        self.limit = memory_limit(settings.cgroup_root, _read("/proc/self/cgroup"), _read("/proc/meminfo"))
        self.server_bytes = server_bytes
        return default_budget(self.limit, server_bytes)

    def _gpu_budgets(self) -> list[int]:
        return [int(total * self.settings.gpu_memory_fraction) for total in self.gpu_totals]

    def follow_server(self, server_bytes: int) -> None:
        """The default budget leaves what the server's own processes hold (`server_bytes`: the resident
        memory of the supervisor's process tree, its gateways and worker template, less the replicas')."""
        if self.settings.memory_budget_mb is None:
            self.capacity.budget = self._budget(server_bytes)
            self._publish()

    # ---------------------------------------------------------------- prediction

    @property
    def on_gpu(self) -> bool:
        """Replicas run on a GPU: the server has one and its device setting allows it."""
        device = self.settings.device
        return bool(self.gpu_totals) and (device == "auto" or device.startswith("cuda"))

    def predict(self, spec: DeploymentSpec, count: int) -> tuple[Prediction, Footprint]:
        """One replica's prediction and the whole deployment's footprint (`count` replicas). Reads the
        artifact's files: off the event loop."""
        on_gpu = self.on_gpu
        largest_gpu = max(self._gpu_budgets(), default=0)
        prediction = predict(
            model_dir=spec.model_dir,
            pipeline=spec.pipeline,
            engine=spec.engine,
            on_gpu=on_gpu,
            remembered=spec.remembered.get("cuda" if on_gpu else "cpu"),
            kv_cache_mb=self.settings.kv_cache_mb,
            host_budget=self.capacity.budget,
            gpu_budget=largest_gpu,
            base_costs=self.base_costs,
            # a Serve actor imports torch itself: only a local worker shares the template's pages
            preload=self.settings.worker_preload and self.settings.runtime == "local",
            max_model_len=spec.generation.max_model_len,
            llamacpp=(self.settings.llamacpp_slots, self.settings.llamacpp_context),
        )
        return prediction, prediction.footprint.times(count)

    # ---------------------------------------------------------------- pinned deployments

    def held(self) -> dict[str, Footprint]:
        """What each loaded (or loading) deployment version holds now, by its runtime key."""
        return {
            r.spec.key: r.holding.footprint for r, _ in self._reservations.values() if not r.holding.unloading
        }

    def check_fits(
        self,
        spec: DeploymentSpec,
        count: int,
        pinned: list[tuple[DeploymentSpec, int]],
        held: dict[str, Footprint],
    ) -> None:
        """Refuse (409) a deployment that can never fit, and a hot one that cannot fit beside the other hot
        ones, `pinned` (their spec and replicas): those loaded count as they hold now (`held`, read on the
        event loop), the others and this one as predicted. Blocking: reads artifacts' files."""
        if not self.enforced:
            return
        _, need = self.predict(spec, count)
        never = self.capacity.never_fits(need)
        if never is not None:
            metrics.CAPACITY_REFUSALS.inc()
            raise CapacityConflict(
                f"The deployment cannot be loaded on this server: {never}.", param="artifact_id"
            )
        if spec.readiness != "hot":
            return
        others = [(s, held.get(s.key) or self.predict(s, n)[1]) for s, n in pinned if s.id != spec.id]
        if self.capacity.fits_beside_pinned(need, [f for _, f in others]):
            return
        metrics.CAPACITY_REFUSALS.inc()
        own = [(s, f) for s, f in others if spec.may_name(s)]
        named = [f"{s.model} ({s.id}, {describe(f.host)})" for s, f in own]
        listed = _listed(spec, named, [f.host for s, f in others if not spec.may_name(s)], "pinned ")
        advice = "Make one of yours warm or cold, or deploy" if own else "Deploy"
        raise CapacityConflict(
            f"A hot deployment of this artifact needs {_describe(need)}, and the hot deployments already "
            f"pinned take {describe(sum(f.host for _, f in others))} of the {describe(self.capacity.budget)} "
            f"budget: {listed}. {advice} this one warm or cold.",
            param="readiness",
        )

    # ---------------------------------------------------------------- admission

    async def admit(
        self,
        tenant: Tenant,
        count: int,
        deadline: float,
        tenants: Callable[[], Sequence[Tenant]],
        *,
        may_evict: bool = True,
    ) -> Reservation:
        """Reserve room for `count` replicas of `tenant`, evicting idle deployments (`tenants()`) if need
        be, waiting in turn until `deadline` (monotonic); InsufficientCapacity when there is no room in
        time. Without `may_evict` (a background reload): only room that is free now, no wait."""
        spec = tenant.spec
        prediction, need = await asyncio.to_thread(self.predict, spec, count)
        if not self.enforced:
            return self._reserve(tenant, prediction, need, count, None)
        never = self.capacity.never_fits(need)
        if never is not None:
            metrics.CAPACITY_REFUSALS.inc()
            raise InsufficientCapacity(f"The deployment cannot be loaded on this server: {never}.")
        ticket = object()
        if not may_evict:
            if self._queue:  # requests wait for room: they go first
                raise InsufficientCapacity("Loads waiting for memory go first.")
            reservation = self._reserve_if_free(tenant, prediction, need, count)
            if reservation is None:
                raise InsufficientCapacity("No room now.")
            return reservation
        self._queue.append(ticket)
        try:
            while True:
                if self._queue[0] is ticket:
                    async with self._admitting:
                        reservation = await self._make_room(tenant, prediction, need, count, tenants)
                    if reservation is not None:
                        return reservation
                remaining = deadline - self._clock.monotonic()
                if remaining <= 0:
                    metrics.CAPACITY_REFUSALS.inc()
                    raise InsufficientCapacity(
                        self._shortage(spec, need),
                        headers={"Retry-After": str(RETRY_AFTER_SECONDS)},
                    )
                changed = self._changed
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(changed.wait(), min(remaining, POLL_SECONDS))
        finally:
            self._queue.remove(ticket)
            self.changed()

    @property
    def waiting(self) -> int:
        """Loads waiting for room now."""
        return len(self._queue)

    def _reserve_if_free(
        self, tenant: Tenant, prediction: Prediction, need: Footprint, count: int
    ) -> Reservation | None:
        for gpu in self.capacity.gpu_order(need):
            if self.capacity.fits(need, gpu):
                return self._reserve(tenant, prediction, need, count, gpu)
        return None

    async def _make_room(
        self,
        tenant: Tenant,
        prediction: Prediction,
        need: Footprint,
        count: int,
        tenants: Callable[[], Sequence[Tenant]],
    ) -> Reservation | None:
        """Reserve now if it fits; else evict what the plan names (waiting for their processes to exit)
        and reserve if it fits then. None: no plan makes room now."""
        reservation = self._reserve_if_free(tenant, prediction, need, count)
        if reservation is not None:
            return reservation
        spec = tenant.spec
        others = [t for t in tenants() if t is not tenant]
        candidates = await self._candidates(others)
        now = self._clock.monotonic()
        for gpu in self.capacity.gpu_order(need):
            short = self.capacity.short(need, gpu)
            load = self.capacity.load(spec.account_id, spec.readiness, gpu, spec.account_weight, need)
            plan = evictions(short, gpu, candidates, now, self.settings.min_residency_seconds, load)
            if plan is None:
                continue
            by_id = {t.spec.key: t for t in others}
            victims = [by_id[c.deployment_id] for c in plan]
            why = [_evicted_for(victim.spec, tenant.spec) for victim in victims]  # each for its viewers
            await asyncio.gather(*(self._evict(v, w, "load") for v, w in zip(victims, why, strict=True)))
            if self.capacity.fits(need, gpu):
                return self._reserve(tenant, prediction, need, count, gpu)
            return None
        return None

    async def _candidates(self, tenants: Sequence[Tenant]) -> list[Candidate]:
        """The loaded deployments, with whether each is idle (its replicas asked)."""
        holding = {r.spec.key: r for r, t in self._reservations.values() if not r.holding.unloading}
        loaded = [t for t in tenants if t.state == "ready" and t.spec.key in holding]
        busy = await asyncio.gather(*(t.busy() for t in loaded))
        return [
            Candidate(
                t.spec.key,
                t.spec.readiness,
                not is_busy,
                t.last_used,
                t.loaded_at,
                holding[t.spec.key].holding.footprint,
                holding[t.spec.key].holding.gpu,
                t.spec.account_id,
            )
            for t, is_busy in zip(loaded, busy, strict=True)
        ]

    async def _evict(self, tenant: Tenant, why: str, reason: str) -> None:
        if await tenant.evict(why):
            log.info("deployment %s (%s) %s", tenant.spec.id, tenant.spec.model, why)
            metrics.EVICTIONS.labels(reason).inc()

    def _reserve(
        self, tenant: Tenant, prediction: Prediction, need: Footprint, count: int, gpu: int | None
    ) -> Reservation:
        spec = tenant.spec
        holding = self.capacity.hold(spec.key, spec.account_id, need, gpu, spec.account_weight)
        kv_mb = math.ceil(prediction.kv_cache / MB) if prediction.kv_cache else None
        device = f"cuda:{gpu}" if gpu is not None else None
        placed = replace(spec, device=device, kv_cache_mb=kv_mb, footprint=prediction.footprint)
        reservation = Reservation(holding, placed, prediction, count, on_gpu=gpu is not None)
        self._reservations[holding.number] = (reservation, tenant)
        self._publish()
        return reservation

    # ---------------------------------------------------------------- autoscaling

    def one_replica(self, reservation: Reservation) -> Footprint:
        """What one more replica of `reservation` takes: the larger of its prediction and what its replicas
        take on average now (measured), so a scale-up never counts on less than the others hold."""
        held = reservation.holding.footprint
        count = max(1, reservation.count)
        predicted = reservation.prediction.footprint
        return Footprint(max(predicted.host, held.host // count), max(predicted.gpu, held.gpu // count))

    def grow(self, reservation: Reservation) -> str | None:
        """Room for one more replica of `reservation` (autoscaling), only if it is free now: no eviction
        (a hot or busy deployment never makes way for another's extra replica), no wait, and not while
        loads wait for room (they go first). None: reserved (`count` grew by one); else why not."""
        if reservation.holding.number not in self._reservations:
            return "the deployment is unloading"
        one = self.one_replica(reservation)
        if self.enforced:
            if self._queue:
                return "loads waiting for memory go first"
            if not self.capacity.fits(one, reservation.holding.gpu):
                return (
                    f"the memory budget has no room for another replica: it needs {_describe(one)}, "
                    f"{describe(max(0, self.capacity.free))} of the {describe(self.capacity.budget)} "
                    "budget is free"
                )
        holding = reservation.holding
        holding.footprint = holding.footprint + one
        holding.measured = False  # the new replica's part is predicted until it is measured
        reservation.count += 1
        self._publish()
        return None

    def shrink(self, reservation: Reservation) -> None:
        """One replica of `reservation` has exited (scaled down): its share of the room is free again."""
        if reservation.holding.number not in self._reservations or reservation.count <= 1:
            return
        holding = reservation.holding
        share = Footprint(
            holding.footprint.host // reservation.count, holding.footprint.gpu // reservation.count
        )
        holding.footprint = Footprint(holding.footprint.host - share.host, holding.footprint.gpu - share.gpu)
        reservation.count -= 1
        self._publish()
        self.changed()
        self.refill()

    def unloading(self, reservation: Reservation | None) -> None:
        """Its processes are being stopped: still reserved, no longer a candidate."""
        if reservation is not None:
            reservation.holding.unloading = True

    def release(self, reservation: Reservation | None) -> None:
        """Its processes have exited (idempotent): the room is free for the next load."""
        if reservation is None or reservation.holding.number not in self._reservations:
            return
        del self._reservations[reservation.holding.number]
        self.capacity.release(reservation.holding)
        self._publish()
        self.changed()
        self.refill()

    def changed(self) -> None:
        """Room may have appeared (or a deployment became evictable): waiting loads look again."""
        self._changed.set()
        self._changed = asyncio.Event()

    def _shortage(self, spec: DeploymentSpec, need: Footprint) -> str:
        """Why a load found no room within its wait: what it needs, and what holds the budget (the
        deployments the load's viewers may see named, the others counted)."""
        named, unnamed = [], []
        others_warm = False
        for reservation, tenant in self._reservations.values():
            size = reservation.holding.footprint.host
            others_warm |= tenant.spec.account_id != spec.account_id and tenant.spec.readiness == "warm"
            if not spec.may_name(tenant.spec):
                unnamed.append(size)
                continue
            what = "stopping" if reservation.holding.unloading else tenant.spec.readiness
            named.append(f"{tenant.spec.model} ({what}, {describe(size)})")
        held = _listed(spec, named, unnamed)
        young = f"loaded less than {self.settings.min_residency_seconds:g} s ago"
        if not others_warm:
            why = f"busy, pinned (hot) or {young}"
        elif spec.readiness == "cold":
            why = (
                f"busy, pinned (hot), {young}, or warm deployments of other accounts, which a cold "
                "deployment's load never evicts"
            )
        else:
            load = self.capacity.load(spec.account_id, spec.readiness, None, spec.account_weight, need)
            own = load.share_of(spec.account_id).host
            total = sum(load.weights.values())
            if load.loader_over_share():
                holds = load.held[spec.account_id].host
                why = (
                    f"busy, pinned (hot), {young}, or warm deployments of other accounts, which a load is "
                    f"not given while its own account's share is full: this account holds "
                    f"{describe(holds)} and would hold {describe(holds + need.host)} with it, over its "
                    f"share of {describe(own)} (weight {spec.account_weight:g} of the {total:g} the "
                    "accounts holding memory weigh together)"
                )
            else:
                why = (
                    f"busy, pinned (hot), {young}, or warm deployments of other accounts that hold no "
                    f"more than their share of the budget (the budget divided among the accounts "
                    f"holding memory by their weights: {describe(load.share.host)} for a weight of 1, "
                    f"{describe(own)} for this account's {spec.account_weight:g})"
                )
        return (
            f"No memory to load {spec.model} within {self.settings.capacity_wait_seconds:g} s: it needs "
            f"{_describe(need)}, {describe(max(0, self.capacity.free))} of the "
            f"{describe(self.capacity.budget)} budget is free, and what holds the rest is {why}: {held}. "
            "Retry shortly."
        )

    # ---------------------------------------------------------------- measurement

    def measured(self, reservation: Reservation, footprints: list[Footprint]) -> None:
        """The reservation's replicas were measured (each one's footprint): it holds what they take now,
        the engine's base cost is learned, and the artifact's footprint remembered if it grew."""
        if reservation.holding.number not in self._reservations or not footprints:
            return
        total = Footprint(sum(f.host for f in footprints), sum(f.gpu for f in footprints))
        # replicas it reserved room for that were not measured (one starting for a scale-up) keep their
        # predicted room: the books never drop below what will run
        total = total + reservation.prediction.footprint.times(max(0, reservation.count - len(footprints)))
        if total.host <= 0:
            return  # not measurable (a Ray replica on another node that has not reported yet)
        shrank = total.host < reservation.holding.footprint.host
        self.capacity.measure(reservation.holding, total)
        one = max(footprints, key=lambda f: f.host)
        engine = reservation.spec.engine
        cost = base_cost(one, reservation.prediction, reservation.on_gpu)
        self.base_costs[engine] = max(self.base_costs.get(engine, 0), cost)
        if one.host > reservation.remembered * (1 + REMEMBER_GROWTH):
            reservation.remembered = one.host
            self._remember(reservation.spec, "cuda" if reservation.on_gpu else "cpu", one)
        self._publish()
        if shrank:
            self.changed()

    def over_budget(self) -> int:
        """How far the reservations are above the budget (0: within it)."""
        return max(0, -self.capacity.free)

    async def shed(self, tenants: Sequence[Tenant]) -> None:
        """Measured footprints grew above the budget: evict idle deployments until it holds again."""
        short = self.over_budget()
        if not short or not self.enforced:
            return
        async with self._admitting:
            candidates = await self._candidates(tenants)
            now = self._clock.monotonic()
            victims = evictions(Footprint(short), None, candidates, now, self.settings.min_residency_seconds)
            if not victims:  # what holds the memory is busy, pinned or new: it stays until that changes
                return
            by_id = {t.spec.key: t for t in tenants}
            why = f"evicted at {_now()}: the deployments' measured memory grew above the budget"
            await asyncio.gather(*(self._evict(by_id[c.deployment_id], why, "over_budget") for c in victims))

    # ---------------------------------------------------------------- what is shown

    def _publish(self) -> None:
        metrics.MEMORY_BUDGET.set(self.capacity.budget)
        metrics.MEMORY_RESERVED.set(self.capacity.reserved)
        for index, budget in enumerate(self.capacity.gpu_budgets):
            metrics.GPU_MEMORY_BUDGET.labels(str(index)).set(budget)
            metrics.GPU_MEMORY_RESERVED.labels(str(index)).set(self.capacity.gpu_reserved(index))

    async def view(self) -> dict[str, Any]:
        """`GET /v1/admin/capacity`: the budget, each GPU's, and every deployment holding memory."""
        capacity = self.capacity
        entries = list(self._reservations.values())
        held = await asyncio.gather(*(t.held() for _, t in entries), return_exceptions=True)
        now_wall, now = time.time(), self._clock.monotonic()
        deployments = []
        for (reservation, tenant), in_flight in zip(entries, held, strict=True):
            holding = reservation.holding
            deployments.append(
                {
                    "id": tenant.spec.id,
                    "artifact_id": tenant.spec.artifact_id,
                    "model": tenant.spec.model,
                    "account_id": tenant.spec.account_id,
                    "readiness": tenant.spec.readiness,
                    "state": "unloading" if holding.unloading else tenant.state,
                    "device": "cpu" if holding.gpu is None else f"cuda:{holding.gpu}",
                    "footprint_bytes": holding.footprint.host,
                    "gpu_footprint_bytes": holding.footprint.gpu,
                    "footprint_measured": holding.measured,
                    "kv_cache_bytes": reservation.prediction.kv_cache,
                    "in_flight": in_flight if isinstance(in_flight, int) and in_flight >= 0 else 0,
                    "last_used_at": datetime.fromtimestamp(now_wall - (now - tenant.last_used), UTC),
                }
            )
        return {
            "memory": {
                "budget_bytes": capacity.budget,
                "reserved_bytes": capacity.reserved,
                "free_bytes": capacity.free,
                "limit_bytes": self.limit or None,
                "server_bytes": self.server_bytes if self.settings.memory_budget_mb is None else None,
                "waiting": self.waiting,
            },
            "gpus": [
                {
                    "index": index,
                    "budget_bytes": budget,
                    "reserved_bytes": capacity.gpu_reserved(index),
                    "free_bytes": capacity.gpu_free(index),
                }
                for index, budget in enumerate(capacity.gpu_budgets)
            ],
            "deployments": deployments,
        }


def _describe(footprint: Footprint) -> str:
    if footprint.gpu:
        return f"{describe(footprint.host)} of host memory and {describe(footprint.gpu)} of GPU memory"
    return describe(footprint.host)


def _listed(spec: DeploymentSpec, named: list[str], unnamed: list[int], kind: str = "") -> str:
    """What holds memory, as `spec`'s viewers may read it: the deployments they may see `named`, the
    others counted with what they hold together (`unnamed`: each one's bytes; `kind`: "pinned ")."""
    if unnamed:
        count = len(unnamed)
        whose = " of other accounts" if len(spec.viewers) == 1 else ""
        other = "" if whose else "other "
        plural = "s" if count != 1 else ""
        holds = "hold" if count != 1 else "holds"
        named = [*named, f"{count} {other}{kind}deployment{plural}{whose} {holds} {describe(sum(unnamed))}"]
    return "; ".join(named) or "nothing"


def _evicted_for(victim: DeploymentSpec, newcomer: DeploymentSpec) -> str:
    """The evicted deployment's `state_reason`: the load it made room for, named only to the one account
    that also owns that load."""
    if victim.may_name(newcomer):
        what = newcomer.model
    else:
        what = "a deployment of another account" if len(victim.viewers) == 1 else "another deployment"
    return f"evicted to make room for {what} at {_now()}"


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""
