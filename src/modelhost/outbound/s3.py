"""An S3 client for a tenant's objects (an import's), every request of which is sent within its bounds:
to a vetted address (one DNS lookup per connection, never a second one by the HTTP client), its answer
read whole capped in bytes and time, its pages counted. Whoever signs (a tenant's keys, the operator's
chain, nobody: the caller's decision) and wherever it goes (a tenant's endpoint, the operator's, AWS).

boto3 connects by name: urllib3 resolves the host each time it opens a connection. Vetting the name
first and letting boto3 connect afterwards leaves a window: a resolver that answers a public address to
the vetting and 127.0.0.1 to the connection (DNS rebinding) gets the request sent inside the operator's
network, and the answer (cloud credentials, an internal service's data) staged as the tenant's file. So
every connection of the client is opened by `_new_conn` below: it resolves the host once, refuses the
lot unless every address is allowed by `Bounds.networks` (`outbound.addresses`: public, as AWS's are, or
in the networks the caller allowed), and connects to one of those addresses itself. TLS still names
the host: urllib3 wraps the socket `_new_conn` returns with `server_hostname=self.host`, so SNI and the
certificate check are the name's, as in `outbound.http`. Every request opens its connections
this way (retries, and botocore's redirects to another endpoint or region, included); a pooled
connection was vetted when it was opened.

How it is wired, and why so. `s3_client` builds the client and registers `_vetted_sender` on it before
anyone else holds it. boto3 has no setting for how its connections resolve names. Its `before-send`
event (public: a handler may answer a request itself, as botocore's Stubber does) hands each request
to `_vetted_sender`'s handler, which sends it with botocore's own `URLLib3Session` (its pooling,
timeouts, TLS and error mapping unchanged) whose connection pools open `_new_conn`'s connections.
`URLLib3Session` keeps its pool classes in one dict that its pool manager shares; we swap the classes
there and check that the manager really uses them, so a botocore that changed this fails every request
loudly rather than connecting unvetted. There is no proxy: a proxy resolves the name itself, so the
S3 server is reached directly, as media fetches are (httpx with `trust_env=False`). Certificates are
checked against `AWS_CA_BUNDLE`, else botocore's bundle.

The other bounds. Every answer botocore reads whole (a listing page, an error) is read here, through
`_Capped`: cut off past `Bounds.max_bytes`, and past `Bounds.seconds` from its request; each step waits
at most `Bounds.idle_seconds`; the client sends at most `Bounds.requests` of them (a listing that pages
for ever stops). An object's body (GetObject) streams to the caller chunk by chunk, never held whole,
under the idle timeout; its caller counts its bytes (the import runner, against the file-size limit).

A bound crossed or an address refused leaves the client's call as FetchFailed: botocore retries only
errors it knows (its HTTPClientError, which wraps whatever a send raises), so it is told at once.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Literal

from modelhost.outbound.addresses import vetted_addresses_now
from modelhost.outbound.bounds import Bounds, FetchFailed, IPNetwork, timed_out, too_large

PARAM = "the S3 endpoint"
RETRIES = 3  # botocore's attempts of one request (standard mode: a 5xx, a throttle, a dropped connection)


@dataclass(frozen=True)
class S3Keys:
    """Keys that sign an S3 client's requests (a tenant's own)."""

    access_key_id: str
    secret_access_key: str
    session_token: str | None


def s3_client(
    bounds: Bounds,
    *,
    endpoint_url: str | None,
    region: str | None,
    signed_by: S3Keys | Literal["operator"] | None,
) -> Any:
    """boto3's S3 client, each request of which is sent within `bounds` (the module's docstring).

    `endpoint_url`: the S3 server (None: boto3's default, the operator's AWS_ENDPOINT_URL, else AWS S3);
    `region`: None for boto3's default. `signed_by`: these keys, `"operator"` (boto3's standard chain:
    the operator's credentials), or None (unsigned). Which one is the caller's decision: this client
    only carries it out."""
    import boto3
    from botocore import UNSIGNED
    from botocore.config import Config

    keys = signed_by if isinstance(signed_by, S3Keys) else None
    session = boto3.session.Session(
        aws_access_key_id=keys.access_key_id if keys else None,
        aws_secret_access_key=keys.secret_access_key if keys else None,
        aws_session_token=keys.session_token if keys else None,
        region_name=region,
    )
    config = Config(
        retries={"max_attempts": RETRIES, "mode": "standard"},
        signature_version=UNSIGNED if signed_by is None else None,
    )
    client = session.client("s3", endpoint_url=endpoint_url, config=config)
    client.meta.events.register("before-send.s3", _vetted_sender(bounds))
    return client


def _vetted_sender(bounds: Bounds) -> Callable[..., Any]:
    """A `before-send` handler: it sends each request of the client itself, within `bounds`, every
    connection opened to an address vetted against `bounds.networks`."""
    from botocore.exceptions import HTTPClientError
    from botocore.httpsession import URLLib3Session

    session = URLLib3Session(
        verify=os.environ.get("AWS_CA_BUNDLE") or True,
        proxies={},  # never the environment's proxies: a proxy would resolve the name itself
        timeout=(bounds.idle_seconds, bounds.idle_seconds),
    )
    pools = _vetted_pools(bounds.networks)
    session._pool_classes_by_scheme.update(pools)
    if session._manager.pool_classes_by_scheme.get("https") is not pools["https"]:
        raise RuntimeError("botocore's URLLib3Session no longer shares its pool classes (outbound.s3)")
    whole_answers = _Counter()

    def send(request: Any, **_: Any) -> Any:
        streamed = bool(request.stream_output)
        if not streamed and whole_answers.next() > bounds.requests:
            raise FetchFailed(
                f"The S3 endpoint answered more than {bounds.requests} listing pages",
                param=PARAM,
                reason="too_many",
            )
        deadline = time.monotonic() + bounds.seconds
        request.stream_output = True  # the answer is read below, bounded, rather than by botocore
        try:
            response = session.send(request)
        except HTTPClientError as exc:
            error = exc.kwargs.get("error")
            if isinstance(error, FetchFailed):  # refused: not a transient error for botocore to retry
                raise error from None
            raise
        finally:
            request.stream_output = streamed
        whole = not streamed or response.status_code >= 300  # botocore reads an error answer whole
        response.raw = _Capped(response.raw, bounds, deadline if whole else None, whole)
        if whole:
            response.content  # noqa: B018 (read now, within the bounds, as botocore's own send does)
        return response

    return send


class _Counter:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._count = 0

    def next(self) -> int:
        with self._lock:
            self._count += 1
            return self._count


class _Capped:
    """urllib3's answer, read through a count of its bytes (past `max_bytes` when `capped`) and a
    deadline (when given); the rest (botocore's socket timeouts, `close`) is the answer's own."""

    def __init__(self, raw: Any, bounds: Bounds, deadline: float | None, capped: bool) -> None:
        self._raw, self._bounds, self._deadline, self._capped = raw, bounds, deadline, capped
        self._read = 0

    def _count(self, chunk: bytes) -> bytes:
        self._read += len(chunk)
        if self._capped and self._read > self._bounds.max_bytes:
            self._raw.close()
            raise too_large(self._bounds.max_bytes, PARAM)
        if self._deadline is not None and time.monotonic() > self._deadline:
            self._raw.close()
            raise timed_out(self._bounds.seconds, PARAM)
        return chunk

    def read(self, amt: int | None = None, *args: Any, **kwargs: Any) -> bytes:
        if amt is None:  # all of it: in pieces, so that the bound is checked on the way
            return b"".join(self.stream())
        return self._count(self._raw.read(amt, *args, **kwargs))

    def stream(self, amt: int | None = 2**16, decode_content: bool | None = None) -> Iterator[bytes]:
        # `read1`: what has arrived, so that a trickle meets the deadline at its next bytes
        while chunk := self._raw.read1(amt, decode_content=decode_content):
            yield self._count(chunk)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._raw, name)


def _vetted_pools(networks: tuple[IPNetwork, ...]) -> dict[str, Any]:
    """botocore's connection pool classes, their connections opened by `_new_conn` under `networks`."""
    from botocore import awsrequest
    from urllib3.exceptions import ConnectTimeoutError, NewConnectionError
    from urllib3.util.connection import create_connection

    def _new_conn(self: Any) -> socket.socket:
        failure: OSError | None = None
        for ip in vetted_addresses_now(self.host, self.port, networks, PARAM):
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
