"""`Replica` backed by a Ray Serve application: one per deployment, for clusters (`MODELHOST_RUNTIME=ray`).

Each modelhost deployment becomes one Serve application named after the deployment ID, holding one
Serve deployment whose replicas are Ray actors running the engine the deployment chose, as a local
worker does: `ModelServer` owns one model loaded by the same task handler a local worker process uses
(`worker.load` → `handler_for(pipeline).load(...)`), an encoder on the runtime chosen at load
(`worker.choose_runtime`); `VllmServer` runs vLLM's replica worker as its child process, under vLLM's
own Python, and forwards its calls to it. Ray Serve, not the `ReplicaManager`, decides how many of
those actors run: readiness maps onto its autoscaling (`cold` → `min_replicas: 0`, scaling to zero
after `cold_idle_seconds`; `warm`/`hot` → at least one replica), so the manager holds a single
`RayServeReplica` per deployment whatever its `min_replicas`, and Serve restarts replicas that die.
Each actor declares one replica's footprint as Ray resources (`memory`, a share of a GPU), so Ray
places replicas by memory; a footprint no node can hold fails the load instead of waiting forever.

The application belongs to the cluster, not to a gateway: every gateway on the cluster serves a
deployment through the same application (a gateway that finds it running deploys it again with the
arguments and resources it runs with, which changes nothing), bills it on one shared meter, and leaves
it running when the gateway exits. Only unloading the deployment (deleted, out of credits, failed to
load) deletes it. Replicas report their resident memory to a `MemoryBoard` actor, so a replica on any
node is measured.

Batching happens inside each Serve replica, as in a local worker: every request is one `run` call, and
the replica's `ReplicaHost` groups the requests it holds into model calls. Generation streams through a
streaming handle; closing the stream cancels the Ray response, and the replica drops the sequence at
its next step.

This module imports Ray; the manager imports it lazily and only with the `ray` runtime, so the default
local runtime never needs Ray installed.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import hashlib
import itertools
import logging
import math
import os
import re
import shutil
import signal
import socket
import tempfile
import threading
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import ray
from ray import serve
from ray._private import ray_constants
from ray.exceptions import RayActorError, RayError, RayTaskError
from ray.serve.config import RequestRouterConfig
from ray.serve.exceptions import RayServeException
from ray.serve.handle import DeploymentHandle

from modelhost import tracing
from modelhost.auth.principal import low_priority
from modelhost.config import Settings, get_settings
from modelhost.engine_table import spec as engine_spec
from modelhost.errors import DeploymentUnavailable, item_error
from modelhost.generation.contract import GenerationEvent, StreamRequest, is_last
from modelhost.generation.deployment_settings import ENVIRONMENT
from modelhost.runtime import metrics
from modelhost.runtime.capacity import MB, Footprint
from modelhost.runtime.gateway.client import ReplicaConnection, Waiters, connect_pair
from modelhost.runtime.memory import gpu_totals, tree_footprint_bytes
from modelhost.runtime.replica import (
    Replica,
    ReplicaDied,
    ReplicaDiedBeforeStart,
    ReplicaFailed,
    ReplicaLoadFailed,
    ReplicaSpec,
    ReplicaStats,
)
from modelhost.runtime.replica_protocol import (
    Cancel,
    LoadFailed,
    Run,
    Stats,
    StatsRequest,
    ToReplica,
)
from modelhost.runtime.spec import DeploymentSpec
from modelhost.runtime.supervisor import serve_router
from modelhost.runtime.supervisor.launch import worker_launch
from modelhost.runtime.worker.host import ReplicaHost
from modelhost.runtime.worker.spawn import WORKER_ENV, WorkerProcess, start_worker

log = logging.getLogger("modelhost.runtime")
DEPLOYMENT = "model"  # the Serve deployment's name inside each application
# Requests one Serve replica takes at once, at least: its host batches them (so at least two batches'
# worth), generations share the engine's continuous batch (64 sequences in `tasks.text_generation`).
MAX_ONGOING_REQUESTS = 64
# A model whose replica fails to start this many times in a row does not load: Serve gives up on a
# first deployment then (its default, 20, takes minutes), and `startup_failure` reports one that has
# been scaled to zero and cannot start again.
CONSTRUCTOR_RETRIES = 3
# How often replicas report their memory, and how often a gateway reads the reports; a replica whose
# report is older than `REPORT_STALE_SECONDS` has stopped (killed, scaled down).
REPORT_SECONDS = 1.0
REFRESH_SECONDS = 2.0
REPORT_STALE_SECONDS = 3 * REPORT_SECONDS
BOARD_NAME, BOARD_NAMESPACE = "modelhost-memory", "modelhost"
_PEER = "serve"  # the one "connection" of a Serve replica's host: its own event loop
_connect_lock = threading.Lock()
# Deploys of one gateway take turns: `serve.run` keeps process-wide state while it runs (see
# `_count_pickle_by_value_registrations` for the part of it that failed deploys in CI).
_deploy_lock = threading.Lock()
_started_ray = False


def _count_pickle_by_value_registrations() -> None:
    """Make Ray's cloudpickle registry of "pickle by value" modules safe to use from many threads.

    Serve builds a `RequestRouterConfig` with every `DeploymentConfig`: in `serve.deployment`, in
    `serve.run`, and in the handle's router thread whenever a deployment's config arrives. Each one
    registers the router's module, pickles the class, and unregisters the module, in cloudpickle's
    one process-wide set. Two threads doing it at once (a warm deployment loading while a cold one
    starts for a request, a router thread decoding a config) unregister twice, and the second fails
    with "... is not registered for pickle by value", failing that deploy. Registrations are counted
    here under one lock instead, so a module stays registered until its last user is done."""
    from ray import cloudpickle

    if getattr(cloudpickle.register_pickle_by_value, "_modelhost_counted", False):
        return
    register: Callable[[Any], None] = cloudpickle.register_pickle_by_value
    unregister: Callable[[Any], None] = cloudpickle.unregister_pickle_by_value
    lock = threading.Lock()
    users: collections.Counter[str] = collections.Counter()

    def counted_register(module: Any) -> None:
        with lock:
            register(module)
            users[module.__name__] += 1

    def counted_unregister(module: Any) -> None:
        with lock:
            if users[module.__name__] > 1:
                users[module.__name__] -= 1
                return
            users.pop(module.__name__, None)
            unregister(module)

    counted_register._modelhost_counted = True  # type: ignore[attr-defined]
    cloudpickle.register_pickle_by_value = counted_register
    cloudpickle.unregister_pickle_by_value = counted_unregister


_count_pickle_by_value_registrations()


@ray.remote(num_cpus=0)
class MemoryBoard:
    """Serve replicas' resident memory, reported by the replicas themselves (one detached actor per
    cluster): a gateway cannot read the memory of a process on another node."""

    def __init__(self) -> None:
        self._reports: dict[str, tuple[str, int, int, float]] = {}  # replica → (app, pid, rss, when)

    def report(self, replica: str, app: str, pid: int, rss: int) -> None:
        self._reports[replica] = (app, pid, rss, time.monotonic())

    def leave(self, replica: str) -> None:
        self._reports.pop(replica, None)

    def read(self, app: str) -> list[tuple[int, int]]:
        """`(pid, rss bytes)` of each replica of `app` that reported lately."""
        fresh = time.monotonic() - REPORT_STALE_SECONDS
        self._reports = {k: r for k, r in self._reports.items() if r[3] >= fresh}
        return [(pid, rss) for name, pid, rss, _ in self._reports.values() if name == app]


def memory_board() -> Any:
    """The cluster's `MemoryBoard`, created by whoever asks first."""
    return MemoryBoard.options(  # type: ignore[attr-defined]
        name=BOARD_NAME, namespace=BOARD_NAMESPACE, lifetime="detached", get_if_exists=True
    ).remote()


class _MemoryReporter(threading.Thread):
    """Reports this replica's footprint (its process tree's, the model's files in `model_dir`) every
    `REPORT_SECONDS`, from before the model loads (loading costs memory too) until the replica stops."""

    def __init__(self, model_dir: Path) -> None:
        super().__init__(name="memory-report", daemon=True)
        self.model_dir = model_dir
        self.app = serve.get_replica_context().app_name
        self.key = ray.get_runtime_context().get_actor_id() or f"pid-{os.getpid()}"
        self.board = memory_board()
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.is_set():
            used = tree_footprint_bytes(os.getpid(), model_dir=self.model_dir)
            self.board.report.remote(self.key, self.app, os.getpid(), used)
            self.stopped.wait(REPORT_SECONDS)

    def stop(self) -> None:
        self.stopped.set()
        self.board.leave.remote(self.key)


EngineChoice = tuple[str, str, str | None]  # engine, reason, int8 quality (`Replica.engine_choice`)


@dataclass(frozen=True, slots=True)
class ServeLoad:
    """What each Serve replica of a deployment on our own engines loads (`ModelServer`'s argument); its
    repr names the Serve code version, so it holds nothing that changes between deploys of one load."""

    pipeline: str
    model_dir: str
    threads: int
    device: str
    warmup: bool
    max_batch: int
    max_wait: float
    # `transformers`, or where the replica chooses an encoder's runtime at load, as a local worker does:
    # `auto`, `onnxruntime`, `openvino` (`engines.replica_engine`)
    engine: str = "transformers"
    precision: str = "float32"
    engine_cache: str | None = None  # encoder exports and decisions: `<data>/encoder-runtimes`
    kv_cache_mb: int | None = None  # the KV cache its footprint reserved (a generation task)
    generation: dict[str, str] = field(default_factory=dict)  # its generation settings' environment


@dataclass(frozen=True, slots=True)
class VllmLaunch:
    """How each Serve replica of a deployment on the vLLM engine starts vLLM's replica worker
    (`VllmServer`'s argument): vLLM's Python and our worker module, what its environment adds to the
    actor's, and its command line (without `--replica` and the sockets, which the actor adds)."""

    command: tuple[str, ...]
    env: dict[str, str]
    args: tuple[str, ...]
    model_dir: str  # its model's folder (the footprint counts the model's own files whole)


def ray_device(device: str) -> str:
    """The device setting inside a Serve replica: Ray shows an actor only the GPU it was given, as
    `cuda` (its `CUDA_VISIBLE_DEVICES`), so a GPU index of the gateway's machine means nothing there."""
    return "cuda" if device.startswith("cuda:") else device


def gpu_share(gpu_bytes: int, largest_gpu: int) -> float:
    """The fraction of a GPU one replica's GPU memory is of the largest GPU (`largest_gpu` bytes, 0 when
    unknown: a whole GPU), at most 1, rounded up to Ray's resolution for fractions (1e-4)."""
    if largest_gpu <= 0:
        return 1.0
    return min(1.0, math.ceil(gpu_bytes / largest_gpu * 10_000) / 10_000)


def actor_resources(footprint: Footprint | None, threads: int, largest_gpu: int) -> dict[str, Any]:
    """The Ray resources one Serve replica reserves: a CPU per thread, its footprint's host memory as
    Ray's `memory` (bytes), and its GPU memory as that share of a GPU, so that Ray packs replicas onto
    the cluster's nodes by the memory they take. No footprint (never placed): CPUs only."""
    options: dict[str, Any] = {"num_cpus": threads}
    if footprint is not None and footprint.host > 0:
        options["memory"] = footprint.host
    if footprint is not None and footprint.gpu > 0:
        options["num_gpus"] = gpu_share(footprint.gpu, largest_gpu)
    return options


def no_room(options: dict[str, Any], nodes: list[dict[str, Any]]) -> str | None:
    """Why no alive node of the cluster (`ray.nodes()`) can ever hold a replica reserving `options`, or
    None. Serve would otherwise keep the replica pending, and the load waiting, until it times out."""
    alive = [node.get("Resources") or {} for node in nodes if node.get("Alive")]
    memory, gpus = int(options.get("memory", 0)), float(options.get("num_gpus", 0))
    largest = int(max((resources.get("memory", 0) for resources in alive), default=0))
    needs = f"no node of the Ray cluster can hold its footprint: it needs {-(-memory // MB)} MiB of memory"
    if memory > largest:
        return f"{needs}, the largest node has {largest // MB} MiB"
    roomy = [resources for resources in alive if resources.get("memory", 0) >= memory]
    if gpus > 0 and not any(resources.get("GPU", 0) >= gpus for resources in roomy):
        return f"{needs} and {gpus:g} of a GPU, and no node with that much memory has a GPU"
    return None


class ModelServer:
    """One Serve replica (a Ray actor) on our own engines: loads the model once with the task handler,
    puts an encoder on the runtime its deployment's engine leaves to the replica (measured, or its cached
    decision read, exactly as a local worker does), and hosts it with the same `ReplicaHost` as a local
    worker. Requests (`run` for one request of a batch task, `generate` for a stream) come in on the
    actor's event loop and are handed to one model thread, which runs the host's batches and steps in
    order; the event loop stays free to take requests and cancellations while the model computes, and
    requests that arrive meanwhile join the next batch."""

    def __init__(self, load: ServeLoad) -> None:
        model_dir = Path(load.model_dir)
        if not model_dir.is_dir():  # checked before importing torch: a node without them fails fast
            raise FileNotFoundError(f"the model's files are not on this node: {model_dir}")
        from modelhost.runtime.worker import sync_worker  # in the actor: imports torch and the handlers

        self._reporter = _MemoryReporter(model_dir)
        self._reporter.start()
        os.environ.update(WORKER_ENV)
        if load.kv_cache_mb:  # our generation engine reads its KV cache from the environment's settings
            os.environ["MODELHOST_KV_CACHE_MB"] = str(load.kv_cache_mb)
            get_settings.cache_clear()
        os.environ.pop(ENVIRONMENT, None)  # the deployment's generation settings, read at load: its own
        os.environ.update(load.generation)
        handler, state = sync_worker.load(load.pipeline, model_dir, load.threads, load.device)
        cache = Path(load.engine_cache) if load.engine_cache else None
        choice = sync_worker.choose_runtime(handler, state, model_dir, load.engine, cache, load.precision)
        self._choice: EngineChoice | None = (
            None if choice is None else (choice.engine, choice.reason, choice.quality)
        )
        if load.warmup:
            sync_worker.warm_up(handler, state)
        tracing.start("replica")  # where the node's OTEL_* variables name an endpoint
        self._host = ReplicaHost(
            handler, state, deployment=self._reporter.app, max_batch=load.max_batch, max_wait=load.max_wait
        )
        self._ids = itertools.count(1)
        self._waiting = Waiters()
        self._inbox: collections.deque[ToReplica] = collections.deque()
        self._wake = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        threading.Thread(target=self._model_loop, name="model", daemon=True).start()

    def __del__(self) -> None:
        """Serve stops the replica (scaled down, deleted): its memory is no longer reported."""
        with contextlib.suppress(Exception):
            self._reporter.stop()

    async def engine_choice(self) -> EngineChoice | None:
        """The encoder runtime this replica chose at load and why (None: it runs the engine asked for);
        the gateway shows it on the deployment, as a local worker's `Ready` message says it."""
        return self._choice

    async def run(self, item: dict[str, Any], trace: str = "") -> dict[str, Any]:
        """One request of a batch task; the host batches it with the others waiting. `trace`: the
        gateway dispatch's `traceparent`, which the host's spans of it join."""
        request_id = next(self._ids)
        future: asyncio.Future[dict[str, Any]] = self._event_loop().create_future()
        self._waiting.calls[request_id] = future
        self._post(Run(request_id, item, low=low_priority(), trace=trace))
        try:
            return await future
        finally:  # still registered: the caller left (Ray cancelled this task); drop it if it waits
            if self._waiting.calls.pop(request_id, None) is not None:
                self._post(Cancel(request_id))

    async def run_many(self, items: list[dict[str, Any]], traces: list[str]) -> list[dict[str, Any]]:
        """The requests one gateway had waiting, each joining the host's queue on its own; a request
        whose batch failed answers an internal error (the gateway's 503) without failing the others."""
        return await _answers(self.run(item, trace) for item, trace in zip(items, traces, strict=True))

    async def generate(
        self, request: StreamRequest, trace: str = ""
    ) -> AsyncGenerator[GenerationEvent, None]:
        """A generation's events until it finishes. When the caller cancels (Ray cancels this task) or
        leaves, the sequence is dropped from the engine before its next step."""
        self._event_loop()
        events = self._waiting.stream(next(self._ids), self._post, request, trace)
        async with contextlib.aclosing(events):
            async for event in events:
                yield event

    async def running(self) -> int:
        """Sequences the engine holds (0 for batch pipelines): how tests see a cancellation arrive."""
        request_id = next(self._ids)
        future: asyncio.Future[Stats] = self._event_loop().create_future()
        self._waiting.calls[request_id] = future
        self._post(StatsRequest(request_id))
        return (await future).running

    def _event_loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        return self._loop

    def _post(self, message: ToReplica) -> None:
        self._inbox.append(message)
        self._wake.set()

    def _model_loop(self) -> None:
        """The model thread: take what arrived, run the host when it is due, hand back its answers."""
        host, inbox = self._host, self._inbox
        while True:
            self._wake.clear()
            while inbox:
                host.receive(_PEER, inbox.popleft())
            self._deliver(host.take_outgoing())
            delay = host.due()
            if delay is None or delay > 0:
                self._wake.wait(delay)
                continue
            host.work()
            self._deliver(host.take_outgoing())

    def _deliver(self, outgoing: list[tuple[Any, Any]]) -> None:
        if outgoing and self._loop is not None:
            self._loop.call_soon_threadsafe(self._answer, [message for _, message in outgoing])

    def _answer(self, messages: list[Any]) -> None:
        """On the event loop: resolve the callers of the host's answers."""
        for message in messages:
            self._waiting.answer(message)


async def _answers(runs: Iterable[Awaitable[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Each request's output; one that failed answers an internal error (the gateway's 503) without
    failing the others."""
    answers = await asyncio.gather(*runs, return_exceptions=True)
    return [
        a if isinstance(a, dict) else item_error(f"{type(a).__name__}: {a}", internal=True) for a in answers
    ]


class VllmServer:
    """One Serve replica (a Ray actor) on the vLLM engine. As Ray Serve's own LLM deployments do, the
    actor runs vLLM in a child process under vLLM's own Python (its environment must be at the same path
    on every node): the same replica worker a local replica runs (`runtime.worker.vllm_worker`, started by
    `spawn.start_worker` with a lifeline and a listening socket), and forwards `generate` to it over the
    replica protocol. The child dies with the actor: the actor kills its process group when Serve stops
    it, and the kernel kills it when the actor's process dies (`PR_SET_PDEATHSIG`: it is forked from the
    thread that runs the actor's user code, which lives as long as the actor)."""

    # Serve awaits an async constructor (`initialize_callable`): starting the worker and waiting for its
    # model are the replica's start, and its connection must live on the loop that serves the calls.
    async def __init__(self, launch: VllmLaunch) -> None:  # type: ignore[misc]
        # the actor's process tree: vLLM's processes are in it
        self._reporter = _MemoryReporter(Path(launch.model_dir))
        self._reporter.start()
        self._process: WorkerProcess | None = None
        self._exited = False
        ours, theirs = socket.socketpair()
        # The worker wants a listening socket; nobody else connects (the actor's calls use the lifeline),
        # so its private folder (0700, like a local replica's) goes as soon as the worker holds it.
        folder = tempfile.mkdtemp(prefix="modelhost-serve-")
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(os.path.join(folder, "replica.sock"))
        listener.listen(1)
        name = f"{self._reporter.app}-{serve.get_replica_context().replica_id.unique_id}"
        # the actor's environment, with what the worker's launch names (vLLM's legacy KV-cache setting,
        # which counts whole GiB and overrides ours, never passed on)
        environment = {k: v for k, v in os.environ.items() if k != "VLLM_CPU_KVCACHE_SPACE"} | launch.env
        try:
            self._process = await start_worker(
                ["--replica", name, *launch.args],
                environment,
                theirs,
                listener,
                preload=False,
                command=launch.command,
            )
        finally:
            theirs.close()  # the worker holds its ends now
            listener.close()
            shutil.rmtree(folder, ignore_errors=True)
        self._connection: ReplicaConnection = await connect_pair(ours, self._lost)
        try:
            hello = await self._connection.hello
        except ReplicaDied as exc:
            self._stop()
            raise ReplicaLoadFailed("vLLM's replica worker exited while loading") from exc
        if isinstance(hello, LoadFailed):
            self._stop()
            raise ReplicaLoadFailed(hello.reason)

    def __del__(self) -> None:
        """Serve stops the replica (scaled down, deleted): vLLM's processes stop with it."""
        with contextlib.suppress(Exception):
            self._stop()

    def _stop(self) -> None:
        self._reporter.stop()
        if self._process is not None and self._process.pid is not None:
            # the worker's own session: vLLM's engine processes are in its group
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self._process.pid, signal.SIGKILL)

    def _lost(self, connection: ReplicaConnection) -> None:
        """The worker exited (its engine died, or it was killed): the replica is unhealthy from now on."""
        self._exited = True

    def check_health(self) -> None:
        """Serve's periodic health check: a replica whose vLLM worker is gone is replaced."""
        if self._exited:
            raise RuntimeError("vLLM's replica worker exited")

    async def engine_choice(self) -> EngineChoice | None:
        """vLLM runs as asked: nothing was chosen at load."""
        return None

    async def generate(
        self, request: StreamRequest, trace: str = ""
    ) -> AsyncGenerator[GenerationEvent, None]:
        """A generation's events from vLLM's worker. When the caller cancels (Ray cancels this task) or
        leaves, closing the worker's stream sends `Cancel`, and vLLM aborts the request."""
        async with contextlib.aclosing(self._connection.stream(request, trace)) as events:
            async for event in events:
                yield event

    async def run_many(self, items: list[dict[str, Any]], traces: list[str]) -> list[dict[str, Any]]:
        """An embedding GGUF's requests (the llama.cpp worker answers a batch task's `Run`s), answered as
        `ModelServer.run_many` answers them."""
        connection = self._connection
        return await _answers(connection.submit(i, t) for i, t in zip(items, traces, strict=True))

    async def running(self) -> int:
        """Sequences vLLM holds: how tests see a cancellation arrive."""
        return (await self._connection.stats()).running


def connect(settings: Settings) -> None:
    """Join the Ray cluster (or start a local one) and Serve, once per gateway process. Blocking.

    Serve runs without its HTTP proxies: the gateway is the only ingress and calls replicas through
    deployment handles. A Ray instance started elsewhere in this process (a test, an embedding
    application) is reused as it is."""
    global _started_ray
    with _connect_lock:
        if not ray.is_initialized():
            # SIGTERM is how a gateway is stopped, and it shuts down cleanly: keep Ray's C++ failure
            # handler (installed when the driver connects) from printing a stack trace for it.
            ray_constants.RAY_DISABLE_FAILURE_SIGNAL_HANDLER = True
            address = settings.ray_address or None
            ray.init(address=address, include_dashboard=False, logging_level=logging.WARNING)
            _started_ray = True
        serve.start(proxy_location="Disabled")


def disconnect() -> None:
    """Leave Ray if this module started it. Serve and its applications are left running: other
    gateways share them, and an application is deleted only with its deployment."""
    global _started_ray
    with _connect_lock:
        if _started_ray and ray.is_initialized():
            ray.shutdown()
        _started_ray = False


def runs_private_ray(settings: Settings) -> bool:
    """Whether this gateway runs (or will start) its own Ray instance, which nothing else shares and
    which stops with the gateway: no cluster address, and no Ray started beside it in this process."""
    return _started_ray or (not settings.ray_address and not ray.is_initialized())


def startup_failure(app: str) -> str | None:
    """Serve's reason when no replica of the application runs and starting one keeps failing (its
    model no longer loads: files gone, out of memory), else None. Serve would retry forever and hold
    requests until they time out."""
    status = serve.status().applications.get(app)
    for deployment in status.deployments.values() if status is not None else []:
        if (
            deployment.status in ("UNHEALTHY", "DEPLOY_FAILED")
            and deployment.status_trigger == "REPLICA_STARTUP_FAILED"
            and not deployment.replica_states.get("RUNNING")  # type: ignore[call-overload]
        ):
            return reason_of(deployment.message)
    return None


def running_definition(app: str) -> tuple[Any, dict[str, Any]] | None:
    """The constructor argument and actor options of the application's replicas when it is deployed
    already (by this gateway or another), else None. A gateway that joins it deploys exactly those again,
    with its own autoscaling only: its own (a footprint remembered since, another machine's KV cache)
    would make Serve restart every replica. Serve has no public reader of a deployment's definition, so
    this asks its controller (a private call: None when it fails, and this gateway deploys its own)."""
    from ray.serve.context import _get_global_client

    try:
        client = _get_global_client()
        assert client is not None
        info, _ = client.get_deployment_info(DEPLOYMENT, app)
        config = info.replica_config
        return config.init_args[0], dict(config.ray_actor_options)
    except Exception:  # not deployed (the controller's KeyError), or a Serve that keeps it elsewhere
        return None


def reason_of(message: str) -> str:
    """The last line of a Ray error (the exception itself), without its terminal colours."""
    lines = [line.strip() for line in re.sub(r"\x1b\[[0-9;]*m", "", message).splitlines() if line.strip()]
    return lines[-1] if lines else message


def request_router(settings: Settings) -> RequestRouterConfig:
    """The deployment option that makes Serve route generations by their prompt's prefix
    (`serve_router.AffinityRouter`), unless `MODELHOST_ROUTING_POLICY=least_busy` keeps Serve's default."""
    if settings.routing_policy != "prefix":
        return RequestRouterConfig()
    options: dict[str, Any] = {  # Ray types the keyword arguments as dicts
        "request_router_class": serve_router.ROUTER_CLASS,
        "request_router_kwargs": {"max_imbalance": settings.routing_max_imbalance},
    }
    return RequestRouterConfig(**options)


def autoscaling(
    readiness: str, min_replicas: int, max_replicas: int, idle_seconds: float, settings: Settings
) -> dict[str, Any]:
    """Readiness as Ray Serve autoscaling. A cold deployment scales to zero after the idle window; it
    starts with one replica because the manager loads it for a request that is waiting. Warm and hot
    deployments keep at least one replica (hot ones also warm up in the constructor). Between the bounds
    Serve aims at the local backend's target of requests in flight per replica
    (`MODELHOST_AUTOSCALE_TARGET_IN_FLIGHT` as `target_ongoing_requests`) and takes a replica away after
    `MODELHOST_SCALE_DOWN_IDLE_SECONDS` of less load (`downscale_delay_s`; the last one of a cold
    deployment after the idle window, `downscale_to_zero_delay_s`).

    Serve scales down once the ongoing requests, averaged over `look_back_period_s` from metrics pushed
    every `metrics_interval_s` (10 s by default), stayed low for the downscale delay; both windows add to
    the idle time, so short idle windows shrink them too (the long default window is kept otherwise)."""
    floor = 0 if readiness == "cold" else max(1, min_replicas)
    interval = min(10.0, idle_seconds / 4)
    return {
        "min_replicas": floor,
        "initial_replicas": max(1, floor),
        "max_replicas": max(1, floor, max_replicas),
        "target_ongoing_requests": settings.autoscale_target_in_flight,
        "upscale_delay_s": 0.0,  # a request waiting on zero replicas must not wait any longer
        "downscale_delay_s": settings.scale_down_idle_seconds,
        "downscale_to_zero_delay_s": idle_seconds,
        "look_back_period_s": min(30.0, max(idle_seconds, 2 * interval)),
        **({"metrics_interval_s": interval} if interval < 10.0 else {}),  # the field warns when it is set
    }


def vllm_definition(spec: ReplicaSpec, settings: Settings, warmup: bool) -> VllmLaunch:
    """How a Serve replica starts vLLM's replica worker: the command line a local replica's worker gets
    (`launch.worker_launch`: vLLM's Python as this gateway finds it, which every node must have at the
    same path; the KV cache its footprint reserved). Ray shows the actor the GPUs it reserved, so no
    device index is named; the actor adds its own environment to what is named here."""
    launch = worker_launch(replace(spec, device=ray_device(spec.device)), settings, {}, warmup=warmup)
    return VllmLaunch(launch.command, launch.env, launch.args, str(spec.model_dir))


def application_name(deployment: DeploymentSpec) -> str:
    """A deployment's Serve application: named by its ID; a version loaded while the deployment lists
    others (a rollout, a canary) by its runtime key, so that both run side by side, each its own
    application (docs/deploy.md, "Ray Serve")."""
    return deployment.id if len(deployment.versions) <= 1 else deployment.key


class RayServeReplica:
    """The manager's one replica for a deployment on Ray Serve; Serve runs and scales the actors."""

    def __init__(
        self,
        spec: ReplicaSpec,
        settings: Settings,
        deployment: DeploymentSpec,
        on_exit: Callable[[Replica], None],
        largest_gpu: int = 0,
    ) -> None:
        """`deployment` as placed: its `footprint` is one replica's, declared to Ray as the actors'
        resources; `largest_gpu`: the largest GPU's memory in bytes (0: unknown), what a replica's GPU
        memory is a share of."""
        self.spec = spec
        self._on_exit = on_exit
        self.failure: str | None = None  # why no replica can start (`startup_failure`)
        self.name = application_name(deployment)
        self._settings = settings
        self._scaling = autoscaling(
            deployment.readiness,
            deployment.min_replicas,
            deployment.max_replicas,
            settings.cold_idle_seconds,
            settings,
        )
        self._warmup = deployment.readiness == "hot"
        self.actor_options = actor_resources(deployment.footprint, spec.threads, largest_gpu)
        self._handle: DeploymentHandle[Any] | None = None
        self._stopping = False
        self._request_ids = itertools.count(1)
        self._pending: dict[int, Any] = {}  # request id → its Ray response (`cancel()` on both kinds)
        # requests waiting for the next `run_many`: (item, its traceparent, its caller's future)
        self._waiting: list[tuple[dict[str, Any], str, asyncio.Future[dict[str, Any]]]] = []
        self._sender: asyncio.Task[None] | None = None
        self._streams: set[int] = set()
        self._memory: list[tuple[int, int]] = []  # (pid, footprint) of each replica, as last reported
        self._refresher: asyncio.Task[None] | None = None
        self.load_seconds: float | None = None
        # the encoder runtime the Serve replicas chose at load (`ModelServer.engine_choice`)
        self.engine_choice: EngineChoice | None = None
        self.pid: int | None = None  # no one process: Serve places the actors
        # Every gateway on a cluster serves the same application, so they bill it on one meter; a Ray
        # instance this gateway starts itself dies with it, and so does the application.
        self.shared_meter: str | None = None if runs_private_ray(settings) else f"serve:{self.name}"

    @property
    def alive(self) -> bool:
        return self._handle is not None and not self._stopping

    @property
    def in_flight(self) -> int:
        return len(self._pending) + len(self._waiting)

    @property
    def address(self) -> str | None:
        """Other gateway processes join the cluster themselves; there is no socket to share."""
        return None

    @property
    def route(self) -> str:
        return self.name  # one Serve application per deployment: Serve spreads its own replicas

    async def load(self) -> None:
        """Deploy the application, wait until its first replica has loaded the model, and ask it which
        engine it chose (an encoder's runtime)."""
        started = time.perf_counter()
        try:
            await asyncio.wait_for(self._start(), timeout=self._settings.load_timeout_seconds)
        except ReplicaLoadFailed:  # no node can hold it: nothing was deployed
            await self.unload()
            raise
        except TimeoutError as exc:
            await self.unload()
            raise ReplicaLoadFailed("timed out while loading the model") from exc
        except Exception as exc:  # Serve's reason: the constructor's exception, resources, ...
            await self.unload()
            raise ReplicaLoadFailed(reason_of(f"{type(exc).__name__}: {exc}")) from exc
        self.load_seconds = time.perf_counter() - started
        engine = self.engine_choice[0] if self.engine_choice is not None else self.spec.engine
        metrics.ENGINE.labels(self.spec.deployment_id, engine).set(1)
        self._refresher = asyncio.create_task(self._refresh())

    async def _start(self) -> None:
        handle = await asyncio.to_thread(self._deploy)
        choice = await handle.engine_choice.remote()
        self._handle, self.engine_choice = handle, None if choice is None else tuple(choice)

    async def rescale(self, deployment: DeploymentSpec) -> None:
        """Readiness or replica bounds changed (PATCH): deploy again with only the new autoscaling. Serve
        applies that in place, so running replicas and their requests carry on. The constructor's
        arguments stay as loaded (a hot deployment's warm-up matters only when a replica loads)."""
        scaling = autoscaling(
            deployment.readiness,
            deployment.min_replicas,
            deployment.max_replicas,
            self._settings.cold_idle_seconds,
            self._settings,
        )
        if scaling != self._scaling and self.alive:
            self._scaling = scaling
            await asyncio.to_thread(self._deploy)

    def _deploy(self) -> DeploymentHandle[Any]:
        """Deploy the application: what this gateway would load, or, when it runs already, what its
        replicas load (`running_definition`), with this gateway's autoscaling. Blocking."""
        connect(self._settings)
        server, argument = self._definition()
        options = self.actor_options
        running = running_definition(self.name)
        if running is not None and type(running[0]) is type(argument):
            argument, options = running
        else:
            refused = no_room(options, ray.nodes())  # type: ignore[no-untyped-call]
            if refused is not None:
                raise ReplicaLoadFailed(refused)
        deployment = serve.deployment(
            name=DEPLOYMENT,
            autoscaling_config=self._scaling,
            max_ongoing_requests=max(MAX_ONGOING_REQUESTS, 2 * self._settings.max_batch_size),
            ray_actor_options=options,
            max_constructor_retry_count=CONSTRUCTOR_RETRIES,
            request_router_config=request_router(self._settings),
        )(server)
        # `serve.run` gives each call a random code version, and a new code version restarts every
        # replica. A version named after what the replicas load lets Serve apply an autoscaling-only
        # change (`rescale`) in place; the public option for it is gone, hence the attribute.
        deployment._version = hashlib.sha256(repr((server.__name__, argument)).encode()).hexdigest()[:16]
        app = deployment.bind(argument)
        with _deploy_lock:
            handle: DeploymentHandle[Any] = serve.run(app, name=self.name, route_prefix=None)
        return handle

    def _definition(self) -> tuple[type, ServeLoad | VllmLaunch]:
        """The actor class of the deployment's engine and its argument."""
        spec, settings = self.spec, self._settings
        if engine_spec(spec.engine).worker is not None:  # a worker program of its own, the actor's child
            return VllmServer, vllm_definition(spec, settings, self._warmup)
        load = ServeLoad(
            pipeline=spec.pipeline,
            model_dir=str(spec.model_dir),
            threads=spec.threads,
            device=ray_device(spec.device),
            warmup=self._warmup,
            max_batch=settings.max_batch_size,
            max_wait=settings.max_batch_wait_ms / 1000,
            engine=spec.engine,
            precision=spec.precision,
            engine_cache=str(settings.data_dir / "encoder-runtimes"),
            kv_cache_mb=spec.kv_cache_mb,
            generation=spec.generation.environment(),
        )
        return ModelServer, load

    async def submit(self, item: dict[str, Any], trace: str = "") -> dict[str, Any]:
        """One request. A Ray call costs far more than a socket write, so one call carries every
        request this gateway has waiting: those that arrive while a call is out go together in the
        next (`run_many`), and the Serve replica's host batches them with everyone else's."""
        if self._handle is None or self._stopping:
            raise ReplicaDied("the replica is not running")
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        waiting = (item, trace, future)
        self._waiting.append(waiting)
        if self._sender is None or self._sender.done():
            self._sender = asyncio.create_task(self._send_waiting())
        try:
            return await future
        finally:
            if waiting in self._waiting:  # the caller left before it was sent: it never will be
                self._waiting.remove(waiting)

    async def _send_waiting(self) -> None:
        """One `run_many` call at a time, each with everything waiting when it starts."""
        assert self._handle is not None
        while self._waiting:
            group, self._waiting = self._waiting, []
            request_id = next(self._request_ids)
            response = self._handle.run_many.remote([w[0] for w in group], [w[1] for w in group])
            self._pending[request_id] = response
            try:
                outputs: list[dict[str, Any]] = await response
            except BaseException as exc:  # failed, or cancelled by `detach` / `_give_up`
                failure = (
                    self._failure(exc)
                    if isinstance(exc, RayError | RayServeException)
                    else ReplicaDied("the Serve replica stopped")
                )
                for _, _, future in group:
                    if not future.done():
                        future.set_exception(failure)
                if not isinstance(exc, Exception):
                    raise
                continue
            finally:
                self._pending.pop(request_id, None)
            for (_, _, future), output in zip(group, outputs, strict=True):
                if not future.done():
                    future.set_result(output)

    async def stream(self, request: StreamRequest, trace: str = "") -> AsyncGenerator[GenerationEvent, None]:
        """A generation's events from a Serve replica; closing the iterator early cancels the Ray
        response, which cancels the replica's generator and drops the sequence from its engine."""
        if self._handle is None or self._stopping:
            raise ReplicaDied("the replica is not running")
        request_id = next(self._request_ids)
        response: Any = self._handle.options(stream=True).generate.remote(request, trace)
        self._pending[request_id] = response
        self._streams.add(request_id)
        finished = False
        try:
            async for event in response:
                finished = is_last(event)
                yield event
        except (RayError, RayServeException) as exc:
            finished = True
            raise self._failure(exc) from exc
        finally:
            self._pending.pop(request_id, None)
            self._streams.discard(request_id)
            if not finished:
                response.cancel()

    async def held(self) -> int:
        """What this gateway has in flight on the application (Serve scales it down by itself)."""
        return len(self._pending)

    def handoff(self) -> None:
        """Serve drains its own replicas (it scales the application): nothing is handed off."""

    def measure(self, table: dict[int, int]) -> Footprint:
        """What the Serve replicas last reported (they measure themselves, on whichever node)."""
        return Footprint(sum(used for _, used in self._memory))

    async def unload(self) -> None:
        """Delete the Serve application (its replicas stop with it), for every gateway. Idempotent."""
        await self.detach()
        if ray.is_initialized():
            with contextlib.suppress(Exception):  # already gone, or Serve shut down under us
                await asyncio.to_thread(serve.delete, self.name)

    async def detach(self) -> None:
        """This gateway stops using the application; it keeps running for the other gateways."""
        self._stopping = True
        if self._refresher is not None:
            self._refresher.cancel()
        for response in list(self._pending.values()):
            response.cancel()
        waiting, self._waiting = self._waiting, []
        for _, _, future in waiting:
            if not future.done():
                future.set_exception(ReplicaDied("the replica was unloaded"))
        self._memory = []

    def stats(self) -> ReplicaStats:
        """The Serve replicas' footprints, as they last reported them (on whichever node)."""
        return ReplicaStats(
            pid=None,
            memory_bytes=sum(used for _, used in self._memory),
            load_seconds=self.load_seconds,
            in_flight=self.in_flight,
            processes=len(self._memory),
        )

    async def _refresh(self) -> None:
        """Re-read the replicas' reports now and then (Serve starts, restarts and stops them by itself),
        and notice when none can start any more."""
        board = memory_board()
        while not self._stopping:
            with contextlib.suppress(Exception):  # a missed reading keeps the last one
                self._memory = list(await board.read.remote(self.name))
            broken = None
            with contextlib.suppress(Exception):
                broken = await asyncio.to_thread(startup_failure, self.name)
            if broken is not None and not self._stopping:
                self._give_up(broken)
                return
            await asyncio.sleep(REFRESH_SECONDS)

    def _give_up(self, reason: str) -> None:
        """No replica can start: fail the requests waiting for one, and tell the manager, which deletes
        the application and shows the deployment `failed` with the reason until its next load retry."""
        log.error("deployment %s: no Serve replica can start: %s", self.name, reason)
        self.failure = reason
        for response in list(self._pending.values()):
            response.cancel()
        self._on_exit(self)

    def _failure(self, exc: RayError | RayServeException) -> Exception:
        """The replica's own exception is a failed inference; anything else (its actor died, Serve
        could not reach it, the request was failed by `_give_up`) means it stopped under the request."""
        if self.failure is not None:  # nothing ran: the deployment cannot be served now
            return DeploymentUnavailable(f"No Serve replica of the deployment can start: {self.failure}")
        if isinstance(exc, RayTaskError) and not isinstance(exc, RayActorError):
            if isinstance(exc.cause, ReplicaDiedBeforeStart):  # its worker was gone before it: Serve
                return DeploymentUnavailable(  # replaces the replica; the request never reached a model
                    f"The Serve replica's worker is not running ({exc.cause}); a replacement is starting: "
                    "retry shortly."
                )
            if isinstance(exc.cause, ReplicaDied):  # the Serve replica's own worker (vLLM's) died
                return ReplicaDied(f"the Serve replica's worker stopped ({exc.cause})")
            return ReplicaFailed(str(exc.cause) if exc.cause is not None else str(exc))
        return ReplicaDied(f"the Serve replica stopped ({type(exc).__name__})")


class RayBackend:
    """Deployments as Ray Serve applications (`MODELHOST_RUNTIME=ray`): Serve scales their replicas."""

    scales_itself = True

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        # What a replica's GPU memory is a share of: the gateway's largest GPU (the cluster's are not
        # listed with their memory); 0 where it has none: a replica on a GPU then reserves a whole one
        self._largest_gpu = 0 if settings.device == "cpu" else max(gpu_totals(), default=0)

    def new_replica(
        self, deployment: DeploymentSpec, on_exit: Callable[[Replica], None], replicas: int
    ) -> Replica:
        """The deployment's application. Serve restarts replicas that die; `on_exit` is called when none
        can start any more."""
        threads = self._settings.worker_threads or 1  # the gateway's cores say nothing of the cluster's
        spec = ReplicaSpec.of(deployment, threads, self._settings.device)
        return RayServeReplica(spec, self._settings, deployment, on_exit, self._largest_gpu)

    async def close(self) -> None:
        """Leave Ray if this gateway joined it; the applications stay for other gateways."""
        await asyncio.to_thread(disconnect)
