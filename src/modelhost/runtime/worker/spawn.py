"""Starting replica worker processes: forked from a preloaded template, or executed afresh.

A fresh `python -m modelhost.runtime.worker.sync_worker` spends about 1.5 s of CPU importing torch and
transformers (far more on a busy machine) before it reads the model, so a small model's cold start was mostly
imports. By default workers are forked instead from the worker template (`runtime.worker.template`), a process
that imported them once: a cold start then costs the model's own loading. The template is one per
process that starts replicas (the supervisor), started on first use or by `warm_template` when the
server starts, and restarted if it dies; it ends with that process, and the workers it forked with it.

`worker_preload = false` executes each worker afresh: the switch for an environment where forking is
unsafe (a library that starts threads at import, say). Either way a worker gets the environment the
supervisor has when the replica starts, and `ps` shows the same command line.

The template is shared by every event loop of the process (a test session runs servers on several), so
one thread reads its messages and hands each result to the loop that waits for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
from collections import deque
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from typing import Protocol

import msgspec

# Workers log to the supervisor's stderr: no progress bars, no tokenizer thread pools fighting torch's.
WORKER_ENV = {"TOKENIZERS_PARALLELISM": "false", "HF_HUB_DISABLE_PROGRESS_BARS": "1", "HF_HUB_OFFLINE": "1"}

# Our own worker's OpenMP threads (torch's libgomp) wait for the next parallel region for a bounded
# moment (10,000 spins: a forward pass's regions follow each other within it), then sleep; and they do
# not spin at all when the process has more threads than cores. By default they spin for milliseconds
# after every region: a replica's idle threads then burned the cores its gateway and every other
# tenant's replica needed (docs/runtime.md; measured by `bench.path_costs`). Passive alone (no spin)
# cost a torch model a fifth of its requests at 1 connection. An operator's own settings win. vLLM and
# llama.cpp set up their own threads.
SYNC_WORKER_ENV = {"OMP_WAIT_POLICY": "PASSIVE", "GOMP_SPINCOUNT": "10000"}


def sync_worker_env(base: Mapping[str, str]) -> dict[str, str]:
    """The environment of our own worker (forked from the template, or executed): `base`, then
    `WORKER_ENV`, with `SYNC_WORKER_ENV` where `base` does not say otherwise."""
    return {**SYNC_WORKER_ENV, **base, **WORKER_ENV}


MESSAGE_BYTES = 1 << 20


# ---------------------------------------------------------------- the template's messages


class Fork(msgspec.Struct, tag="fork", array_like=True):
    """Fork a worker with this command line (without its sockets, which travel beside) and environment."""

    args: list[str]
    env: dict[str, str]


class Forked(msgspec.Struct, tag="forked", array_like=True):
    pid: int


class ForkFailed(msgspec.Struct, tag="fork_failed", array_like=True):
    reason: str


class Exited(msgspec.Struct, tag="exited", array_like=True):
    """A worker ended and was reaped; `code` as `subprocess` gives it (negative: killed by a signal)."""

    pid: int
    code: int


FromTemplate = Forked | ForkFailed | Exited


# ---------------------------------------------------------------- the supervisor's side


class WorkerProcess(Protocol):
    """What the supervisor needs of a worker process, whichever way it was started."""

    @property
    def pid(self) -> int | None: ...

    @property
    def returncode(self) -> int | None: ...

    async def wait(self) -> int: ...

    def kill(self) -> None: ...


class TemplateGone(Exception):
    """The template exited (or could not start): no worker can be forked from it."""


class ForkedWorker:
    """A worker forked from the template, seen through `asyncio.subprocess.Process`'s interface."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self._exit: Future[int] = Future()  # completed by the template's reader thread

    @property
    def returncode(self) -> int | None:
        return self._exit.result() if self._exit.done() else None

    async def wait(self) -> int:
        # shielded: a waiter that is cancelled must not cancel the exit that others wait for
        return await asyncio.shield(asyncio.wrap_future(self._exit))

    def kill(self) -> None:
        if not self._exit.done():
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)


class Template:
    """The template process and the thread that reads its messages."""

    def __init__(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._socket = ours
        self._process = subprocess.Popen(
            [sys.executable, "-m", "modelhost.runtime.worker.template", "--fd", str(theirs.fileno())],
            stdin=subprocess.DEVNULL,
            env=sync_worker_env(os.environ),  # its OpenMP is set up here, before its workers fork
            pass_fds=(theirs.fileno(),),
        )
        theirs.close()
        self._lock = threading.Lock()  # orders requests with their answers
        self._waiting: deque[Future[ForkedWorker]] = deque()
        self._workers: dict[int, ForkedWorker] = {}
        self.alive = True
        threading.Thread(target=self._read, name="modelhost-worker-template", daemon=True).start()

    def fork(
        self, args: list[str], env: dict[str, str], lifeline: int, listener: int
    ) -> Future[ForkedWorker]:
        answer: Future[ForkedWorker] = Future()
        with self._lock:
            if not self.alive:
                raise TemplateGone("the worker template has exited")
            self._waiting.append(answer)
            try:
                socket.send_fds(self._socket, [msgspec.msgpack.encode(Fork(args, env))], [lifeline, listener])
            except OSError as exc:
                self._waiting.remove(answer)
                raise TemplateGone(f"the worker template is not reachable: {exc}") from exc
        return answer

    def stop(self, timeout: float) -> None:
        self._process.terminate()
        try:
            self._process.wait(timeout)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()

    def _read(self) -> None:
        decoder = msgspec.msgpack.Decoder(FromTemplate)
        while True:
            try:
                data = self._socket.recv(MESSAGE_BYTES)
            except OSError:
                data = b""
            if not data:
                break
            message = decoder.decode(data)
            if isinstance(message, Exited):
                worker = self._workers.pop(message.pid, None)
                if worker is not None:
                    worker._exit.set_result(message.code)
                continue
            with self._lock:
                answer = self._waiting.popleft()
                if isinstance(message, Forked):
                    worker = ForkedWorker(message.pid)
                    self._workers[message.pid] = worker
                    if not answer.cancelled():  # else the worker ends alone: its lifeline is closed
                        answer.set_result(worker)
                elif not answer.cancelled():
                    answer.set_exception(
                        TemplateGone(f"the worker template could not fork: {message.reason}")
                    )
        self._ended()

    def _ended(self) -> None:
        """End-of-file: the template exited. Its workers die with it (their `PR_SET_PDEATHSIG`)."""
        with self._lock:
            self.alive = False
            while self._waiting:
                answer = self._waiting.popleft()
                if not answer.cancelled():
                    answer.set_exception(TemplateGone("the worker template exited"))
        for worker in self._workers.values():
            worker._exit.set_result(-signal.SIGKILL)
        self._workers.clear()
        self._socket.close()
        self._process.wait()


_template: Template | None = None
_template_lock = threading.Lock()


def _running_template() -> Template:
    global _template
    with _template_lock:
        if _template is None or not _template.alive:
            _template = Template()
        return _template


def stop_template(timeout: float = 5.0) -> None:
    """The server stops: its template goes (and any worker it still has with it), before the server's
    run folder, where a template still importing would write its metrics, is removed."""
    global _template
    with _template_lock:
        template, _template = _template, None
    if template is not None:
        template.stop(timeout)


def warm_template() -> None:
    """Start the template now: its imports run while the server starts, so that the first cold start
    does not wait for them."""
    _running_template()


async def start_worker(
    args: list[str],
    env: dict[str, str],
    lifeline: socket.socket,
    listener: socket.socket,
    preload: bool,
    command: Sequence[str] = (),
) -> WorkerProcess:
    """Start a worker with `args` (its command line without the sockets) in `env`, holding `lifeline`
    and `listener`; the caller closes its own copies afterwards. `command` executes another worker
    (an interpreter and its module: the vLLM worker under vLLM's Python) instead of ours, never forked
    from the template, in a session of its own so that its whole process group can be killed (vLLM runs
    its engine in child processes)."""
    if preload and not command:
        answer = _running_template().fork(args, env, lifeline.fileno(), listener.fileno())
        # the first fork after the template's start waits for its imports
        return await asyncio.wrap_future(answer)
    return await asyncio.create_subprocess_exec(
        *(command or (sys.executable, "-m", "modelhost.runtime.worker.sync_worker")),
        *args,
        "--fd",
        str(lifeline.fileno()),
        "--listen-fd",
        str(listener.fileno()),
        stdin=asyncio.subprocess.DEVNULL,
        env=env,
        pass_fds=(lifeline.fileno(), listener.fileno()),
        start_new_session=bool(command),
    )
