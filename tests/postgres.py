"""A throwaway PostgreSQL server for the test session (Debian's server binaries, run as `postgres`)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def _bindir() -> Path:
    found = shutil.which("pg_config")
    if found is None:
        raise RuntimeError("pg_config not found: install Debian's postgresql package (scripts/setup.sh does)")
    return Path(subprocess.check_output([found, "--bindir"], text=True).strip())


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _as_postgres(args: list[str]) -> list[str]:
    """initdb refuses to run as root: drop to the `postgres` user when we are root."""
    return ["runuser", "-u", "postgres", "--", *args] if os.geteuid() == 0 else args


class PostgresServer:
    """A throwaway server in a temp dir, on a free port; `stop` and `start` it again on the same data (a
    database outage, for the fault tests)."""

    def __init__(self) -> None:
        self.bindir = _bindir()
        self.root = Path(tempfile.mkdtemp(prefix="modelhost-pg-"))
        self.data, sockets = self.root / "data", self.root / "sock"
        sockets.mkdir()
        if os.geteuid() == 0:
            shutil.chown(self.root, "postgres")
            shutil.chown(sockets, "postgres")
        self.port = _free_port()
        subprocess.run(
            _as_postgres(
                [
                    str(self.bindir / "initdb"),
                    "-D",
                    str(self.data),
                    "-U",
                    "postgres",
                    "--auth=trust",
                    "-E",
                    "UTF8",
                ]
            ),
            check=True,
            capture_output=True,
        )
        self._options = (
            f"-p {self.port} -k {sockets} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200"
        )
        self.url = f"postgresql+psycopg://postgres@127.0.0.1:{self.port}"

    def start(self) -> None:
        self._ctl("-o", self._options, "-l", str(self.root / "log"), "-w", "start")
        _wait_ready(self.port)

    def stop(self, mode: str = "fast") -> None:
        """`fast`: sessions are ended at once (their transactions roll back); `immediate`: no shutdown."""
        self._ctl("-m", mode, "stop")

    def remove(self) -> None:
        subprocess.run(self._command("-m", "immediate", "stop"), capture_output=True)
        shutil.rmtree(self.root, ignore_errors=True)

    def _command(self, *args: str) -> list[str]:
        return _as_postgres([str(self.bindir / "pg_ctl"), "-D", str(self.data), *args])

    def _ctl(self, *args: str) -> None:
        subprocess.run(self._command(*args), check=True, capture_output=True)


@contextmanager
def postgres_server() -> Iterator[str]:
    """Start a server on a free port in a temp dir; yield its base URL (no database name)."""
    server = PostgresServer()
    try:
        server.start()
        yield server.url
    finally:
        server.remove()


def _wait_ready(port: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise RuntimeError("PostgreSQL did not start")


def create_database(base_url: str, name: str) -> str:
    import psycopg

    with psycopg.connect(
        base_url.replace("postgresql+psycopg", "postgresql") + "/postgres", autocommit=True
    ) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return f"{base_url}/{name}"
