"""`s3://bucket/prefix`: the objects under a prefix of a bucket on any S3-compatible server.

The prefix is a folder: `s3://models/ab` imports `ab/...` (as paths relative to it) and never `abc/...`;
where no object is under it but one is named so (`s3://models/q4.gguf`), that one object, at its name.
Without credentials the import uses the operator's: boto3's standard chain (`AWS_ENDPOINT_URL`,
`AWS_PROFILE`, `AWS_ACCESS_KEY_ID`…, instance roles), and the operator's endpoint is trusted. A
tenant's own credentials (`aws_access_key_id`, `aws_secret_access_key`, `aws_session_token`?,
`endpoint_url`?, `region`?) replace them; a tenant's `endpoint_url` is an address the tenant chose, so
it obeys the media rules: every address its host resolves to must be public unless the operator allowed
its network (`MODELHOST_MEDIA_ALLOW_NETWORKS`), checked before each request. The operator's credentials
never go to a tenant's endpoint: with an `endpoint_url` and no keys the requests are unsigned.

boto3 blocks, so every call runs in a thread; its clients are thread-safe.
"""

from __future__ import annotations

import asyncio
import ipaddress
import re
import socket
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlsplit

from modelhost.config import Settings
from modelhost.errors import InvalidRequest
from modelhost.imports.sources import ImportFailed, RemoteFile, selected
from modelhost.media.fetch import address_allowed, parse_networks

CHUNK = 1024 * 1024
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
        self._networks = parse_networks(settings.media_allow_networks)
        self._client: Any = None

    @property
    def description(self) -> str:
        return f"s3://{self.bucket}/{self.folder.rstrip('/')}".rstrip("/")

    async def list_files(self) -> list[RemoteFile]:
        objects = await self._call(self._list, self.folder)
        start = len(self.folder)
        if not objects and self.folder:  # `s3://bucket/model.gguf`: one object, at its own name
            key = self.folder.rstrip("/")
            objects = [o for o in await self._call(self._list, key) if o[0] == key]
            start = key.rfind("/") + 1
        files = [
            RemoteFile(path=key[start:], locator=key, size=size, etag=etag)
            for key, size, etag in objects
            if not key.endswith("/") and selected(key[start:], self._include, self._exclude)
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

    def _list(self, prefix: str) -> list[tuple[str, int, str | None]]:
        found = []
        pages = self._s3().get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix)
        for page in pages:
            for item in page.get("Contents", []):
                etag = item.get("ETag")
                found.append((str(item["Key"]), int(item["Size"]), etag.strip('"') if etag else None))
        return found

    def _get(self, key: str, offset: int) -> Any:
        extra = {"Range": f"bytes={offset}-"} if offset else {}
        return self._s3().get_object(Bucket=self.bucket, Key=key, **extra)["Body"]

    def _s3(self) -> Any:
        if self._client is None:
            self._client = _client(self._credentials)
        return self._client

    async def _call(self, function: Any, *args: Any, vetted: bool = False) -> Any:
        """`function(*args)` in a thread, a tenant's endpoint vetted first (unless the call only reads a
        vetted connection), boto3's errors as ImportFailed."""
        if self._endpoint is not None and not vetted:
            await _vet(self._endpoint, self._networks)
        import botocore.exceptions as boto

        try:
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


def _client(credentials: dict[str, str]) -> Any:
    import boto3
    from botocore import UNSIGNED
    from botocore.config import Config

    keys = "aws_access_key_id" in credentials
    config = Config(
        retries={"max_attempts": 3, "mode": "standard"},
        connect_timeout=10,
        read_timeout=60,
        # a tenant's endpoint without keys: unsigned, never the operator's credentials
        signature_version=UNSIGNED if "endpoint_url" in credentials and not keys else None,
    )
    session = boto3.session.Session(
        aws_access_key_id=credentials.get("aws_access_key_id"),
        aws_secret_access_key=credentials.get("aws_secret_access_key"),
        aws_session_token=credentials.get("aws_session_token"),
        region_name=credentials.get("region"),
    )
    return session.client("s3", endpoint_url=credentials.get("endpoint_url"), config=config)


async def _vet(endpoint: str, networks: Any) -> None:
    """Refuse a tenant's endpoint whose host is (or resolves to) an address the media rules forbid."""
    parts = urlsplit(endpoint)
    host = parts.hostname or ""
    try:
        addresses = [ipaddress.ip_address(host)]
    except ValueError:
        try:
            infos = await asyncio.get_running_loop().getaddrinfo(
                host, parts.port or 443, type=socket.SOCK_STREAM
            )
        except (OSError, UnicodeError):
            raise ImportFailed(
                "source_unreachable", f"Could not resolve the S3 endpoint's host {host!r}."
            ) from None
        addresses = [ipaddress.ip_address(str(info[4][0]).split("%")[0]) for info in infos]
    if not addresses or not all(address_allowed(ip, networks) for ip in addresses):
        raise ImportFailed(
            "address_refused",
            f"Refused the S3 endpoint {host!r}: a loopback, private, link-local or otherwise non-public "
            "address (operators can allow networks with MODELHOST_MEDIA_ALLOW_NETWORKS).",
        )


def _client_error(exc: Any, description: str) -> ImportFailed:
    error = exc.response.get("Error", {})
    code = str(error.get("Code", ""))
    status = str(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", ""))
    if code in NOT_FOUND or status == "404":
        return ImportFailed("source_not_found", f"{description} does not exist ({code or status}).")
    if code in DENIED or status in ("401", "403"):
        return ImportFailed("source_denied", f"Access to {description} was denied ({code or status}).")
    return ImportFailed("source_unreachable", f"The S3 server of {description} answered {code or status}.")
