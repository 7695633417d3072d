"""An MCP session with a tenant's MCP server: the official `mcp` SDK (streamable HTTP: sessions, SSE
answers) over an HTTP client whose every request this module bounds.

The SDK's HTTP client (httpx2) sends through `BoundedTransport`, which
- connects only to the addresses vetted when the server was named (`outbound.addresses.vet`: no second
  DNS answer can switch the target), keeps the name in `Host` and TLS SNI (certificates are checked
  for the name, against the same CA bundle as every fetch), refuses any other origin (the caller's
  tokens go to that server only) and follows no redirect;
- counts the session's requests, refusing the one past `Bounds.requests` (an MCP session is a few
  messages: initialize, its notification, the listener's GET, the operation's pages, the closing DELETE);
- gives each request, and each read of its answer, what is left of the session's `Bounds.seconds`;
- cuts each answer off past `Bounds.max_bytes`, JSON and SSE alike, before the SDK parses it (an
  encoded answer is refused: its decoded size is unknown), so nothing larger is ever held.
A session is one operation (list the tools, call one), so none outlives the task that opened it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

import httpx2

from modelhost.outbound import tls
from modelhost.outbound.addresses import Vetted
from modelhost.outbound.bounds import Bounds

if TYPE_CHECKING:
    from mcp import Client


class BoundCrossed(httpx2.TransportError):
    """A request or answer of an MCP session past one of its bounds; `str` says which."""


class BoundedTransport(httpx2.AsyncBaseTransport):
    """Sends each request of one MCP session to its vetted addresses only, within its bounds (the
    module's docstring). `crossed` keeps the first bound crossed, whatever the SDK made of the error."""

    def __init__(self, server: Vetted, bounds: Bounds, deadline: float) -> None:
        self._origin = (server.url.scheme, server.url.host, server.url.port)
        self._addresses = server.addresses
        self._bounds = bounds
        self._deadline = deadline
        self._inner = httpx2.AsyncHTTPTransport(verify=tls.tls_context(), trust_env=False)
        self.requests = 0
        self.crossed: str | None = None

    def _cross(self, why: str, request: httpx2.Request) -> BoundCrossed:
        self.crossed = self.crossed or why
        return BoundCrossed(why, request=request)

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        url = request.url
        if (url.scheme, url.host, url.port) != self._origin:
            raise httpx2.ConnectError(
                f"refused: {url.host!r} is not the MCP server's origin", request=request
            )
        self.requests += 1
        if self.requests > self._bounds.requests:
            raise self._cross(f"more than {self._bounds.requests} requests in one MCP session", request)
        if url.scheme == "https":
            request.extensions = {**request.extensions, "sni_hostname": url.host}
        try:
            async with asyncio.timeout(self._deadline - time.monotonic()):
                response = await self._send(request)
        except TimeoutError:
            raise self._cross(self._late(), request) from None
        encoding = response.headers.get("content-encoding", "identity").strip().lower()
        if encoding not in ("", "identity"):
            await response.aclose()
            raise self._cross(f"an answer encoded {encoding!r} (its decoded size is unknown)", request)
        stream = response.stream
        assert isinstance(stream, httpx2.AsyncByteStream)
        return httpx2.Response(
            response.status_code,
            headers=response.headers,
            stream=_BoundedStream(stream, self, request),
            extensions=response.extensions,
            request=request,
        )

    async def _send(self, request: httpx2.Request) -> httpx2.Response:
        url = request.url
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

    def _late(self) -> str:
        return f"no answer within the {self._bounds.seconds:g} s of the MCP operation"

    async def aclose(self) -> None:
        await self._inner.aclose()


class _BoundedStream(httpx2.AsyncByteStream):
    """An answer's body, each read given what is left of the session's time, cut off past the bytes."""

    def __init__(self, inner: httpx2.AsyncByteStream, transport: BoundedTransport, request: httpx2.Request):
        self._inner = inner
        self._transport = transport
        self._request = request

    async def __aiter__(self) -> AsyncIterator[bytes]:
        transport, most = self._transport, self._transport._bounds.max_bytes
        chunks = self._inner.__aiter__()
        read = 0
        while True:
            try:
                async with asyncio.timeout(transport._deadline - time.monotonic()):
                    chunk = await anext(chunks)
            except StopAsyncIteration:
                return
            except TimeoutError:
                raise transport._cross(transport._late(), self._request) from None
            read += len(chunk)
            if read > most:
                raise transport._cross(f"an answer larger than {most} bytes", self._request)
            yield chunk

    async def aclose(self) -> None:
        await self._inner.aclose()


class SessionFailed(Exception):
    """An MCP session that failed: the server unreachable, an error answer, a bound crossed; `str` says
    why (the bound first, whatever the SDK made of it)."""


@asynccontextmanager
async def mcp_session(server: Vetted, headers: Mapping[str, str], bounds: Bounds) -> AsyncIterator[Client]:
    """One MCP session with `server` within `bounds` (the module's docstring): the SDK's client.
    SessionFailed for any failure in it, the caller's own included."""
    # The SDK is imported by the first session, not with this module: its pydantic models take about 2 s
    # of CPU to import, which every server process (the supervisor, each gateway) paid at start through
    # the container, though most never open an MCP session.
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    deadline = time.monotonic() + bounds.seconds
    transport = BoundedTransport(server, bounds, deadline)
    http = httpx2.AsyncClient(
        transport=transport,
        headers={**headers, "Accept-Encoding": "identity"},
        timeout=httpx2.Timeout(bounds.idle_seconds),
        follow_redirects=False,
        trust_env=False,
    )
    streams = streamable_http_client(str(server.url), http_client=http, max_sse_event_size=bounds.max_bytes)
    try:
        async with (
            asyncio.timeout(bounds.seconds),
            http,
            Client(streams, cache=None, read_timeout_seconds=bounds.seconds) as client,
        ):
            yield client
    except Exception as exc:  # the SDK's errors, httpx2's, task-group groups of them: all a failure here
        raise SessionFailed(transport.crossed or _reason(exc, transport)) from None


def _reason(exc: BaseException, transport: BoundedTransport) -> str:
    """The innermost cause of a failure (anyio wraps a transport's error in exception groups)."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    if isinstance(exc, TimeoutError):
        return transport._late()
    return str(exc) or type(exc).__name__
