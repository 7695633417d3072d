"""Billing as the rest of the gateway sees it: balances and their enforcement, the periodic tick,
and usage reports.

Enforcement (on by default): an account at or below zero gets 402 `insufficient_credits` on
inference and when a replica of it would load, and its loaded replicas are unloaded after the tick
that used up its credits. Balances are cached briefly per gateway (the request path must not sum the
ledger); a top-up on this gateway clears the entry at once, other gateways see it within the cache
lifetime.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta

from modelhost.auth.limits import Limits
from modelhost.billing.ledger import Billed, Ledger, Usage
from modelhost.billing.meter import ComputeMeter, count
from modelhost.billing.rates import cap_reached, to_credits
from modelhost.cache import SingleFlight, TTLCache
from modelhost.clock import Clock
from modelhost.errors import InsufficientCredits, InsufficientQuota, InvalidRequest, NotFound
from modelhost.runtime.spec import DeploymentSpec

log = logging.getLogger("modelhost.billing")

# A compute meter whose gateway has not billed it for this many ticks belongs to a gateway that died.
STALE_TICKS = 3


class Billing:
    def __init__(
        self,
        ledger: Ledger,
        meter: ComputeMeter,
        clock: Clock,
        *,
        enforce: bool,
        tick_seconds: float,
        balance_cache: TTLCache[int],
    ) -> None:
        self.ledger = ledger
        self.meter = meter
        self.clock = clock
        self.enforce = enforce
        self.tick_seconds = tick_seconds
        self._balances = balance_cache
        self._balance_loads: SingleFlight[int] = SingleFlight(lambda: balance_cache.generation)
        # What each capped account spent this day and month, trusted as long as a balance
        self._spent: TTLCache[int] = TTLCache(balance_cache.ttl, balance_cache.max_entries)
        self._spent_loads: SingleFlight[int] = SingleFlight(lambda: self._spent.generation)

    # ---------------------------------------------------------------- balances

    def balance_micro(self, account_id: str) -> int:
        """Granted − spent, read now (and remembered for the request path; the last one read while the
        database is unavailable)."""
        balance = self._balances.fresh_or_stale(account_id, lambda: self._read_balance(account_id))
        assert balance is not None  # `_read_balance` reads a number or raises
        return balance

    def _read_balance(self, account_id: str) -> int:
        balance = self.ledger.balances_micro([account_id]).get(account_id)
        if balance is None:
            raise NotFound("Account not found", param="account_id", code="account_not_found")
        return balance

    def _cached_balance(self, account_id: str) -> int | None:
        found, balance = self._balances.get(account_id)
        return balance if found else None

    async def require_credits(self, account_id: str) -> None:
        """The request path: 402 when the account is out of credits (cached read)."""
        if not self.enforce:
            return
        balance = self._cached_balance(account_id)
        if balance is None:
            balance = await self._balance_loads.load(account_id, lambda: self.balance_micro(account_id))
        _refuse_if_exhausted(balance)

    async def require_within_caps(self, account_id: str, limits: Limits | None) -> None:
        """The request path: 429 `insufficient_quota` once the account has spent its cap of credits
        this UTC day or month (docs/limits.md). Read from the ledger, so it holds across processes,
        servers and restarts; it lags by up to a billing tick plus the balance cache."""
        if limits is None:
            return
        now_ms = self.clock.now_ms()
        for cap, bounds, period in (
            (limits.credits_per_day, _day, "day"),
            (limits.credits_per_month, _month, "month"),
        ):
            if cap is None:
                continue
            start, end = bounds(now_ms)
            key = f"{account_id}:{start}"
            found, spent = self._spent.get(key)
            if not found or spent is None:
                spent = await self._spent_loads.load(
                    key, functools.partial(self._read_spent, key, account_id, start)
                )
            if cap_reached(spent, cap):
                wait = max(1, -(-(end - now_ms) // 1000))
                raise InsufficientQuota(
                    f"The account has spent its cap of {cap:g} credits per {period} "
                    f"({to_credits(spent):.6f} used); it resets at the start of the next {period} (UTC), "
                    f"in {wait} s.",
                    headers={"Retry-After": str(wait)},
                )

    def _read_spent(self, key: str, account_id: str, since_ms: int) -> int:
        began = self._spent.generation
        spent = self.ledger.spent_since_micro(account_id, since_ms)
        self._spent.put(key, spent, began=began)
        return spent

    def check_can_load(self, spec: DeploymentSpec) -> None:
        """The runtime asks before loading a replica (called off the event loop). A shared base's
        refusal reaches the accounts whose adapters it serves too: it tells them no balance."""
        if not self.enforce:
            return
        balance = self._cached_balance(spec.account_id)
        balance = self.balance_micro(spec.account_id) if balance is None else balance
        if balance <= 0 and len(spec.viewers) > 1:
            raise InsufficientCredits(
                "The account that owns this deployment (or the shared base it runs on) is out of credits; "
                "ask the operator for a top-up."
            )
        _refuse_if_exhausted(balance)

    def forget(self, account_id: str) -> None:
        """After a top-up or correction: the next request reads the new balance."""
        self._balances.discard(account_id)

    # ---------------------------------------------------------------- ticks

    def tick(self) -> list[Billed]:
        """Bill this gateway's replicas and every stored artifact up to now, and close what a dead
        gateway left open."""
        now = self.clock.now_ms()
        billed = self.meter.tick()
        storage = self.ledger.tick_storage(now)
        count(storage)
        self.close_stale()
        return billed + storage

    def close_stale(self) -> None:
        """Close the compute meters of a gateway that died without closing them. At start and on every
        tick: a gateway that restarts sooner than `STALE_TICKS` ticks after a crash finds its old
        meters still fresh, and closes them on a later tick."""
        stale_ms = int(STALE_TICKS * self.tick_seconds * 1000)
        closed = self.ledger.close_stale(self.clock.now_ms(), stale_ms, self.meter.owner)
        if closed:
            log.info("closed %d compute meter(s) left open by a stopped gateway", closed)

    def exhausted(self, billed: list[Billed]) -> list[str]:
        """Accounts billed just now whose balance is used up (their balances are refreshed)."""
        balances = self.ledger.balances_micro(entry.account_id for entry in billed)
        for account_id, balance in balances.items():
            self._balances.put(account_id, balance)
        return sorted(a for a, balance in balances.items() if balance <= 0) if self.enforce else []

    async def run_forever(self, unload_account: Callable[[str], Awaitable[None]]) -> None:
        """Tick every `tick_seconds`; unload the replicas of accounts that ran out."""
        while True:
            await asyncio.sleep(self.tick_seconds)
            try:
                await self.tick_and_enforce(unload_account)
            except Exception:
                log.exception("billing tick failed; the next one bills the time since the last")

    async def tick_and_enforce(self, unload_account: Callable[[str], Awaitable[None]]) -> None:
        billed = await asyncio.to_thread(self.tick)
        for account_id in await asyncio.to_thread(self.exhausted, billed):
            log.warning("account %s is out of credits: unloading its replicas", account_id)
            await unload_account(account_id)

    # ---------------------------------------------------------------- reports

    def usage(
        self, account_id: str, start: datetime | None, end: datetime | None
    ) -> tuple[Usage, datetime, datetime]:
        """The account's usage in `[start, end)`; by default this calendar month (UTC)."""
        now = datetime.fromtimestamp(self.clock.now_ms() / 1000, UTC)
        month = now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
        start = start or month
        end = end or (month + timedelta(days=32)).replace(day=1)
        if start >= end:  # given both, or one that falls on the wrong side of the default month
            raise InvalidRequest("`end` must be after `start`.", param="end")
        usage = self.ledger.usage(account_id, _ms(start), _ms(end))
        if usage is None:
            raise NotFound("Account not found", param="account_id", code="account_not_found")
        return usage, start, end


def _refuse_if_exhausted(balance: int) -> None:
    if balance <= 0:
        raise InsufficientCredits(
            f"The account is out of credits (balance {to_credits(balance):.6f}); "
            "ask the operator for a top-up."
        )


def _day(now_ms: int) -> tuple[int, int]:
    """The UTC day around `now_ms`: its start and the next day's, in ms."""
    start = datetime.fromtimestamp(now_ms / 1000, UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    return _ms(start), _ms(start + timedelta(days=1))


def _month(now_ms: int) -> tuple[int, int]:
    """The UTC month around `now_ms`: its start and the next month's, in ms."""
    start = datetime.fromtimestamp(now_ms / 1000, UTC).replace(
        day=1, hour=0, minute=0, second=0, microsecond=0
    )
    following = (start + timedelta(days=32)).replace(day=1)
    return _ms(start), _ms(following)


def _ms(moment: datetime) -> int:
    return int(moment.timestamp() * 1000)
