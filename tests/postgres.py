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


@contextmanager
def postgres_server() -> Iterator[str]:
    """Start a server on a free port in a temp dir; yield its base URL (no database name)."""
    bindir = _bindir()
    root = Path(tempfile.mkdtemp(prefix="modelhost-pg-"))
    data, sockets = root / "data", root / "sock"
    sockets.mkdir()
    if os.geteuid() == 0:
        shutil.chown(root, "postgres")
        shutil.chown(sockets, "postgres")
    port = _free_port()
    subprocess.run(
        _as_postgres(
            [str(bindir / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust", "-E", "UTF8"]
        ),
        check=True,
        capture_output=True,
    )
    options = f"-p {port} -k {sockets} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200"
    subprocess.run(
        _as_postgres(
            [str(bindir / "pg_ctl"), "-D", str(data), "-o", options, "-l", str(root / "log"), "-w", "start"]
        ),
        check=True,
        capture_output=True,
    )
    try:
        _wait_ready(port)
        yield f"postgresql+psycopg://postgres@127.0.0.1:{port}"
    finally:
        subprocess.run(
            _as_postgres([str(bindir / "pg_ctl"), "-D", str(data), "-m", "immediate", "stop"]),
            capture_output=True,
        )
        shutil.rmtree(root, ignore_errors=True)


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
