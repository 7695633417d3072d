"""`s3://bucket/prefix`: the objects under a prefix of a bucket on any S3-compatible server.

The prefix is a folder: `s3://models/ab` imports `ab/...` (as paths relative to it) and never `abc/...`;
where no object is under it but one is named so (`s3://models/q4.gguf`), that one object, at its name.

Whose credentials. The operator's AWS credentials (boto3's standard chain: `AWS_ACCESS_KEY_ID`…,
`AWS_PROFILE`, the instance or pod role) can read what the server keeps for every account, so an import
never uses them on its own: without keys of its own, an import's requests are unsigned (a public bucket
still imports; a private one answers `source_denied`), unless the operator lent its credentials to that
bucket (MODELHOST_IMPORT_OPERATOR_CREDENTIALS_BUCKETS), and then only at the operator's endpoint
(`AWS_ENDPOINT_URL`, or AWS). A tenant's own keys (`aws_access_key_id`, `aws_secret_access_key`,
`aws_session_token`?, `endpoint_url`?, `region`?) sign its requests. And the blob store's own bucket, at
the blob store's endpoint, is never a source, nor is the blob store's endpoint a tenant's
`endpoint_url`, whoever signs (400 `source_refused`, before anything starts).

Every request of an import's client, wherever it goes and whoever signs it, is sent by the outbound
client (`imports.s3_connections`, `outbound.s3`): every address its host resolves to must be public
unless the operator allowed its network (`MODELHOST_MEDIA_ALLOW_NETWORKS`), every connection goes to the
address that was vetted (no second lookup, so no DNS rebinding), and every answer read whole is bounded
in bytes and time, every page counted. The one exception to the addresses: the operator's own endpoint
(`AWS_ENDPOINT_URL`), which the operator chose, is allowed at the addresses it resolves to; a tenant's
`endpoint_url` never is.

The listing is bounded: it stops once it holds one file more than an artifact may have (the runner
then fails the import `too_large`), and it asks for one page at a time, each in a thread, so that a
cancel or the runner's listing deadline stops it between pages (a bucket of millions of keys is never
read whole, nor read on after its import ended).

boto3 blocks, so every call runs in a thread; its clients are thread-safe.
"""

from __future__ import annotations

import asyncio
import ipaddress
import os
import re
import socket
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any, Literal
from urllib.parse import urlsplit

from modelhost.config import Settings
from modelhost.errors import InvalidRequest
from modelhost.imports.s3_connections import import_client, import_failures, vetted_addresses
from modelhost.imports.sources import ImportFailed, RemoteFile, selected
from modelhost.outbound import IPNetwork, parse_networks
from modelhost.outbound.s3 import S3Keys

CHUNK = 1024 * 1024
LIST_PAGE_SIZE = 1000  # keys per LIST request: S3's own maximum
RETRIES = 2  # a cut stream is resumed this many times in a row (boto3 retries the requests themselves)
CREDENTIAL_FIELDS = frozenset(
    {"aws_access_key_id", "aws_secret_access_key", "aws_session_token", "endpoint_url", "region"}
)
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.\-_]{1,254}$")
NOT_FOUND = frozenset({"404", "NoSuchBucket", "NoSuchKey", "NotFound"})
DENIED = frozenset(
    {"401", "403", "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken"}
)


class S3Source:
    """An `ImportSource` over one bucket and prefix."""

    def __init__(
        self,
        source: str | list[Any],
        *,
        include: list[str] | None,
        exclude: list[str] | None,
        credentials: dict[str, Any] | None,
        settings: Settings,
    ) -> None:
        assert isinstance(source, str)
        self.bucket, self.folder = parse_s3(source)
        self._include, self._exclude = include, exclude
        self._credentials = _checked(credentials)
        self._endpoint = self._credentials.get("endpoint_url")
        refuse_blob_store(self.bucket, self._endpoint, settings)
        # the operator's credentials: only where the operator lent them, and the tenant brought none
        self._operator = (
            self._endpoint is None
            and "aws_access_key_id" not in self._credentials
            and self.bucket in settings.operator_credentials_buckets
        )
        self._networks = parse_networks(settings.media_allow_networks)
        self._most = settings.max_upload_files
        self._client: Any = None

    @property
    def description(self) -> str:
        return f"s3://{self.bucket}/{self.folder.rstrip('/')}".rstrip("/")

    async def list_files(self) -> list[RemoteFile]:
        """The chosen objects under the folder, at most one more than an artifact may hold; else the one
        object named so."""
        start = len(self.folder)

        def chosen(key: str) -> bool:
            return not key.endswith("/") and selected(key[start:], self._include, self._exclude)

        objects = await self._list(self.folder, chosen, self._most + 1)
        if not objects and self.folder:  # `s3://bucket/model.gguf`: one object, at its own name
            key = self.folder.rstrip("/")
            # the object named `key` comes first of all keys starting with it (S3 lists in key order)
            objects = [o for o in await self._list(key, lambda _: True, 1) if o[0] == key]
            start = key.rfind("/") + 1
        files = [
            RemoteFile(path=key[start:], locator=key, size=size, etag=etag) for key, size, etag in objects
        ]
        if not files:
            raise ImportFailed(
                "source_not_found", f"No files under {self.description} (after include / exclude)."
            )
        return files

    async def read(self, file: RemoteFile, offset: int = 0) -> AsyncIterator[bytes]:
        """The object from `offset`; a stream cut short is asked again from where it stopped (a range
        GET), RETRIES times in a row at most."""
        position, tries = offset, 0
        while True:
            body = await self._call(self._get, file.locator, position)
            try:
                while chunk := await self._call(body.read, CHUNK, vetted=True):  # a vetted connection
                    position, tries = position + len(chunk), 0
                    yield chunk
                return
            except ImportFailed as failure:
                if failure.code != "source_unreachable" or tries >= RETRIES:
                    raise
                tries += 1
            finally:
                await asyncio.to_thread(body.close)

    # ---------------------------------------------------------------- internals

    async def _list(
        self, prefix: str, keep: Callable[[str], bool], most: int
    ) -> list[tuple[str, int, str | None]]:
        """(key, size, etag) of the objects under `prefix` that `keep` takes, `most` at most: one page
        per call, each in a thread, so that cancelling this coroutine stops the listing at the page in
        flight."""
        found: list[tuple[str, int, str | None]] = []
        pages = await self._call(self._pages, prefix, min(LIST_PAGE_SIZE, most), vetted=True)  # no I/O
        while len(found) < most and (page := await self._call(next, pages, None)) is not None:
            for item in page.get("Contents", []):
                key, etag = str(item["Key"]), item.get("ETag")
                if keep(key) and len(found) < most:
                    found.append((key, int(item["Size"]), etag.strip('"') if etag else None))
        return found

    def _pages(self, prefix: str, size: int) -> Iterator[dict[str, Any]]:
        """The listing's pages, each asked for when `next` is called on it."""
        paginator = self._s3().get_paginator("list_objects_v2")
        return iter(
            paginator.paginate(Bucket=self.bucket, Prefix=prefix, PaginationConfig={"PageSize": size})
        )

    def _get(self, key: str, offset: int) -> Any:
        extra = {"Range": f"bytes={offset}-"} if offset else {}
        return self._s3().get_object(Bucket=self.bucket, Key=key, **extra)["Body"]

    def _s3(self) -> Any:
        if self._client is None:
            self._client = _client(self._credentials, self._networks, operator=self._operator)
        return self._client

    async def _call(self, function: Any, *args: Any, vetted: bool = False) -> Any:
        """`function(*args)` in a thread, boto3's errors as ImportFailed. A tenant's endpoint is vetted
        first (unless `vetted`: the call sends no request, or only reads an open connection): a quick
        refusal of a host that is private on its face; what holds against a second DNS answer is that each
        connection is made to the address it vetted itself (`outbound.s3`), whatever the endpoint."""
        if self._endpoint is not None and not vetted:
            await _vet(self._endpoint, self._networks)
        import botocore.exceptions as boto

        try:
            with import_failures():
                return await asyncio.to_thread(function, *args)
        except boto.ClientError as exc:
            raise _client_error(exc, self.description) from None
        except boto.NoCredentialsError:
            raise ImportFailed("source_denied", f"No credentials to read {self.description}.") from None
        except (boto.BotoCoreError, OSError) as exc:  # connection refused, timeouts, TLS, a cut stream
            raise ImportFailed(
                "source_unreachable",
                f"Could not reach the S3 server of {self.description}: {type(exc).__name__}.",
            ) from None


def parse_s3(source: str) -> tuple[str, str]:
    """(bucket, folder) of `s3://bucket/prefix`, the folder `prefix/` ('' for the whole bucket)."""
    rest = source[len("s3://") :] if source.lower().startswith("s3://") else ""
    bucket, _, prefix = rest.partition("/")
    if not _BUCKET.match(bucket):
        raise InvalidRequest(
            "An S3 source is s3://bucket/prefix, with a valid bucket name.",
            param="source",
            code="invalid_source",
        )
    prefix = prefix.strip("/")
    return bucket, f"{prefix}/" if prefix else ""


def _checked(credentials: dict[str, Any] | None) -> dict[str, str]:
    if not credentials:
        return {}
    unknown = sorted(set(credentials) - CREDENTIAL_FIELDS)
    if unknown or not all(isinstance(v, str) for v in credentials.values()):
        raise InvalidRequest(
            f"S3 credentials take {', '.join(sorted(CREDENTIAL_FIELDS))} (strings)"
            + (f"; not {', '.join(unknown)}." if unknown else "."),
            param="credentials",
        )
    if ("aws_access_key_id" in credentials) != ("aws_secret_access_key" in credentials):
        raise InvalidRequest(
            "S3 credentials need both aws_access_key_id and aws_secret_access_key.", param="credentials"
        )
    endpoint = credentials.get("endpoint_url")
    if endpoint is not None and (
        urlsplit(endpoint).scheme not in ("http", "https") or not urlsplit(endpoint).hostname
    ):
        raise InvalidRequest(
            "credentials.endpoint_url must be an http(s) URL.", param="credentials.endpoint_url"
        )
    return dict(credentials)


def refuse_blob_store(bucket: str, endpoint: str | None, settings: Settings) -> None:
    """InvalidRequest (400 `source_refused`) when the source is the blob store itself: its bucket at its
    endpoint, or (as a tenant's `endpoint_url`) its endpoint, whoever's credentials would sign. Endpoints
    are compared as servers (host and port, the scheme's default port filled in, an address's spelling
    normalised); any AWS S3 host is AWS, one endpoint for every bucket."""
    if settings.blob_store != "s3" or not settings.s3_bucket:
        return
    store = _server(settings.s3_endpoint_url or _operator_endpoint())
    if endpoint is not None and store is not None and _server(endpoint) == store:
        raise InvalidRequest(
            "credentials.endpoint_url is this server's own blob store, which is never an import's source.",
            param="credentials.endpoint_url",
            code="source_refused",
        )
    at = _server(endpoint if endpoint is not None else _operator_endpoint())
    if bucket == settings.s3_bucket.lower() and at == store:
        raise InvalidRequest(
            f"s3://{bucket} is this server's own blob store, which is never an import's source.",
            param="source",
            code="source_refused",
        )


def _operator_endpoint() -> str | None:
    """The endpoint boto3 takes when given none: the operator's AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL
    (None: AWS S3)."""
    if os.environ.get("AWS_IGNORE_CONFIGURED_ENDPOINT_URLS", "").lower() == "true":
        return None
    return os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or None


def _server(endpoint: str | None) -> tuple[str, int] | None:
    """(host, port) of an S3 endpoint, as compared; None for AWS S3 (no endpoint, or an AWS host)."""
    if not endpoint:
        return None
    parts = urlsplit(endpoint.strip())
    host = (parts.hostname or "").rstrip(".")
    try:
        address = ipaddress.ip_address(host)
        mapped = address.ipv4_mapped if isinstance(address, ipaddress.IPv6Address) else None
        host = str(mapped or address)
    except ValueError:
        if host == "amazonaws.com" or host.endswith((".amazonaws.com", ".amazonaws.com.cn")):
            return None
    try:
        port = parts.port
    except ValueError:
        port = None
    return host, port or (443 if parts.scheme.lower() == "https" else 80)


def _client(credentials: dict[str, str], networks: tuple[IPNetwork, ...], *, operator: bool) -> Any:
    """An import's S3 client (`imports.s3_connections`: every request sent within its bounds): signed with
    the tenant's keys, or with the operator's chain where `operator` (a bucket the operator lent its
    credentials to), else unsigned."""
    endpoint = credentials.get("endpoint_url")
    signed_by: S3Keys | Literal["operator"] | None = None
    if "aws_access_key_id" in credentials:
        signed_by = S3Keys(
            credentials["aws_access_key_id"],
            credentials["aws_secret_access_key"],
            credentials.get("aws_session_token"),
        )
    elif operator and endpoint is None:  # never the operator's credentials to a tenant's endpoint
        signed_by = "operator"
    if endpoint is None:
        networks += _operator_addresses()
    region = credentials.get("region")
    return import_client(networks, endpoint_url=endpoint, region=region, signed_by=signed_by)


def _operator_addresses() -> tuple[IPNetwork, ...]:
    """The addresses of the operator's own endpoint (AWS_ENDPOINT_URL: a MinIO on its network, say), each
    a network of one, for the requests sent there: the operator chose that server. AWS S3's are public."""
    host = urlsplit(_operator_endpoint() or "").hostname
    if not host:
        return ()
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return ()  # its requests then fail to resolve it, `source_unreachable`
    return tuple(ipaddress.ip_network(str(info[4][0]).split("%")[0]) for info in infos)


async def _vet(endpoint: str, networks: tuple[IPNetwork, ...]) -> None:
    """Refuse a tenant's endpoint whose host is (or resolves to) an address the media rules forbid."""
    parts = urlsplit(endpoint)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    await asyncio.to_thread(vetted_addresses, parts.hostname or "", port, networks)


def _client_error(exc: Any, description: str) -> ImportFailed:
    error = exc.response.get("Error", {})
    code = str(error.get("Code", ""))
    status = str(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", ""))
    if code in NOT_FOUND or status == "404":
        return ImportFailed("source_not_found", f"{description} does not exist ({code or status}).")
    if code in DENIED or status in ("401", "403"):
        return ImportFailed("source_denied", f"Access to {description} was denied ({code or status}).")
    return ImportFailed("source_unreachable", f"The S3 server of {description} answered {code or status}.")
