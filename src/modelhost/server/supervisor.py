"""The supervisor's side of a server: the control socket and the other gateway processes.

`ControlServer` answers the other gateway processes' calls (`server.control`) with the supervisor's own
runtime and runners, and pushes to all of them where a deployment's replicas are whenever that changes
and which cache entries to forget. `Gateways` starts those processes on the shared listening socket,
restarts one that dies (only its own requests are lost), and at shutdown asks them to drain and waits.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import sys
import time
from collections.abc import Awaitable
from pathlib import Path
from types import FrameType
from typing import Any

import msgspec
import uvicorn

from modelhost.auth.limits import RateLimiter
from modelhost.container import Services, Supervision
from modelhost.errors import ModelhostError
from modelhost.metrics import process_gone
from modelhost.server.control import (
    Acquire,
    Apply,
    CancelVideo,
    Done,
    Forget,
    FrameReader,
    GetCapacity,
    GetStatus,
    Hello,
    Refused,
    Remove,
    Replicas,
    ResumeAccount,
    StartRun,
    StopRuns,
    ToSupervisor,
    Touch,
    Welcome,
    decode_to_supervisor,
    encode,
)

log = logging.getLogger("modelhost.server")
RESTART_DELAY_SECONDS = 1.0


class _Session(asyncio.Protocol):
    """One gateway process's control connection."""

    def __init__(self, server: ControlServer) -> None:
        self._server = server
        self._reader = FrameReader()
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self._server.sessions.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self._server.sessions.discard(self)

    def data_received(self, data: bytes) -> None:
        for body in self._reader.feed(data):
            try:
                message = decode_to_supervisor(body)
            except msgspec.DecodeError:
                log.exception("an unreadable control message: closing that connection")
                if self.transport is not None:
                    self.transport.close()
                return
            self._server.received(self, message)

    def send(self, message: msgspec.Struct) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(encode(message))


class ControlServer:
    """The supervisor's end of the control protocol (see the module docstring)."""

    def __init__(self, services: Services, supervision: Supervision, path: Path) -> None:
        self._services = services
        self._supervision = supervision
        self.path = path
        self.sessions: set[_Session] = set()
        self._server: asyncio.AbstractServer | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_unix_server(lambda: _Session(self), str(self.path))
        self._supervision.runtime.replicas_changed = self._replicas_changed
        for name, cache in self._services.caches.items():
            cache.on_forget = lambda key, name=name: self._broadcast(Forget(name, key))

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for session in list(self.sessions):
            if session.transport is not None:
                session.transport.close()
        for task in list(self._tasks):
            task.cancel()

    def _replicas_changed(self, deployment_id: str, addresses: list[str]) -> None:
        self._broadcast(Replicas(deployment_id, addresses))

    def _broadcast(self, message: msgspec.Struct, *, but: _Session | None = None) -> None:
        for session in self.sessions:
            if session is not but:
                session.send(message)

    def received(self, session: _Session, message: ToSupervisor) -> None:
        runtime = self._supervision.runtime
        if isinstance(message, Touch):
            runtime.touch(message.deployment_ids)
        elif isinstance(message, Forget):
            cache = self._services.caches.get(message.cache)
            if cache is not None:
                cache.forget_here(message.key)
            self._broadcast(message, but=session)
        else:
            task = asyncio.create_task(self._answer(session, message.call, self._call(message)))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def _call(self, message: ToSupervisor) -> Awaitable[Any]:
        runtime, supervision = self._supervision.runtime, self._supervision
        if isinstance(message, Hello):
            return self._welcome()
        if isinstance(message, Acquire):
            return runtime.acquire(message.deployment_id)
        if isinstance(message, GetStatus):
            return runtime.status(message.deployment_id)
        if isinstance(message, GetCapacity):
            return runtime.capacity()
        if isinstance(message, Apply):
            return runtime.apply(message.deployment_id)
        if isinstance(message, Remove):
            return runtime.remove(message.deployment_id)
        if isinstance(message, ResumeAccount):
            return runtime.resume_account(message.account_id)
        if isinstance(message, StartRun):
            return supervision.agents.submit(message.job)
        if isinstance(message, StopRuns):
            return supervision.agents.stop_runs(message.run_ids)
        assert isinstance(message, CancelVideo)
        return supervision.videos.cancel(message.video_id)

    async def _welcome(self) -> Welcome:
        return Welcome(self._supervision.agents.name, self._supervision.runtime.addresses())

    async def _answer(self, session: _Session, call: int, work: Awaitable[Any]) -> None:
        try:
            value = await work
        except ModelhostError as exc:
            session.send(_refused(call, exc))
            return
        except Exception:
            log.exception("a control call failed")
            session.send(Refused(call, "ModelhostError", "Internal server error.", None, None, {}))
            return
        session.send(Done(call, value))


def _refused(call: int, exc: ModelhostError) -> Refused:
    """The error a call failed with, as the gateway process rebuilds it for its client."""
    return Refused(call, type(exc).__name__, exc.message, exc.param, exc.code, exc.headers)


class Gateways:
    """The server's gateway processes other than the supervisor, on its listening socket."""

    def __init__(
        self, count: int, listener: socket.socket, control: Path, log_level: str, limits: RateLimiter
    ) -> None:
        self.count = count
        self._listener = listener
        self._control = control
        self._log_level = log_level
        self._limits = limits  # on the table they share: a process that dies has its column cleared
        self.processes: dict[int, asyncio.subprocess.Process] = {}
        self._watchers: list[asyncio.Task[None]] = []
        self._stopping = False

    async def start(self) -> None:
        for index in range(1, self.count + 1):
            self._watchers.append(asyncio.create_task(self._keep(index)))

    def signal(self, signum: int) -> None:
        """Pass a stop signal on: each process stops accepting and drains its own requests."""
        self._stopping = True
        for process in self.processes.values():
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signum)

    async def stop(self, timeout: float) -> None:
        """Ask every process to drain and exit; kill what is left after `timeout`."""
        self.signal(signal.SIGTERM)
        processes = list(self.processes.values())
        try:
            await asyncio.wait_for(asyncio.gather(*(p.wait() for p in processes)), timeout)
        except TimeoutError:
            for process in processes:
                with contextlib.suppress(ProcessLookupError):
                    process.kill()
        for watcher in self._watchers:
            watcher.cancel()
        await asyncio.gather(*self._watchers, return_exceptions=True)

    async def _keep(self, index: int) -> None:
        """Run gateway process `index`; start it again whenever it dies, until the server stops."""
        while not self._stopping:
            started = time.monotonic()
            process = await self._spawn(index)
            self.processes[index] = process
            code = await process.wait()
            process_gone(process.pid)
            self._limits.forget_column(index)  # its requests in flight ended with it
            if self._stopping:
                return
            log.warning(
                "gateway process %d (pid %d) exited with code %s: starting it again", index, process.pid, code
            )
            if time.monotonic() - started < RESTART_DELAY_SECONDS:
                await asyncio.sleep(RESTART_DELAY_SECONDS)  # a process that cannot start does not spin

    async def _spawn(self, index: int) -> asyncio.subprocess.Process:
        fd = self._listener.fileno()
        return await asyncio.create_subprocess_exec(
            sys.executable, "-m", "modelhost.server.gateway",
            "--index", str(index),
            "--listen-fd", str(fd),
            "--control", str(self._control),
            "--limits", str(self._limits.table.path),
            "--log-level", self._log_level,
            stdin=asyncio.subprocess.DEVNULL,
            pass_fds=(fd,),
            start_new_session=True,  # Ctrl-C reaches the supervisor alone, which stops everything in order
            env=os.environ.copy(),
        )  # fmt: skip


class SupervisorServer(uvicorn.Server):
    """uvicorn's server, passing stop signals on to the other gateway processes at once, so that all of
    them stop accepting together and drain their own requests."""

    def __init__(self, config: uvicorn.Config, gateways: Gateways) -> None:
        super().__init__(config)
        self.gateways = gateways

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        self.gateways.signal(sig)
        super().handle_exit(sig, frame)
