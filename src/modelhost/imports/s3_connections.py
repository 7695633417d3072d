"""An S3 import's client: the outbound one (`outbound.s3.s3_client`: every connection to an address
vetted once, every answer read whole bounded in bytes and time, the listing's pages bounded), with the
bounds an import states, and its failures as an import's failure codes.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, Literal

from modelhost.imports.remote import import_failure
from modelhost.outbound import Bounds, FetchFailed, IPAddress, IPNetwork
from modelhost.outbound.addresses import vetted_addresses_now
from modelhost.outbound.s3 import PARAM, S3Keys, s3_client

# An answer read whole (a listing page of at most 1,000 keys is under 1 MiB), within this long; each
# step (connect, a read) at most IDLE_SECONDS without progress; and the pages of the listings of one
# import: 10,000 pages are 10 million keys looked at.
ANSWER_MAX_BYTES = 16 * 1024**2
ANSWER_SECONDS = 300.0
IDLE_SECONDS = 60.0
MAX_PAGES = 10_000


def import_client(
    networks: tuple[IPNetwork, ...],
    *,
    endpoint_url: str | None,
    region: str | None,
    signed_by: S3Keys | Literal["operator"] | None,
) -> Any:
    """An import's S3 client (`outbound.s3.s3_client`), its connections to addresses allowed by
    `networks`; its calls raise FetchFailed, which `import_failures` turns into ImportFailed."""
    bounds = Bounds(
        networks=networks,
        max_bytes=ANSWER_MAX_BYTES,
        seconds=ANSWER_SECONDS,
        idle_seconds=IDLE_SECONDS,
        requests=MAX_PAGES,
    )
    return s3_client(bounds, endpoint_url=endpoint_url, region=region, signed_by=signed_by)


@contextlib.contextmanager
def import_failures() -> Iterator[None]:
    """An outbound failure of an import's client (an address refused, a bound crossed) as ImportFailed:
    `address_refused`, `too_large`, `source_unreachable`."""
    try:
        yield
    except FetchFailed as exc:
        raise import_failure(exc) from None


def vetted_addresses(host: str, port: int, networks: tuple[IPNetwork, ...]) -> list[IPAddress]:
    """Every address `host` resolves to (once), all of them allowed; ImportFailed(`address_refused`)
    if any is not: a mixed answer must not reach the private one on a retry."""
    try:
        return vetted_addresses_now(host, port, networks, PARAM)
    except FetchFailed as exc:
        raise import_failure(exc) from None
