"""An import's downloads through the outbound client (`outbound.open_url`), and their failures as an
import's failure codes. Shared by the HTTPS and the Hub sources.

The rules are the media fetches': public addresses only unless the operator allows networks with
MODELHOST_MEDIA_ALLOW_NETWORKS, every redirect hop vetted again, the connection made to the vetted
address. What differs is the scale (`import_bounds`): a file may be as large as an uploaded one
(MODELHOST_MAX_UPLOAD_FILE_BYTES); a download fails after MODELHOST_IMPORT_READ_TIMEOUT_SECONDS
without a byte, and its whole time is the import's (MODELHOST_IMPORT_DEADLINE_SECONDS); a listing is
smaller and shorter (`listing_bounds`); and a request that got no good answer (no
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
from modelhost.outbound import Bounds, FetchFailed, RemoteResponse, open_url, parse_networks

HTTPS_ONLY = ("https",)
# Seconds before the second and the third try of a request that got no (good) answer.
RETRY_DELAYS = (1.0, 4.0)
T = TypeVar("T")


def import_bounds(settings: Settings) -> Bounds:
    """The bounds of one file's download: as large as an uploaded file may be, an idle timeout, and the
    import's whole time."""
    return Bounds(
        networks=parse_networks(settings.media_allow_networks),
        max_bytes=settings.max_upload_file_bytes,
        seconds=settings.import_deadline_seconds,
        idle_seconds=settings.import_read_timeout_seconds,
        requests=settings.media_max_redirects + 1,
    )


def listing_bounds(settings: Settings, max_bytes: int) -> Bounds:
    """The bounds of a listing read whole (the Hub's file list): `max_bytes`, the listing's deadline."""
    return Bounds(
        networks=parse_networks(settings.media_allow_networks),
        max_bytes=max_bytes,
        seconds=settings.import_list_deadline_seconds,
        idle_seconds=settings.import_read_timeout_seconds,
        requests=settings.media_max_redirects + 1,
    )


@contextlib.asynccontextmanager
async def open_remote(
    url: str,
    bounds: Bounds,
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
            url, bounds, param=what, headers=headers, offset=offset, schemes=schemes
        ) as response:
            yield response
    except FetchFailed as exc:
        raise import_failure(exc) from None


async def stream(
    url: str,
    bounds: Bounds,
    *,
    what: str,
    headers: Mapping[str, str] | None = None,
    offset: int = 0,
    schemes: tuple[str, ...] = HTTPS_ONLY,
) -> AsyncIterator[bytes]:
    """The bytes of `url` from `offset` on, cut off past `bounds.max_bytes`; ImportFailed on
    failure. A transfer that breaks (`source_unreachable`: a reset, a stall, a 5xx) is taken up again
    where it stopped, after `RETRY_DELAYS`, so one hiccup does not cost a 16 GB file."""
    done = offset
    for delay in (*RETRY_DELAYS, None):
        try:
            async with open_remote(
                url, bounds, what=what, headers=headers, offset=done, schemes=schemes
            ) as response:
                async for chunk in response.aiter_bytes():
                    done += len(chunk)
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
    if exc.reason in ("too_large", "too_many"):
        return ImportFailed("too_large", exc.message)
    if exc.reason == "status" and exc.status in (404, 410):
        return ImportFailed("source_not_found", exc.message)
    if exc.reason == "status" and exc.status in (401, 403):
        return ImportFailed("source_denied", exc.message)
    return ImportFailed("source_unreachable", exc.message)  # no answer, a 5xx, a 429, a broken transfer
