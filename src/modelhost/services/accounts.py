"""Accounts and their credit grants (admin only). Balances come from the ledger (billing)."""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal

from sqlalchemy import select

from modelhost import audit
from modelhost.billing.ledger import Ledger
from modelhost.billing.rates import to_micro
from modelhost.errors import InvalidRequest, NotFound
from modelhost.services.keys import KeyService, StoredLimits, stored_limits
from modelhost.store.db import Database
from modelhost.store.models import Account
from modelhost.store.types import new_id


@dataclass(frozen=True, slots=True)
class AccountView:
    account: Account
    granted_micro: int
    balance_micro: int


class AccountService:
    def __init__(
        self, database: Database, keys: KeyService, ledger: Ledger, initial_credits: Decimal
    ) -> None:
        self._database = database
        self._keys = keys
        self._ledger = ledger
        self._initial_credits = initial_credits

    def create(
        self, name: str, credits: float | None, limits: StoredLimits | None = None, weight: float = 1.0
    ) -> tuple[AccountView, str]:
        """A new account and its first account key; returns it and the key's secret.
        Without `credits` the account gets the operator's initial grant."""
        granted = to_micro(self._initial_credits if credits is None else credits)
        with self._database.transaction() as session:
            account = Account(
                id=new_id("acct"),
                name=name,
                credits_granted_micro=granted,
                limits=stored_limits(limits),
                weight=weight,
            )
            session.add(account)
            session.flush()
            fields = {
                "name": name,
                "credits_granted_micro": granted,
                "limits": account.limits,
                "weight": weight,
            }
            audit.record(session, "account.created", "account", account.id, account.id, audit.created(fields))
            _, secret = self._keys.create_in(session, account.id, name="default", deployment_ids=None)
        return AccountView(account, granted, granted), secret

    def list_accounts(self) -> list[AccountView]:
        with self._database.transaction() as session:
            accounts = list(session.scalars(select(Account).order_by(Account.created_at, Account.id)))
        return self._views(accounts)

    def get(self, account_id: str) -> AccountView:
        with self._database.transaction() as session:
            account = session.get(Account, account_id)
            if account is None:
                raise NotFound("Account not found", param="account_id", code="account_not_found")
        return self._views([account])[0]

    def update(self, account_id: str, changes: dict[str, object]) -> AccountView:
        """Rename an account, replace its limits or set its weight (`changes`: the fields given; `weight`
        None: 1). Its keys' own limits
        stay as they are: a key above the account's new limit is held to it by the account's own
        bucket. Every gateway process reads the account's keys again on their next request."""
        with self._database.transaction() as session:
            account = session.get(Account, account_id, with_for_update=True)
            if account is None:
                raise NotFound("Account not found", param="account_id", code="account_not_found")
            before = {"name": account.name, "limits": account.limits, "weight": account.weight}
            if "name" in changes:
                if changes["name"] is None:
                    raise InvalidRequest("An account's name cannot be null.", param="name")
                account.name = changes["name"]  # type: ignore[assignment]
            if "limits" in changes:
                account.limits = stored_limits(changes["limits"])  # type: ignore[arg-type]
            if "weight" in changes:
                account.weight = float(changes["weight"] or 1.0)  # type: ignore[arg-type]
            after = {"name": account.name, "limits": account.limits, "weight": account.weight}
            audit.record(
                session, "account.updated", "account", account.id, account.id, audit.diff(before, after)
            )
        self._keys.forget_principals()
        return self._views([account])[0]

    def add_credits(self, account_id: str, credits: float) -> AccountView:
        """Top-up (or correction when negative), as one guarded increment of the grant."""
        with self._database.transaction() as session:
            account = session.get(Account, account_id, with_for_update=True)
            if account is None:
                raise NotFound("Account not found", param="account_id", code="account_not_found")
            before = account.credits_granted_micro
            account.credits_granted_micro += to_micro(credits)
            granted = {"credits_granted_micro": {"before": before, "after": account.credits_granted_micro}}
            audit.record(session, "account.credits_added", "account", account.id, account.id, granted)
        return self._views([account])[0]

    def _views(self, accounts: list[Account]) -> list[AccountView]:
        balances = self._ledger.balances_micro(a.id for a in accounts)
        return [
            AccountView(a, a.credits_granted_micro, balances.get(a.id, a.credits_granted_micro))
            for a in accounts
        ]
