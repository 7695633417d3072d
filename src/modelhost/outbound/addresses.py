"""Which addresses a tenant's URL may reach, and its host's addresses vetted once.

A URL in a request is attacker-chosen, so this server must not become a proxy to its own loopback,
cloud metadata (169.254.169.254) or private services (SSRF). Every address a host resolves to must be
public unless the operator allowed its network (`Bounds.networks`); all of them are checked, not just
the one connected to, so that a mixed public/private answer cannot reach the private one on a retry.
The connection then goes to a vetted address itself, never to the name, so a second DNS answer (DNS
rebinding) cannot switch the target.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from modelhost.outbound.bounds import FetchFailed, IPAddress, IPNetwork, unreachable

# NAT64 prefix: such an address reaches the IPv4 address in its last 32 bits through a translator.
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
_REFUSED = (
    "is a loopback, private, link-local or otherwise non-public address (operators can allow networks "
    "with MODELHOST_MEDIA_ALLOW_NETWORKS)"
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
    """Whether `ip` may be reached: public addresses always, others only when allowed.

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


@dataclass(frozen=True)
class Vetted:
    """A URL whose host's addresses were all allowed when `vet` looked them up: a client that connects
    by itself (the MCP client) connects to these addresses only."""

    url: httpx.URL
    addresses: tuple[IPAddress, ...]


async def vet(url: str, networks: tuple[IPNetwork, ...], *, param: str) -> Vetted:
    """`url` (http or https) with every address of its host, all allowed; FetchFailed naming `param`."""
    parsed = parse_url(url, param, ("http", "https"))
    return Vetted(parsed, tuple(await vetted_addresses(parsed, networks, param)))


def parse_url(url: str, param: str, schemes: tuple[str, ...]) -> httpx.URL:
    try:
        parsed = httpx.URL(url)
    except httpx.InvalidURL as exc:
        raise FetchFailed(f"`{param}` is not a valid URL: {exc}", param=param, reason="invalid") from None
    check_scheme(parsed, param, schemes)
    return parsed


def check_scheme(url: httpx.URL, param: str, schemes: tuple[str, ...]) -> None:
    if url.scheme not in schemes:
        allowed = " and ".join(schemes)
        raise FetchFailed(
            f"Unsupported scheme {url.scheme!r} in `{param}`: only {allowed} URLs are fetched",
            param=param,
            reason="scheme",
        )
    if not url.raw_host:
        raise FetchFailed(f"`{param}` is a URL without a host", param=param, reason="invalid")


async def vetted_addresses(url: httpx.URL, networks: tuple[IPNetwork, ...], param: str) -> list[IPAddress]:
    """Every address of the URL's host, refusing the lot if any one is not allowed."""
    addresses = await _resolve(url, param)
    if not all(address_allowed(ip, networks) for ip in addresses):
        raise FetchFailed(
            f"Refused to fetch `{param}`: host {url.host!r} {_REFUSED}", param=param, reason="refused"
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
        raise unreachable(f"Could not resolve host {url.host!r} in `{param}`", param) from None
    return _unique(infos, url.host, param)


def vetted_addresses_now(
    host: str, port: int, networks: tuple[IPNetwork, ...], param: str
) -> list[IPAddress]:
    """`vetted_addresses` for a blocking client (boto3's connections, in a thread)."""
    try:
        addresses = [ipaddress.ip_address(host)]
    except ValueError:
        try:
            infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except (OSError, UnicodeError):
            raise unreachable(f"Could not resolve host {host!r} in `{param}`", param) from None
        addresses = _unique(infos, host, param)
    if not all(address_allowed(ip, networks) for ip in addresses):
        raise FetchFailed(f"Refused `{param}`: host {host!r} {_REFUSED}", param=param, reason="refused")
    return addresses


def _unique(infos: Sequence[tuple[Any, ...]], host: str, param: str) -> list[IPAddress]:
    # Scope ids ("fe80::1%eth0") are dropped: they only occur on link-local addresses, refused anyway.
    unique = dict.fromkeys(ipaddress.ip_address(str(info[4][0]).split("%")[0]) for info in infos)
    if not unique:
        raise unreachable(f"Could not resolve host {host!r} in `{param}`", param)
    return list(unique)
