"""A real MCP server for the hosted-MCP tests: the official `mcp` SDK's MCPServer (FastMCP) over
streamable HTTP, on 127.0.0.1 in a thread of the test process (cheap to start, once per module).

It serves `get_weather(city)`, answering `weather` (the trained result text the model answers from),
and `fail_always()`, which raises. `calls` records each tool call's (name, arguments); `requests`
records (method, path, headers) of every HTTP request that reached it, so a test can say the server saw
nothing at all.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import closing, contextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx
import uvicorn
from mcp.server.mcpserver import MCPServer

from tests.live import HOST, _bound_socket

OTHER_HOST = "127.0.0.2"


@dataclass
class McpTestServer:
    url: str = ""
    other_url: str = ""
    weather: str = "sunny"
    calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    requests: list[tuple[str, str, dict[str, str]]] = field(default_factory=list)

    def app(self) -> Any:
        server = MCPServer("weather", log_level="WARNING")

        @server.tool()
        def get_weather(city: str) -> str:
            """Get the current weather for a city."""
            self.calls.append(("get_weather", {"city": city}))
            return self.weather

        @server.tool()
        def fail_always() -> str:
            """A tool that always fails."""
            self.calls.append(("fail_always", {}))
            raise RuntimeError("the weather station is down")

        inner = server.streamable_http_app()

        async def app(scope: Any, receive: Any, send: Any) -> None:
            if scope["type"] == "http":
                if scope["path"] == "/health":
                    await send({"type": "http.response.start", "status": 200, "headers": []})
                    await send({"type": "http.response.body", "body": b"ok"})
                    return
                headers = {k.decode(): v.decode() for k, v in scope["headers"]}
                self.requests.append((scope["method"], scope["path"], headers))
            await inner(scope, receive, send)

        return app


@contextmanager
def mcp_server() -> Iterator[McpTestServer]:
    """The server, serving at `url` (`http://127.0.0.1:<port>/mcp`) until the block ends, and at the
    same port of 127.0.0.2 (`other_url`: another loopback address, one a gateway allowing only
    127.0.0.1/32 must refuse)."""
    served = McpTestServer()
    with closing(_bound_socket()) as sock:
        port = sock.getsockname()[1]
        other = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        other.bind((OTHER_HOST, port))
        config = uvicorn.Config(served.app(), host=HOST, port=port, log_level="warning")
        server = uvicorn.Server(config)
        thread = threading.Thread(target=server.run, kwargs={"sockets": [sock, other]}, daemon=True)
        thread.start()
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"http://{HOST}:{port}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert thread.is_alive() and time.monotonic() < deadline, "the MCP server did not start"
            time.sleep(0.05)
        served.url = f"http://{HOST}:{port}/mcp"
        served.other_url = f"http://{OTHER_HOST}:{port}/mcp"
        try:
            yield served
        finally:
            server.should_exit = True
            thread.join(10)
            other.close()
