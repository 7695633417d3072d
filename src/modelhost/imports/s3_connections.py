"""An S3 import's connections to a tenant's endpoint: the outbound client's (`outbound.s3`: every
connection to an address vetted once, every answer read whole bounded in bytes and time, the listing's
pages bounded), with the bounds an import states and its failures as an import's failure codes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from modelhost.imports.remote import import_failure
from modelhost.outbound import Bounds, FetchFailed, IPAddress, IPNetwork
from modelhost.outbound.addresses import vetted_addresses_now
from modelhost.outbound.s3 import PARAM
from modelhost.outbound.s3 import vetted_sender as bounded_sender

# An answer read whole (a listing page of at most 1,000 keys is under 1 MiB), within this long, and
# the pages of the listings of one import: 10,000 pages are 10 million keys looked at.
ANSWER_MAX_BYTES = 16 * 1024**2
ANSWER_SECONDS = 300.0
MAX_PAGES = 10_000


def vetted_addresses(host: str, port: int, networks: tuple[IPNetwork, ...]) -> list[IPAddress]:
    """Every address `host` resolves to (once), all of them allowed; ImportFailed(`address_refused`)
    if any is not: a mixed answer must not reach the private one on a retry."""
    try:
        return vetted_addresses_now(host, port, networks, PARAM)
    except FetchFailed as exc:
        raise import_failure(exc) from None


def vetted_sender(
    networks: tuple[IPNetwork, ...], *, connect_timeout: float, read_timeout: float
) -> Callable[..., Any]:
    """A `before-send` handler for a tenant's S3 client (`outbound.s3.vetted_sender`), its failures as
    ImportFailed. Each step waits at most the longer of the two timeouts."""
    bounds = Bounds(
        networks=networks,
        max_bytes=ANSWER_MAX_BYTES,
        seconds=ANSWER_SECONDS,
        idle_seconds=max(connect_timeout, read_timeout),
        requests=MAX_PAGES,
    )
    send = bounded_sender(bounds)

    def sender(request: Any, **kwargs: Any) -> Any:
        try:
            return send(request, **kwargs)
        except FetchFailed as exc:
            raise import_failure(exc) from None

    return sender
