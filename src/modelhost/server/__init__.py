"""`modelhost serve`: one server, several processes, one port.

```
clients ──HTTP──> gateway processes 0..N-1 (one listening socket, shared)
                    0 = the supervisor: also loads and unloads replicas, meters, runs jobs and agent runs
                    1..N-1: ask the supervisor over its control socket (`server.control`)
                       │  every gateway process reaches every replica directly (`runtime.protocol`)
                       ▼
                  replica processes (one per loaded replica; batch the requests of every gateway)
```

Everything of one server lives in a private run folder (mode 0700): the supervisor's control socket,
the metrics every process writes (`modelhost.metrics`) and the rate-limit table they share
(`auth/limit_table.py`). It is removed when the server stops; what a killed server left is removed
when the next one starts (`modelhost.run_folders`).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from modelhost.config import Settings
from modelhost.run_folders import new_folder, remove_orphans

if TYPE_CHECKING:
    from modelhost.container import Services

METRICS_FOLDER_VARIABLE = "PROMETHEUS_MULTIPROC_DIR"  # read by prometheus_client when first imported


def default_workers(cores: int | None = None) -> int:
    """Gateway processes when neither `--workers` nor MODELHOST_WORKERS says: one per four cores, at
    least one and at most eight. On a small machine the model needs the cores more than HTTP does;
    on a big one a few processes keep a GPU fed (docs/benchmarks.md)."""
    cores = cores if cores is not None else (os.cpu_count() or 1)
    return max(1, min(8, cores // 4))


def workers_for(settings: Settings, given: int | None) -> int:
    """The number of gateway processes to run: `--workers`, else MODELHOST_WORKERS, else the default.
    With Ray Serve replicas a server is one process (they are not reached over a local socket): more
    servers on the cluster scale it instead, so asking for more is refused."""
    asked = given or settings.workers
    if settings.runtime == "ray":
        if asked is not None and asked > 1:
            raise ValueError(
                "MODELHOST_RUNTIME=ray serves from one gateway process per server; run several "
                "`modelhost serve` on the cluster instead of --workers (docs/deploy.md)"
            )
        return 1
    return asked or default_workers()


def serve(
    settings: Settings,
    host: str,
    port: int,
    workers: int,
    log_level: str,
    *,
    beside: Callable[[], None] | None = None,
) -> None:
    """Run a server until SIGTERM or Ctrl-C; `beside` runs in a thread once it has started."""
    remove_orphans()
    folder = new_folder()
    metrics = folder / "metrics"
    metrics.mkdir()
    os.environ[METRICS_FOLDER_VARIABLE] = str(metrics)  # before prometheus_client is imported
    stopped_by: int | None = None
    try:
        with _signal_ends_the_run():
            _run(settings, host, port, max(1, workers), log_level, folder, beside)
    except _Signalled as signalled:
        stopped_by = signalled.signum
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    if stopped_by is not None:  # exit as the signal says, once the folder is gone (systemd reads it)
        signal.raise_signal(stopped_by)


class _Signalled(BaseException):
    """SIGTERM reached the server: after draining, uvicorn delivers it again to the handler it found."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


@contextmanager
def _signal_ends_the_run() -> Iterator[None]:
    """While the server runs, SIGTERM's default action (the process ends where it stands) becomes an
    exception: uvicorn drains on SIGTERM, then raises the signal again for the handler it found, which
    would end the process before the run folder is removed."""

    def signalled(signum: int, frame: object) -> None:
        raise _Signalled(signum)

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, signalled)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _run(
    settings: Settings,
    host: str,
    port: int,
    workers: int,
    log_level: str,
    folder: Path,
    beside: Callable[[], None] | None,
) -> None:
    from modelhost.api.app import create_app, settle_memory
    from modelhost.auth.limit_table import LimitTable
    from modelhost.auth.limits import RateLimiter
    from modelhost.server.http import raise_open_files_limit, uvicorn_config
    from modelhost.server.supervisor import ControlServer, Gateways, SupervisorServer

    raise_open_files_limit()  # before the other gateway processes start: they inherit it
    listener = _listen(host, port)
    if settings.runtime == "local" and settings.worker_preload:
        from modelhost.runtime.spawn import warm_template

        warm_template()  # its imports run beside the server's start: the first cold start finds it ready
    control_path, limits_path = folder / "control.sock", folder / "limits"
    # every gateway process counts rate limits in one table: column 0 is the supervisor's
    limits = RateLimiter(table=LimitTable.create(limits_path, columns=workers) if workers > 1 else None)
    gateways = Gateways(workers - 1, listener, control_path, log_level, limits)

    @asynccontextmanager
    async def with_gateways(services: Services) -> AsyncIterator[None]:
        assert services.supervisor is not None
        control = ControlServer(services, services.supervisor, control_path)
        await control.start()
        await gateways.start()
        try:
            yield
        finally:  # they drain their own requests while the replicas still run
            await gateways.stop(settings.shutdown_drain_seconds + 5)
            await control.stop()

    app = create_app(settings, around=with_gateways if workers > 1 else None, limits=limits)
    config = uvicorn_config(app, settings, log_level)
    server = SupervisorServer(config, gateways)
    if beside is not None:
        threading.Thread(target=beside, name="beside", daemon=True).start()
    settle_memory()
    server.run(sockets=[listener])


def _listen(host: str, port: int) -> socket.socket:
    """The one listening socket every gateway process accepts on (inherited by the others)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)
    return sock  # not inheritable: only the gateway processes get it (pass_fds), never a replica
