"""`modelhost serve`: one server, several processes, one port.

```
supervisor (serves no HTTP): migrations, replicas, meters, video jobs, agent runs, batches, imports
   │ starts (and starts again when they die) the gateway processes, answers them on its control
   │ socket (`server.control`)
clients ──HTTP──> gateway processes 1..N (one listening socket, shared; at least one)
                       │  every gateway process reaches every replica directly (`runtime.replica_protocol`)
                       ▼
                  replica processes (one per loaded replica; batch the requests of every gateway)
```

A tenant's request is parsed, and what it carries compiled, only in a gateway (or a replica): a request
that crashes its gateway costs that gateway's requests in flight, never the supervisor and so never the
replicas, batches, imports, agent runs or the other gateways (DESIGN.md; docs/operations.md, "Gateway
processes"). The supervisor sends a batch's lines to a gateway to run (`RunLine`) for the same reason.
On Ray Serve (`MODELHOST_RUNTIME=ray`) the server is one process that is both: its replicas are the
cluster's actors, not this machine's processes (docs/deploy.md).

Everything of one server lives in a private run folder (mode 0700): the supervisor's control socket,
the metrics every process writes (`modelhost.metrics`) and the rate-limit table they share
(`auth/limit_table.py`). It is removed when the server stops; what a killed server left is removed
when the next one starts (`modelhost.run_folders`).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import shutil
import signal
import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from modelhost import tracing
from modelhost.config import Settings
from modelhost.run_folders import new_folder, remove_orphans

log = logging.getLogger("modelhost.server")
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
    import logging.config

    from modelhost.logs import log_config
    from modelhost.server.http import raise_open_files_limit

    raise_open_files_limit()  # before the gateway processes start: they inherit it
    listener = _listen(host, port)
    if settings.runtime == "ray":
        _run_embedded(settings, listener, log_level, beside)
        return
    logging.config.dictConfig(log_config(log_level))  # uvicorn's and ours, as every gateway logs
    from modelhost.runtime.worker.spawn import stop_template, warm_template

    if settings.worker_preload and settings.runtime == "local":
        warm_template()  # its imports run beside the server's start: the first cold start finds it ready
    if beside is not None:
        threading.Thread(target=beside, name="beside", daemon=True).start()
    try:
        signum = _event_loop().run(_supervise(settings, listener, workers, log_level, folder))
    finally:
        stop_template()
    if signum is not None:
        raise _Signalled(signum)


def _event_loop() -> asyncio.Runner:
    """uvloop where installed (uvicorn[standard] brings it), as the gateway processes run."""
    try:
        import uvloop

        return asyncio.Runner(loop_factory=uvloop.new_event_loop)
    except ImportError:  # pragma: no cover
        return asyncio.Runner()


async def _supervise(
    settings: Settings, listener: socket.socket, workers: int, log_level: str, folder: Path
) -> int | None:
    """The supervisor until SIGTERM or SIGINT: its control socket first (gateway processes, started at
    once, connect while it migrates and builds its services), then its duties; at the end the batch
    runner stops (its lines run in gateways), the gateways drain their requests while the replicas still
    run, then the rest stops. Returns SIGTERM if that stopped it."""
    from modelhost.auth.limit_table import LimitTable
    from modelhost.auth.limits import RateLimiter
    from modelhost.container import Services
    from modelhost.server.supervisor import ControlServer, Gateways

    stop, received = asyncio.Event(), set[int]()

    def stop_on(signum: int) -> None:
        received.add(signum)
        stop.set()

    for signum in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(signum, stop_on, signum)
    # every process counts rate limits in one table: column 0 is the supervisor's (agent runs), 1..N the
    # gateways'
    limits = RateLimiter(table=LimitTable.create(folder / "limits", columns=workers + 1))
    control = ControlServer(folder / "control.sock")
    await control.start()
    gateways = Gateways(workers, listener, control.path, log_level, limits)
    await gateways.start()
    traced = tracing.start("supervisor")
    services = None
    try:
        try:
            services = await asyncio.to_thread(Services.build, settings, limits=limits)
        except Exception as exc:  # the database unreachable, a migration that fails...: said plainly
            log.error("the server could not start: %s: %s", type(exc).__name__, exc)
            raise SystemExit(3) from None  # as uvicorn's "Application startup failed"
        supervision = services.supervisor
        assert supervision is not None
        control.serve(services, supervision)
        async with supervision.duties(services, control.line_call):
            settle_memory()
            log.info("supervisor ready: %d gateway process(es) on %s", workers, _address(listener))
            await stop.wait()
            log.info("stopping: draining the gateway processes")
            await supervision.batches.stop()  # before the gateways that run its lines
            await gateways.stop(settings.shutdown_drain_seconds + 5)
    finally:
        await gateways.stop(0)
        await control.stop()
        if services is not None:
            services.close()
        if traced:
            tracing.stop()
    # SIGTERM ends the process as the signal says (`serve`); Ctrl-C is a normal end, as uvicorn's
    return signal.SIGTERM if signal.SIGTERM in received else None


def _address(listener: socket.socket) -> str:
    host, port = listener.getsockname()[:2]
    return f"http://{host}:{port}"


def _run_embedded(
    settings: Settings, listener: socket.socket, log_level: str, beside: Callable[[], None] | None
) -> None:
    """Ray Serve's server: one process that serves HTTP and supervises (its replicas run on the cluster)."""
    from modelhost.api.app import create_app
    from modelhost.server.http import QuietServer, uvicorn_config

    server = QuietServer(uvicorn_config(create_app(settings), settings, log_level))
    if beside is not None:
        threading.Thread(target=beside, name="beside", daemon=True).start()
    settle_memory()
    server.run(sockets=[listener])


def settle_memory() -> None:
    """Called once a gateway process has built everything it keeps for its whole life.

    `gc.freeze` takes all of that out of the collector's view, and a larger first-generation threshold
    collects less often. Together they cut the gateway's CPU per request by about a tenth under load
    (bench/)."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(10_000, 10, 10)


def _listen(host: str, port: int) -> socket.socket:
    """The one listening socket every gateway process accepts on (inherited by the others)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)
    return sock  # not inheritable: only the gateway processes get it (pass_fds), never a replica
