"""Accounts and their credit grants (admin only)."""

from __future__ import annotations

from sqlalchemy import select

from modelhost.errors import NotFound
from modelhost.services.keys import KeyService
from modelhost.store.db import Database
from modelhost.store.models import Account
from modelhost.store.types import new_id

MICRO = 1_000_000


def to_micro(credits: float) -> int:
    """Credits as given on the wire → integer micro-credits (rounded to the nearest micro)."""
    return round(credits * MICRO)


def to_credits(micro: int) -> float:
    return micro / MICRO


class AccountService:
    def __init__(self, database: Database, keys: KeyService) -> None:
        self._database = database
        self._keys = keys

    def create(self, name: str, credits: float) -> tuple[Account, str]:
        """A new account and its first account key; returns the row and the key's secret."""
        with self._database.transaction() as session:
            account = Account(id=new_id("acct"), name=name, credits_granted_micro=to_micro(credits))
            session.add(account)
            session.flush()
            _, secret = self._keys.create_in(session, account.id, name="default", deployment_ids=None)
        return account, secret

    def list_accounts(self) -> list[Account]:
        with self._database.transaction() as session:
            return list(session.scalars(select(Account).order_by(Account.created_at, Account.id)))

    def get(self, account_id: str) -> Account:
        with self._database.transaction() as session:
            account = session.get(Account, account_id)
            if account is None:
                raise NotFound("Account not found", param="account_id", code="account_not_found")
            return account

    def add_credits(self, account_id: str, credits: float) -> Account:
        """Top-up (or correction when negative), as one guarded increment."""
        with self._database.transaction() as session:
            account = session.get(Account, account_id, with_for_update=True)
            if account is None:
                raise NotFound("Account not found", param="account_id", code="account_not_found")
            account.credits_granted_micro += to_micro(credits)
            return account
