"""Fetching remote media over http(s) without letting a request reach inside the operator's network.

A URL in a request is attacker-chosen, so the gateway must not become a proxy to its own loopback,
cloud metadata (169.254.169.254) or private services (SSRF). Every hop is checked the same way: the
scheme must be http(s), and every address the host resolves to must be public unless the operator
allowed its network. The connection then goes to the vetted address itself, never to the name, so a
second DNS answer (DNS rebinding) cannot switch the target; the `Host` header and TLS SNI keep the
original name, so virtual hosts and certificate checks still work. Redirects are followed by hand for
the same reason.

`open_url` is the one way to open a URL (media inputs, an import's files): the body is the caller's to
stream, with an idle timeout. `fetch_url` reads a media input through it: one deadline covers the whole
fetch and the body is cut off at `max_bytes`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import ipaddress
import os
import socket
import ssl
from collections.abc import AsyncIterator, Iterable, Mapping
from dataclasses import dataclass

import certifi
import httpx

from modelhost import tracing
from modelhost.config import Settings
from modelhost.errors import InvalidMedia

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})
# NAT64 prefix: such an address reaches the IPv4 address in its last 32 bits through a translator.
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")


@dataclass(frozen=True)
class FetchPolicy:
    """What a remote media fetch may do; built once from the settings."""

    allowed_networks: tuple[IPNetwork, ...]
    max_bytes: int
    max_timeout: float  # the server's maximum; a request's `timeout` is capped by it
    max_redirects: int

    @classmethod
    def from_settings(cls, settings: Settings) -> FetchPolicy:
        return cls(
            allowed_networks=parse_networks(settings.media_allow_networks),
            max_bytes=settings.media_max_bytes,
            max_timeout=settings.media_fetch_timeout_seconds,
            max_redirects=settings.media_max_redirects,
        )


def parse_networks(cidrs: Iterable[str]) -> tuple[IPNetwork, ...]:
    """CIDRs from MODELHOST_MEDIA_ALLOW_NETWORKS; host bits are tolerated (10.1.2.3/8 means 10/8)."""
    networks = []
    for cidr in cidrs:
        try:
            networks.append(ipaddress.ip_network(cidr.strip(), strict=False))
        except ValueError as exc:
            raise ValueError(f"MODELHOST_MEDIA_ALLOW_NETWORKS: {cidr!r} is not a network: {exc}") from None
    return tuple(networks)


def address_allowed(ip: IPAddress, allowed_networks: Iterable[IPNetwork]) -> bool:
    """Whether media may be fetched from `ip`: public addresses always, others only when allowed.

    IPv6 forms that carry an IPv4 address (IPv4-mapped, 6to4, Teredo, NAT64) are judged by that
    address too, since they can route to it.
    """
    forms = _address_forms(ip)
    if any(form in network for form in forms for network in allowed_networks):
        return True
    return all(_is_public(form) for form in forms)


def _address_forms(ip: IPAddress) -> list[IPAddress]:
    forms: list[IPAddress] = [ip]
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            forms.append(ip.ipv4_mapped)
        if ip.sixtofour is not None:
            forms.append(ip.sixtofour)
        if ip.teredo is not None:
            forms.extend(ip.teredo)
        if ip in _NAT64:
            forms.append(ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF))
    return forms


def _is_public(ip: IPAddress) -> bool:
    # `is_global` alone misses multicast (224.0.0.0/4 counts as global), so every property is checked.
    special = (
        ip.is_loopback
        or ip.is_private
        or ip.is_link_local
        or ip.is_multicast
        or ip.is_reserved
        or ip.is_unspecified
        or (isinstance(ip, ipaddress.IPv6Address) and ip.is_site_local)
    )
    return ip.is_global and not special


async def fetch_url(url: str, policy: FetchPolicy, *, timeout: float | None, param: str) -> bytes:
    """The body of `url`, or InvalidMedia naming `param`. `timeout` is capped by the policy's maximum and
    bounds the whole fetch (a media input is small: a slow trickle is as bad as silence)."""
    budget = min(timeout or policy.max_timeout, policy.max_timeout)
    try:
        with tracing.step("fetch media", {"modelhost.param": param}, kind=tracing.CLIENT):
            async with asyncio.timeout(budget):
                async with open_url(url, policy, timeout=budget, param=param) as response:
                    body = await read_body(response, policy.max_bytes, param)
                tracing.current_attributes({"http.response.body.size": len(body)})
                return body
    except TimeoutError:
        raise _timed_out(budget, param) from None


@contextlib.asynccontextmanager
async def open_url(
    url: str,
    policy: FetchPolicy,
    *,
    timeout: float,
    param: str,
    headers: Mapping[str, str] | None = None,
    offset: int = 0,
    schemes: tuple[str, ...] = ("http", "https"),
) -> AsyncIterator[RemoteResponse]:
    """`url` opened under the media rules, its body not yet read: the one way this server fetches a URL.

    Every hop is vetted (scheme in `schemes`, every address of its host allowed) and connected to by
    the vetted address; redirects are followed by hand, at most `policy.max_redirects`. `timeout` is an
    idle timeout: it bounds each step (connect, each read), not the whole transfer, so a long download
    that keeps moving never times out; a caller wanting one deadline wraps the call (as `fetch_url`).
    `headers` (credentials, say) go to the original URL's origin only, never after a redirect to
    another one. `offset` > 0 asks for the rest of the body (`Range: bytes=offset-`); a server that
    ignores ranges is read from the start and the first `offset` bytes are dropped. FetchFailed (an
    InvalidMedia naming `param`) on any failure, its `reason` saying which.
    """
    current = _parse_url(url, param, schemes)
    origin = _origin(current)
    for _hop in range(policy.max_redirects + 1):
        tracing.current_attributes({"server.address": current.host, "url.scheme": current.scheme})
        addresses = await _vetted_addresses(current, policy, param)
        own = dict(headers or {}) if _origin(current) == origin else {}
        # A client per hop: a pooled TLS connection verified for one name must not serve the next.
        async with httpx.AsyncClient(
            verify=_tls_context(), trust_env=False, follow_redirects=False, timeout=timeout
        ) as client:
            response = await _connect(client, current, addresses, param, own, offset)
            try:
                target = _redirect_target(response, current, param, schemes)
                if target is None:
                    yield _opened(response, current, param, offset, timeout)
                    return
            finally:
                await response.aclose()
        current = target
    raise FetchFailed(
        f"Too many redirects fetching `{param}` (at most {policy.max_redirects} are followed)",
        param=param,
        reason="invalid",
    )


class FetchFailed(InvalidMedia):
    """InvalidMedia that says why, for callers that tell causes apart (an import's failure codes).

    `reason`: `invalid` (not a URL, too many redirects), `scheme` (a scheme not allowed, at any hop),
    `refused` (a non-public address the operator did not allow), `unreachable` (no answer: name, connection,
    TLS, timeout, a broken transfer), `status` (an HTTP error status, in `status`), `too_large`.
    """

    reason = "invalid"
    status: int | None = None
    answer_headers: httpx.Headers | None = None

    def __init__(
        self,
        message: str,
        *,
        param: str,
        reason: str,
        status: int | None = None,
        answer_headers: httpx.Headers | None = None,
    ) -> None:
        super().__init__(message, param=param)
        self.reason = reason
        self.status = status
        self.answer_headers = answer_headers  # of a `status` failure: some servers say more there


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
    _timeout: float

    async def aiter_bytes(self) -> AsyncIterator[bytes]:
        """The body in chunks as they arrive; FetchFailed (`unreachable`) if the transfer breaks or stalls."""
        skip = self._skip
        try:
            async for chunk in self._response.aiter_bytes():
                if skip:
                    dropped = min(skip, len(chunk))
                    chunk, skip = chunk[dropped:], skip - dropped
                if chunk:
                    yield chunk
        except httpx.TimeoutException:
            raise _timed_out(self._timeout, self._param) from None
        except httpx.HTTPError as exc:
            raise _unreachable(f"Could not fetch `{self._param}`: {exc}", self._param) from None


def _parse_url(url: str, param: str, schemes: tuple[str, ...]) -> httpx.URL:
    try:
        parsed = httpx.URL(url)
    except httpx.InvalidURL as exc:
        raise FetchFailed(f"`{param}` is not a valid URL: {exc}", param=param, reason="invalid") from None
    _check_scheme(parsed, param, schemes)
    return parsed


def _check_scheme(url: httpx.URL, param: str, schemes: tuple[str, ...]) -> None:
    if url.scheme not in schemes:
        allowed = " and ".join(schemes)
        raise FetchFailed(
            f"Unsupported scheme {url.scheme!r} in `{param}`: only {allowed} URLs are fetched",
            param=param,
            reason="scheme",
        )
    if not url.raw_host:
        raise FetchFailed(f"`{param}` is a URL without a host", param=param, reason="invalid")


def _origin(url: httpx.URL) -> tuple[str, bytes, int | None]:
    return url.scheme, url.raw_host, url.port


async def vetted_addresses(url: str, policy: FetchPolicy, *, param: str) -> tuple[httpx.URL, list[IPAddress]]:
    """`url` parsed (http or https) and every address of its host, all allowed under the media rules, for
    a client that connects by itself but only to these addresses (the MCP client, `modelhost.mcp.client`);
    FetchFailed naming `param` otherwise."""
    parsed = _parse_url(url, param, ("http", "https"))
    return parsed, await _vetted_addresses(parsed, policy, param)


async def _vetted_addresses(url: httpx.URL, policy: FetchPolicy, param: str) -> list[IPAddress]:
    """Every address of the URL's host, refusing the lot if any one is not allowed.

    Checking all of them (not just the one connected to) keeps a mixed public/private answer from
    being used to reach the private one on a retry.
    """
    addresses = await _resolve(url, param)
    if not all(address_allowed(ip, policy.allowed_networks) for ip in addresses):
        raise FetchFailed(
            f"Refused to fetch `{param}`: host {url.host!r} is a loopback, private, link-local or otherwise "
            "non-public address (operators can allow networks with MODELHOST_MEDIA_ALLOW_NETWORKS)",
            param=param,
            reason="refused",
        )
    return addresses


async def _resolve(url: httpx.URL, param: str) -> list[IPAddress]:
    host = url.raw_host.decode("ascii")
    try:
        return [ipaddress.ip_address(host)]
    except ValueError:
        pass  # a name, not an IP literal
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        raise _unreachable(f"Could not resolve host {url.host!r} in `{param}`", param) from None
    # Scope ids ("fe80::1%eth0") are dropped: they only occur on link-local addresses, refused anyway.
    unique = dict.fromkeys(ipaddress.ip_address(str(info[4][0]).split("%")[0]) for info in infos)
    if not unique:
        raise _unreachable(f"Could not resolve host {url.host!r} in `{param}`", param)
    return list(unique)


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
            raise _timed_out(client.timeout.connect or 0.0, param) from None
        except httpx.HTTPError as exc:
            raise _unreachable(f"Could not fetch `{param}`: {exc}", param) from None
    raise _unreachable(f"Could not connect to {url.host!r} for `{param}`: {failure}", param)


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
    _check_scheme(target, param, schemes)
    return target


def _opened(
    response: httpx.Response, url: httpx.URL, param: str, offset: int, timeout: float
) -> RemoteResponse:
    """The final answer, checked: a success, and for a ranged request the range asked for (a server
    that ignored the range answers 200 with the whole body, whose first `offset` bytes are skipped)."""
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
            raise _unreachable(f"`{param}`: {url.host!r} answered another range than bytes={offset}-", param)
        skip = 0
    elif length is not None:
        length = max(length - offset, 0)
    return RemoteResponse(
        url, response.status_code, response.headers, length, size, response, skip, param, timeout
    )


def _content_range(value: str) -> tuple[int | None, int | None]:
    """(first byte, whole size) of `bytes a-b/size`; None where absent or `*`."""
    unit, _, spec = value.partition(" ")
    span, _, total = spec.partition("/")
    first = span.partition("-")[0]
    if unit != "bytes" or not first.isdigit():
        return None, None
    return int(first), int(total) if total.isdigit() else None


async def read_body(response: RemoteResponse, max_bytes: int, param: str) -> bytes:
    """The body of a small answer (a media input, a listing), stopping as soon as it passes `max_bytes`
    so a huge file never sits in memory."""
    if response.length is not None and response.length > max_bytes:
        raise _too_large(max_bytes, param)
    body = bytearray()
    async for chunk in response.aiter_bytes():
        body += chunk
        if len(body) > max_bytes:
            raise _too_large(max_bytes, param)
    return bytes(body)


def _too_large(max_bytes: int, param: str) -> FetchFailed:
    return FetchFailed(
        f"Media in `{param}` is too large (limit {max_bytes} bytes)", param=param, reason="too_large"
    )


def _timed_out(seconds: float, param: str) -> FetchFailed:
    return _unreachable(f"Timed out after {seconds:g} s fetching `{param}`", param)


def _unreachable(message: str, param: str) -> FetchFailed:
    return FetchFailed(message, param=param, reason="unreachable")


def _tls_context() -> ssl.SSLContext:
    """The verifying context of every fetch. The CA bundle is `SSL_CERT_FILE`, else the folder
    `SSL_CERT_DIR`, when set (read at each fetch, as httpx 0.28's `create_ssl_context` reads them once):
    an operator's private CA, a test's CA. Otherwise certifi's bundle, as httpx uses by default: the
    same answer on every machine, whatever its system store holds."""
    return _tls_context_for(os.environ.get("SSL_CERT_FILE") or None, os.environ.get("SSL_CERT_DIR") or None)


@functools.cache
def _tls_context_for(cafile: str | None, capath: str | None) -> ssl.SSLContext:
    """Cached per bundle: building a context loads the bundle, which is slow."""
    if cafile:
        return ssl.create_default_context(cafile=cafile)
    if capath:
        return ssl.create_default_context(capath=capath)
    return ssl.create_default_context(cafile=certifi.where())
