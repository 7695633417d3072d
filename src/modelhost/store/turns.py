"""Queued work claimed in turn between accounts (batches, imports): one account's queue never holds
another's back."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from sqlalchemy import ColumnElement, func, select
from sqlalchemy.orm import Session

# Accounts whose oldest row one claim tries, in turn: a later one is tried when another runner took an
# earlier one's row meanwhile.
ACCOUNTS_TRIED = 5


def in_turn(
    session: Session,
    model: Any,
    claimable: tuple[ColumnElement[bool], ...],
    running: tuple[ColumnElement[bool], ...],
    per_account: int,
) -> Iterator[Any]:
    """Rows of `model` (a table with `account_id` and `created_at`) that match `claimable`, one per
    account, in the order they should be claimed: of the accounts with fewer than `per_account` rows
    matching `running` (on any server), the one running fewest, then the one waiting longest; each its
    oldest row."""
    counts: dict[str, int] = dict(
        session.execute(
            select(model.account_id, func.count()).where(*running).group_by(model.account_id)
        ).all()
    )
    waiting = session.execute(
        select(model.account_id, func.min(model.created_at)).where(*claimable).group_by(model.account_id)
    ).all()
    turns = sorted(
        (counts.get(account, 0), since, account)
        for account, since in waiting
        if counts.get(account, 0) < per_account
    )
    for _, _, account in turns[:ACCOUNTS_TRIED]:
        row = session.scalars(
            select(model).where(*claimable, model.account_id == account).order_by(model.created_at)
        ).first()
        if row is not None:
            yield row
