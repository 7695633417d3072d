"""The bounds of one outbound operation, and the failure an operation ends with when it crosses one.

`Bounds` has no defaults: whoever opens a connection for a tenant states every limit, and the entry
points of `modelhost.outbound` (the only code that opens one) apply all of them themselves.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, replace

import httpx

from modelhost.errors import InvalidMedia

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


@dataclass(frozen=True, kw_only=True)
class Bounds:
    """Every limit of one operation (what an operation is, per entry point: the package's docstring).

    - `networks`: the non-public networks the operator allowed (`MODELHOST_MEDIA_ALLOW_NETWORKS`);
      public addresses are always allowed, every other one refused, at every hop and connection.
    - `max_bytes`: the most bytes of one answer's body (decoded); the answer is cut off past them,
      so no more is ever held.
    - `seconds`: the whole operation, from its first lookup to its last byte (every hop, every page).
    - `idle_seconds`: each step (connect, each read) without progress.
    - `requests`: the most requests of the operation (redirect hops, a listing's pages, an MCP
      session's messages).
    """

    networks: tuple[IPNetwork, ...]
    max_bytes: int
    seconds: float
    idle_seconds: float
    requests: int

    def __post_init__(self) -> None:
        if self.max_bytes < 1 or self.seconds <= 0 or self.idle_seconds <= 0 or self.requests < 1:
            raise ValueError(f"Bounds must all be positive: {self}")

    def within(self, seconds: float | None) -> Bounds:
        """These bounds with at most `seconds` in all (a request's own, shorter `timeout`; None or 0:
        these bounds' own)."""
        if not seconds or seconds <= 0 or seconds >= self.seconds:
            return self
        return replace(self, seconds=seconds, idle_seconds=min(self.idle_seconds, seconds))


class FetchFailed(InvalidMedia):
    """An outbound operation that failed, saying why (an import's failure codes tell causes apart).

    `reason`: `invalid` (not a URL, too many redirects), `scheme` (a scheme not allowed, at any hop),
    `refused` (a non-public address the operator did not allow), `unreachable` (no answer: name,
    connection, TLS, timeout, a broken transfer), `status` (an HTTP error status, in `status`),
    `too_large` (past `max_bytes`), `too_many` (past `requests`).
    """

    reason = "invalid"
    status: int | None = None
    answer_headers: httpx.Headers | None = None

    def __init__(
        self,
        message: str,
        *,
        param: str,
        reason: str,
        status: int | None = None,
        answer_headers: httpx.Headers | None = None,
    ) -> None:
        super().__init__(message, param=param)
        self.reason = reason
        self.status = status
        self.answer_headers = answer_headers  # of a `status` failure: some servers say more there


def too_large(max_bytes: int, param: str) -> FetchFailed:
    return FetchFailed(
        f"The answer for `{param}` is too large (limit {max_bytes} bytes)", param=param, reason="too_large"
    )


def timed_out(seconds: float, param: str) -> FetchFailed:
    return unreachable(f"Timed out after {seconds:g} s fetching `{param}`", param)


def unreachable(message: str, param: str) -> FetchFailed:
    return FetchFailed(message, param=param, reason="unreachable")
