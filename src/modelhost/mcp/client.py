"""The MCP client of hosted MCP tools: the official `mcp` SDK (streamable HTTP: sessions, SSE answers)
over an HTTP client whose every connection goes to an address vetted by the media rules.

A server URL in a request is attacker-chosen, as a media URL is (`media.fetch`): its host is resolved
once (`vetted_addresses`: every address public, or in `MODELHOST_MEDIA_ALLOW_NETWORKS`), and the SDK's
HTTP client (httpx2) then sends through `VettedTransport`, which connects only to those addresses (no
second DNS answer can switch the target), keeps the name in `Host` and TLS SNI (certificates are checked
for the name, against the same CA bundle as every fetch), refuses any other origin (the request's
`headers`, the caller's tokens, go to that server only) and follows no redirect. Each operation (list the
tools, call one) is one short MCP session, so no session outlives the task that opened it (a streamed
response runs in another task than the request that prepared it).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from modelhost.media.fetch import FetchPolicy, IPAddress, _tls_context, vetted_addresses

Item = dict[str, Any]


class McpFailure(Exception):
    """An MCP operation that failed: the server unreachable, an error answer, a timeout; `str` says why."""


@dataclass(frozen=True)
class McpServer:
    """A request's MCP server, checked: its URL allowed for the account and its addresses vetted."""

    label: str
    url: str
    headers: dict[str, str] = field(repr=False)  # the caller's tokens: never logged, stored or echoed
    addresses: tuple[IPAddress, ...] = ()


async def vetted_server(
    label: str, url: str, headers: dict[str, str], policy: FetchPolicy, param: str
) -> McpServer:
    """The server with its host's addresses vetted now (FetchFailed naming `param` if refused)."""
    _, addresses = await vetted_addresses(url, policy, param=param)
    return McpServer(label, url, dict(headers), tuple(addresses))


class VettedTransport(httpx2.AsyncBaseTransport):
    """Sends each request of one MCP server to its vetted addresses only (the module's docstring)."""

    def __init__(self, server: McpServer) -> None:
        url = httpx2.URL(server.url)
        self._origin = (url.scheme, url.host, url.port)
        self._addresses = server.addresses
        self._inner = httpx2.AsyncHTTPTransport(verify=_tls_context(), trust_env=False)

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        url = request.url
        if (url.scheme, url.host, url.port) != self._origin:
            raise httpx2.ConnectError(
                f"refused: {url.host!r} is not the MCP server's origin", request=request
            )
        if url.scheme == "https":
            request.extensions = {**request.extensions, "sni_hostname": url.host}
        failure: Exception = httpx2.ConnectError("no vetted address", request=request)
        for ip in self._addresses:
            request.url = url.copy_with(host=str(ip))  # `Host` keeps the name: set when the request was built
            try:
                return await self._inner.handle_async_request(request)
            except httpx2.ConnectError as exc:  # refused, unreachable: the next vetted address
                failure = exc
            finally:
                request.url = url
        raise failure

    async def aclose(self) -> None:
        await self._inner.aclose()


@asynccontextmanager
async def _session(server: McpServer, timeout: float) -> AsyncIterator[Client]:
    http = httpx2.AsyncClient(
        transport=VettedTransport(server),
        headers=server.headers,
        timeout=httpx2.Timeout(timeout),
        follow_redirects=False,
        trust_env=False,
    )
    async with (
        http,
        Client(
            streamable_http_client(server.url, http_client=http), cache=None, read_timeout_seconds=timeout
        ) as client,
    ):
        yield client


async def list_tools(server: McpServer, timeout: float) -> list[Item]:
    """The server's tools as `{name, description, input_schema}`, every page; McpFailure if it fails."""
    tools: list[Item] = []
    try:
        async with _session(server, timeout) as client:
            cursor: str | None = None
            while True:
                page = await client.list_tools(cursor=cursor)
                tools += [
                    {"name": t.name, "description": t.description, "input_schema": t.input_schema}
                    for t in page.tools
                ]
                cursor = page.next_cursor
                if not cursor:
                    return tools
    except Exception as exc:  # the SDK's errors, httpx2's, task-group groups of them: all a failure here
        raise McpFailure(_reason(exc)) from None


async def call_tool(server: McpServer, name: str, arguments: Item, timeout: float) -> tuple[str, bool]:
    """(the result's text, whether the tool reported an error); McpFailure if the call itself failed."""
    try:
        async with _session(server, timeout) as client:
            result = await client.call_tool(name, arguments, read_timeout_seconds=timeout)
    except Exception as exc:
        raise McpFailure(_reason(exc)) from None
    texts = [getattr(part, "text", None) for part in result.content]
    text = "\n".join(t for t in texts if t is not None)
    if not text and result.structured_content is not None:
        text = json.dumps(result.structured_content)
    return text, bool(result.is_error)


def _reason(exc: BaseException) -> str:
    """The innermost cause of a failure (anyio wraps a transport's error in exception groups)."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return str(exc) or type(exc).__name__
