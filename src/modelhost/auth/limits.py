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
both allow it, and it counts against both. The `RateLimiter` here is exact within one process; a
server's gateway processes all ask the supervisor's (`server.control`'s `Admit` and `Release`), so the
counts hold across `serve --workers N`. Several servers on one database share what they count through
it (`auth/shared_limits.py`): each learns the others' use within one sync interval (`merge`).
"""

from __future__ import annotations

import contextvars
import itertools
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from modelhost.errors import (
    ConcurrencyLimitReached,
    RateLimitExceeded,
    RequestsLimitReached,
    TokensLimitReached,
)

MINUTE = 60.0
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


@dataclass(slots=True)
class _Bucket:
    level: float
    at: float

    def refill(self, capacity: int, now: float) -> float:
        """Refill to now (at capacity per minute, never above it); the level."""
        self.level = min(float(capacity), self.level + (now - self.at) * capacity / MINUTE)
        self.at = now
        return self.level


@dataclass(slots=True)
class _State:
    requests: _Bucket | None = None
    tokens: _Bucket | None = None
    in_flight: int = 0
    # What this process took in all (requests admitted, tokens released): what other servers learn.
    taken_requests: int = 0
    taken_tokens: int = 0
    # What other servers took and this process has no bucket to take it from yet, and since when; and
    # their requests in flight, as they last said (auth/shared_limits.py).
    owed: dict[str, float] = field(default_factory=dict)
    owed_at: float = 0.0
    elsewhere: int = 0


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
    """The buckets and counts of every subject seen, in this process (see the module docstring)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._states: dict[str, _State] = {}
        self._tickets: dict[int, tuple[Subject, ...]] = {}
        self._numbers = itertools.count(1)
        self._changed: set[str] = set()  # subjects whose `Taken` changed since `taken` last asked

    def admit(self, subjects: tuple[Subject, ...]) -> Admitted:
        """Admit a request of `subjects` (its key's and its account's), or raise the
        `RateLimitExceeded` of the first limit reached, with `Retry-After` and the headers."""
        now = self._clock()
        for subject in subjects:
            self._check(subject, now)
        for subject in subjects:
            state = self._states[subject.name]
            if state.requests is not None:
                state.requests.level -= 1
            state.in_flight += 1
            state.taken_requests += 1
            self._changed.add(subject.name)
        ticket = next(self._numbers)
        self._tickets[ticket] = subjects
        return Admitted(ticket, self._headers(subjects, now))

    def release(self, ticket: int, tokens: int = 0) -> None:
        """The request of `ticket` ended having used `tokens`: its tokens are taken, its place given back.
        An unknown ticket (already released) is ignored."""
        subjects = self._tickets.pop(ticket, None)
        if subjects is None:
            return
        for subject in subjects:
            state = self._states[subject.name]
            state.in_flight = max(0, state.in_flight - 1)
            self._changed.add(subject.name)
        self.charge(subjects, tokens)

    def charge(self, subjects: tuple[Subject, ...], tokens: int) -> None:
        """`subjects` used `tokens` outside any admitted request (a background response, after its
        request was answered): taken from their token buckets, as `release` takes a request's."""
        if tokens <= 0:
            return
        now = self._clock()
        for subject in subjects:
            state = self._states.setdefault(subject.name, _State())
            state.taken_tokens += tokens
            self._changed.add(subject.name)
            capacity = subject.limits.tokens_per_minute
            if capacity is not None:
                self._bucket(state, "tokens", capacity, now).level -= tokens

    def in_flight(self, name: str) -> int:
        state = self._states.get(name)
        return state.in_flight if state is not None else 0

    def use(self, subject: Subject) -> Use:
        """What `subject` has left now (a subject never seen has its buckets full)."""
        now, state = self._clock(), self._states.setdefault(subject.name, _State())
        left: dict[str, int | None] = {}
        for kind in ("requests", "tokens"):
            capacity = getattr(subject.limits, f"{kind}_per_minute")
            level = None if capacity is None else self._bucket(state, kind, capacity, now).level
            left[kind] = None if level is None else max(0, math.floor(level))
        return Use(state.in_flight + state.elsewhere, left["requests"], left["tokens"])

    def taken(self) -> list[Taken]:
        """What changed since the last call, and every subject with requests in flight (so that other
        servers see those as still in flight): what this server tells the others."""
        names = self._changed | {name for name, state in self._states.items() if state.in_flight}
        self._changed = set()
        states = [(name, self._states[name]) for name in sorted(names)]
        return [Taken(name, s.taken_requests, s.taken_tokens, s.in_flight) for name, s in states]

    def merge(self, taken: dict[str, tuple[int, int]], in_flight: dict[str, int]) -> None:
        """Other servers took `taken[subject]` (requests, tokens) since the last merge, and have
        `in_flight[subject]` requests in flight now (a subject not named: none)."""
        now = self._clock()
        for name, (requests, tokens) in taken.items():
            state = self._states.setdefault(name, _State())
            for kind, amount in (("requests", requests), ("tokens", tokens)):
                if amount <= 0:
                    continue
                bucket: _Bucket | None = getattr(state, kind)
                if bucket is not None:
                    bucket.level -= amount
                else:
                    state.owed[kind] = state.owed.get(kind, 0.0) + amount
                    state.owed_at = now
        for name, state in self._states.items():
            state.elsewhere = in_flight.get(name, 0)

    def _bucket(self, state: _State, kind: str, capacity: int, now: float) -> _Bucket:
        """`state`'s bucket of `kind` ("requests" or "tokens"), refilled to now; a new one starts full
        less what other servers took since they said so (`merge`)."""
        bucket: _Bucket | None = getattr(state, kind)
        if bucket is None:
            owed = state.owed.pop(kind, 0.0)
            bucket = _Bucket(float(capacity) - owed, state.owed_at if owed else now)
            setattr(state, kind, bucket)
        bucket.refill(capacity, now)
        return bucket

    def _check(self, subject: Subject, now: float) -> None:
        limits = subject.limits
        state = self._states.setdefault(subject.name, _State())
        if limits.requests_per_minute is None:
            state.requests = None
        else:
            level = self._bucket(state, "requests", limits.requests_per_minute, now).level
            if level < 1:
                wait = (1 - level) * MINUTE / limits.requests_per_minute
                raise self._refused(RequestsLimitReached, subject, "requests per minute", wait, now)
        if limits.tokens_per_minute is not None:  # a bucket never used is full: at least one token
            level = self._bucket(state, "tokens", limits.tokens_per_minute, now).level
            if level < 1:
                wait = (1 - level) * MINUTE / limits.tokens_per_minute
                raise self._refused(TokensLimitReached, subject, "tokens per minute", wait, now)
        in_flight = state.in_flight + state.elsewhere
        if limits.concurrent_requests is not None and in_flight >= limits.concurrent_requests:
            wait = float(CONCURRENCY_RETRY_SECONDS)
            raise self._refused(ConcurrencyLimitReached, subject, "concurrent requests", wait, now)

    def _refused(
        self, error: type[RateLimitExceeded], subject: Subject, what: str, wait: float, now: float
    ) -> RateLimitExceeded:
        kind, _, owner = subject.name.partition(":")
        limit = getattr(subject.limits, what.replace(" ", "_"))
        message = (
            f"Rate limit reached for {kind} {owner} on {what}: limit {limit}. "
            f"Please try again in {_duration(wait)}."
        )
        headers = {"Retry-After": str(max(1, math.ceil(wait))), **self._headers((subject,), now)}
        return error(message, headers=headers)

    def _headers(self, subjects: tuple[Subject, ...], now: float) -> dict[str, str]:
        """OpenAI's `x-ratelimit-{limit,remaining,reset}-{requests,tokens}`, for each kind some subject
        limits: from the subject with the least left."""
        headers: dict[str, str] = {}
        for kind in ("requests", "tokens"):
            found: tuple[float, int, float] | None = None  # (left, limit, seconds to full)
            for subject in subjects:
                capacity = getattr(subject.limits, f"{kind}_per_minute")
                if capacity is None:
                    continue
                level = self._bucket(self._states[subject.name], kind, capacity, now).level
                full_in = (capacity - level) * MINUTE / capacity
                if found is None or level < found[0]:
                    found = (level, capacity, full_in)
            if found is not None:
                left, capacity, full_in = found
                headers[f"x-ratelimit-limit-{kind}"] = str(capacity)
                headers[f"x-ratelimit-remaining-{kind}"] = str(max(0, math.floor(left)))
                headers[f"x-ratelimit-reset-{kind}"] = _duration(full_in)
        return headers


class Limiter(Protocol):
    """What the API admits requests through: the supervisor's `LocalLimits`, or in a server's other
    gateway processes `server.remote.RemoteLimits`, which asks the supervisor's."""

    async def admit(self, subjects: tuple[Subject, ...]) -> Admitted: ...

    async def release(self, ticket: int, tokens: int) -> None: ...

    async def charge(self, subjects: tuple[Subject, ...], tokens: int) -> None: ...

    async def use(self, subjects: tuple[Subject, ...]) -> list[Use]: ...


class LocalLimits:
    """The limiter of this process (a server's supervisor, or a single-process server)."""

    def __init__(self, limiter: RateLimiter | None = None) -> None:
        self.limiter = limiter or RateLimiter()

    async def admit(self, subjects: tuple[Subject, ...]) -> Admitted:
        return self.limiter.admit(subjects)

    async def release(self, ticket: int, tokens: int) -> None:
        self.limiter.release(ticket, tokens)

    async def charge(self, subjects: tuple[Subject, ...], tokens: int) -> None:
        self.limiter.charge(subjects, tokens)

    async def use(self, subjects: tuple[Subject, ...]) -> list[Use]:
        return [self.limiter.use(subject) for subject in subjects]


# The tokens the current request used so far, where it is limited (`api.middleware.RateLimits` sets
# it; the code that knows a request's tokens adds them with `count_tokens`).
_TOKENS: contextvars.ContextVar[list[int] | None] = contextvars.ContextVar("modelhost_tokens", default=None)


def start_counting() -> list[int]:
    """A token count for the request running in this context (and the tasks it starts)."""
    counter = [0]
    _TOKENS.set(counter)
    return counter


def count_tokens(tokens: int) -> None:
    """The current request used `tokens` more (a no-op where it is not limited)."""
    counter = _TOKENS.get()
    if counter is not None:
        counter[0] += tokens


def _duration(seconds: float) -> str:
    """OpenAI's way of writing a reset time: `20ms`, `1.5s`, `6m0s`."""
    if seconds < 1:
        return f"{max(0, math.ceil(seconds * 1000))}ms"
    if seconds < MINUTE:
        return f"{seconds:.3g}s"
    minutes, rest = divmod(seconds, MINUTE)
    return f"{int(minutes)}m{rest:.0f}s"
