"""Replica manager: readiness levels, loading and unloading, restarts, and the route to a batch.

| readiness | loaded | unloaded |
|---|---|---|
| cold | on the first request | after `cold_idle_seconds` without requests |
| warm | when created (or set), and on demand after a restart | only when deleted |
| hot  | at server start (with a warm-up inference), when created or set | never (only when deleted) |
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import math
import os
import time
from collections.abc import AsyncGenerator, Callable
from typing import Any

from modelhost import tracing
from modelhost.clock import Clock, SystemClock
from modelhost.config import Settings
from modelhost.engine_table import FALLBACK
from modelhost.errors import (
    CapacityConflict,
    DeploymentUnavailable,
    InsufficientCapacity,
    ModelhostError,
    NotFound,
)
from modelhost.generation.contract import GenerationEvent, StreamRequest
from modelhost.routing import Version, choose_version, split_key, version_key
from modelhost.runtime import metrics
from modelhost.runtime.capacity import Footprint
from modelhost.runtime.gateway.dispatch import Dispatcher
from modelhost.runtime.memory import parents, rss_bytes, tree
from modelhost.runtime.replica import Replica, ReplicaBackend, ReplicaLoadFailed
from modelhost.runtime.spec import DeploymentSpec, LiveStatus, ScalingEvent
from modelhost.runtime.supervisor.adapter_meters import AdapterMeters, Meter
from modelhost.runtime.supervisor.autoscale import Decision, Sample, ScalingPolicy
from modelhost.runtime.supervisor.local import LocalBackend
from modelhost.runtime.supervisor.placement import Placement, Reservation
from modelhost.tasks.registry import served

log = logging.getLogger("modelhost.runtime")
GB = 1_000_000_000
MB = 1_000_000
# A replica over the memory limit is restarted at most this often in the window; the next time the
# deployment fails instead: a model that needs more than the limit would otherwise restart forever.
MEMORY_RESTARTS = 2
MEMORY_RESTART_WINDOW_SECONDS = 600.0
# An idle deployment's replicas (and the server's own processes) are measured at most this often
IDLE_MEASURE_SECONDS = 60.0
# A used deployment is measured again (its processes' memory maps read) only when the resident memory of
# the processes measured last moved by more than this share of it, or they changed, or after
# IDLE_MEASURE_SECONDS: a torch replica's map is thousands of mappings, tens of milliseconds to read and
# count, while its resident size costs microseconds.
RESIDENT_MOVE = 0.01


SpecSource = Callable[[str], DeploymentSpec | None]
# Told whenever a deployment's set of replicas changes (loaded, unloaded, one replaced): the supervisor
# publishes the new addresses (by runtime key, `DeploymentSpec.key`) to its other gateway processes.
ReplicasChanged = Callable[[str, list[str]], None]
# Told when a version of a rollout is ready, failed to load or has drained: (deployment, artifact, event
# (`loaded`, `failed`, `drained`), reason); the store moves the deployment's versions on (`services.rollouts`)
VersionChanged = Callable[[str, str, str, str | None], None]
# A version leaving the split waits this long before it may unload, so that requests routed by the split
# before it changed (another gateway process's, told a moment later) still find it loaded
DRAIN_GRACE_SECONDS = 0.5
DRAIN_POLL_SECONDS = 0.1


# Billing's view of replicas: each costs from the moment it starts loading until it goes away
ReplicaMeter = Meter


class DeploymentRuntime:
    """The live side of one deployment: its replicas, queue and state."""

    def __init__(self, spec: DeploymentSpec, manager: ReplicaManager) -> None:
        self.spec = spec
        self._manager = manager
        self.state = "unloaded"
        self.reason: str | None = None
        # The last replica restarted for its memory: shown as the reason while the deployment has none
        # of its own (ready again, or loading the replacement), until it is unloaded.
        self.notice: str | None = None
        self._memory_restarts: list[float] = []  # when, on the monotonic clock
        self.replicas: list[Replica] = []
        self.last_cold_start: float | None = None
        self._clock = manager.clock
        self.last_used = self._clock.monotonic()
        self._failed_at = 0.0
        self._load_lock = asyncio.Lock()
        self._unloading = False
        self._loading: list[Replica] = []
        # Its room in the memory budget while its replicas load, run and stop (`runtime.supervisor.placement`)
        self.reservation: Reservation | None = None
        self.loaded_at = 0.0  # monotonic: eviction leaves it alone for `min_residency_seconds`
        # Evicted, or refused room, while it wants to be loaded (warm, hot): loads again once room frees
        self.wants_memory = False
        self.measured_at = -math.inf  # monotonic: when its replicas were last measured
        # The processes measured then (the replicas' trees) and their resident bytes together
        self.measured_processes: tuple[int, ...] = ()
        self.measured_resident = 0
        self.rolling: asyncio.Task[None] | None = None  # a rollout's load of it, or its drain
        self.leaving = False  # a version draining: never loaded again for its readiness
        settings = manager.settings
        self.dispatcher = Dispatcher(
            spec.id,
            settings.max_queue_size,
            settings.request_timeout_seconds,
            settings.routing_max_imbalance,
            settings.routing_policy == "prefix",
            spec.artifact_id,
        )
        # Autoscaling (`autoscale`): the policy, the replicas it wants, its last step, the step under
        # way, and the replicas scaled down: out of the routing set, stopped once they hold nothing
        self.scaling = ScalingPolicy(
            settings.autoscale_target_in_flight,
            settings.autoscale_ttft_seconds,
            settings.autoscale_window_seconds,
            settings.scale_down_idle_seconds,
        )
        self.desired = 0
        self.last_scaling: ScalingEvent | None = None
        self._step: asyncio.Task[None] | None = None
        self._retiring: list[Replica] = []
        self._first_tokens_read = (0.0, 0)  # the dispatcher's first-token totals at the last sample

    # ---------------------------------------------------------------- requests

    async def infer(self, item: dict[str, Any]) -> dict[str, Any]:
        self.last_used = self._clock.monotonic()
        try:
            return await self.dispatcher.infer(self._live_replicas, item)
        finally:
            self.last_used = self._clock.monotonic()

    async def _live_replicas(self) -> list[Replica]:
        """The replicas now, loaded first if need be (a replacement on its way: waited for)."""
        await self.ensure_loaded()
        return self.replicas

    async def stream(self, item: StreamRequest) -> AsyncGenerator[GenerationEvent, None]:
        """A generation's events from the least busy replica (the engine in the replica batches
        continuously)."""
        self.last_used = self._clock.monotonic()
        with tracing.step("wait for replica"):
            await self.ensure_loaded()
        try:
            async with contextlib.aclosing(self.dispatcher.stream(self._live_replicas, item)) as events:
                async for event in events:
                    yield event
        finally:
            self.last_used = self._clock.monotonic()

    def touch(self, age: float = 0.0) -> None:
        """Another gateway process used the deployment `age` seconds ago (or still is: 0): not idle."""
        self.last_used = max(self.last_used, self._clock.monotonic() - age)

    # ---------------------------------------------------------------- loading

    async def busy(self) -> bool:
        """Work in flight from this process, or held by a replica for any gateway process."""
        return bool(self.dispatcher.outstanding) or await self.held() != 0

    async def held(self) -> int:
        """Requests and sequences its replicas hold for every gateway process (-1: one cannot tell)."""
        answers = await asyncio.gather(*(r.held() for r in self.replicas), return_exceptions=True)
        if any(not isinstance(a, int) or a < 0 for a in answers):
            return -1
        return sum(a for a in answers if isinstance(a, int))

    async def evict(self, reason: str) -> bool:
        """Unload to make room for another deployment; a warm one loads again once room frees. Not when a
        request of this process reached it since it was found idle (False: the load looks again)."""
        if self.dispatcher.outstanding or self.state != "ready":
            return False
        self.wants_memory = self.wants_loaded
        await self.unload(reason=reason)
        return True

    @property
    def wants_loaded(self) -> bool:
        return not self.leaving and self.spec.readiness in ("warm", "hot")

    async def ensure_loaded(self, *, may_evict: bool = True) -> None:
        """Loaded when this returns; a load that finds no memory waits its turn (`may_evict` False: a
        background reload, which takes only free room and does not wait)."""
        if self.state == "ready" and any(r.alive for r in self.replicas):
            return
        if (
            self.state == "failed"
            and time.monotonic() - self._failed_at < self._manager.settings.load_retry_seconds
        ):
            raise DeploymentUnavailable(f"The deployment failed to load: {self.reason}")
        # the wait for memory counts from the request's arrival, whoever loads before it
        deadline = self._clock.monotonic() + self._manager.settings.capacity_wait_seconds
        async with self._load_lock:
            if self.state == "ready" and any(r.alive for r in self.replicas):
                return
            self._drop_dead()
            with tracing.step("load deployment", {"modelhost.deployment": self.spec.id}):  # a cold start
                await self._load(deadline, may_evict)

    def _drop_dead(self) -> None:
        """Replicas that died but whose exit is not handled yet (`on_replica_exit` comes a moment after
        their connection ends): billed up to now and stopped here, once, before a replacement loads (a
        request waiting for one asked first)."""
        dead = [r for r in self.replicas if not r.alive]
        if dead:
            self.replicas = [r for r in self.replicas if r.alive]
            metrics.REPLICA_RESTARTS.labels(self.spec.id, "exited").inc(len(dead))
            self._manager.in_background(self._manager.stop(dead))

    async def _load(self, deadline: float, may_evict: bool = True) -> None:
        try:  # first: an account out of credits loads nothing, whatever else is wrong
            await self._manager.check_can_load(self.spec)
        except ModelhostError as exc:  # stays unloaded, and says why
            self.state, self.reason = "unloaded", exc.message
            raise
        if not served(self.spec.pipeline):
            self._fail(f"no endpoint serves the {self.spec.pipeline} pipeline in this version")
            raise DeploymentUnavailable(f"The deployment failed to load: {self.reason}")
        if not self.spec.model_dir.is_dir():
            self._fail("the artifact's published files are missing")
            raise DeploymentUnavailable(f"The deployment failed to load: {self.reason}")
        reason, self.state, self.reason, self._unloading = self.reason, "loading", None, False
        started = time.perf_counter()
        backend = self._manager.backend
        count = self._manager.replica_count(self.spec)
        if self.reservation is None:  # a replacement of a replica that died keeps the room it had
            try:
                with tracing.step("wait for memory"):  # room in the budget: evictions, or a turn
                    self.reservation = await self._manager.placement.admit(
                        self, count, deadline, self._manager.tenants, may_evict=may_evict
                    )
            except InsufficientCapacity as exc:  # stays unloaded; a background try keeps the old reason
                self.state, self.reason = "unloaded", exc.message if may_evict else reason
                self.wants_memory = self.wants_loaded
                raise
            if self._unloading:  # deleted or unloaded while it waited for room
                self._release()
                self.state = "unloaded"
                raise DeploymentUnavailable("The deployment was unloaded while it was loading.")
        spec = self.reservation.spec  # placed (a GPU), its KV cache sized
        replicas = [backend.new_replica(spec, self.on_replica_exit, count) for _ in range(count)]
        self._loading = replicas  # visible to unload(): a delete during the load stops these too
        try:
            await asyncio.gather(*(self._manager.metered(r, self.spec) for r in replicas))
            results = await asyncio.gather(*(r.load() for r in replicas), return_exceptions=True)
        finally:
            self._loading = []
        if self._unloading:  # deleted or unloaded while loading
            await self._manager.stop(replicas)
            self._release()
            self.state = "unloaded"
            raise DeploymentUnavailable("The deployment was unloaded while it was loading.")
        errors = [e for e in results if isinstance(e, BaseException)]
        if errors:
            await self._manager.stop(replicas)
            self._release()  # its processes have exited: a crashed load gives its room back
            reason = str(errors[0]) if isinstance(errors[0], ReplicaLoadFailed) else repr(errors[0])
            if self.spec.falls_back:
                await self._fall_back(reason)
                return await self._load(deadline)
            self._fail(reason)
            raise DeploymentUnavailable(f"The deployment failed to load: {self.reason}")
        self.replicas = replicas
        self.loaded_at, self.wants_memory = self._clock.monotonic(), False
        await self._manager.measure(self)  # the prediction gives way to what the replicas take
        chosen = next((r.engine_choice for r in replicas if r.engine_choice is not None), None)
        if chosen is not None:  # an encoder's runtime, measured (or read from its cache) at load
            await asyncio.to_thread(self._manager.engine_measured, self.spec.id, *chosen)
        self.state = "ready"
        self.last_cold_start = time.perf_counter() - started
        self.last_used = self._clock.monotonic()
        metrics.COLD_STARTS.labels(self.spec.id).inc()
        metrics.LOAD_SECONDS.labels(self.spec.id).observe(self.last_cold_start)
        metrics.LOADED_REPLICAS.labels(self.spec.id).set(len(replicas))
        self._want(len(replicas))
        self.scaling.reset(self._clock.monotonic())
        self.publish()
        log.info("deployment %s loaded %d replica(s) in %.2fs", self.spec.id, count, self.last_cold_start)

    async def _fall_back(self, reason: str) -> None:
        """`auto` chose vLLM, which could not load the model (an architecture it lists but cannot run
        here, say): the deployment runs on `transformers`, and its `engine_reason` says why."""
        log.warning("deployment %s runs on transformers: vLLM could not load it (%s)", self.spec.id, reason)
        self.spec = dataclasses.replace(self.spec, engine=FALLBACK, falls_back=False)
        await asyncio.to_thread(self._manager.engine_fell_back, self.spec.id, reason)

    def _fail(self, reason: str) -> None:
        self.state, self.reason, self._failed_at = "failed", reason, time.monotonic()
        log.error("deployment %s failed to load: %s", self.spec.id, reason)

    def load_in_background(self) -> None:
        if self.state in ("unloaded", "failed"):
            self.state, self.reason = "loading", None  # visible at once in the deployment view
        self._manager.in_background(self._quiet_load())

    async def _quiet_load(self) -> None:
        with contextlib.suppress(ModelhostError):  # the state records why
            await self.ensure_loaded()

    async def unload(self, *, detach: bool = False, reason: str | None = None) -> None:
        """Stop the replicas; with `detach` (gateway shutdown), leave shared ones to other gateways. Its
        room in the budget stays reserved until the processes have exited. `reason`: why, shown as its
        `state_reason` until it loads again (an eviction)."""
        self._unloading = True
        replicas, self.replicas = [*self.replicas, *self._loading, *self._retiring], []
        self._want(0)
        if self.state != "failed":
            self.state = "unloaded"  # at once: a request from now on loads it again
        if reason is not None:
            self.reason = reason
        self.notice = None
        self.publish()
        await self._stop_all(replicas, detach=detach)
        metrics.LOADED_REPLICAS.labels(self.spec.id).set(0)
        metrics.MEMORY_BYTES.labels(self.spec.id).set(0)

    async def _stop_all(self, replicas: list[Replica], *, detach: bool = False) -> None:
        """Stop every replica of the deployment and give its room back once their processes have exited."""
        reservation, self.reservation = self.reservation, None
        self._manager.placement.unloading(reservation)
        try:
            await self._manager.stop(replicas, detach=detach)
        finally:
            self._manager.placement.release(reservation)

    def _release(self) -> None:
        """The load's processes have exited (or never started): its room is free again."""
        reservation, self.reservation = self.reservation, None
        self._manager.placement.release(reservation)

    def addresses(self) -> list[str]:
        """Where the server's other gateway processes reach the live replicas."""
        return [r.address for r in self.replicas if r.alive and r.address is not None]

    def publish(self) -> None:
        """Tell the supervisor's other gateway processes where the live replicas are now."""
        self._manager.publish(self.spec.id)

    async def drain(self, timeout: float) -> None:
        """Wait until this process's requests and generations are done (used at shutdown)."""
        deadline = time.monotonic() + timeout
        while self.dispatcher.outstanding and time.monotonic() < deadline:
            await asyncio.sleep(0.05)

    def on_replica_exit(self, replica: Replica) -> None:
        """A replica died (a worker killed or out of memory): drop it and start a replacement unless we
        are unloading. One whose model no longer loads (`failure`) fails the deployment instead."""
        if replica not in self.replicas:
            return
        if self._unloading:
            self.replicas.remove(replica)
            self.publish()
            self._manager.in_background(self._manager.stop([replica]))
        elif replica.failure is not None:  # failed until the next load retry, like a first load
            stopping, self.replicas = self.replicas, []
            self.publish()
            self._fail(replica.failure)
            self._manager.in_background(self._stop_all(stopping))
        else:
            self._restart(replica, "exited")

    def _restart(self, replica: Replica, why: str) -> None:
        """Drop `replica` and start its replacement (`why`: the restarts metric's reason)."""
        self.replicas.remove(replica)
        metrics.LOADED_REPLICAS.labels(self.spec.id).set(len(self.replicas))
        metrics.REPLICA_RESTARTS.labels(self.spec.id, why).inc()
        if not self.replicas:
            self.state, self.reason = "loading", None  # a replacement is on its way
        self.publish()
        self._manager.in_background(self._replace(replica))

    def over_memory(self, replica: Replica, used: int, limit: int) -> None:
        """`replica` takes more memory than the limit: stop it and start a replacement, as if it had died;
        the third time within the window, fail the deployment instead (the model needs more)."""
        if replica not in self.replicas or self._unloading:
            return  # gone or replaced since it was measured
        now = time.monotonic()
        recent = [t for t in self._memory_restarts if now - t < MEMORY_RESTART_WINDOW_SECONDS]
        self._memory_restarts = [*recent, now]
        over = f"its memory {used // MB} MB exceeded the limit of {limit // MB} MB"
        if len(recent) < MEMORY_RESTARTS:
            self.notice = f"replica {replica.name} was restarted: {over}"
            log.warning("deployment %s: %s", self.spec.id, self.notice)
            self._restart(replica, "memory")
            return
        minutes = f"{MEMORY_RESTART_WINDOW_SECONDS / 60:g} minutes"
        self.notice = None
        self._failed_at, self.state = now, "failed"
        self.reason = f"replica {replica.name} was stopped: {over} {len(recent) + 1} times in {minutes}"
        log.warning("deployment %s failed: %s", self.spec.id, self.reason)
        stopping, self.replicas = self.replicas, []
        self.publish()
        self._manager.in_background(self._stop_all(stopping))

    async def _replace(self, replica: Replica) -> None:
        """Stop what is left of the replica first: a Serve application is replaced under its own name."""
        await self._manager.stop([replica])
        if not self._unloading:  # unloaded or deleted meanwhile
            await self._quiet_load()

    # ---------------------------------------------------------------- autoscaling

    def _want(self, desired: int) -> None:
        self.desired = desired
        metrics.DESIRED_REPLICAS.labels(self.spec.id).set(desired)

    async def autoscale(self) -> None:
        """One sample of the deployment's load and the step it calls for (docs/runtime.md, "Autoscaling
        (local backend)"): the requests its replicas hold for every gateway process (or, where a replica
        cannot tell, what this process has in flight) and this process's times to first token since the
        last sample. A step runs in the background, one at a time, so other deployments are sampled
        while a replica starts or drains."""
        floor = max(1, self.spec.min_replicas)
        if self.state != "ready" or self._unloading or self.leaving or self.reservation is None:
            return
        if self._step is not None and not self._step.done():
            return
        if self.spec.max_replicas <= floor and len(self.replicas) == floor:
            return  # nothing to decide: the count is fixed
        held = await self.held()
        if self.state != "ready" or self._unloading or self.reservation is None:
            return
        seconds, count = self.dispatcher.first_token_seconds, self.dispatcher.first_tokens
        read_seconds, read_count = self._first_tokens_read
        self._first_tokens_read = (seconds, count)
        first_token = (seconds - read_seconds) / (count - read_count) if count > read_count else None
        sample = Sample(self._clock.monotonic(), max(held, self.dispatcher.outstanding), first_token)
        before = len(self.replicas)
        decision = self.scaling.observe(sample, before, floor, self.spec.max_replicas)
        self._want(decision.desired)
        if decision.desired > before:
            self._step = asyncio.ensure_future(self._scale_up(before, decision))
        elif decision.desired < before:
            self._step = asyncio.ensure_future(self._scale_down(before, decision))

    def _scaled(self, before: int, after: int, reason: str, direction: str | None) -> None:
        """Record a step (`direction` None: one not taken, shown with why until the next)."""
        same = self.last_scaling is not None and self.last_scaling.reason == reason
        self.last_scaling = ScalingEvent(time.time(), before, after, reason)
        if direction is not None:
            metrics.SCALE_EVENTS.labels(self.spec.id, direction).inc()
            self.scaling.reset(self._clock.monotonic())
            self._want(after)
            log.info("deployment %s scaled %s, %d to %d: %s", self.spec.id, direction, before, after, reason)
        elif not same:
            log.info("deployment %s stays at %d replica(s): %s", self.spec.id, before, reason)

    async def _scale_up(self, before: int, decision: Decision) -> None:
        """Start one more replica where the budget has room now (never by evicting anyone), or in the
        room a replica that died left reserved; it joins the routing set once loaded."""
        reservation = self.reservation
        if reservation is None:
            return
        placement = self._manager.placement
        if reservation.count <= len(self.replicas) + len(self._retiring):  # no room left by a dead one
            refusal = placement.grow(reservation)
            if refusal is not None:
                self._scaled(before, before, f"{decision.reason}; no replica started: {refusal}", None)
                return
        replica = self._manager.backend.new_replica(reservation.spec, self.on_replica_exit, reservation.count)
        self._loading.append(replica)  # an unload meanwhile stops it with the others
        try:
            await self._manager.metered(replica, self.spec)
            await replica.load()
            failure = None
        except Exception as exc:
            failure = str(exc) if isinstance(exc, ReplicaLoadFailed) else repr(exc)
        finally:
            with contextlib.suppress(ValueError):
                self._loading.remove(replica)
        if self._unloading or self.reservation is not reservation:  # unloaded meanwhile: room released
            await self._manager.stop([replica])
            return
        if failure is not None:
            await self._manager.stop([replica])
            placement.shrink(reservation)
            why = f"{decision.reason}; the new replica failed to load: {failure}"
            self._scaled(before, before, why, None)
            return
        self.replicas.append(replica)
        metrics.LOADED_REPLICAS.labels(self.spec.id).set(len(self.replicas))
        self.publish()
        self._scaled(before, len(self.replicas), decision.reason, "up")
        await self._manager.measure(self)

    async def _scale_down(self, before: int, decision: Decision) -> None:
        """The replica holding least leaves the routing set at once (every gateway process is told), and
        is stopped once it holds nothing, for any gateway process, or after the drain bound
        (`MODELHOST_SHUTDOWN_DRAIN_SECONDS`); then its room in the budget is free."""
        reservation = self.reservation
        if reservation is None or len(self.replicas) <= 1:
            return
        answers = await asyncio.gather(*(r.held() for r in self.replicas), return_exceptions=True)
        loads = [a if isinstance(a, int) and a >= 0 else math.inf for a in answers]
        leaving = min(zip(self.replicas, loads, strict=True), key=lambda pair: pair[1])[0]
        if self.reservation is not reservation or leaving not in self.replicas:
            return
        self.replicas.remove(leaving)
        self._retiring.append(leaving)
        metrics.LOADED_REPLICAS.labels(self.spec.id).set(len(self.replicas))
        self.publish()
        self._scaled(before, len(self.replicas), decision.reason, "down")
        deadline = self._clock.monotonic() + self._manager.settings.shutdown_drain_seconds
        await asyncio.sleep(DRAIN_GRACE_SECONDS)  # the other gateway processes hear of it a moment later
        leaving.handoff()  # its generations go on on the others (issue 73)
        while leaving.alive and self._clock.monotonic() < deadline:
            if leaving.in_flight == 0 and await leaving.held() == 0:
                break
            await asyncio.sleep(DRAIN_POLL_SECONDS)
        if self.reservation is not reservation:
            return  # unloaded meanwhile: the unload stopped it and released the room
        await self._manager.stop([leaving])
        with contextlib.suppress(ValueError):
            self._retiring.remove(leaving)
        placement = self._manager.placement
        placement.shrink(reservation)

    def measurable(self) -> list[Replica]:
        """Its replica processes that run: those serving and those scaled down but not yet stopped."""
        return [r for r in [*self.replicas, *self._retiring] if r.alive]

    def memory_moved(self) -> bool:
        """Whether its replicas may take other memory than when last measured: another set of replicas,
        a process of theirs gone, or their resident bytes moved by more than `RESIDENT_MOVE` (read from
        `/proc/<pid>/statm`, microseconds, on the event loop)."""
        roots = {r.pid for r in self.measurable()}
        if not self.measured_processes or not roots <= set(self.measured_processes):
            return True
        resident = [rss_bytes(pid) for pid in self.measured_processes]
        if 0 in resident:
            return True
        return abs(sum(resident) - self.measured_resident) > RESIDENT_MOVE * self.measured_resident

    def status(self) -> LiveStatus:
        stats = [r.stats() for r in self.replicas if r.alive]
        memory = sum(s.memory_bytes for s in stats)
        metrics.MEMORY_BYTES.labels(self.spec.id).set(memory)
        replicas = sum(s.processes for s in stats)
        return LiveStatus(
            state=self.state,
            reason=self.reason or self.notice,
            replicas=replicas,
            memory_gb=round(memory / GB, 6),
            last_cold_start_seconds=None if self.last_cold_start is None else round(self.last_cold_start, 3),
            # Ray Serve's autoscaler keeps its wish to itself: what runs is what it wants
            desired_replicas=replicas if self._manager.backend.scales_itself else self.desired,
            last_scaling=self.last_scaling,
        )


class ReplicaManager:
    """All deployments' runtimes, in the supervisor (the server's first gateway process), which alone
    loads and unloads replicas. Implements `Runtime` for the routes of that process; the others reach
    it through `server.remote.RemoteRuntime`."""

    def __init__(
        self,
        settings: Settings,
        specs: SpecSource,
        hot_specs: Callable[[], list[DeploymentSpec]],
        *,
        clock: Clock | None = None,
        meter: ReplicaMeter | None = None,
        load_guard: Callable[[DeploymentSpec], None] | None = None,
        backend: ReplicaBackend | None = None,
        gpus: list[int] | None = None,
    ) -> None:
        """`gpus`: each GPU's memory (default: what `nvidia-smi` lists; tests give fakes)."""
        self.settings = settings
        self.backend = backend or backend_of(settings)
        self.clock = clock or SystemClock()
        self._specs = specs
        self._hot_specs = hot_specs
        self._runtimes: dict[str, DeploymentRuntime] = {}  # by runtime key: one per version
        # Each deployment's versions as last read: how a request that names no version is split
        self._versions: dict[str, tuple[Version, ...]] = {}
        self.background: set[asyncio.Task[None]] = set()
        self._reaper: asyncio.Task[None] | None = None
        self._memory_watch: asyncio.Task[None] | None = None
        self._autoscaler: asyncio.Task[None] | None = None
        self._meter = meter
        self._adapter_meters = AdapterMeters(meter) if meter is not None else None  # adapters on bases
        # Asked before every load (billing: 402 when the account is out of credits).
        self.load_guard = load_guard
        self.replicas_changed: ReplicasChanged = lambda _deployment, _addresses: None
        # Records that a deployment `auto` put on vLLM runs on `transformers` (its load failed on vLLM).
        self.engine_fell_back: Callable[[str, str], None] = lambda _deployment, _reason: None
        # (deployment, engine, reason, int8 quality): a replica chose the engine at load (an encoder's)
        self.engine_measured: Callable[[str, str, str, str | None], None] = lambda *_: None
        # (deployment, device kind, one replica's footprint): remembered for its artifact's next load
        self.footprint_measured: Callable[[DeploymentSpec, str, Footprint], None] = lambda *_: None
        self.version_changed: VersionChanged = lambda *_: None
        # The deployments in the middle of a rollout (a version loading or draining): resumed at start
        self.rolling: Callable[[], list[str]] = list
        self.placement = Placement(settings, self.clock, gpus=gpus, remember=self._remember_footprint)
        self.placement.refill = self._refill_soon
        self._refilling: asyncio.Task[None] | None = None
        self._server_measured_at = -IDLE_MEASURE_SECONDS  # when the server's own processes were measured

    def _remember_footprint(self, spec: DeploymentSpec, device: str, footprint: Footprint) -> None:
        self.in_background(asyncio.to_thread(self.footprint_measured, spec, device, footprint))

    def replica_count(self, spec: DeploymentSpec) -> int:
        """Replicas a load starts: Ray Serve scales one application itself."""
        return 1 if self.backend.scales_itself else max(1, spec.min_replicas)

    def tenants(self) -> list[DeploymentRuntime]:
        """Every deployment this manager runs (what placement may evict)."""
        return list(self._runtimes.values())

    async def check_can_load(self, spec: DeploymentSpec) -> None:
        """Billing enforcement: 402 when the account is out of credits (the guard may read the database)."""
        if self.load_guard is not None:
            await asyncio.to_thread(self.load_guard, spec)

    async def metered(self, replica: Replica, spec: DeploymentSpec) -> None:
        """The replica costs from now on (before it loads: loading takes memory too)."""
        if self._meter is not None:
            await asyncio.to_thread(self._meter.replica_started, replica, spec)
        if self._adapter_meters is not None:
            await self._adapter_meters.started(replica, spec)

    async def stop(self, replicas: list[Replica], *, detach: bool = False) -> None:
        """Bill replicas up to now, then stop them; a replica's meter closes even if it will not stop.

        With `detach` (this gateway shuts down), a replica other gateways share stays up and its meter
        open: they go on billing and serving it."""
        if self._meter is not None:
            meter = self._meter

            def bill(replica: Replica) -> object:
                return meter.replica_stopped(replica, close=not (detach and replica.shared_meter))

            await asyncio.gather(*(asyncio.to_thread(bill, r) for r in replicas), return_exceptions=True)
        if self._adapter_meters is not None:
            adapter_meters = self._adapter_meters
            await asyncio.gather(*(adapter_meters.stopped(r) for r in replicas), return_exceptions=True)
        await asyncio.gather(
            *((r.detach() if detach else r.unload()) for r in replicas), return_exceptions=True
        )

    def in_background(self, work: Any) -> None:
        task = asyncio.ensure_future(work)
        self.background.add(task)
        task.add_done_callback(self.background.discard)

    # ---------------------------------------------------------------- lifecycle

    async def start(self) -> None:
        """Load every hot deployment (with a warm-up inference) and start the idle reaper."""
        specs = await asyncio.to_thread(self._hot_specs)
        for spec in specs:
            self._runtime_for(spec).load_in_background()
        for deployment_id in await asyncio.to_thread(self.rolling):
            self.in_background(self._quiet_apply(deployment_id))
        self._reaper = asyncio.create_task(self._reap_idle())
        self._memory_watch = asyncio.create_task(self._watch_memory())
        self._autoscaler = asyncio.create_task(self._autoscale())

    async def shutdown(self) -> None:
        """Drain queued and running work, then stop every worker."""
        for task in (self._reaper, self._memory_watch, self._autoscaler, self._refilling):
            if task is not None:
                task.cancel()
        runtimes = list(self._runtimes.values())
        await asyncio.gather(
            *(rt.drain(self.settings.shutdown_drain_seconds) for rt in runtimes), return_exceptions=True
        )
        for task in list(self.background):
            task.cancel()
        await asyncio.gather(*(rt.unload(detach=True) for rt in runtimes), return_exceptions=True)
        await self.backend.close()

    # ---------------------------------------------------------------- deployments

    async def apply(self, deployment_id: str) -> None:
        """Re-read the deployment after create/patch and act on each of its versions at once: an active
        one on its readiness (`_apply_spec`), a `loading` one loads beside the others and reports when it
        is ready or failed, a `draining` one unloads once its requests are done, a version no longer listed
        (a rollout rolled back before it was ready) stops.
        CapacityConflict (409) when it could never fit, is hot and cannot fit beside the other hot
        deployments, or a new version cannot fit beside the ones serving: nothing changes here then (the
        caller puts the stored deployment back)."""
        spec = await asyncio.to_thread(self._specs, deployment_id)
        if spec is None:
            await self.remove(deployment_id)
            return
        specs = [spec]
        for version in spec.versions:
            if version.artifact_id != spec.artifact_id:
                other = await asyncio.to_thread(self._specs, version_key(deployment_id, version.artifact_id))
                if other is not None and other.artifact_id == version.artifact_id:
                    specs.append(other)
        states = {v.artifact_id: v.state for v in spec.versions}
        await self._check_rollout(deployment_id, specs, states)
        self._versions[deployment_id] = spec.versions
        listed = {s.key for s in specs}
        for key, runtime in list(self._runtimes.items()):
            if runtime.spec.id == deployment_id and key not in listed:
                del self._runtimes[key]  # rolled back before it was ready, or drained: it stops
                self.in_background(runtime.unload())
        self.publish(deployment_id)
        for version_spec in specs:
            state = states.get(version_spec.artifact_id, "active")
            if state == "active":
                await self._apply_spec(version_spec)
            elif state == "loading":
                self._roll(version_spec, self._roll_in)
            elif state == "draining":
                self._roll(version_spec, self._drain)
            else:  # failed: it holds nothing; a PATCH that asks for it again loads it anew
                failed = self._runtimes.pop(version_spec.key, None)
                if failed is not None:
                    self.in_background(failed.unload())

    async def _check_rollout(
        self, deployment_id: str, specs: list[DeploymentSpec], states: dict[str, str]
    ) -> None:
        """A new version loads beside the active ones: refused (409) where both cannot fit in the budget
        beside the hot deployments pinned (the operator's answer: `strategy: replace`, where the serving
        version is draining: its memory is freed first)."""
        new = [s for s in specs if states.get(s.artifact_id) == "loading" and s.key not in self._runtimes]
        if not new or not self.placement.enforced:
            return
        held = self.placement.held()
        serving = [
            held.get(rt.spec.key) or self.placement.predict(rt.spec, self.replica_count(rt.spec))[1]
            for rt in self.tenants()
            if rt.spec.id == deployment_id
            and rt.state in ("ready", "loading")
            and states.get(rt.spec.artifact_id) == "active"
        ]
        if not serving:
            return
        pinned = [
            held.get(rt.spec.key) or self.placement.predict(rt.spec, self.replica_count(rt.spec))[1]
            for rt in self.tenants()
            if rt.spec.readiness == "hot" and rt.spec.id != deployment_id
        ]
        for spec in new:
            _, need = await asyncio.to_thread(self.placement.predict, spec, self.replica_count(spec))
            if not self.placement.capacity.fits_beside_pinned(need, [*serving, *pinned]):
                raise CapacityConflict(
                    f"The new version ({spec.artifact_id}, about {need.host // MB} MB) cannot load beside "
                    f"the one serving ({sum(f.host for f in serving) // MB} MB) within the memory budget "
                    f"of {self.placement.capacity.budget // MB} MB. Nothing changed; send "
                    '"strategy": "replace" to stop the serving version first (requests wait for the new '
                    "one).",
                    param="artifact_id",
                    code="insufficient_capacity",
                )
            serving.append(need)

    def _roll(self, spec: DeploymentSpec, work: Callable[[DeploymentRuntime], Any]) -> None:
        """Start a version's rollout work (its load beside the others, or its drain) unless it runs."""
        runtime = self._runtime_for(spec)
        runtime.spec = spec
        if runtime.rolling is None or runtime.rolling.done():
            runtime.rolling = asyncio.ensure_future(work(runtime))
            self.background.add(runtime.rolling)
            runtime.rolling.add_done_callback(self.background.discard)

    async def _roll_in(self, runtime: DeploymentRuntime) -> None:
        """Load the new version beside the serving ones; the store then moves traffic onto it."""
        try:
            await runtime.ensure_loaded()
        except ModelhostError as exc:
            await self._version_event(runtime.spec, "failed", runtime.reason or exc.message)
            return
        await self._version_event(runtime.spec, "loaded", None)

    async def _drain(self, runtime: DeploymentRuntime) -> None:
        """A version leaving: once its requests in flight (every gateway process's) have finished, or
        after `request_timeout_seconds` (no request lasts longer), it unloads. Not if it was asked for
        again meanwhile (a rollback: it serves on)."""
        deadline = self.clock.monotonic() + self.settings.request_timeout_seconds
        runtime.leaving, runtime.wants_memory = True, False
        await asyncio.sleep(DRAIN_GRACE_SECONDS)  # every gateway process routes to the new version now
        if self._state_of(runtime.spec) == "draining":
            for replica in runtime.replicas:  # its generations go on on the version that serves (issue 73)
                replica.handoff()
        while self._state_of(runtime.spec) == "draining" and self.clock.monotonic() < deadline:
            if not await runtime.busy():
                break
            await asyncio.sleep(DRAIN_POLL_SECONDS)
        if self._state_of(runtime.spec) != "draining":
            runtime.leaving = False  # asked for again (a rollback): it serves on
            return
        if self._runtimes.get(runtime.spec.key) is runtime:
            del self._runtimes[runtime.spec.key]
        await runtime.unload()
        await self._version_event(runtime.spec, "drained", None)

    def _state_of(self, spec: DeploymentSpec) -> str | None:
        versions = self._versions.get(spec.id, ())
        return next((v.state for v in versions if v.artifact_id == spec.artifact_id), None)

    async def _version_event(self, spec: DeploymentSpec, event: str, reason: str | None) -> None:
        """Tell the store, then act on the versions it now lists (traffic moved, the old one drains)."""
        try:
            await asyncio.to_thread(self.version_changed, spec.id, spec.artifact_id, event, reason)
        except Exception:
            log.exception(
                "recording version %s of deployment %s as %s failed", spec.artifact_id, spec.id, event
            )
            return
        await self._quiet_apply(spec.id)

    async def _quiet_apply(self, deployment_id: str) -> None:
        try:
            await self.apply(deployment_id)
        except ModelhostError as exc:  # a background step: the deployment's versions say where it stands
            log.warning("deployment %s: %s", deployment_id, exc.message)

    async def _apply_spec(self, spec: DeploymentSpec) -> None:
        """An active version: act on its readiness at once; a new engine unloads the replicas of the old
        one (and forgets its failure) so the next load runs the new, and new generation settings reload
        them once drained."""
        pinned = [
            (rt.spec, self.replica_count(rt.spec)) for rt in self.tenants() if rt.spec.readiness == "hot"
        ]
        held = self.placement.held()
        await asyncio.to_thread(self.placement.check_fits, spec, self.replica_count(spec), pinned, held)
        runtime = self._runtime_for(spec)
        old, runtime.spec = runtime.spec, spec  # before any await: a load from now on is new
        if not spec.viewers <= old.viewers and runtime.state != "failed":
            runtime.reason = None  # written for fewer accounts than see it now (an adapter of another)
        if not runtime.wants_loaded:
            runtime.wants_memory = False
        self.placement.changed()  # a deployment made cold may be evicted for a waiting load now
        if old.engine != spec.engine:
            runtime.state, runtime.reason = "unloaded", None  # the old engine's failure is not the new one's
            await runtime.unload()
        elif (spec.lora_rank or 0) > (old.lora_rank or 0) or old.generation != spec.generation:
            # adapters attached need LoRA on (or larger slots), and new generation settings (a context
            # length, a chat template) a new load: once the requests in flight have finished, the
            # replicas start again with them; a detached adapter changes nothing (LoRA stays on until then)
            await runtime.drain(self.settings.shutdown_drain_seconds)
            await runtime.unload()
        elif old.adapters != spec.adapters and self._adapter_meters is not None:
            # billed from now, or no more: on the replicas still loading too (metered with the old spec)
            replicas = [*runtime.replicas, *runtime._loading]
            await self._adapter_meters.changed(replicas, old, spec)
        if runtime.wants_loaded and runtime.state in ("unloaded", "failed"):
            runtime.load_in_background()
        elif runtime.state == "ready":  # Ray Serve applies new autoscaling in place
            for replica in runtime.replicas:
                self.in_background(replica.rescale(spec))

    def _refill_soon(self) -> None:
        """Room was freed: warm and hot deployments that were evicted (or found no room) load again in the
        background, in the room that is free, without evicting anyone."""
        if self._refilling is None or self._refilling.done():
            with contextlib.suppress(RuntimeError):  # no running loop: the server is stopping
                self._refilling = asyncio.get_running_loop().create_task(self._refill())

    async def _refill(self) -> None:
        await asyncio.sleep(0)  # after the release that asked for it has finished
        for runtime in self.tenants():
            if self.placement.waiting:
                return  # requests waiting for room go first
            if runtime.wants_memory and runtime.wants_loaded and runtime.state == "unloaded":
                with contextlib.suppress(ModelhostError):  # no room yet: it waits for the next release
                    await runtime.ensure_loaded(may_evict=False)

    async def capacity(self) -> dict[str, Any]:
        """The budget and who holds it (`GET /v1/admin/capacity`)."""
        return await self.placement.view()

    async def unload_account(self, account_id: str) -> None:
        """The account ran out of credits: unload its replicas (they stay down until a top-up)."""
        runtimes = [rt for rt in self._runtimes.values() if rt.spec.account_id == account_id]
        for runtime in runtimes:
            runtime.wants_memory = False  # not reloaded when memory frees: a top-up loads them again
        await asyncio.gather(*(rt.unload() for rt in runtimes), return_exceptions=True)
        for runtime in runtimes:  # a shared base's reason is read by its adapters' accounts too
            whose = "the account" if len(runtime.spec.viewers) == 1 else "the account that owns it"
            runtime.reason = f"{whose} is out of credits"

    async def resume_account(self, account_id: str) -> None:
        """After a top-up: load the account's warm and hot deployments again at once."""
        for runtime in list(self._runtimes.values()):
            if runtime.spec.account_id == account_id and runtime.wants_loaded and runtime.state != "ready":
                runtime.load_in_background()

    async def remove(self, deployment_id: str) -> None:
        """Every version of the deployment stops."""
        self._versions.pop(deployment_id, None)
        runtimes = [rt for rt in self._runtimes.values() if rt.spec.id == deployment_id]
        for runtime in runtimes:
            self._runtimes.pop(runtime.spec.key, None)
        await asyncio.gather(*(rt.unload() for rt in runtimes), return_exceptions=True)

    async def infer(self, deployment_id: str, item: dict[str, Any]) -> dict[str, Any]:
        return await (await self._runtime_of(deployment_id)).infer(item)

    async def load(self, deployment_id: str) -> None:
        await self._loaded(deployment_id)

    async def acquire(self, deployment_id: str) -> list[str]:
        """For another gateway process: load the deployment if it is not, and where its replicas are."""
        return (await self._loaded(deployment_id)).addresses()

    async def _loaded(self, deployment_id: str) -> DeploymentRuntime:
        runtime = await self._runtime_of(deployment_id)
        runtime.touch()
        await runtime.ensure_loaded()
        return runtime

    def addresses(self) -> dict[str, list[str]]:
        """Where every loaded version's replicas are, and each deployment's active ones (`publish`), for a
        gateway process that starts."""
        known = {key: rt.addresses() for key, rt in self._runtimes.items() if rt.replicas}
        for deployment_id in {rt.spec.id for rt in self._runtimes.values() if rt.replicas}:
            states = {v.artifact_id: v.state for v in self._versions.get(deployment_id, ())}
            known[deployment_id] = [
                a
                for rt in self._runtimes.values()
                if rt.spec.id == deployment_id and states.get(rt.spec.artifact_id, "active") == "active"
                for a in rt.addresses()
            ]
        return known

    def publish(self, deployment_id: str) -> None:
        """Tell the other gateway processes where each version of the deployment runs (by runtime key),
        and, under the deployment's own ID, where its active versions run (what they send requests that
        name no version to: an adapter's, on its base)."""
        runtimes = [rt for rt in self._runtimes.values() if rt.spec.id == deployment_id]
        for runtime in runtimes:
            self.replicas_changed(runtime.spec.key, runtime.addresses())
        states = {v.artifact_id: v.state for v in self._versions.get(deployment_id, ())}
        active = [
            a
            for rt in runtimes
            if states.get(rt.spec.artifact_id, "active") == "active"
            for a in rt.addresses()
        ]
        self.replicas_changed(deployment_id, active)

    def touch(self, ages: dict[str, float]) -> None:
        """Other gateway processes used these versions (or deployments) lately, each that many seconds
        ago (the idle reaper and eviction's least-recently-used order read it)."""
        for key, age in ages.items():
            for runtime in self._runtimes.values():
                if key in (runtime.spec.key, runtime.spec.id):
                    runtime.touch(age)

    async def _runtime_of(self, key: str) -> DeploymentRuntime:
        """The runtime of a version (`deployment@artifact`, as a gateway chose it), or of a deployment
        (split here by its versions: the supervisor's runners, an adapter's base). A version no longer
        listed (a gateway routed by the split before a rollout ended) is served by the current one."""
        deployment_id, artifact_id = split_key(key)
        if artifact_id is None:
            versions = self._versions.get(deployment_id)
            if versions is None:
                spec = await asyncio.to_thread(self._specs, deployment_id)
                if spec is None:
                    raise NotFound("Deployment not found", code="deployment_not_found")
                versions = self._versions[deployment_id] = spec.versions
            if versions:
                key = version_key(deployment_id, choose_version(versions))
        runtime = self._runtimes.get(key)
        if runtime is None:
            spec = await asyncio.to_thread(self._specs, key)
            if spec is None:
                raise NotFound("Deployment not found", code="deployment_not_found")
            runtime = self._runtimes.get(spec.key) or self._runtime_for(spec)
        return runtime

    async def stream(self, deployment_id: str, item: StreamRequest) -> AsyncGenerator[GenerationEvent, None]:
        runtime = await self._runtime_of(deployment_id)
        async with contextlib.aclosing(runtime.stream(item)) as events:
            async for event in events:
                yield event

    async def status(self, deployment_id: str) -> LiveStatus:
        """The deployment's state: its best version's (ready before loading before the rest), with the
        replicas and memory of all its versions (a rollout holds two)."""
        runtimes = [rt for rt in self._runtimes.values() if rt.spec.id == deployment_id]
        if not runtimes:
            return LiveStatus()
        statuses = [rt.status() for rt in runtimes]
        order = ("ready", "loading", "failed", "unloaded")
        best = min(statuses, key=lambda s: order.index(s.state) if s.state in order else len(order))
        steps = [s.last_scaling for s in statuses if s.last_scaling is not None]
        return dataclasses.replace(
            best,
            replicas=sum(s.replicas for s in statuses),
            memory_gb=round(sum(s.memory_gb for s in statuses), 6),
            desired_replicas=sum(s.desired_replicas for s in statuses),
            last_scaling=max(steps, key=lambda step: step.at, default=None),
        )

    def _runtime_for(self, spec: DeploymentSpec) -> DeploymentRuntime:
        runtime = self._runtimes.get(spec.key)
        if runtime is None:
            runtime = self._runtimes[spec.key] = DeploymentRuntime(spec, self)
        return runtime

    async def _reap_idle(self) -> None:
        while True:
            await asyncio.sleep(min(5.0, self.settings.cold_idle_seconds / 2))
            await self.reap_idle()

    async def reap_idle(self) -> None:
        """Unload cold deployments idle for longer than the window (asking their replicas too: other
        gateway processes report what they used only once a second)."""
        for runtime in list(self._runtimes.values()):
            if (
                runtime.spec.readiness == "cold"
                and not self.backend.scales_itself  # Ray Serve scales a cold application to zero itself
                and runtime.state == "ready"
                and self._idle(runtime)
                and not await runtime.busy()
                and self._idle(runtime)  # still: no request came while the replicas were asked
            ):
                log.info("unloading idle cold deployment %s", runtime.spec.id)
                await runtime.unload()

    async def _autoscale(self) -> None:
        while True:
            await asyncio.sleep(self.settings.autoscale_interval_seconds)
            try:
                await self.autoscale()
            except Exception:  # one failed sample must not end autoscaling for good
                log.exception("autoscaling failed")

    async def autoscale(self) -> None:
        """Sample every loaded deployment at once, each deciding for itself (`DeploymentRuntime.autoscale`);
        Ray Serve's own autoscaler scales its applications (given the same target: `ray_backend`)."""
        if self.backend.scales_itself:
            return
        results = await asyncio.gather(*(rt.autoscale() for rt in self.tenants()), return_exceptions=True)
        for result in results:
            if isinstance(result, Exception):
                log.error("autoscaling a deployment failed", exc_info=result)

    async def _watch_memory(self) -> None:
        while True:
            try:
                await self.check_memory()
            except Exception:  # a measurement that fails must not end the watch for good
                log.exception("measuring replicas' memory failed")
            await asyncio.sleep(self.settings.memory_check_seconds)

    async def check_memory(self) -> None:
        """Measure the replicas: each deployment's reservation becomes what its replicas take, the
        default budget follows what the server's own processes hold, idle deployments are evicted while
        the measured total is above the budget, and a local replica above `replica_memory_limit_mb` is
        restarted (Ray Serve replicas are left to Ray's own memory monitor). A deployment that has not
        been used since it was last measured, or whose resident memory has not moved
        (`DeploymentRuntime.memory_moved`), is measured again only after `IDLE_MEASURE_SECONDS` (reading
        a process's memory map costs milliseconds, and an idle replica's hardly moves), unless the
        replica memory limit is set: then every check measures every replica."""
        runtimes = self.tenants()
        now, every = self.clock.monotonic(), self.settings.replica_memory_limit_mb is not None
        due = [
            rt
            for rt in runtimes
            if every
            or now - rt.measured_at >= IDLE_MEASURE_SECONDS
            or (rt.last_used >= rt.measured_at and rt.memory_moved())
        ]
        if not due and now - self._server_measured_at < IDLE_MEASURE_SECONDS:
            return
        self._server_measured_at = now
        for runtime in due:
            runtime.measured_at = now
        live = [(rt, r) for rt in due for r in rt.measurable()]
        pids = [r.pid for rt in runtimes for r in [*rt.measurable(), *rt._loading] if r.pid is not None]

        def measure() -> tuple[list[Footprint], int]:  # reads all of /proc: off the event loop
            table = parents()
            footprints = [r.measure(table) for _, r in live]
            for runtime in due:
                roots = [r.pid for owner, r in live if owner is runtime and r.pid is not None]
                runtime.measured_processes = tuple(p for root in roots for p in tree(root, table))
                runtime.measured_resident = sum(rss_bytes(p) for p in runtime.measured_processes)
            replicas = {p for pid in pids for p in tree(pid, table)}
            own = sum(rss_bytes(p) for p in tree(os.getpid(), table) if p not in replicas)
            return footprints, own

        footprints, own = await asyncio.to_thread(measure)
        self.placement.follow_server(own)
        for runtime in due:
            measured = [f for (rt, _), f in zip(live, footprints, strict=True) if rt is runtime]
            if runtime.reservation is not None and measured:
                self.placement.measured(runtime.reservation, measured)
        limit_mb = self.settings.replica_memory_limit_mb
        if limit_mb is not None and isinstance(self.backend, LocalBackend):
            for (runtime, replica), footprint in zip(live, footprints, strict=True):
                if footprint.host > limit_mb * MB:
                    runtime.over_memory(replica, footprint.host, limit_mb * MB)
        if self.placement.over_budget():
            await self.placement.shed(runtimes)

    async def measure(self, runtime: DeploymentRuntime) -> None:
        """Measure one deployment's replicas now (just loaded): its reservation becomes what they take."""
        runtime.measured_at = self.clock.monotonic()
        replicas = runtime.measurable()
        table = await asyncio.to_thread(parents)
        footprints = await asyncio.to_thread(lambda: [r.measure(table) for r in replicas])
        if runtime.reservation is not None:
            self.placement.measured(runtime.reservation, footprints)

    def _idle(self, runtime: DeploymentRuntime) -> bool:
        return self.clock.monotonic() - runtime.last_used >= self.settings.cold_idle_seconds


def backend_of(settings: Settings) -> ReplicaBackend:
    """The backend `MODELHOST_RUNTIME` names (Ray is imported only for `ray`: the default needs none)."""
    if settings.runtime == "ray":
        from modelhost.runtime.supervisor.ray_backend import RayBackend

        return RayBackend(settings)
    return LocalBackend(settings)
