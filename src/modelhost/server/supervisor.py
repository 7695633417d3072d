"""The supervisor's side of a server: the control socket and the gateway processes.

`ControlServer` answers the gateway processes' calls (`server.control`) with the supervisor's own
runtime and runners, pushes to all of them where a deployment's replicas are whenever that changes and
which cache entries to forget, and hands each batch line to a gateway to run (`line_call`). It listens
before the supervisor's services are built, so gateways started at the same moment connect while it
migrates; their calls are answered once `serve` is called. `Gateways` starts the gateway processes on
the shared listening socket, starts one again when it dies (only its own requests are lost), and at
shutdown asks them to drain and waits.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import signal
import socket
import sys
import time
from collections.abc import Awaitable
from pathlib import Path
from typing import Any

import msgspec
import orjson

from modelhost import tracing
from modelhost.auth.limits import RateLimiter
from modelhost.auth.principal import Principal
from modelhost.container import Services, Supervision
from modelhost.errors import Crashed, ModelhostError, ServiceUnavailable
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
    LineAnswered,
    LineCaller,
    Refused,
    Remove,
    Replicas,
    ResumeAccount,
    RunLine,
    StartRun,
    StopRuns,
    ToSupervisor,
    Touch,
    Wake,
    Welcome,
    decode_to_supervisor,
    encode,
)

log = logging.getLogger("modelhost.server")
RESTART_DELAY_SECONDS = 1.0
# How long a batch line waits for a gateway process to run it (one is starting again, say) before it is
# answered 503, which the batch runner takes as "not now" and tries again later.
LINE_WAIT_SECONDS = 30.0
# A line whose gateway process died while running it goes to another (or the restarted one) this many
# times more: most such lines are innocent (the gateway was killed), and one that kills every gateway it
# reaches costs two of them, not all (`runtime.gateway.dispatch` treats replicas alike for `infer`).
LINE_RETRIES_AFTER_CRASH = 1


class GatewayLost(Exception):
    """The gateway process running a batch line went away before answering it."""


class _Session(asyncio.Protocol):
    """One gateway process's control connection."""

    def __init__(self, server: ControlServer) -> None:
        self._server = server
        self._reader = FrameReader()
        self.transport: asyncio.Transport | None = None
        self.pid = 0  # from its `Hello`: a gateway that has said hello runs batch lines
        self.lines: dict[int, asyncio.Future[LineAnswered]] = {}

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self._server.sessions.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self._server.sessions.discard(self)
        for future in self.lines.values():
            if not future.done():
                future.set_exception(GatewayLost(f"gateway process {self.pid} went away"))

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

    @property
    def open(self) -> bool:
        return self.transport is not None and not self.transport.is_closing()


class ControlServer:
    """The supervisor's end of the control protocol (see the module docstring)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.sessions: set[_Session] = set()
        self._server: asyncio.AbstractServer | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._ready: asyncio.Future[tuple[Services, Supervision]] | None = None
        self._lines = itertools.count(1)
        self._gateway_joined = asyncio.Event()

    async def start(self) -> None:
        """Listen; calls wait until `serve`."""
        loop = asyncio.get_running_loop()
        self._ready = loop.create_future()
        self._server = await loop.create_unix_server(lambda: _Session(self), str(self.path))

    def serve(self, services: Services, supervision: Supervision) -> None:
        """Answer with these services from now on (the supervisor's, once built)."""
        assert self._ready is not None
        supervision.runtime.replicas_changed = self._replicas_changed
        for name, cache in services.caches.items():
            cache.on_forget = lambda key, name=name: self._broadcast(Forget(name, key))
        self._ready.set_result((services, supervision))

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for session in list(self.sessions):
            if session.transport is not None:
                session.transport.close()
        for task in list(self._tasks):
            task.cancel()
        if self._ready is not None and not self._ready.done():
            self._ready.cancel()

    def _replicas_changed(self, deployment_id: str, addresses: list[str]) -> None:
        self._broadcast(Replicas(deployment_id, addresses))

    def _broadcast(self, message: msgspec.Struct, *, but: _Session | None = None) -> None:
        for session in self.sessions:
            if session is not but:
                session.send(message)

    # ---------------------------------------------------------------- gateway → supervisor

    def received(self, session: _Session, message: ToSupervisor) -> None:
        if isinstance(message, LineAnswered):
            future = session.lines.pop(message.line, None)
            if future is not None and not future.done():
                future.set_result(message)
            return
        if isinstance(message, Hello):
            session.pid = message.pid
        ready = self._ready
        if isinstance(message, Touch | Forget | Wake):
            # told only by gateways that were welcomed, which happens once the services are built
            assert ready is not None and ready.done()
            self._told(session, message, *ready.result())
            return
        task = asyncio.create_task(self._answer(session, message.call, self._call(message)))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _told(
        self, session: _Session, message: Touch | Forget | Wake, services: Services, supervision: Supervision
    ) -> None:
        if isinstance(message, Touch):
            supervision.runtime.touch(message.ages)
        elif isinstance(message, Wake):
            supervision.wake(message.runner)
        else:
            cache = services.caches.get(message.cache)
            if cache is not None:
                cache.forget_here(message.key)
            self._broadcast(message, but=session)

    async def _call(self, message: ToSupervisor) -> Any:
        assert self._ready is not None
        _, supervision = await asyncio.shield(self._ready)
        runtime = supervision.runtime
        if isinstance(message, Hello):
            self._gateway_joined.set()
            return Welcome(supervision.agents.name, runtime.addresses())
        if isinstance(message, Acquire):
            return await runtime.acquire(message.deployment_id)
        if isinstance(message, GetStatus):
            return await runtime.status(message.deployment_id)
        if isinstance(message, GetCapacity):
            return await runtime.capacity()
        if isinstance(message, Apply):
            return await runtime.apply(message.deployment_id)
        if isinstance(message, Remove):
            return await runtime.remove(message.deployment_id)
        if isinstance(message, ResumeAccount):
            return await runtime.resume_account(message.account_id)
        if isinstance(message, StartRun):
            return await supervision.agents.submit(message.job)
        if isinstance(message, StopRuns):
            return await supervision.agents.stop_runs(message.run_ids)
        assert isinstance(message, CancelVideo)
        return await supervision.videos.cancel(message.video_id)

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

    # ---------------------------------------------------------------- batch lines, run by gateways

    async def line_call(
        self, principal: Principal, endpoint: str, body: dict[str, Any], pinned: str | None = None
    ) -> tuple[int, str, bytes]:
        """The batch runner's `LineCall`: the line runs in the gateway process with the fewest lines in
        flight. Without a gateway for `LINE_WAIT_SECONDS` it is a 503 (the runner tries it again later);
        a line whose gateway died while running it goes to another once, then is a 502 `gateway_crashed`
        (see `LINE_RETRIES_AFTER_CRASH`)."""
        caller, payload = LineCaller.of(principal), orjson.dumps(body)
        traceparent = tracing.parent() or ""
        lost = 0
        while True:
            session = await self._gateway_for_line()
            if session is None:
                error: ModelhostError = ServiceUnavailable(
                    "No gateway process is running to answer this line; it is tried again later."
                )
                return error.status_code, "", orjson.dumps(error.body())
            number = next(self._lines)
            future: asyncio.Future[LineAnswered] = asyncio.get_running_loop().create_future()
            session.lines[number] = future
            session.send(RunLine(number, caller, endpoint, payload, traceparent, pinned or ""))
            try:
                answer = await future
            except GatewayLost as exc:
                lost += 1
                if lost > LINE_RETRIES_AFTER_CRASH:
                    error = Crashed(
                        f"The gateway process running this line stopped ({exc}), and so did the one it was "
                        "sent to again: it is not sent a third time, since it may be what stops them.",
                        code="gateway_crashed",
                    )
                    return error.status_code, "", orjson.dumps(error.body())
                continue
            finally:
                session.lines.pop(number, None)
            return answer.status, answer.request_id, answer.body

    async def _gateway_for_line(self) -> _Session | None:
        deadline = time.monotonic() + LINE_WAIT_SECONDS
        while True:
            welcomed = [s for s in self.sessions if s.pid and s.open]
            if welcomed:
                return min(welcomed, key=lambda s: len(s.lines))
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            self._gateway_joined.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._gateway_joined.wait(), min(left, 0.5))


def _refused(call: int, exc: ModelhostError) -> Refused:
    """The error a call failed with, as the gateway process rebuilds it for its client."""
    return Refused(call, type(exc).__name__, exc.message, exc.param, exc.code, exc.headers)


class Gateways:
    """The server's gateway processes, numbered 1 to `count`, on its listening socket."""

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
        """Pass a stop signal on: each process stops accepting and drains its own requests. The
        supervisor's own copy of the listening socket closes too (no gateway starts again), so that new
        connections are refused once every gateway has stopped accepting."""
        self._stopping = True
        self._listener.close()
        for process in self.processes.values():
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signum)

    async def stop(self, timeout: float) -> None:
        """Ask every process to drain and exit; kill what is left after `timeout`."""
        self.signal(signal.SIGTERM)
        processes = [p for p in self.processes.values() if p.returncode is None]
        try:
            await asyncio.wait_for(asyncio.gather(*(p.wait() for p in processes)), timeout)
        except TimeoutError:
            for process in processes:
                with contextlib.suppress(ProcessLookupError):
                    process.kill()
            await asyncio.gather(*(p.wait() for p in processes))
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
