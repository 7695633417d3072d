"""Fetching a tenant's http(s) URL: media inputs, an import's files and the Hub's listing.

Every hop is checked the same way (`outbound.addresses`): the scheme must be one the caller allows,
and every address the host resolves to must be allowed by `Bounds.networks`. The connection then goes
to the vetted address itself; the `Host` header and TLS SNI keep the original name, so virtual hosts
and certificate checks still work. Redirects are followed by hand for the same reason, each one a
request of `Bounds.requests`.

`open_url` opens a URL, its body the caller's to stream: each step waits at most `idle_seconds`, the
whole operation (every hop, the whole body) at most `seconds`, and the body is cut off past
`max_bytes`. `fetch_url` reads a small answer whole through it (a media input, a listing).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Mapping
from dataclasses import dataclass
from typing import TypeVar

import httpx

from modelhost import tracing
from modelhost.outbound import tls
from modelhost.outbound.addresses import check_scheme, parse_url, vetted_addresses
from modelhost.outbound.bounds import Bounds, FetchFailed, IPAddress, timed_out, too_large, unreachable

REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})
T = TypeVar("T")


async def fetch_url(
    url: str,
    bounds: Bounds,
    *,
    timeout: float | None,
    param: str,
    headers: Mapping[str, str] | None = None,
    schemes: tuple[str, ...] = ("http", "https"),
) -> bytes:
    """The body of `url`, read whole within `bounds` (and `timeout`, a request's own shorter limit);
    FetchFailed naming `param` otherwise."""
    bounds = bounds.within(timeout)
    with tracing.step("fetch media", {"modelhost.param": param}, kind=tracing.CLIENT):
        async with open_url(url, bounds, param=param, headers=headers, schemes=schemes) as response:
            body = bytearray()
            async for chunk in response.aiter_bytes():
                body += chunk
        tracing.current_attributes({"http.response.body.size": len(body)})
        return bytes(body)


@contextlib.asynccontextmanager
async def open_url(
    url: str,
    bounds: Bounds,
    *,
    param: str,
    headers: Mapping[str, str] | None = None,
    offset: int = 0,
    schemes: tuple[str, ...] = ("http", "https"),
) -> AsyncIterator[RemoteResponse]:
    """`url` opened within `bounds`, its body not yet read: the one way this server fetches a URL.

    Every hop is vetted (scheme in `schemes`, every address of its host allowed) and connected to by
    the vetted address; redirects are followed by hand, `bounds.requests - 1` at most. `headers`
    (credentials, say) go to the original URL's origin only, never after a redirect to another one.
    `offset` > 0 asks for the rest of the body (`Range: bytes=offset-`); a server that ignores ranges is
    read from the start and the first `offset` bytes are dropped. An answer that says it is longer than
    `bounds.max_bytes` is refused before its body. FetchFailed (an InvalidMedia naming `param`) on any
    failure, its `reason` saying which.
    """
    deadline = time.monotonic() + bounds.seconds
    current = parse_url(url, param, schemes)
    origin = _origin(current)
    for _hop in range(bounds.requests):
        tracing.current_attributes({"server.address": current.host, "url.scheme": current.scheme})
        addresses = await _within(deadline, bounds, param, vetted_addresses(current, bounds.networks, param))
        own = dict(headers or {}) if _origin(current) == origin else {}
        # A client per hop: a pooled TLS connection verified for one name must not serve the next.
        async with httpx.AsyncClient(
            verify=tls.tls_context(), trust_env=False, follow_redirects=False, timeout=bounds.idle_seconds
        ) as client:
            connecting = _connect(client, current, addresses, param, own, offset)
            response = await _within(deadline, bounds, param, connecting)
            try:
                target = _redirect_target(response, current, param, schemes)
                if target is None:
                    yield _opened(response, current, param, offset, bounds, deadline)
                    return
            finally:
                await response.aclose()
        current = target
    raise FetchFailed(
        f"Too many redirects fetching `{param}` (at most {bounds.requests - 1} are followed)",
        param=param,
        reason="invalid",
    )


async def _within(deadline: float, bounds: Bounds, param: str, step: Awaitable[T]) -> T:
    """`step`, given what is left of the operation's time."""
    try:
        async with asyncio.timeout(deadline - time.monotonic()):
            return await step
    except TimeoutError:
        raise timed_out(bounds.seconds, param) from None


@dataclass
class RemoteResponse:
    """An answer `open_url` opened: the final URL (after redirects), headers, and the body from the
    asked offset on. `length`: the bytes the body will give, `size`: the whole file's, when the server
    said (Content-Length, Content-Range)."""

    url: httpx.URL
    status_code: int
    headers: httpx.Headers
    length: int | None
    size: int | None
    _response: httpx.Response
    _skip: int
    _param: str
    _bounds: Bounds
    _deadline: float
    _offset: int

    async def aiter_bytes(self) -> AsyncIterator[bytes]:
        """The body in chunks as they arrive, each read given what is left of the operation's time, and
        cut off past `max_bytes` (counted from the file's start); FetchFailed (`unreachable`) if the
        transfer breaks or stalls, (`too_large`) past the bound."""
        skip, done, param = self._skip, self._offset, self._param
        chunks = self._response.aiter_bytes().__aiter__()
        try:
            while True:
                try:
                    async with asyncio.timeout(self._deadline - time.monotonic()):
                        chunk = await anext(chunks)
                except StopAsyncIteration:
                    return
                except TimeoutError:
                    raise timed_out(self._bounds.seconds, param) from None
                if skip:
                    dropped = min(skip, len(chunk))
                    chunk, skip = chunk[dropped:], skip - dropped
                done += len(chunk)
                if done > self._bounds.max_bytes:
                    raise too_large(self._bounds.max_bytes, param)
                if chunk:
                    yield chunk
        except httpx.TimeoutException:
            raise timed_out(self._bounds.idle_seconds, param) from None
        except httpx.HTTPError as exc:
            raise unreachable(f"Could not fetch `{param}`: {exc}", param) from None
        finally:
            await chunks.aclose()  # type: ignore[attr-defined]


def _origin(url: httpx.URL) -> tuple[str, bytes, int | None]:
    return url.scheme, url.raw_host, url.port


async def _connect(
    client: httpx.AsyncClient,
    url: httpx.URL,
    addresses: list[IPAddress],
    param: str,
    own_headers: dict[str, str],
    offset: int,
) -> httpx.Response:
    """A streaming response from the first vetted address that accepts a connection.

    Trying each in turn matters on hosts whose IPv6 answers are unreachable (common in containers).
    """
    headers = {
        **own_headers,
        "Host": url.netloc.decode("ascii"),
        "Accept": "*/*",
        "Accept-Encoding": "identity",  # byte offsets and sizes are those of the file itself
    }
    if offset:
        headers["Range"] = f"bytes={offset}-"
    extensions = {"sni_hostname": url.raw_host.decode("ascii")} if url.scheme == "https" else {}
    failure = "no address"
    for ip in addresses:
        request = client.build_request(
            "GET", url.copy_with(host=str(ip)), headers=headers, extensions=extensions
        )
        try:
            return await client.send(request, stream=True)
        except httpx.ConnectError as exc:
            failure = str(exc) or type(exc).__name__
        except httpx.TimeoutException:
            raise timed_out(client.timeout.connect or 0.0, param) from None
        except httpx.HTTPError as exc:
            raise unreachable(f"Could not fetch `{param}`: {exc}", param) from None
    raise unreachable(f"Could not connect to {url.host!r} for `{param}`: {failure}", param)


def _redirect_target(
    response: httpx.Response, url: httpx.URL, param: str, schemes: tuple[str, ...]
) -> httpx.URL | None:
    """The next URL if `response` is a redirect (its scheme checked here, its addresses at the next hop)."""
    if response.status_code not in REDIRECT_STATUSES or "location" not in response.headers:
        return None
    try:
        target = url.join(response.headers["location"])
    except httpx.InvalidURL as exc:
        raise FetchFailed(
            f"`{param}` redirected to an invalid URL: {exc}", param=param, reason="invalid"
        ) from None
    check_scheme(target, param, schemes)
    return target


def _opened(
    response: httpx.Response, url: httpx.URL, param: str, offset: int, bounds: Bounds, deadline: float
) -> RemoteResponse:
    """The final answer, checked: a success, no larger than the bound by what it says, and for a ranged
    request the range asked for (a server that ignored the range answers 200 with the whole body, whose
    first `offset` bytes are skipped)."""
    if not response.is_success:
        raise FetchFailed(
            f"Could not fetch `{param}`: {url.host!r} answered HTTP {response.status_code} "
            f"{response.reason_phrase}".rstrip(),
            param=param,
            reason="status",
            status=response.status_code,
            answer_headers=response.headers,
        )
    declared = response.headers.get("content-length", "")
    length = int(declared) if declared.isdigit() else None
    size, skip = length, offset
    if response.status_code == 206:
        start, size = _content_range(response.headers.get("content-range", ""))
        if start != offset:
            raise unreachable(f"`{param}`: {url.host!r} answered another range than bytes={offset}-", param)
        skip = 0
    elif length is not None:
        length = max(length - offset, 0)
    if size is not None and size > bounds.max_bytes:
        raise too_large(bounds.max_bytes, param)
    return RemoteResponse(
        url,
        response.status_code,
        response.headers,
        length,
        size,
        response,
        skip,
        param,
        bounds,
        deadline,
        offset,
    )


def _content_range(value: str) -> tuple[int | None, int | None]:
    """(first byte, whole size) of `bytes a-b/size`; None where absent or `*`."""
    unit, _, spec = value.partition(" ")
    span, _, total = spec.partition("/")
    first = span.partition("-")[0]
    if unit != "bytes" or not first.isdigit():
        return None, None
    return int(first), int(total) if total.isdigit() else None
