"""The rate-limit table a server's gateway processes share (auth/limit_table.py): counts exact across
processes that admit at the same moment, what a dead process had in flight given back, and a table
that fills up making room by removing the subjects at rest."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from modelhost.auth.limit_table import LimitTable
from modelhost.auth.limits import Limits, RateLimiter, Subject
from modelhost.errors import ConcurrencyLimitReached, RequestsLimitReached, ServiceUnavailable

# One process of a server: waits for the common start, then tries to admit ATTEMPTS requests of one key
# without giving any back, and prints how many were admitted.
ADMITTING = """
import sys, time
from pathlib import Path
from modelhost.auth.limit_table import LimitTable
from modelhost.auth.limits import Limits, RateLimiter, Subject
from modelhost.errors import RateLimitExceeded

path, column = sys.argv[1], int(sys.argv[2])
start, attempts, limit = float(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
limiter = RateLimiter(clock=lambda: 1000.0, table=LimitTable.open(Path(path), column=column))
subject = Subject("key:key_shared", Limits(requests_per_minute=limit))
time.sleep(max(0.0, start - time.time()))
admitted = 0
for _ in range(attempts):
    try:
        limiter.admit((subject,))
        admitted += 1
    except RateLimitExceeded:
        pass
print(admitted)
"""


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_processes_admitting_at_the_same_moment_admit_exactly_the_limit_between_them(tmp_path: Path) -> None:
    path, processes, attempts, limit = tmp_path / "limits", 3, 2000, 3000
    server = RateLimiter(clock=lambda: 1000.0, table=LimitTable.create(path, columns=processes + 1))
    start = time.time() + 3  # once all have imported
    children = [
        subprocess.Popen(
            [sys.executable, "-c", ADMITTING, str(path), str(column), str(start), str(attempts), str(limit)],
            stdout=subprocess.PIPE,
            text=True,
        )
        for column in range(1, processes + 1)
    ]
    admitted = [int(child.communicate(timeout=60)[0]) for child in children]
    assert sum(admitted) == limit  # 6000 tries for 3000 places: not one more, not one less
    assert all(count > 0 for count in admitted)
    assert server.in_flight("key:key_shared") == limit
    with pytest.raises(RequestsLimitReached):
        server.admit((Subject("key:key_shared", Limits(requests_per_minute=limit)),))
    # the processes ended without giving their requests back: each one's are given back as it is gone
    server.forget_column(1)
    assert server.in_flight("key:key_shared") == limit - admitted[0]
    server.forget_column(2)
    server.forget_column(3)
    assert server.in_flight("key:key_shared") == 0


def test_a_request_admitted_in_one_process_is_released_in_the_count_every_process_sees(
    tmp_path: Path,
) -> None:
    path = tmp_path / "limits"
    first = RateLimiter(table=LimitTable.create(path, columns=2))
    second = RateLimiter(table=LimitTable.open(path, column=1))
    subject = Subject("key:key_a", Limits(concurrent_requests=2, tokens_per_minute=1000))
    held = first.admit((subject,))
    second.admit((subject,))
    with pytest.raises(ConcurrencyLimitReached):
        first.admit((subject,))
    first.release(held.ticket, tokens=400)
    use = second.use(subject)
    assert use.in_flight == 1 and use.tokens_remaining is not None and 600 <= use.tokens_remaining < 610
    second.forget_column(0)  # the first process is gone: nothing of it is left in flight
    assert second.use(subject).in_flight == 1


def test_a_full_table_removes_the_subjects_at_rest_and_keeps_the_others(tmp_path: Path) -> None:
    path, clock = tmp_path / "limits", Clock()
    one = RateLimiter(clock, LimitTable.create(path, columns=2, slots=8))  # compacts past 4 subjects
    other = RateLimiter(clock, LimitTable.open(path, column=1))
    busy = Subject("key:busy", Limits(concurrent_requests=5))
    hot = Subject("key:hot", Limits(requests_per_minute=10))
    idle = [Subject(f"key:idle{i}", Limits(requests_per_minute=10)) for i in range(2)]
    held = one.admit((busy,))
    for subject in idle:
        one.release(one.admit((subject,)).ticket)
    clock.now += 7  # one request of 10 a minute refills in 6 s: the idle ones are full again
    one.release(one.admit((hot,)).ticket)
    generation = one.table._counts()[0]
    other.admit((Subject("key:new", Limits(requests_per_minute=10)),))  # the fifth: makes room
    assert one.table._counts()[0:2] == (generation + 1, 3)  # busy, hot and new are left
    assert other.in_flight("key:busy") == 1  # found again where it was placed anew
    one.release(held.ticket)
    assert other.in_flight("key:busy") == 0
    assert other.use(hot).requests_remaining == 9
    assert other.use(idle[0]).requests_remaining == 10  # removed: the same as a full bucket


def test_a_table_full_of_subjects_in_flight_refuses_with_503(tmp_path: Path) -> None:
    limiter = RateLimiter(table=LimitTable.create(tmp_path / "limits", slots=4))
    for index in range(3):
        limiter.admit((Subject(f"key:k{index}", Limits(concurrent_requests=1)),))
    with pytest.raises(ServiceUnavailable, match="rate-limit table is full"):
        limiter.admit((Subject("key:k3", Limits(concurrent_requests=1)),))
