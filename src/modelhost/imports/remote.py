"""An import's downloads under the media rules (`media.fetch.open_url`), and their failures as an
import's failure codes. Shared by the HTTPS and the Hub sources.

The rules are the media fetches': public addresses only unless the operator allows networks with
MODELHOST_MEDIA_ALLOW_NETWORKS, every redirect hop vetted again, the connection made to the vetted
address. What differs is the scale: a file may be as large as an uploaded one
(MODELHOST_MAX_UPLOAD_FILE_BYTES); rather than one deadline, a download fails after
MODELHOST_IMPORT_READ_TIMEOUT_SECONDS without a byte; and a request that got no good answer (no
connection, a stall, a 5xx) is tried twice more (`RETRY_DELAYS`), a broken download resuming where it
stopped. Imports fetch over https only: model weights over cleartext could be swapped on the way when
no checksum is stated, and a redirect down to http is refused like a redirect to a private address.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import TypeVar

from modelhost.config import Settings
from modelhost.imports.sources import ImportFailed
from modelhost.media.fetch import FetchFailed, FetchPolicy, RemoteResponse, open_url, parse_networks

HTTPS_ONLY = ("https",)
# Seconds before the second and the third try of a request that got no (good) answer.
RETRY_DELAYS = (1.0, 4.0)
T = TypeVar("T")


def import_fetch_policy(settings: Settings) -> FetchPolicy:
    """The media rules at an import's scale: `max_bytes` is one file's limit, `max_timeout` an idle
    timeout."""
    return FetchPolicy(
        allowed_networks=parse_networks(settings.media_allow_networks),
        max_bytes=settings.max_upload_file_bytes,
        max_timeout=settings.import_read_timeout_seconds,
        max_redirects=settings.media_max_redirects,
    )


@contextlib.asynccontextmanager
async def open_remote(
    url: str,
    policy: FetchPolicy,
    *,
    what: str,
    headers: Mapping[str, str] | None = None,
    offset: int = 0,
    schemes: tuple[str, ...] = HTTPS_ONLY,
) -> AsyncIterator[RemoteResponse]:
    """`url` opened (see `open_url`: `headers` reach its origin only); any failure, while opening or
    reading, as ImportFailed. `what` names the file in messages: never the URL, which may carry a
    signature."""
    try:
        async with open_url(
            url,
            policy,
            timeout=policy.max_timeout,
            param=what,
            headers=headers,
            offset=offset,
            schemes=schemes,
        ) as response:
            if response.size is not None and response.size > policy.max_bytes:
                raise _too_large(what, policy.max_bytes)
            yield response
    except FetchFailed as exc:
        raise import_failure(exc) from None


async def stream(
    url: str,
    policy: FetchPolicy,
    *,
    what: str,
    headers: Mapping[str, str] | None = None,
    offset: int = 0,
    schemes: tuple[str, ...] = HTTPS_ONLY,
) -> AsyncIterator[bytes]:
    """The bytes of `url` from `offset` on, cut off past the policy's `max_bytes`; ImportFailed on
    failure. A transfer that breaks (`source_unreachable`: a reset, a stall, a 5xx) is taken up again
    where it stopped, after `RETRY_DELAYS`, so one hiccup does not cost a 16 GB file."""
    done = offset
    for delay in (*RETRY_DELAYS, None):
        try:
            async with open_remote(
                url, policy, what=what, headers=headers, offset=done, schemes=schemes
            ) as response:
                async for chunk in response.aiter_bytes():
                    done += len(chunk)
                    if done > policy.max_bytes:
                        raise _too_large(what, policy.max_bytes)
                    yield chunk
            return
        except ImportFailed as failure:
            if failure.code != "source_unreachable" or delay is None:
                raise
        await asyncio.sleep(delay)


async def retried(attempt: Callable[[], Awaitable[T]]) -> T:
    """`attempt()`, tried again after each of `RETRY_DELAYS` while it fails with `source_unreachable`."""
    for delay in (*RETRY_DELAYS, None):
        try:
            return await attempt()
        except ImportFailed as failure:
            if failure.code != "source_unreachable" or delay is None:
                raise
        await asyncio.sleep(delay)
    raise AssertionError("unreachable")  # the last try returns or raises


def import_failure(exc: FetchFailed) -> ImportFailed:
    """A fetch's failure as the import's: its stable code, the fetch's message (no URL, no secret)."""
    if exc.reason in ("refused", "scheme"):
        return ImportFailed("address_refused", exc.message)
    if exc.reason == "too_large":
        return ImportFailed("too_large", exc.message)
    if exc.reason == "status" and exc.status in (404, 410):
        return ImportFailed("source_not_found", exc.message)
    if exc.reason == "status" and exc.status in (401, 403):
        return ImportFailed("source_denied", exc.message)
    return ImportFailed("source_unreachable", exc.message)  # no answer, a 5xx, a 429, a broken transfer


def _too_large(what: str, max_bytes: int) -> ImportFailed:
    return ImportFailed(
        "too_large", f"`{what}` is larger than the largest file an artifact may hold ({max_bytes} bytes)"
    )
