"""A gateway process: `python -m modelhost.server.gateway`, started by the supervisor.

It serves the app on the server's shared listening socket (`--listen-fd`), with the supervisor's
stand-ins for the runtime and runners (`server.remote`) connected over its control socket
(`--control`), runs the batch lines the supervisor sends it, and counts rate limits in the table every
process of the server shares (`--limits`, in the column of its `--index`). It stops when asked (SIGTERM:
stop accepting, drain its own requests, exit), and when its supervisor goes away (end-of-file on the
control socket, or `PR_SET_PDEATHSIG`).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import socket
import sys
from pathlib import Path

from modelhost.api.app import create_app
from modelhost.auth.limit_table import LimitTable
from modelhost.auth.limits import RateLimiter
from modelhost.config import get_settings
from modelhost.container import Services
from modelhost.runtime.lifetime import die_with_parent
from modelhost.server import settle_memory
from modelhost.server.control import Wake
from modelhost.server.http import QuietServer, uvicorn_config
from modelhost.server.remote import (
    LineRunner,
    RemoteRuns,
    RemoteRuntime,
    RemoteVideos,
    SupervisorLink,
    share_caches,
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="modelhost gateway process (started by `modelhost serve`)")
    parser.add_argument("--index", type=int, required=True, help="this process's number (`ps`, logs, limits)")
    parser.add_argument("--listen-fd", type=int, required=True, help="the server's listening socket")
    parser.add_argument("--control", required=True, help="the supervisor's control socket")
    parser.add_argument("--limits", required=True, help="the server's rate-limit table")
    parser.add_argument("--log-level", default="info")
    args = parser.parse_args(argv)
    die_with_parent(signal.SIGTERM)  # drain what is in flight, then exit
    listener = socket.socket(fileno=args.listen_fd)
    limits = RateLimiter(table=LimitTable.open(Path(args.limits), column=args.index))
    try:
        import uvloop

        uvloop.run(_serve(listener, args.control, limits, args.log_level))
    except ImportError:  # pragma: no cover (uvicorn[standard] brings uvloop)
        asyncio.run(_serve(listener, args.control, limits, args.log_level))
    return 0


async def _serve(listener: socket.socket, control: str, limits: RateLimiter, log_level: str) -> None:
    settings = get_settings().model_copy(update={"apply_migrations_on_start": False})
    server: QuietServer | None = None

    def supervisor_gone() -> None:
        if server is not None:
            server.should_exit = True

    link = await SupervisorLink.open(control, supervisor_gone)
    lines = LineRunner(link)
    welcome = await link.hello(os.getpid())
    runtime = RemoteRuntime(link, settings)
    runs, videos = RemoteRuns(link, welcome.agent_runner), RemoteVideos(link)
    services = await asyncio.to_thread(
        Services.build, settings, stand_ins=(runtime, videos, runs), limits=limits
    )
    share_caches(services.caches, link.tell)
    services.wake = lambda runner: link.tell(Wake(runner))
    link.on_forget = lambda cache, key: services.caches[cache].forget_here(key)
    runtime.start(welcome.replicas)
    app = create_app(services=services)
    server = QuietServer(uvicorn_config(app, settings, log_level, lifespan="on"))
    settle_memory()
    lines.start(app)
    try:
        await server.serve(sockets=[listener])
    finally:
        lines.close()
        await runtime.close()
        services.close()


if __name__ == "__main__":
    sys.exit(main())
