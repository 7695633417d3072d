"""Fetching remote media over http(s) without letting a request reach inside the operator's network.

A URL in a request is attacker-chosen, so the gateway must not become a proxy to its own loopback,
cloud metadata (169.254.169.254) or private services (SSRF). Every hop is checked the same way: the
scheme must be http(s), and every address the host resolves to must be public unless the operator
allowed its network. The connection then goes to the vetted address itself, never to the name, so a
second DNS answer (DNS rebinding) cannot switch the target; the `Host` header and TLS SNI keep the
original name, so virtual hosts and certificate checks still work. Redirects are followed by hand for
the same reason. One deadline covers the whole fetch and the body is cut off at `max_bytes`.
"""

from __future__ import annotations

import asyncio
import functools
import ipaddress
import socket
import ssl
from collections.abc import Iterable
from dataclasses import dataclass

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
    """The body of `url`, or InvalidMedia naming `param`. `timeout` is capped by the policy's maximum."""
    budget = min(timeout or policy.max_timeout, policy.max_timeout)
    try:
        with tracing.step("fetch media", {"modelhost.param": param}, kind=tracing.CLIENT):
            async with asyncio.timeout(budget):
                return await _fetch(_parse_url(url, param), policy, budget, param)
    except (TimeoutError, httpx.TimeoutException):
        raise InvalidMedia(f"Timed out after {budget:g} s fetching `{param}`", param=param) from None
    except (httpx.HTTPError, httpx.InvalidURL) as exc:
        raise InvalidMedia(f"Could not fetch `{param}`: {exc}", param=param) from None


async def _fetch(url: httpx.URL, policy: FetchPolicy, budget: float, param: str) -> bytes:
    for _hop in range(policy.max_redirects + 1):
        tracing.current_attributes({"server.address": url.host, "url.scheme": url.scheme})  # the last hop's
        addresses = await _vetted_addresses(url, policy, param)
        # A client per hop: a pooled TLS connection verified for one name must not serve the next.
        async with httpx.AsyncClient(
            verify=_tls_context(), trust_env=False, follow_redirects=False, timeout=budget
        ) as client:
            response = await _connect(client, url, addresses, param)
            try:
                target = _redirect_target(response, url, param)
                if target is None:
                    _check_status(response, url, param)
                    body = await _read_body(response, policy.max_bytes, param)
                    tracing.current_attributes({"http.response.body.size": len(body)})
                    return body
            finally:
                await response.aclose()
        url = target
    raise InvalidMedia(
        f"Too many redirects fetching `{param}` (at most {policy.max_redirects} are followed)", param=param
    )


def _parse_url(url: str, param: str) -> httpx.URL:
    try:
        parsed = httpx.URL(url)
    except httpx.InvalidURL as exc:
        raise InvalidMedia(f"`{param}` is not a valid URL: {exc}", param=param) from None
    _check_scheme(parsed, param)
    return parsed


def _check_scheme(url: httpx.URL, param: str) -> None:
    if url.scheme not in ("http", "https"):
        raise InvalidMedia(
            f"Unsupported scheme {url.scheme!r} in `{param}`: only http and https URLs are fetched",
            param=param,
        )
    if not url.raw_host:
        raise InvalidMedia(f"`{param}` is a URL without a host", param=param)


async def _vetted_addresses(url: httpx.URL, policy: FetchPolicy, param: str) -> list[IPAddress]:
    """Every address of the URL's host, refusing the lot if any one is not allowed.

    Checking all of them (not just the one connected to) keeps a mixed public/private answer from
    being used to reach the private one on a retry.
    """
    addresses = await _resolve(url, param)
    if not all(address_allowed(ip, policy.allowed_networks) for ip in addresses):
        raise InvalidMedia(
            f"Refused to fetch `{param}`: host {url.host!r} is a loopback, private, link-local or otherwise "
            "non-public address (operators can allow networks with MODELHOST_MEDIA_ALLOW_NETWORKS)",
            param=param,
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
        raise InvalidMedia(f"Could not resolve host {url.host!r} in `{param}`", param=param) from None
    # Scope ids ("fe80::1%eth0") are dropped: they only occur on link-local addresses, refused anyway.
    unique = dict.fromkeys(ipaddress.ip_address(str(info[4][0]).split("%")[0]) for info in infos)
    if not unique:
        raise InvalidMedia(f"Could not resolve host {url.host!r} in `{param}`", param=param)
    return list(unique)


async def _connect(
    client: httpx.AsyncClient, url: httpx.URL, addresses: list[IPAddress], param: str
) -> httpx.Response:
    """A streaming response from the first vetted address that accepts a connection.

    Trying each in turn matters on hosts whose IPv6 answers are unreachable (common in containers).
    """
    headers = {"Host": url.netloc.decode("ascii"), "Accept": "*/*", "Accept-Encoding": "identity"}
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
    raise InvalidMedia(f"Could not connect to {url.host!r} for `{param}`: {failure}", param=param)


def _redirect_target(response: httpx.Response, url: httpx.URL, param: str) -> httpx.URL | None:
    """The next URL if `response` is a redirect (its scheme checked here, its addresses at the next hop)."""
    if response.status_code not in REDIRECT_STATUSES or "location" not in response.headers:
        return None
    try:
        target = url.join(response.headers["location"])
    except httpx.InvalidURL as exc:
        raise InvalidMedia(f"`{param}` redirected to an invalid URL: {exc}", param=param) from None
    _check_scheme(target, param)
    return target


def _check_status(response: httpx.Response, url: httpx.URL, param: str) -> None:
    if not response.is_success:
        raise InvalidMedia(
            f"Could not fetch `{param}`: {url.host!r} answered HTTP {response.status_code} "
            f"{response.reason_phrase}".rstrip(),
            param=param,
        )


async def _read_body(response: httpx.Response, max_bytes: int, param: str) -> bytes:
    """The body, stopping as soon as it passes `max_bytes` so a huge file never sits in memory."""
    declared = response.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > max_bytes:
        raise _too_large(max_bytes, param)
    body = bytearray()
    async for chunk in response.aiter_bytes():
        body += chunk
        if len(body) > max_bytes:
            raise _too_large(max_bytes, param)
    return bytes(body)


def _too_large(max_bytes: int, param: str) -> InvalidMedia:
    return InvalidMedia(f"Media in `{param}` is too large (limit {max_bytes} bytes)", param=param)


@functools.cache
def _tls_context() -> ssl.SSLContext:
    """One verifying context for all fetches: building one loads the CA bundle, which is slow."""
    return httpx.create_ssl_context()
