"""The rate limiter's rules (auth/limits.py), on a clock the test moves: buckets that refill at the
limit per minute, tokens taken when a request ends, requests at once, key and account together; and
several servers' limiters sharing their counts through one database (auth/shared_limits.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from modelhost.auth.limits import Limits, RateLimiter, Subject
from modelhost.auth.shared_limits import SharedLimits
from modelhost.errors import (
    ConcurrencyLimitReached,
    RateLimitExceeded,
    RequestsLimitReached,
    TokensLimitReached,
)
from modelhost.store import migrate
from modelhost.store.db import Database


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


def key(**limits: int) -> Subject:
    return Subject("key:key_a", Limits(**limits))


def test_requests_per_minute_admits_exactly_the_limit_then_says_when_to_retry(clock: Clock) -> None:
    limiter = RateLimiter(clock)
    remaining = [limiter.admit((key(requests_per_minute=3),)).headers for _ in range(3)]
    assert [h["x-ratelimit-remaining-requests"] for h in remaining] == ["2", "1", "0"]
    assert remaining[0]["x-ratelimit-limit-requests"] == "3"
    assert remaining[-1]["x-ratelimit-reset-requests"] == "1m0s"  # all three back after a minute
    with pytest.raises(RequestsLimitReached) as refused:
        limiter.admit((key(requests_per_minute=3),))
    assert refused.value.status_code == 429 and refused.value.code == "rate_limit_exceeded"
    assert refused.value.error_type == "requests"
    assert refused.value.headers["Retry-After"] == "20"  # one request refills in 60 / 3 s
    assert "requests per minute: limit 3" in refused.value.message
    clock.now += 19.9
    with pytest.raises(RequestsLimitReached):
        limiter.admit((key(requests_per_minute=3),))
    clock.now += 0.1
    assert limiter.admit((key(requests_per_minute=3),)).headers["x-ratelimit-remaining-requests"] == "0"


def test_tokens_are_taken_when_the_request_ends_and_hold_back_the_next(clock: Clock) -> None:
    limiter = RateLimiter(clock)
    subject = key(tokens_per_minute=100)
    first = limiter.admit((subject,))
    assert first.headers["x-ratelimit-remaining-tokens"] == "100"
    limiter.release(first.ticket, tokens=120)  # one request may go past the limit: its tokens were unknown
    with pytest.raises(TokensLimitReached) as refused:
        limiter.admit((subject,))
    assert refused.value.error_type == "tokens"
    assert refused.value.headers["Retry-After"] == "13"  # from -20 back to 1 token: 21 x 0.6 s
    assert refused.value.headers["x-ratelimit-remaining-tokens"] == "0"
    clock.now += 12.6
    assert limiter.admit((subject,)).headers["x-ratelimit-remaining-tokens"] == "1"


def test_concurrent_requests_are_counted_until_each_ends(clock: Clock) -> None:
    limiter = RateLimiter(clock)
    subject = key(concurrent_requests=2)
    first, _ = limiter.admit((subject,)), limiter.admit((subject,))
    with pytest.raises(ConcurrencyLimitReached) as refused:
        limiter.admit((subject,))
    assert refused.value.headers["Retry-After"] == "1"
    limiter.release(first.ticket)
    limiter.release(first.ticket)  # twice: ignored, not a place given back twice
    limiter.admit((subject,))
    with pytest.raises(ConcurrencyLimitReached):
        limiter.admit((subject,))
    assert limiter.in_flight("key:key_a") == 2


def test_a_request_counts_against_its_key_and_its_account_and_the_tighter_one_refuses(clock: Clock) -> None:
    limiter = RateLimiter(clock)
    account = Subject("account:acct_a", Limits(requests_per_minute=2))
    first_key, second_key = (
        Subject("key:key_a", Limits(requests_per_minute=5)),
        Subject("key:key_b", Limits()),
    )
    assert limiter.admit((first_key, account)).headers["x-ratelimit-remaining-requests"] == "1"
    limiter.admit((second_key, account))
    with pytest.raises(RateLimitExceeded) as refused:
        limiter.admit((first_key, account))
    assert "account acct_a" in refused.value.message
    assert limiter.in_flight("key:key_a") == 1  # the refused request took nothing from its key


def test_a_lowered_limit_applies_to_the_next_request(clock: Clock) -> None:
    limiter = RateLimiter(clock)
    limiter.admit((key(requests_per_minute=100),))
    headers = limiter.admit((key(requests_per_minute=2),)).headers  # the bucket shrinks to the new limit
    assert headers["x-ratelimit-limit-requests"] == "2" and headers["x-ratelimit-remaining-requests"] == "1"


def test_no_limits_means_no_headers(clock: Clock) -> None:
    assert RateLimiter(clock).admit((key(),)).headers == {}
    assert Limits.of({"requests_per_minute": None}) is None and Limits.of(None) is None


# ---------------------------------------------------------------- several servers (auth/shared_limits.py)


@pytest.fixture
def database(tmp_path: Path) -> Iterator[Database]:
    database = Database(f"sqlite:///{tmp_path / 'shared.db'}")
    migrate.upgrade(database)
    yield database
    database.dispose()


def servers(database: Database, clock: Clock, count: int = 2) -> list[tuple[RateLimiter, SharedLimits]]:
    """`count` servers' limiters sharing through `database`, on the test's clock (monotonic and wall)."""
    made = []
    for index in range(count):
        limiter = RateLimiter(clock)
        made.append((limiter, SharedLimits(database, limiter, 1.0, server=f"s{index}", clock=clock)))
    return made


async def sync_all(shared: list[tuple[RateLimiter, SharedLimits]]) -> None:
    for _, sharing in shared:
        await sharing.sync()


async def test_servers_sharing_a_database_take_each_others_requests_after_a_sync(
    database: Database, clock: Clock
) -> None:
    (a, _), (b, _) = shared = servers(database, clock)
    subject = key(requests_per_minute=4)
    await sync_all(shared)  # the first read notes what is there: nothing
    for _ in range(3):
        a.admit((subject,))
    b.admit((subject,))  # before the sync, B only knows its own
    await sync_all(shared)
    await sync_all(shared)  # A learns B's request on A's next read after B wrote
    for limiter in (a, b):
        with pytest.raises(RequestsLimitReached):
            limiter.admit((subject,))
    clock.now += 15  # one request refills on both
    a.admit((subject,))
    await sync_all(shared)
    await sync_all(shared)
    with pytest.raises(RequestsLimitReached):
        b.admit((subject,))


async def test_tokens_taken_on_another_server_hold_back_a_subject_this_one_never_saw(
    database: Database, clock: Clock
) -> None:
    (a, _), (b, _) = shared = servers(database, clock)
    subject = key(tokens_per_minute=100)
    await sync_all(shared)
    a.release(a.admit((subject,)).ticket, tokens=150)
    await sync_all(shared)
    with pytest.raises(TokensLimitReached) as refused:
        b.admit((subject,))  # B's first request of this key: its bucket starts 150 short
    assert refused.value.headers["x-ratelimit-remaining-tokens"] == "0"
    clock.now += 33  # 55 tokens back: above zero again
    assert b.admit((subject,)).headers["x-ratelimit-remaining-tokens"] == "5"


async def test_requests_in_flight_elsewhere_count_until_they_end_or_their_server_goes_silent(
    database: Database, clock: Clock
) -> None:
    (a, _), (b, sharing_b) = shared = servers(database, clock)
    subject = key(concurrent_requests=2)
    await sync_all(shared)
    first, _second = a.admit((subject,)), a.admit((subject,))
    await sync_all(shared)
    with pytest.raises(ConcurrencyLimitReached):
        b.admit((subject,))
    assert b.use(subject).in_flight == 2
    a.release(first.ticket)
    await sync_all(shared)
    b.release(b.admit((subject,)).ticket)  # one place free again
    clock.now += sharing_b.window_ms / 1000 + 1  # A goes silent (it died): its request stops counting
    await sharing_b.sync()
    assert b.use(subject).in_flight == 0


async def test_a_server_that_starts_does_not_charge_what_the_others_took_before_it(
    database: Database, clock: Clock
) -> None:
    (a, sharing_a), (b, sharing_b) = servers(database, clock)
    subject = key(requests_per_minute=3)
    a.admit((subject,))
    a.admit((subject,))
    await sharing_a.sync()  # A wrote its two requests before B started
    await sharing_b.sync()  # B's first read: A's bucket holds those, not B's
    assert b.admit((subject,)).headers["x-ratelimit-remaining-requests"] == "2"
    a.admit((subject,))  # what A takes from now on reaches B
    await sharing_a.sync()
    await sharing_b.sync()
    assert b.admit((subject,)).headers["x-ratelimit-remaining-requests"] == "0"


async def test_what_other_servers_took_over_a_minute_ago_is_not_owed_by_a_subject_this_one_never_saw(
    database: Database, clock: Clock
) -> None:
    (a, _), (b, _) = shared = servers(database, clock)
    subject = key(tokens_per_minute=100)
    await sync_all(shared)
    for _ in range(5):  # A takes 90 tokens a minute for five minutes; B never sees the key meanwhile
        a.release(a.admit((subject,)).ticket, tokens=90)
        await sync_all(shared)
        clock.now += 61
    a.release(a.admit((subject,)).ticket, tokens=10)
    await sync_all(shared)
    # B's bucket starts short by the last minute's take only: the older ones have refilled
    assert b.admit((subject,)).headers["x-ratelimit-remaining-tokens"] == "90"
