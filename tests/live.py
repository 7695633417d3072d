"""Run the real gateway in a live uvicorn server, for tests that need a real HTTP socket.

In-process `httpx.ASGITransport` covers most tests; the CLI and the `openai` SDK need a URL instead.
`live_server` serves `create_app(settings)` from a background thread on a free local port and
shuts it down cleanly (lifespan included) when the block ends.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import closing, contextmanager

import httpx
import uvicorn
from starlette.types import ASGIApp

from modelhost.api.app import create_app
from modelhost.config import Settings
from modelhost.server.http import guard_for

HOST = "127.0.0.1"
STARTUP_TIMEOUT_SECONDS = 30.0
SHUTDOWN_TIMEOUT_SECONDS = 30.0


def _bound_socket(port: int = 0) -> socket.socket:
    """A socket bound to a free port; handing it to uvicorn leaves no window for another process."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((HOST, port))
    return sock


def _wait_until_healthy(base_url: str, server: uvicorn.Server, thread: threading.Thread) -> None:
    """Poll `/health` until it answers 200; fail fast if the server thread dies during startup."""
    deadline = time.monotonic() + STARTUP_TIMEOUT_SECONDS
    with httpx.Client(base_url=base_url, timeout=2.0) as http:
        while time.monotonic() < deadline:
            if not thread.is_alive():
                raise RuntimeError("the live server stopped during startup (see its log above)")
            if server.started:
                try:
                    if http.get("/health").status_code == 200:
                        return
                except httpx.TransportError:
                    pass
            time.sleep(0.02)
    raise TimeoutError(f"the live server did not answer /health within {STARTUP_TIMEOUT_SECONDS}s")


@contextmanager
def live_server(settings: Settings, app: ASGIApp | None = None, port: int = 0) -> Iterator[str]:
    """Serve the gateway built from `settings` (or `app`, a gateway already built); yields its base URL
    (`http://127.0.0.1:<port>`; `port`: one chosen before, where the settings must name it).

    The app owns its services (built in its lifespan, so migrations run at startup). On exit the
    server is asked to stop (`should_exit`), finishes its lifespan shutdown, and its thread is joined;
    a server that does not stop in time fails the test rather than leaking a thread.
    """
    with closing(_bound_socket(port)) as sock:
        port = sock.getsockname()[1]
        # the gateway's own HTTP protocol (`server.http.ClientGuard`: its deadlines, and the connection's
        # loss told to the requests on it), without its logging configuration (pytest captures the logs)
        config = uvicorn.Config(
            app or create_app(settings), host=HOST, port=port, log_level="warning", http=guard_for(settings)
        )
        server = uvicorn.Server(config)
        thread = threading.Thread(
            target=server.run, kwargs={"sockets": [sock]}, name=f"live-server-{port}", daemon=True
        )
        thread.start()
        base_url = f"http://{HOST}:{port}"
        try:
            _wait_until_healthy(base_url, server, thread)
            yield base_url
        finally:
            server.should_exit = True
            thread.join(SHUTDOWN_TIMEOUT_SECONDS)
            if thread.is_alive():
                server.force_exit = True
                thread.join(5.0)
                raise RuntimeError(f"the live server did not stop within {SHUTDOWN_TIMEOUT_SECONDS}s")
