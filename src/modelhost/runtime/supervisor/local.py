"""`Replica` backed by a local worker process (the default backend).

The supervisor starts the worker with two sockets: its lifeline (a socketpair; the supervisor's own
requests go over it too) and a listening Unix socket in the backend's private run folder, which the
server's other gateway processes connect to (`address`). Both speak the replica protocol.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import shutil
import signal
import socket
from collections.abc import AsyncGenerator, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from modelhost.config import Settings
from modelhost.engine_table import spec as engine_spec
from modelhost.generation.contract import GenerationEvent, StreamRequest
from modelhost.metrics import process_gone
from modelhost.run_folders import new_folder
from modelhost.runtime import metrics
from modelhost.runtime.capacity import Footprint
from modelhost.runtime.gateway.client import ReplicaConnection, connect_pair
from modelhost.runtime.memory import gpu_memory_bytes, tree, tree_footprint_bytes
from modelhost.runtime.replica import (
    Replica,
    ReplicaDied,
    ReplicaDiedBeforeStart,
    ReplicaLoadFailed,
    ReplicaSpec,
    ReplicaStats,
)
from modelhost.runtime.replica_protocol import Handoff, LoadFailed, Stop
from modelhost.runtime.supervisor.launch import worker_launch
from modelhost.runtime.worker.spawn import WorkerProcess, start_worker

if TYPE_CHECKING:
    from modelhost.runtime.spec import DeploymentSpec

log = logging.getLogger("modelhost.runtime")
_ids = itertools.count(1)


class LocalProcessReplica:
    """One worker process owning one model. `on_exit` is called once when the process ends."""

    def __init__(
        self,
        spec: ReplicaSpec,
        on_exit: Callable[[LocalProcessReplica], None],
        settings: Settings,
        folder: Path,
        warmup: bool = False,
    ) -> None:
        self.spec = spec
        self.name = f"{spec.deployment_id}-{next(_ids)}"
        self._on_exit = on_exit
        self._settings = settings
        self._warmup = warmup
        self._path = folder / f"{self.name}.sock"
        self._process: WorkerProcess | None = None
        self._connection: ReplicaConnection | None = None
        self._watcher: asyncio.Task[None] | None = None
        self._stopping = False
        self.load_seconds: float | None = None
        self.engine_choice: tuple[str, str, str | None] | None = None  # engine, reason, int8 quality
        self.shared_meter: str | None = None  # this server's process: billed on a meter of its own
        self.failure: str | None = None  # a worker that exits died: a replacement is started
        self.footprint = Footprint(0)  # as last measured (`measure`)
        self._gone_reported = False

    @property
    def alive(self) -> bool:
        return (
            self._process is not None
            and self._process.returncode is None
            and not self._stopping
            and self._connection is not None
            and self._connection.alive
        )

    def _report_gone(self) -> None:
        """The worker's `live*` gauges stop counting: once, as soon as its exit is seen. A second, later
        call could name a pid the system has since given to another worker (pids wrap at 32768 on many
        machines, threads included) and erase that live worker's gauges."""
        if not self._gone_reported:
            self._gone_reported = True
            process_gone(self.pid)

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process else None

    @property
    def address(self) -> str | None:
        return str(self._path) if self.load_seconds is not None else None

    @property
    def route(self) -> str:
        return str(self._path)  # what the other gateway processes connect to (`address`)

    @property
    def in_flight(self) -> int:
        return self._connection.in_flight if self._connection is not None else 0

    async def load(self) -> None:
        """Start the worker and wait until it reports its model loaded (or why it could not)."""
        ours, theirs = socket.socketpair()
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(str(self._path))
        listener.listen(128)
        settings = self._settings
        launch = worker_launch(self.spec, settings, os.environ, warmup=self._warmup)
        # `--replica` first: `ps` shows which deployment a worker serves
        args, env, command = ["--replica", self.name, *launch.args], launch.env, list(launch.command)
        try:
            self._process = await start_worker(
                args, env, theirs, listener, preload=settings.worker_preload, command=command
            )
            self._gone_reported = False
        finally:
            theirs.close()  # the worker holds its ends now; ours alone tells it we are alive
            listener.close()
        self._connection = await connect_pair(ours, lambda _: None)
        self._watcher = asyncio.create_task(self._watch())
        try:
            hello = await asyncio.wait_for(
                asyncio.shield(self._connection.hello), settings.load_timeout_seconds
            )
        except (TimeoutError, ReplicaDied) as exc:
            await self.unload()
            raise ReplicaLoadFailed(
                "timed out while loading the model"
                if isinstance(exc, TimeoutError)
                else "the worker exited while loading"
            ) from exc
        if isinstance(hello, LoadFailed):
            await self.unload()
            raise ReplicaLoadFailed(hello.reason)
        self.load_seconds = hello.load_seconds
        if hello.engine is not None:
            self.engine_choice = (hello.engine, hello.engine_reason or "", hello.quality)
        engine = hello.engine or self.spec.engine
        metrics.ENGINE.labels(self.spec.deployment_id, engine).set(1)

    async def submit(self, item: dict[str, Any], trace: str = "") -> dict[str, Any]:
        if not self.alive or self._connection is None:
            raise ReplicaDiedBeforeStart("the replica is not running")
        return await self._connection.submit(item, trace)

    async def stream(self, request: StreamRequest, trace: str = "") -> AsyncGenerator[GenerationEvent, None]:
        if not self.alive or self._connection is None:
            raise ReplicaDied("the replica is not running")
        async with contextlib.aclosing(self._connection.stream(request, trace)) as events:
            async for event in events:
                yield event

    async def held(self) -> int:
        if not self.alive or self._connection is None:
            return 0
        try:
            stats = await asyncio.wait_for(self._connection.stats(), 5)
        except (TimeoutError, ReplicaDied):
            return -1  # cannot tell: do not unload it under someone
        return stats.queued + stats.running

    def handoff(self) -> None:
        if self.alive and self._connection is not None and self._connection.alive:
            self._connection.send(Handoff())

    async def unload(self) -> None:
        """Ask the worker to stop; kill it if it does not within a few seconds. Idempotent."""
        self._stopping = True
        process = self._process
        if process is not None and process.returncode is None:
            try:
                if self._connection is not None and self._connection.alive:
                    self._connection.send(Stop())
                await asyncio.wait_for(process.wait(), timeout=5)
            except (TimeoutError, ConnectionError, ReplicaDied):
                process.kill()
                await process.wait()
        self._kill_group()
        if self._watcher is not None and self._watcher is not asyncio.current_task():
            self._watcher.cancel()
        if self._connection is not None:
            self._connection.close()
        self._path.unlink(missing_ok=True)
        self._report_gone()

    async def detach(self) -> None:
        """The process is this server's alone: it stops with it."""
        await self.unload()

    async def rescale(self, deployment: DeploymentSpec) -> None:
        """Nothing to do: the manager starts `min_replicas` processes at the next load."""

    def stats(self) -> ReplicaStats:
        running = self._process is not None and self._process.returncode is None
        return ReplicaStats(
            pid=self.pid,
            # a worker that exited holds nothing: its pid may already be another process's
            memory_bytes=self.footprint.host + self.footprint.gpu if running else 0,
            load_seconds=self.load_seconds,
            in_flight=self.in_flight,
        )

    def measure(self, table: dict[int, int]) -> Footprint:
        """The worker's process tree (vLLM's engine processes are its children): host memory as
        `memory.tree_footprint_bytes` counts it, and the GPU memory its processes hold."""
        pid = self.pid if self._process is not None and self._process.returncode is None else None
        if pid is None:
            self.footprint = Footprint(0)
            return self.footprint
        gpu = gpu_memory_bytes(tree(pid, table)) if self.spec.device.startswith("cuda") else 0
        self.footprint = Footprint(tree_footprint_bytes(pid, table, self.spec.model_dir), gpu)
        return self.footprint

    def _kill_group(self) -> None:
        """A vLLM worker's engine processes (its own session), a llama.cpp worker's `llama-server`, end
        with it, even when it was killed."""
        if engine_spec(self.spec.engine).worker is not None and self.pid is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pid, signal.SIGKILL)

    async def _watch(self) -> None:
        assert self._process is not None
        code = await self._process.wait()
        self._kill_group()
        self._report_gone()
        if self._connection is not None:
            self._connection.close()
        if not self._stopping:
            log.warning("replica %s exited with code %s", self.name, code)
            self._stopping = True
            self._path.unlink(missing_ok=True)
            self._on_exit(self)


class LocalBackend:
    """Worker processes on this machine: `min_replicas` of them per loaded deployment. Their sockets
    live in a private folder (mode 0700): only this user's processes can reach them."""

    scales_itself = False

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._folder: Path | None = None

    def new_replica(
        self, deployment: DeploymentSpec, on_exit: Callable[[Replica], None], replicas: int
    ) -> Replica:
        # Replicas of one deployment share the cores rather than oversubscribing them.
        threads = self._settings.worker_threads or max(1, (os.cpu_count() or 1) // max(1, replicas))
        spec = ReplicaSpec.of(deployment, threads, self._settings.device)
        if self._folder is None:  # short and private: a Unix socket path has at most 107 bytes
            self._folder = new_folder("replicas")
        return LocalProcessReplica(
            spec,
            on_exit=on_exit,
            settings=self._settings,
            folder=self._folder,
            warmup=deployment.readiness == "hot",
        )

    async def close(self) -> None:
        """Every worker stopped with its deployment's runtime: remove their folder."""
        if self._folder is not None:
            shutil.rmtree(self._folder, ignore_errors=True)
            self._folder = None
