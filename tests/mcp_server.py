"""A real MCP server for the hosted-MCP tests: the official `mcp` SDK's MCPServer (FastMCP) over
streamable HTTP, on 127.0.0.1 in a thread of the test process (cheap to start, once per module).

It serves `get_weather(city)`, answering `weather` (the trained result text the model answers from),
`fail_always()`, which raises, and, when asked for (`hostile_tools`), `stall()`, which answers after a
minute, and `huge_result()`. `calls`
records each tool call's (name, arguments); `requests` records (method, path, headers) of every HTTP
request that reached it, so a test can say the server saw nothing at all.

Two hostile answers, written by hand in front of the SDK's server (what a tenant's server may send):
- `pages` set: `tools/list` is answered page after page (`page_tools` tools each, always with a next
  cursor, up to `pages` pages: a listing "for ever" that still ends if a client follows it all);
  `list_calls` counts the pages asked for.
- `huge_result` answers `huge_bytes` of text in one JSON-RPC answer, streamed in 64 KiB chunks as the
  client reads them (the server waits for the client, as a socket's flow control makes it); `huge_sent`
  records how much the client had taken when it hung up (or all of it).
"""

from __future__ import annotations

import asyncio
import json
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
    hostile_tools: bool = False
    pages: int | None = None
    page_tools: int = 1
    list_calls: int = 0
    huge_bytes: int = 100 * 1024**2
    huge_sent: list[int] = field(default_factory=list)

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

        if self.hostile_tools:  # not offered otherwise: the trained models' prompts list two tools

            @server.tool()
            async def stall() -> str:
                """A tool that answers after a minute."""
                self.calls.append(("stall", {}))
                await asyncio.sleep(60)
                return "late"

            @server.tool(structured_output=False)  # text only, as the hand-written answer gives it
            def huge_result() -> str:
                """A tool whose answer is larger than any client should read (answered by `hostile`)."""
                raise AssertionError("answered in front of the SDK")

        inner = server.streamable_http_app()

        async def app(scope: Any, receive: Any, send: Any) -> None:
            if scope["type"] == "http":
                if scope["path"] == "/health":
                    await send({"type": "http.response.start", "status": 200, "headers": []})
                    await send({"type": "http.response.body", "body": b"ok"})
                    return
                headers = {k.decode(): v.decode() for k, v in scope["headers"]}
                self.requests.append((scope["method"], scope["path"], headers))
                if scope["method"] == "POST":
                    await self.hostile(scope, receive, send, inner)
                    return
            await inner(scope, receive, send)

        return app

    async def hostile(self, scope: Any, receive: Any, send: Any, inner: Any) -> None:
        """The hostile answers of the module's docstring; any other request goes to the SDK's server."""
        body, more = b"", True
        while more:
            message = await receive()
            body, more = body + message.get("body", b""), message.get("more_body", False)
        try:
            rpc = json.loads(body)
        except ValueError:
            rpc = None
        method = rpc.get("method") if isinstance(rpc, dict) else None
        if method == "tools/list" and self.pages is not None:
            await self._page(rpc, send)
        elif method == "tools/call" and rpc["params"].get("name") == "huge_result":
            self.calls.append(("huge_result", {}))
            await self._huge(rpc, receive, send)
        else:
            replayed = False

            async def replay() -> Any:
                nonlocal replayed
                if not replayed:
                    replayed = True
                    return {"type": "http.request", "body": body, "more_body": False}
                return await receive()

            await inner(scope, replay, send)

    async def _page(self, rpc: dict[str, Any], send: Any) -> None:
        self.list_calls += 1
        page = int((rpc.get("params") or {}).get("cursor") or 0)
        tools = [
            {"name": f"tool_{page}_{i}", "inputSchema": {"type": "object"}} for i in range(self.page_tools)
        ]
        result: dict[str, Any] = {
            "tools": tools,
            "resultType": "complete",
            "ttlMs": 0,
            "cacheScope": "private",
        }
        if self.pages is not None and page + 1 < self.pages:
            result["nextCursor"] = str(page + 1)
        answer = json.dumps({"jsonrpc": "2.0", "id": rpc["id"], "result": result}).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"application/json")],
            }
        )
        await send({"type": "http.response.body", "body": answer})

    async def _huge(self, rpc: dict[str, Any], receive: Any, send: Any) -> None:
        head = json.dumps({"jsonrpc": "2.0", "id": rpc["id"]})[:-1]
        opening = f'{head}, "result": {{"content": [{{"type": "text", "text": "'.encode()
        closing = b'"}], "isError": false, "resultType": "complete"}}'
        gone = asyncio.Event()

        async def watch() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass
            gone.set()

        watcher = asyncio.create_task(watch())
        sent = 0
        try:
            await send(
                {
                    "type": "http.response.start",
                    "status": 200,
                    "headers": [(b"content-type", b"application/json")],
                }
            )
            await send({"type": "http.response.body", "body": opening, "more_body": True})
            chunk = b"x" * 65536
            while sent < self.huge_bytes and not gone.is_set():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
                sent += len(chunk)
                await asyncio.sleep(0)  # let the watcher see a hang-up
            await send({"type": "http.response.body", "body": closing})
        finally:
            self.huge_sent.append(sent)
            watcher.cancel()


@contextmanager
def mcp_server(*, hostile_tools: bool = False) -> Iterator[McpTestServer]:
    """The server, serving at `url` (`http://127.0.0.1:<port>/mcp`) until the block ends, and at the
    same port of 127.0.0.2 (`other_url`: another loopback address, one a gateway allowing only
    127.0.0.1/32 must refuse); `hostile_tools`: it offers `stall` and `huge_result` too."""
    served = McpTestServer(hostile_tools=hostile_tools)
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
