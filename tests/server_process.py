"""The real `modelhost serve` in its own process, for tests that kill it (SIGKILL, SIGTERM), and `Server`:
such a process tree with an account, driven the way the multi-process and fault tests need."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.helpers import ADMIN_KEY, bearer, push_folder


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def gateway_index(pid: int) -> int:
    """A gateway process's `--index` (1 to N), from its command line."""
    arguments = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    return int(arguments[arguments.index(b"--index") + 1])


def stat(pid: int) -> list[str]:
    """/proc/<pid>/stat fields after the command name: state, ppid, ..."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def descends_from(pid: int, ancestor: int) -> bool:
    """`pid` is `ancestor`'s child, or a child of its child... (a replica worker is forked by the worker
    template, itself a child of the gateway process that started it)."""
    while pid > 1:
        pid = int(stat(pid)[1])
        if pid == ancestor:
            return True
    return False


def alive(pid: int) -> bool:
    """Exists and is not a zombie (a zombie has died; only its exit status is left)."""
    with contextlib.suppress(OSError):
        return stat(pid)[0] != "Z"
    return False


def processes(module: str, marker: str = "") -> list[int]:
    """Live processes running `python -m <module>` whose command line mentions `marker`."""
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        with contextlib.suppress(OSError):
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            if f"-m {module} " in cmdline and marker in cmdline and alive(int(proc.name)):
                found.append(int(proc.name))
    return sorted(found)


class ServerProcess:
    """Start, kill and restart a gateway process on fixed data (same data dir and database)."""

    def __init__(self, data_dir: Path, database_url: str, log_level: str = "warning", **env: str) -> None:
        self.port = free_port()
        self.log_level = log_level
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = {
            **os.environ,
            "MODELHOST_DATA_DIR": str(data_dir),
            "MODELHOST_DATABASE_URL": database_url,
            "MODELHOST_ADMIN_KEY": ADMIN_KEY,
            "MODELHOST_PORT": str(self.port),
            **env,
        }
        self.log = data_dir.parent / f"server-{self.port}.log"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 60.0) -> None:
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "modelhost.cli.main", "serve", "--log-level", self.log_level],
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"server exited: {self.log.read_text()[-2000:]}")
            try:
                if httpx.get(f"{self.url}/health", timeout=1).status_code == 200:
                    return
            except httpx.TransportError:
                time.sleep(0.05)
        raise TimeoutError("server did not start")

    def kill(self) -> None:
        """SIGKILL to the server's every process at once, as a container's end or the OOM killer of a
        cgroup would: no cleanup of any kind runs. The gateway processes are sessions of their own (a
        Ctrl-C reaches the supervisor alone), so they are killed by name."""
        assert self.process is not None
        gateways = [p for p in processes("modelhost.server.gateway") if int(stat(p)[1]) == self.process.pid]
        os.killpg(self.process.pid, signal.SIGKILL)
        for pid in gateways:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.process.wait(10)
        deadline = time.monotonic() + 10
        while any(alive(pid) for pid in gateways) and time.monotonic() < deadline:
            time.sleep(0.02)

    def terminate(self, timeout: float = 30.0) -> int:
        assert self.process is not None
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.kill()


ST_RECIPE = ("t03_feature_extraction", "st")  # the tiny sentence-transformers model


def accepted(pid: int, port: int) -> int:
    """Established connections to `port` that process `pid` holds (it accepted them)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            target = os.readlink(fd)
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                fields = line.split()
                if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] == "01" and fields[9] in inodes:
                    count += 1
    return count


@contextlib.contextmanager
def stopped(*pids: int) -> Iterator[None]:
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)


async def until(check: Callable[[], Any], timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while not (result := check()):
        if time.monotonic() > deadline:
            pytest.fail(f"not true within {timeout}s: {check.__qualname__}")
        await asyncio.sleep(0.02)
    return result


@dataclass
class Server:
    """A `modelhost serve --workers N` process tree with an account."""

    process: ServerProcess
    key: str

    @property
    def url(self) -> str:
        return self.process.url

    @property
    def supervisor(self) -> int:
        assert self.process.process is not None
        return self.process.process.pid

    def gateways(self) -> list[int]:
        """Every gateway process (the supervisor's children that serve HTTP), by `--index`."""
        children = [p for p in processes("modelhost.server.gateway") if int(stat(p)[1]) == self.supervisor]
        return sorted(children, key=gateway_index)

    def replicas(self, deployment_id: str) -> list[int]:
        return processes("modelhost.runtime.worker.sync_worker", deployment_id)

    def metrics(self) -> str:
        return httpx.get(f"{self.url}/metrics", timeout=10).text

    def in_flight(self, deployment_id: str) -> dict[int, float]:
        """Requests each process has in flight on the deployment, by pid (those with none left out: the
        supervisor's own dispatcher, say, which only its runs and warm-ups use)."""
        pattern = rf'modelhost_requests_in_flight{{deployment="{deployment_id}",pid="(\d+)"}} ([\d.]+)'
        found = re.findall(pattern, self.metrics())
        return {int(pid): float(value) for pid, value in found if float(value)}

    def sample(self, name: str, deployment_id: str) -> float:
        match = re.search(rf'^{name}{{deployment="{deployment_id}"}} ([\d.e+]+)$', self.metrics(), re.M)
        return float(match.group(1)) if match else 0.0

    def batches(self, deployment_id: str) -> tuple[float, float]:
        """(model calls, requests they carried), from the replica's `modelhost_batch_size`."""
        return (
            self.sample("modelhost_batch_size_count", deployment_id),
            self.sample("modelhost_batch_size_sum", deployment_id),
        )

    async def via(self, pid: int, request: Callable[[], Awaitable[Any]]) -> asyncio.Task[Any]:
        """Start `request` on a new connection that gateway process `pid` accepts (the others are held
        stopped until it has)."""
        before = accepted(pid, self.process.port)
        with stopped(*(p for p in self.gateways() if p != pid)):
            task = asyncio.ensure_future(request())
            await until(lambda: accepted(pid, self.process.port) > before or task.done())
        return task

    async def serving(self, pid: int, timeout: float = 60.0) -> None:
        """Wait until gateway process `pid` accepts connections (a new one starts up for seconds): open
        a few idle connections at a time, until it takes one of them."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            probes = [socket.create_connection(("127.0.0.1", self.process.port)) for _ in range(8)]
            try:
                await asyncio.sleep(0.1)
                if accepted(pid, self.process.port):
                    return
            finally:
                for probe in probes:
                    probe.close()
        pytest.fail(f"gateway process {pid} did not start serving")

    async def embed(self, text: str, model: str = "m") -> httpx.Response:
        async with httpx.AsyncClient(base_url=self.url, timeout=60) as client:  # a connection of its own
            return await client.post(
                "/v1/embeddings", json={"model": model, "input": text}, headers=bearer(self.key)
            )

    async def deploy(self, folder: Path, pipeline: str, model: str, **extra: Any) -> str:
        async with httpx.AsyncClient(base_url=self.url, timeout=60) as client:
            pushed = await push_folder(client, self.key, folder, pipeline)
            assert pushed["artifact"]["status"] == "ready", pushed
            body = {"model": model, "artifact_id": pushed["artifact"]["id"], **extra}
            created = await client.post("/v1/deployments", json=body, headers=bearer(self.key))
            assert created.status_code == 201, created.text
            deployment_id: str = created.json()["id"]
            return deployment_id

    async def ready(self, deployment_id: str, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while (state := await self.state(deployment_id)) != "ready":
            assert state != "failed" and time.monotonic() < deadline, state
            await asyncio.sleep(0.05)

    async def state(self, deployment_id: str) -> str:
        async with httpx.AsyncClient(base_url=self.url, timeout=10) as client:
            view = await client.get(f"/v1/deployments/{deployment_id}", headers=bearer(self.key))
            return str(view.json()["state"])


@contextlib.asynccontextmanager
async def server_with(
    root: Path, workers: int, database_url: str | None = None, **env: str
) -> AsyncIterator[Server]:
    """`modelhost serve --workers N` on `root` (its SQLite file there unless `database_url` names another
    database), one torch thread per replica, and an account."""
    process = ServerProcess(
        root / "data", database_url or f"sqlite:///{root / 'db.sqlite'}",
        MODELHOST_WORKERS=str(workers), MODELHOST_WORKER_THREADS="1", **env,
    )  # fmt: skip
    process.start()
    try:
        created = httpx.post(
            f"{process.url}/v1/admin/accounts", json={"name": "a"}, headers=bearer(ADMIN_KEY)
        )
        server = Server(process, created.json()["api_key"])
        await until(lambda: len(server.gateways()) == workers)
        if workers > 1:  # the first answered the account's creation
            for pid in server.gateways():
                await server.serving(pid)
        yield server
    finally:
        process.stop()
