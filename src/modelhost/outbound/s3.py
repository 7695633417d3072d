"""A tenant's S3 endpoint, reached at the address that was vetted: one DNS lookup per connection, never
a second one by the HTTP client.

boto3 connects by name: urllib3 resolves the host each time it opens a connection. Vetting the name
first and letting boto3 connect afterwards leaves a window: a resolver that answers a public address to
the vetting and 127.0.0.1 to the connection (DNS rebinding) gets the request sent inside the operator's
network, and the answer (cloud credentials, an internal service's data) staged as the tenant's file. So
every connection to a tenant's endpoint is opened by `_new_conn` below: it resolves the host once,
refuses the lot unless every address is allowed by the media rules (`media.fetch.address_allowed`:
public, or in `MODELHOST_MEDIA_ALLOW_NETWORKS`), and connects to one of those addresses itself. TLS
still names the host: urllib3 wraps the socket `_new_conn` returns with `server_hostname=self.host`, so
SNI and the certificate check are the name's, as in `media.fetch`. Every request opens its connections
this way (retries, and botocore's redirects to another endpoint, included); a pooled connection was
vetted when it was opened.

How it is wired, and why so. boto3 has no setting for how its connections resolve names. Its
`before-send` event (public: a handler may answer a request itself, as botocore's Stubber does) hands
each request of the tenant's client to `vetted_sender`, which sends it with botocore's own
`URLLib3Session` (its pooling, timeouts, TLS and error mapping unchanged) whose connection pools open
`_new_conn`'s connections. `URLLib3Session` keeps its pool classes in one dict that its pool manager
shares; we swap the classes there and check that the manager really uses them, so a botocore that
changed this fails every tenant request loudly rather than connecting unvetted. There is no proxy: a
proxy resolves the name itself, so a tenant's endpoint is reached directly, as media fetches are
(httpx with `trust_env=False`). Certificates are checked against `AWS_CA_BUNDLE`, else botocore's bundle.

A refused address leaves the handler as ImportFailed(`address_refused`): botocore retries only errors it
knows (its HTTPClientError, which wraps whatever a send raises), so the refusal is told at once.
"""

from __future__ import annotations

import ipaddress
import os
import socket
from collections.abc import Callable
from typing import Any

from modelhost.imports.sources import ImportFailed
from modelhost.media.fetch import IPAddress, IPNetwork, address_allowed


def vetted_addresses(host: str, port: int, networks: tuple[IPNetwork, ...]) -> list[IPAddress]:
    """Every address `host` resolves to (once), all of them allowed; ImportFailed(`address_refused`)
    if any is not: a mixed answer must not reach the private one on a retry."""
    try:
        addresses = [ipaddress.ip_address(host)]
    except ValueError:
        try:
            infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except (OSError, UnicodeError):
            raise ImportFailed(
                "source_unreachable", f"Could not resolve the S3 endpoint's host {host!r}."
            ) from None
        # scope ids ("fe80::1%eth0") only occur on link-local addresses, refused anyway
        addresses = list(dict.fromkeys(ipaddress.ip_address(str(i[4][0]).split("%")[0]) for i in infos))
    if not addresses or not all(address_allowed(ip, networks) for ip in addresses):
        raise ImportFailed(
            "address_refused",
            f"Refused the S3 endpoint {host!r}: a loopback, private, link-local or otherwise non-public "
            "address (operators can allow networks with MODELHOST_MEDIA_ALLOW_NETWORKS).",
        )
    return addresses


def vetted_sender(
    networks: tuple[IPNetwork, ...], *, connect_timeout: float, read_timeout: float
) -> Callable[..., Any]:
    """A `before-send` handler for a tenant's S3 client: it sends each request itself, every connection
    opened to an address vetted against `networks` (see the module's docstring)."""
    from botocore.exceptions import HTTPClientError
    from botocore.httpsession import URLLib3Session

    session = URLLib3Session(
        verify=os.environ.get("AWS_CA_BUNDLE") or True,
        proxies={},  # never the environment's proxies: a proxy would resolve the name itself
        timeout=(connect_timeout, read_timeout),
    )
    pools = _vetted_pools(networks)
    session._pool_classes_by_scheme.update(pools)
    if session._manager.pool_classes_by_scheme.get("https") is not pools["https"]:
        raise RuntimeError("botocore's URLLib3Session no longer shares its pool classes (s3_connections)")

    def send(request: Any, **_: Any) -> Any:
        try:
            return session.send(request)
        except HTTPClientError as exc:
            error = exc.kwargs.get("error")
            if isinstance(error, ImportFailed):  # refused: not a transient error for botocore to retry
                raise error from None
            raise

    return send


def _vetted_pools(networks: tuple[IPNetwork, ...]) -> dict[str, Any]:
    """botocore's connection pool classes, their connections opened by `_new_conn` under `networks`."""
    from botocore import awsrequest
    from urllib3.exceptions import ConnectTimeoutError, NewConnectionError
    from urllib3.util.connection import create_connection

    def _new_conn(self: Any) -> socket.socket:
        failure: OSError | None = None
        for ip in vetted_addresses(self.host, self.port, networks):
            try:
                return create_connection(
                    (str(ip), self.port),
                    self.timeout,
                    source_address=self.source_address,
                    socket_options=self.socket_options,
                )
            except TimeoutError as exc:  # socket.timeout
                raise ConnectTimeoutError(
                    self, f"Connection to {self.host} timed out. (connect timeout={self.timeout})"
                ) from exc
            except OSError as exc:  # refused, unreachable: the next vetted address
                failure = exc
        raise NewConnectionError(self, f"Failed to establish a new connection: {failure}")

    http = type("VettedHTTPConnection", (awsrequest.AWSHTTPConnection,), {"_new_conn": _new_conn})
    https = type("VettedHTTPSConnection", (awsrequest.AWSHTTPSConnection,), {"_new_conn": _new_conn})
    return {
        "http": type("VettedHTTPPool", (awsrequest.AWSHTTPConnectionPool,), {"ConnectionCls": http}),
        "https": type("VettedHTTPSPool", (awsrequest.AWSHTTPSConnectionPool,), {"ConnectionCls": https}),
    }
