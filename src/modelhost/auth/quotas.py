"""Quotas per person (issue 72; docs/limits.md, "Quotas per person"): tokens and requests per UTC day
and per UTC month for a person in an account, counted over every key they own and their sign-in
sessions (both act as the person: `Principal.user_id`).

A quota is set by the account's admins, per person (`Membership.quota`) or per role as the default of
the role's people (`Account.role_quotas`); a person's own replaces their role's. It is read with the
key (`auth.authenticator`, `services.sessions`), so a change reaches every gateway process as a key
change does.

What a person used lives in the database (`person_usage`, one row per person and period), so it is
shared by the server's gateway processes, by several servers, and outlives a restart. Each gateway
process counts in memory (a request when it is admitted, its tokens when it ends, as the rate limits
take them) and adds what it counted to the rows once a second (`flush`, one short transaction off every
request's path). A person's stored totals are read at most once a second per process, on the request
path only where they have a quota. So a process sees its own use at once and the others' within about
two seconds: a person can pass a quota by what other processes admit for them in that time.

Enforcement is the rate limits' admission (`api.deps.admit`): over a quota, 429 `insufficient_quota`
with `Retry-After` and OpenAI's `x-ratelimit-*` headers until the next UTC day or month. Service keys
(no person) have no quota.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import NamedTuple

from sqlalchemy import delete, select
from sqlalchemy.dialects.postgresql import insert as postgresql_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from modelhost.auth.limits import duration
from modelhost.cache import SingleFlight
from modelhost.clock import Clock
from modelhost.errors import InsufficientQuota
from modelhost.store.db import Database
from modelhost.store.models import PersonUsage

log = logging.getLogger("modelhost.quotas")

FIELDS = ("requests_per_day", "requests_per_month", "tokens_per_day", "tokens_per_month")
REFRESH_SECONDS = 1.0  # a person's stored totals are trusted this long
FORGET_AFTER_MS = 40 * 86400 * 1000  # rows nobody added to for this long belong to periods long over


@dataclass(frozen=True, slots=True)
class Quota:
    """A person's quota; None: unlimited."""

    requests_per_day: int | None = None
    requests_per_month: int | None = None
    tokens_per_day: int | None = None
    tokens_per_month: int | None = None

    @classmethod
    def of(cls, stored: Mapping[str, int | None] | None) -> Quota | None:
        """The quota stored as JSON (None, or every field None: no quota)."""
        if not stored:
            return None
        quota = cls(**{name: int(v) for name in FIELDS if (v := stored.get(name)) is not None})
        return quota if quota != cls() else None

    def stored(self) -> dict[str, int | None]:
        return {name: getattr(self, name) for name in FIELDS}


def quota_for(
    own: Mapping[str, int | None] | None,
    role_quotas: Mapping[str, Mapping[str, int | None]] | None,
    role: str,
) -> tuple[Quota | None, str | None]:
    """A member's quota and where it comes from (`person`, `role`; None: none): their own, else their
    role's default in the account."""
    quota = Quota.of(own)
    if quota is not None:
        return quota, "person"
    quota = Quota.of((role_quotas or {}).get(role))
    return (quota, "role") if quota is not None else (None, None)


class Person(NamedTuple):
    """Whom a request's use counts against: a person in an account."""

    account_id: str
    user_id: str


@dataclass(frozen=True, slots=True)
class PeriodUse:
    """What a person used in one period (a UTC day or month), and when it ends (Unix ms)."""

    period: str
    requests: int
    tokens: int
    ends_ms: int


@dataclass(frozen=True, slots=True)
class PersonUse:
    day: PeriodUse
    month: PeriodUse


def periods(now_ms: int) -> tuple[tuple[str, int], tuple[str, int]]:
    """The UTC day (`2026-11-29`) and month (`2026-11`) of `now_ms`, each with its end (Unix ms)."""
    now = datetime.fromtimestamp(now_ms / 1000, UTC)
    day = now.replace(hour=0, minute=0, second=0, microsecond=0)
    month = day.replace(day=1)
    next_month = (month + timedelta(days=32)).replace(day=1)
    return (
        (day.date().isoformat(), _ms(day + timedelta(days=1))),
        (month.strftime("%Y-%m"), _ms(next_month)),
    )


def _ms(moment: datetime) -> int:
    return int(moment.timestamp() * 1000)


Counts = dict[tuple[str, str, str], list[int]]  # (account, user, period) -> [requests, tokens]


class PersonQuotas:
    """This gateway process's side of the quotas (module docstring)."""

    def __init__(self, database: Database, clock: Clock, refresh_seconds: float = REFRESH_SECONDS) -> None:
        self._database = database
        self.clock = clock
        self.refresh_seconds = refresh_seconds
        self._lock = threading.Lock()  # `/v1/me` reads from a thread
        self._pending: Counts = {}  # counted here, not yet added to the rows
        self._flushing: Counts = {}  # being added now
        # stored totals per person, as last read: (when, day, month, (requests, tokens) of each)
        self._stored: dict[Person, tuple[float, str, str, tuple[int, int], tuple[int, int]]] = {}
        self._generation = 0  # flushes so far: a read that began before one may predate its rows
        self._loads: SingleFlight[tuple[tuple[int, int], tuple[int, int]]] = SingleFlight(
            lambda: self._generation
        )
        self._forgot_ms = 0

    # ------------------------------------------------------------------ the request path

    async def require_within(self, person: Person, quota: Quota | None) -> None:
        """429 `insufficient_quota` when the person has used a limit of `quota` this day or month."""
        if quota is None:
            return
        use = await self.use(person)
        for period, what, limit, used in (
            (use.day, "requests per day", quota.requests_per_day, use.day.requests),
            (use.month, "requests per month", quota.requests_per_month, use.month.requests),
            (use.day, "tokens per day", quota.tokens_per_day, use.day.tokens),
            (use.month, "tokens per month", quota.tokens_per_month, use.month.tokens),
        ):
            if limit is not None and used >= limit:
                raise _refused(person, what, limit, used, period.ends_ms - self.clock.now_ms())

    def admitted(self, person: Person) -> Person:
        """The person's request was admitted: one request more this day and month."""
        self._add(person, 1, 0)
        return person

    def ended(self, person: Person, tokens: int) -> None:
        """The person's request (or work it started: a background response) used `tokens`."""
        if tokens > 0:
            self._add(person, 0, tokens)

    def _add(self, person: Person, requests: int, tokens: int) -> None:
        (day, _), (month, _) = periods(self.clock.now_ms())
        with self._lock:
            for period in (day, month):
                counts = self._pending.setdefault((*person, period), [0, 0])
                counts[0] += requests
                counts[1] += tokens

    async def use(self, person: Person) -> PersonUse:
        """What the person used this day and month: the stored totals (read again once they are older
        than `refresh_seconds`) and what this process counted since."""
        (day, day_ends), (month, month_ends) = periods(self.clock.now_ms())
        stored = self._fresh(person, day, month)
        if stored is None:
            load = functools.partial(self._read, person, day, month)
            stored = await self._loads.load(f"{person}/{day}", load)
        return self._with_own(person, stored, (day, day_ends), (month, month_ends))

    def use_now(self, person: Person) -> PersonUse:
        """`use`, from a thread (a sync route)."""
        (day, day_ends), (month, month_ends) = periods(self.clock.now_ms())
        stored = self._fresh(person, day, month) or self._read(person, day, month)
        return self._with_own(person, stored, (day, day_ends), (month, month_ends))

    def _fresh(self, person: Person, day: str, month: str) -> tuple[tuple[int, int], tuple[int, int]] | None:
        with self._lock:
            entry = self._stored.get(person)
        if entry is None or entry[1:3] != (day, month):
            return None
        if self.clock.monotonic() - entry[0] >= self.refresh_seconds:
            return None
        return entry[3], entry[4]

    def _read(self, person: Person, day: str, month: str) -> tuple[tuple[int, int], tuple[int, int]]:
        began, at = self._generation, self.clock.monotonic()
        with self._database.transaction() as session:
            rows = session.execute(
                select(PersonUsage.period, PersonUsage.requests, PersonUsage.tokens).where(
                    PersonUsage.account_id == person.account_id,
                    PersonUsage.user_id == person.user_id,
                    PersonUsage.period.in_((day, month)),
                )
            )
            found = {period: (int(requests), int(tokens)) for period, requests, tokens in rows}
        totals = found.get(day, (0, 0)), found.get(month, (0, 0))
        with self._lock:
            if began == self._generation:  # else a flush added rows it may or may not have read
                self._stored[person] = (at, day, month, *totals)
        return totals

    def _with_own(
        self,
        person: Person,
        stored: tuple[tuple[int, int], tuple[int, int]],
        day: tuple[str, int],
        month: tuple[str, int],
    ) -> PersonUse:
        used = []
        with self._lock:
            for (period, ends), (requests, tokens) in zip((day, month), stored, strict=True):
                for counts in (self._pending, self._flushing):
                    own = counts.get((*person, period))
                    if own is not None:
                        requests, tokens = requests + own[0], tokens + own[1]
                used.append(PeriodUse(period, requests, tokens, ends))
        return PersonUse(*used)

    # ------------------------------------------------------------------ adding to the rows

    async def run_forever(self, interval: float = 1.0) -> None:
        """Add what was counted to the rows every `interval` until cancelled; a database that cannot be
        reached is tried again at the next interval (the counts wait in memory)."""
        while True:
            await asyncio.sleep(interval)
            try:
                await asyncio.to_thread(self.flush)
            except Exception as exc:
                log.warning("quota use not stored this time: %s", exc)

    async def stop(self) -> None:
        """A last flush, so that what was counted outlives the process."""
        try:
            await asyncio.to_thread(self.flush)
        except Exception as exc:
            log.warning("quota use not stored at shutdown: %s", exc)

    def flush(self) -> None:
        """Add what this process counted to `person_usage`, in one transaction; what could not be
        written is counted again the next time."""
        with self._lock:
            if not self._pending or self._flushing:
                return
            self._flushing, self._pending = self._pending, {}
        try:
            self._write(self._flushing)
        except Exception:
            with self._lock:
                for key, (requests, tokens) in self._flushing.items():
                    counts = self._pending.setdefault(key, [0, 0])
                    counts[0] += requests
                    counts[1] += tokens
                self._flushing = {}
            raise
        with self._lock:
            self._generation += 1
            for account_id, user_id, _ in self._flushing:
                self._stored.pop(Person(account_id, user_id), None)  # read again, with what was added
            self._flushing = {}

    def _write(self, counts: Counts) -> None:
        now_ms = self.clock.now_ms()
        insert = sqlite_insert if self._database.is_sqlite else postgresql_insert
        with self._database.transaction() as session:
            written = insert(PersonUsage).values(
                [
                    {
                        "account_id": account_id,
                        "user_id": user_id,
                        "period": period,
                        "requests": requests,
                        "tokens": tokens,
                        "updated_ms": now_ms,
                    }
                    for (account_id, user_id, period), (requests, tokens) in sorted(counts.items())
                ]
            )
            session.execute(
                written.on_conflict_do_update(
                    index_elements=["account_id", "user_id", "period"],
                    set_={
                        "requests": PersonUsage.requests + written.excluded.requests,
                        "tokens": PersonUsage.tokens + written.excluded.tokens,
                        "updated_ms": written.excluded.updated_ms,
                    },
                )
            )
            if now_ms - self._forgot_ms > 86400 * 1000:
                session.execute(delete(PersonUsage).where(PersonUsage.updated_ms < now_ms - FORGET_AFTER_MS))
                self._forgot_ms = now_ms


def _refused(person: Person, what: str, limit: int, used: int, wait_ms: int) -> InsufficientQuota:
    period = what.rpartition(" ")[2]
    wait = max(1, math.ceil(wait_ms / 1000))
    kind = what.partition(" ")[0]
    headers = {
        "Retry-After": str(wait),
        f"x-ratelimit-limit-{kind}": str(limit),
        f"x-ratelimit-remaining-{kind}": "0",
        f"x-ratelimit-reset-{kind}": duration(wait_ms / 1000),
    }
    return InsufficientQuota(
        f"Quota reached for user {person.user_id} on {what}: limit {limit} ({used} used). It resets at "
        f"the start of the next {period} (UTC), in {wait} s.",
        headers=headers,
    )
