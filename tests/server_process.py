"""The real `modelhost serve` in its own process, for tests that kill it (SIGKILL, SIGTERM)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

from tests.helpers import ADMIN_KEY


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


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
        """SIGKILL: no cleanup of any kind runs."""
        assert self.process is not None
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(10)

    def terminate(self, timeout: float = 30.0) -> int:
        assert self.process is not None
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.kill()
