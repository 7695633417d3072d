"""`Replica` backed by a local worker process, spoken to over a Unix socketpair (the default backend)."""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import socket
import sys
from collections.abc import AsyncGenerator, Callable
from typing import TYPE_CHECKING, Any

from modelhost.config import Settings
from modelhost.runtime.channel import frame, read_message
from modelhost.runtime.memory import rss_bytes
from modelhost.runtime.replica import Replica, ReplicaDied, ReplicaLoadFailed, ReplicaSpec, ReplicaStats

if TYPE_CHECKING:
    from modelhost.services.deployments import DeploymentSpec

log = logging.getLogger("modelhost.runtime")
_ids = itertools.count(1)
# Workers log to the gateway's stderr: no progress bars, no tokenizer thread pools fighting torch's.
WORKER_ENV = {"TOKENIZERS_PARALLELISM": "false", "HF_HUB_DISABLE_PROGRESS_BARS": "1", "HF_HUB_OFFLINE": "1"}


class WorkerError(Exception):
    """The worker raised while running a batch; the message is its exception."""


class LocalProcessReplica:
    """One worker process owning one model. `on_exit` is called once when the process ends."""

    def __init__(
        self,
        spec: ReplicaSpec,
        on_exit: Callable[[LocalProcessReplica], None],
        load_timeout: float,
        warmup: bool = False,
    ) -> None:
        self.spec = spec
        self.name = f"{spec.deployment_id}-{next(_ids)}"
        self._on_exit = on_exit
        self._load_timeout = load_timeout
        self._warmup = warmup
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._process: asyncio.subprocess.Process | None = None
        self._pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._streams: dict[int, asyncio.Queue[dict[str, Any] | BaseException]] = {}
        self.generating = 0  # sequences the worker's engine holds, as it last reported
        self._tasks: list[asyncio.Task[None]] = []
        self._request_ids = itertools.count(1)
        self._stopping = False
        self._exited = asyncio.Event()
        self.load_seconds: float | None = None
        self.shared_meter: str | None = None  # this gateway's process: billed on a meter of its own
        self.failure: str | None = None  # a worker that exits died: a replacement is started

    @property
    def alive(self) -> bool:
        return self._process is not None and self._process.returncode is None and not self._stopping

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process else None

    async def load(self) -> None:
        """Start the worker and wait until it reports its model loaded (or why it could not)."""
        ours, theirs = socket.socketpair()
        args = [
            "-m", "modelhost.runtime.worker",
            "--replica", self.name,  # so that `ps` shows which deployment a worker serves
            "--fd", str(theirs.fileno()),
            "--pipeline", self.spec.pipeline,
            "--model-dir", str(self.spec.model_dir),
            "--threads", str(self.spec.threads),
            "--device", self.spec.device,
        ]  # fmt: skip
        if self._warmup:
            args.append("--warmup")
        try:
            self._process = await asyncio.create_subprocess_exec(
                sys.executable,
                *args,
                stdin=asyncio.subprocess.DEVNULL,
                env={**os.environ, **WORKER_ENV},
                pass_fds=(theirs.fileno(),),
            )
        finally:
            theirs.close()  # the worker holds its end now; ours alone tells it we are alive
        self._reader, self._writer = await asyncio.open_unix_connection(sock=ours)
        self._tasks.append(asyncio.create_task(self._watch()))
        first: asyncio.Future[dict[str, Any]] = asyncio.ensure_future(read_message(self._reader))
        exited: asyncio.Future[Any] = asyncio.ensure_future(self._exited.wait())
        done, _ = await asyncio.wait(
            [first, exited], timeout=self._load_timeout, return_when=asyncio.FIRST_COMPLETED
        )
        exited.cancel()
        if first not in done or first.exception() is not None:
            gone = self._exited.is_set() or first in done  # end-of-file: the worker died
            first.cancel()
            await self.unload()
            raise ReplicaLoadFailed(
                "the worker exited while loading" if gone else "timed out while loading the model"
            )
        message = first.result()
        if message["op"] != "ready":
            await self.unload()
            raise ReplicaLoadFailed(str(message.get("reason", "unknown load failure")))
        self.load_seconds = float(message["load_seconds"])
        self._tasks.append(asyncio.create_task(self._read_replies()))

    async def submit(self, batch: list[Any]) -> list[Any]:
        if not self.alive or self._writer is None:
            raise ReplicaDied("the replica is not running")
        request_id = next(self._request_ids)
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._pending[request_id] = future
        try:
            self._writer.write(frame({"op": "run", "id": request_id, "batch": batch}))
            await self._writer.drain()
            reply = await future
        finally:
            self._pending.pop(request_id, None)
        if "error" in reply:
            raise WorkerError(str(reply["error"]))
        outputs: list[Any] = reply["outputs"]
        return outputs

    async def stream(self, request: Any) -> AsyncGenerator[dict[str, Any], None]:
        """Start a generation in the worker and yield its events until it finishes; closing the
        iterator early (client gone) cancels the generation in the worker at its next step."""
        if not self.alive or self._writer is None:
            raise ReplicaDied("the replica is not running")
        request_id = next(self._request_ids)
        queue: asyncio.Queue[dict[str, Any] | BaseException] = asyncio.Queue()
        self._streams[request_id] = queue
        finished = False
        try:
            self._writer.write(frame({"op": "generate", "id": request_id, "request": request}))
            await self._writer.drain()
            while not finished:
                event = await queue.get()
                if isinstance(event, BaseException):
                    raise event
                finished = "finish" in event or "error" in event
                yield event
        finally:
            self._streams.pop(request_id, None)
            if not finished:
                await self.cancel(request_id)

    async def cancel(self, request_id: int) -> None:
        future = self._pending.get(request_id)
        if future is not None and not future.done():
            future.cancel()
        if self.alive and self._writer is not None:
            self._writer.write(frame({"op": "cancel", "id": request_id}))  # buffered: never blocks

    async def unload(self) -> None:
        """Ask the worker to stop; kill it if it does not within a few seconds. Idempotent."""
        self._stopping = True
        process = self._process
        if process is not None and process.returncode is None:
            try:
                if self._writer is not None:
                    self._writer.write(frame({"op": "stop"}))  # buffered: never blocks here
                await asyncio.wait_for(process.wait(), timeout=5)
            except (TimeoutError, ConnectionError):
                process.kill()
                await process.wait()
        for task in self._tasks:
            task.cancel()
        if self._writer is not None:
            self._writer.close()
            self._writer = self._reader = None
        self._fail_pending(ReplicaDied("the replica was unloaded"))

    async def detach(self) -> None:
        """The process is this gateway's alone: it stops with it."""
        await self.unload()

    async def rescale(self, deployment: DeploymentSpec) -> None:
        """Nothing to do: the manager starts `min_replicas` processes at the next load."""

    def stats(self) -> ReplicaStats:
        return ReplicaStats(
            pid=self.pid,
            rss_bytes=rss_bytes(self.pid),
            load_seconds=self.load_seconds,
            in_flight=self.in_flight,
        )

    @property
    def in_flight(self) -> int:
        return len(self._pending) + len(self._streams)

    async def _read_replies(self) -> None:
        assert self._reader is not None
        while True:
            try:
                message = await read_message(self._reader)
            except (asyncio.IncompleteReadError, ConnectionError):
                return  # the worker is gone: `_watch` fails what is pending
            if message.get("op") == "events":
                self.generating = message.get("running", self.generating)
                for request_id, event in message["events"]:
                    queue = self._streams.get(request_id)
                    if queue is not None:
                        queue.put_nowait(event)
                continue
            future = self._pending.get(message.get("id", -1))
            if future is not None and not future.done():
                future.set_result(message)

    async def _watch(self) -> None:
        assert self._process is not None
        code = await self._process.wait()
        self._exited.set()
        if not self._stopping:
            log.warning("replica %s exited with code %s", self.name, code)
        self._fail_pending(ReplicaDied(f"the replica's worker process exited (code {code})"))
        if not self._stopping:
            self._stopping = True
            self._on_exit(self)

    def _fail_pending(self, error: Exception) -> None:
        for future in self._pending.values():
            if not future.done():
                future.set_exception(error)
        for queue in self._streams.values():
            queue.put_nowait(error)
        self.generating = 0


class LocalBackend:
    """Worker processes on this machine: `min_replicas` of them per loaded deployment."""

    scales_itself = False

    def __init__(self, settings: Settings) -> None:
        self._settings = settings

    def new_replica(
        self, deployment: DeploymentSpec, on_exit: Callable[[Replica], None], replicas: int
    ) -> Replica:
        # Replicas of one deployment share the cores rather than oversubscribing them.
        threads = self._settings.worker_threads or max(1, (os.cpu_count() or 1) // max(1, replicas))
        spec = ReplicaSpec.of(deployment, threads, self._settings.device)
        return LocalProcessReplica(
            spec,
            on_exit=on_exit,
            load_timeout=self._settings.load_timeout_seconds,
            warmup=deployment.readiness == "hot",
        )

    async def close(self) -> None:
        """Nothing is left: every worker stopped with its deployment's runtime."""
