"""Rate limits of keys and accounts (issue 31; docs/limits.md): requests and tokens per minute, and
requests at once.

A minute's limit is a bucket that holds at most the limit and refills continuously at limit / 60 per
second (OpenAI's behaviour: a client that used its minute gets its first request back after 60 / limit
seconds, not at the top of the next minute; `x-ratelimit-reset-*` is the time until the bucket is full
again). A request takes one request from the bucket when it is admitted; its tokens are taken when it
ends, once they are known (prompt plus completion for generation, input tokens for embeddings and the
other text tasks), so a request may take the bucket below zero, and the next one waits until it has
refilled to at least one token. Concurrent requests are a count, given back when a request ends.

A request is checked against its key's limits and its account's, both at once: it is admitted only when
both allow it, and it counts against both. The counts live in a `LimitTable` (auth/limit_table.py) that
a server's gateway processes share, each admitting and releasing its own requests under the table's
lock: exact across `serve --workers N`, with no call to another process. Several servers on one
database share what they count through it (`auth/shared_limits.py`): each learns the others' use
within one sync interval (`merge`).
"""

from __future__ import annotations

import contextvars
import itertools
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from modelhost.auth.limit_table import MINUTE, Bucket, LimitTable, Row
from modelhost.errors import (
    ConcurrencyLimitReached,
    RateLimitExceeded,
    RequestsLimitReached,
    TokensLimitReached,
)

CONCURRENCY_RETRY_SECONDS = 1  # `Retry-After` for requests at once: when one of them ends, unknown here


@dataclass(frozen=True, slots=True)
class Limits:
    """One key's or account's limits; None: unlimited. The spend caps (credits) are an account's only,
    and checked against the credit ledger (`billing.service.Billing.require_within_caps`), not here."""

    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None
    concurrent_requests: int | None = None
    credits_per_day: float | None = None
    credits_per_month: float | None = None

    @classmethod
    def of(cls, stored: dict[str, float | None] | None) -> Limits | None:
        """The limits stored as JSON (None, or every field None: no limits)."""
        if not stored:
            return None

        def whole(name: str) -> int | None:
            value = stored.get(name)
            return int(value) if value is not None else None

        limits = cls(
            requests_per_minute=whole("requests_per_minute"),
            tokens_per_minute=whole("tokens_per_minute"),
            concurrent_requests=whole("concurrent_requests"),
            credits_per_day=stored.get("credits_per_day"),
            credits_per_month=stored.get("credits_per_month"),
        )
        return limits if limits != cls() else None

    @property
    def rated(self) -> bool:
        """Whether a rate limit is set (what the rate limiter counts)."""
        return any(
            value is not None
            for value in (self.requests_per_minute, self.tokens_per_minute, self.concurrent_requests)
        )


@dataclass(frozen=True, slots=True)
class Subject:
    """Who a request counts against: `key:<id>` or `account:<id>`, with its limits."""

    name: str
    limits: Limits

    @classmethod
    def of(cls, kind: str, owner: str | None, limits: Limits | None) -> Subject | None:
        """The key's or account's (`kind`) subject, where it has rate limits (spend caps are not)."""
        return cls(f"{kind}:{owner}", limits) if limits is not None and limits.rated else None


@dataclass(frozen=True, slots=True)
class Taken:
    """What one subject took in this process since it started, and has in flight: what a server tells
    the others (auth/shared_limits.py)."""

    subject: str
    requests: int
    tokens: int
    in_flight: int


@dataclass(frozen=True, slots=True)
class Use:
    """What a subject has left now: requests and tokens in its buckets (None where not limited), and
    its requests in flight."""

    in_flight: int
    requests_remaining: int | None = None
    tokens_remaining: int | None = None


@dataclass(frozen=True, slots=True)
class Admitted:
    """An admitted request: its ticket (give it back with `release`) and the `x-ratelimit-*` headers of
    its answer (those of the subject with the least left, per kind)."""

    ticket: int
    headers: dict[str, str] = field(default_factory=dict)


class RateLimiter:
    """The buckets and counts of every subject seen, in a `LimitTable`: this process's own, or the one
    its server's gateway processes share (see the module docstring)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, table: LimitTable | None = None) -> None:
        self._clock = clock
        self.table = table if table is not None else LimitTable.create()
        self._tickets: dict[int, tuple[Subject, ...]] = {}  # this process's requests in flight
        self._numbers = itertools.count(1)
        self._told: dict[str, tuple[int, int, int]] = {}  # what `taken` last said, per subject

    def admit(self, subjects: tuple[Subject, ...]) -> Admitted:
        """Admit a request of `subjects` (its key's and its account's), or raise the
        `RateLimitExceeded` of the first limit reached, with `Retry-After` and the headers."""
        now, table = self._clock(), self.table
        slots: list[int] = []
        rows: list[Row] = []
        with table:
            for subject in subjects:  # all checked before any is taken: a refused request takes nothing
                slot = table.place(subject.name, now)
                row = table.load(slot)
                _refill(subject.limits, row, now)
                _check(subject, row)
                slots.append(slot)
                rows.append(row)
            for subject, slot, row in zip(subjects, slots, rows, strict=True):
                if subject.limits.requests_per_minute is not None:
                    row.requests.level -= 1
                row.in_flight += 1
                row.taken_requests += 1
                table.store(slot, row, own=1)
        ticket = next(self._numbers)
        self._tickets[ticket] = subjects
        return Admitted(ticket, _headers(subjects, rows))

    def release(self, ticket: int, tokens: int = 0) -> None:
        """The request of `ticket` ended having used `tokens`: its tokens are taken, its place given back.
        An unknown ticket (already released) is ignored."""
        subjects = self._tickets.pop(ticket, None)
        if subjects is not None:
            self._take(subjects, tokens, ended=True)

    def charge(self, subjects: tuple[Subject, ...], tokens: int) -> None:
        """`subjects` used `tokens` outside any admitted request (a background response, after its
        request was answered): taken from their token buckets, as `release` takes a request's."""
        if tokens > 0:
            self._take(subjects, tokens, ended=False)

    def forget_column(self, column: int) -> None:
        """The gateway process that counts in `column` of the shared table is gone: what it had in
        flight is given back."""
        with self.table:
            self.table.clear_column(column)

    def in_flight(self, name: str) -> int:
        with self.table:
            slot = self.table.find(name)
            return self.table.load(slot).in_flight if slot >= 0 else 0

    def use(self, subject: Subject) -> Use:
        """What `subject` has left now (a subject never seen has its buckets full)."""
        now, table = self._clock(), self.table
        with table:
            slot = table.find(subject.name)
            row = table.load(slot) if slot >= 0 else _empty_row()
        _refill(subject.limits, row, now)
        limits = subject.limits
        return Use(
            row.in_flight + row.elsewhere,
            None if limits.requests_per_minute is None else max(0, math.floor(row.requests.level)),
            None if limits.tokens_per_minute is None else max(0, math.floor(row.tokens.level)),
        )

    def taken(self) -> list[Taken]:
        """What changed since the last call, and every subject with requests in flight (so that other
        servers see those as still in flight): what this server tells the others."""
        with self.table:
            rows = self.table.rows()
        told, self._told = self._told, rows
        return [Taken(name, *row) for name, row in sorted(rows.items()) if row[2] or told.get(name) != row]

    def merge(self, taken: dict[str, tuple[int, int]], in_flight: dict[str, int]) -> None:
        """Other servers took `taken[subject]` (requests, tokens) since the last merge, and have
        `in_flight[subject]` requests in flight now (a subject not named: none)."""
        now, table = self._clock(), self.table
        with table:
            for name, (requests, tokens) in taken.items():
                slot = table.place(name, now)
                row = table.load(slot)
                if now - row.owed_at > MINUTE:  # owed by a subject unused here: older takes have refilled
                    row.requests.owed = row.tokens.owed = 0.0
                for bucket, amount in ((row.requests, requests), (row.tokens, tokens)):
                    if amount > 0:
                        if bucket.at == 0.0:  # no bucket yet: it will start that much short
                            row.owed_at = now
                        bucket.take(amount)
                table.store(slot, row)
            table.set_elsewhere(in_flight, now)

    def _take(self, subjects: tuple[Subject, ...], tokens: int, *, ended: bool) -> None:
        """Take `tokens` from `subjects`' token buckets; `ended`: and give back their request's place."""
        now, table = self._clock(), self.table
        with table:
            for subject in subjects:
                slot = table.place(subject.name, now)
                row = table.load(slot)
                if ended:
                    row.in_flight = max(0, row.in_flight - 1)
                row.taken_tokens += tokens
                capacity = subject.limits.tokens_per_minute
                if capacity is not None and tokens:
                    row.tokens.refill(capacity, now, row.owed_at)
                    row.tokens.level -= tokens
                table.store(slot, row, own=-1 if ended else 0)


def _refill(limits: Limits, row: Row, now: float) -> None:
    """`row`'s buckets as of `now`; a bucket whose limit was removed is dropped (set again later, it
    starts full)."""
    _refill_bucket(row.requests, limits.requests_per_minute, now, row.owed_at)
    _refill_bucket(row.tokens, limits.tokens_per_minute, now, row.owed_at)


def _refill_bucket(bucket: Bucket, capacity: int | None, now: float, owed_at: float) -> None:
    if capacity is not None:
        bucket.refill(capacity, now, owed_at)
    elif bucket.at:
        bucket.level = bucket.at = bucket.capacity = 0.0


def _check(subject: Subject, row: Row) -> None:
    """Refuse the request if `subject` is at one of its limits (`row` refilled to now)."""
    limits = subject.limits
    rpm, tpm, at_once = limits.requests_per_minute, limits.tokens_per_minute, limits.concurrent_requests
    if rpm is not None and row.requests.level < 1:
        wait = (1 - row.requests.level) * MINUTE / rpm
        raise _refused(RequestsLimitReached, subject, row, "requests per minute", wait)
    if tpm is not None and row.tokens.level < 1:  # a new bucket is full: at least one token
        wait = (1 - row.tokens.level) * MINUTE / tpm
        raise _refused(TokensLimitReached, subject, row, "tokens per minute", wait)
    if at_once is not None and row.in_flight + row.elsewhere >= at_once:
        wait = float(CONCURRENCY_RETRY_SECONDS)
        raise _refused(ConcurrencyLimitReached, subject, row, "concurrent requests", wait)


def _empty_row() -> Row:
    return Row(Bucket(), Bucket(), 0.0, 0, 0, 0, 0)


def _refused(
    error: type[RateLimitExceeded], subject: Subject, row: Row, what: str, wait: float
) -> RateLimitExceeded:
    kind, _, owner = subject.name.partition(":")
    limit = getattr(subject.limits, what.replace(" ", "_"))
    message = (
        f"Rate limit reached for {kind} {owner} on {what}: limit {limit}. "
        f"Please try again in {duration(wait)}."
    )
    headers = {"Retry-After": str(max(1, math.ceil(wait))), **_headers((subject,), [row])}
    return error(message, headers=headers)


def _headers(subjects: tuple[Subject, ...], rows: list[Row]) -> dict[str, str]:
    """OpenAI's `x-ratelimit-{limit,remaining,reset}-{requests,tokens}`, for each kind some subject
    limits: from the subject with the least left (`rows` refilled to now)."""
    headers: dict[str, str] = {}
    requests = tokens = None  # the buckets with the least left
    for subject, row in zip(subjects, rows, strict=True):
        limits = subject.limits
        if limits.requests_per_minute is not None and (
            requests is None or row.requests.level < requests.level
        ):
            requests = row.requests
        if limits.tokens_per_minute is not None and (tokens is None or row.tokens.level < tokens.level):
            tokens = row.tokens
    if requests is not None:
        _describe(requests, _REQUESTS_HEADERS, headers)
    if tokens is not None:
        _describe(tokens, _TOKENS_HEADERS, headers)
    return headers


_REQUESTS_HEADERS = (
    "x-ratelimit-limit-requests",
    "x-ratelimit-remaining-requests",
    "x-ratelimit-reset-requests",
)
_TOKENS_HEADERS = ("x-ratelimit-limit-tokens", "x-ratelimit-remaining-tokens", "x-ratelimit-reset-tokens")


def _describe(bucket: Bucket, names: tuple[str, str, str], headers: dict[str, str]) -> None:
    """A bucket's limit, what is left and the time until it is full, in `headers` as `names`."""
    capacity = bucket.capacity
    headers[names[0]] = str(int(capacity))
    headers[names[1]] = str(max(0, math.floor(bucket.level)))
    headers[names[2]] = duration((capacity - bucket.level) * MINUTE / capacity)


# The tokens the current request used so far, where it is limited (`api.middleware.RequestPath` sets
# it; the code that knows a request's tokens adds them with `count_tokens`).
_TOKENS: contextvars.ContextVar[list[int] | None] = contextvars.ContextVar("modelhost_tokens", default=None)


def start_counting() -> list[int]:
    """The token count of the request running in this context (and the tasks it starts): [all, input,
    output]. Rate limits take the first; a request's trace names the other two."""
    counter = [0, 0, 0]
    _TOKENS.set(counter)
    return counter


def count_tokens(input_tokens: int, output_tokens: int = 0) -> None:
    """The current request used these tokens more (a no-op where nothing counts them)."""
    counter = _TOKENS.get()
    if counter is not None:
        counter[0] += input_tokens + output_tokens
        counter[1] += input_tokens
        counter[2] += output_tokens


def duration(seconds: float) -> str:
    """OpenAI's way of writing a reset time: `20ms`, `1.5s`, `6m0s`, `17h3m0s` (a quota's day)."""
    if seconds < 1:
        return f"{max(0, math.ceil(seconds * 1000))}ms"
    if seconds < MINUTE:
        return f"{seconds:.3g}s"
    minutes, rest = divmod(round(seconds), MINUTE)
    if minutes < 60:
        return f"{int(minutes)}m{rest:.0f}s"
    hours, minutes = divmod(minutes, 60)
    return f"{int(hours)}h{int(minutes)}m{rest:.0f}s"
