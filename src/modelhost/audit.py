"""The audit log: who changed what, append-only, each row chained to the one before by its hash.

**Recording.** A service that changes accounts, keys, deployments, artifacts, shares, limits, credits or
files calls `record(session, ...)` inside the transaction that makes the change: a change that rolls
back leaves no row, and a change that commits never lacks its row.

**Who acted.** The request's actor (its key's kind and ID, its account, the client's address) is a
context variable set once by the auth dependency (`api.deps`), as the request ID is (`logs.REQUEST_ID`):
the services below the HTTP layer read it at the moment they record, so no service signature grows an
`actor` parameter that every caller (routes, the CLI's server-side paths, tests) would have to thread
through, and a service called by the server itself (housekeeping, a batch's output file) records the
`system` actor without being told. Context variables follow a request into `asyncio.to_thread` and
FastAPI's thread pool (both copy the context), and never leak between requests (each runs in its own
context).

**The chain.** Row `n` stores `hash = sha256(hash of row n-1 + "\\n" + canonical JSON of row n)`; the
single row of `audit_head` holds the last `seq` and hash. An append first updates that head row (a
write: PostgreSQL's row lock, SQLite's database write lock), so appends of every gateway process and
every server on the database are serialized and the chain stays linear. `verify` recomputes every hash:
an edited row no longer matches its hash, a deleted one leaves a gap (or a row that does not follow its
predecessor), a truncated tail no longer reaches the head. Pruning (`AuditLog.prune`, the retention
setting) deletes the oldest rows and keeps the last pruned row's `seq` and hash in the head, where the
remaining chain starts. Someone who can write the database can still rewrite the whole chain from an
edit onwards: keep the head hash that `modelhost audit verify` prints elsewhere to detect that too.

**Never a secret.** Rows hold field names and values the services pass; fields named like secrets are
dropped here whatever the caller passes (`_SECRET_FIELDS`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from sqlalchemy import delete, func, insert, select, update
from sqlalchemy.orm import Session

from modelhost.errors import NotFound
from modelhost.logs import REQUEST_ID
from modelhost.store.db import Database
from modelhost.store.models import AuditHead, AuditRow
from modelhost.store.pages import keyset_page
from modelhost.store.types import new_id, utcnow

GENESIS = "0" * 64  # the hash before the first row
HEAD_ID = 1
_SECRET_FIELDS = ("secret", "hash", "password", "api_key", "token", "credential")
_VERIFY_CHUNK = 1000


@dataclass(frozen=True, slots=True)
class Actor:
    """Who made a change: `kind` is `admin`, `account`, `deployment` (the key kinds) or `system` (the
    server itself); `address` the client's IP address; `user_id`, `email` and `subject` (the identity
    provider's `sub`, once they signed in) the person who owns the key (None: a service key, the admin
    key, the server)."""

    kind: str
    key_id: str | None = None
    account_id: str | None = None
    address: str | None = None
    user_id: str | None = None
    email: str | None = None
    subject: str | None = None


SYSTEM = Actor("system")
# Set on every request (its key checked), read only by the few that change something: a plain tuple,
# made into an `Actor` when a row is written.
_ACTOR: ContextVar[Actor | None] = ContextVar("modelhost_audit_actor", default=None)


def acting(actor: Actor) -> None:
    """The current request acts as this key (called by the auth dependency once the key is checked)."""
    _ACTOR.set(actor)


def current_actor() -> Actor:
    return _ACTOR.get() or SYSTEM


Changes = dict[str, dict[str, Any]]


def created(fields: Mapping[str, Any]) -> Changes:
    """The changes of something new: every field set, from nothing."""
    return {name: {"before": None, "after": value} for name, value in fields.items() if value is not None}


def removed(fields: Mapping[str, Any]) -> Changes:
    """The changes of something deleted: every field it had, to nothing."""
    return {name: {"before": value, "after": None} for name, value in fields.items() if value is not None}


def diff(before: Mapping[str, Any], after: Mapping[str, Any]) -> Changes:
    """The fields whose value changed, with both values."""
    return {
        name: {"before": before.get(name), "after": value}
        for name, value in after.items()
        if _plain(before.get(name)) != _plain(value)
    }


def record(
    session: Session,
    action: str,
    target_type: str,
    target_id: str,
    account_id: str | None,
    changes: Changes | None = None,
) -> None:
    """Append a row for a change made in `session`'s transaction (committed or rolled back with it).
    `account_id`: the account the target belongs to (whose key may read the row); None for the server's
    own."""
    actor = current_actor()
    session.execute(update(AuditHead).where(AuditHead.id == HEAD_ID).values(seq=AuditHead.seq + 1))
    seq, previous = session.execute(
        select(AuditHead.seq, AuditHead.hash).where(AuditHead.id == HEAD_ID)
    ).one()
    row = {
        "id": new_id("audit"),
        "seq": seq,
        "created_at": utcnow(),
        "actor_kind": actor.kind,
        "actor_key_id": actor.key_id,
        "actor_account_id": actor.account_id,
        "actor_user_id": actor.user_id,
        "actor_email": actor.email,
        "actor_subject": actor.subject,
        "client_address": actor.address,
        "request_id": REQUEST_ID.get(),
        "action": action,
        "target_type": target_type,
        "target_id": target_id,
        "account_id": account_id,
        "changes": _plain(_without_secrets(changes or {})),
        "prev_hash": previous,
    }
    row["hash"] = chain_hash(previous, row)
    session.execute(insert(AuditRow).values(**row))
    session.execute(update(AuditHead).where(AuditHead.id == HEAD_ID).values(hash=row["hash"]))


def chain_hash(previous: str, row: Mapping[str, Any]) -> str:
    """The row's hash: over the previous row's hash and every field of the row but its own hashes (the
    person's fields where set: rows written before they existed hash as they did)."""
    fields = {name: row[name] for name in _HASHED}
    fields.update({name: row[name] for name in _HASHED_WHERE_SET if row.get(name) is not None})
    fields["created_at"] = _plain(row["created_at"])
    canonical = json.dumps(fields, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(f"{previous}\n{canonical}".encode()).hexdigest()


_HASHED = (
    "id",
    "seq",
    "created_at",
    "actor_kind",
    "actor_key_id",
    "actor_account_id",
    "client_address",
    "request_id",
    "action",
    "target_type",
    "target_id",
    "account_id",
    "changes",
)
_HASHED_WHERE_SET = ("actor_user_id", "actor_email", "actor_subject")


def _without_secrets(changes: Changes) -> Changes:
    return {
        name: value
        for name, value in changes.items()
        if not any(word in name.lower() for word in _SECRET_FIELDS)
    }


def _plain(value: Any) -> Any:
    """JSON's own values, so that a row reads back from the database as it was hashed."""
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        items = [_plain(v) for v in value]
        return sorted(items) if isinstance(value, set | frozenset) else items
    return value


@dataclass(frozen=True, slots=True)
class Filters:
    """What `GET /v1/audit` narrows rows to; `account_id` is the caller's own for an account key."""

    account_id: str | None = None
    action: str | None = None
    target_type: str | None = None
    target_id: str | None = None
    actor_key_id: str | None = None
    since: datetime | None = None
    until: datetime | None = None


@dataclass(frozen=True, slots=True)
class Problem:
    seq: int
    id: str | None
    reason: str


@dataclass(frozen=True, slots=True)
class Verification:
    ok: bool
    rows: int
    first_seq: int | None
    last_seq: int
    head_hash: str
    pruned_through: int
    problems: list[Problem]


class AuditLog:
    """Reading, verifying and pruning the log (appending is `record`, in the changing transaction)."""

    def __init__(self, database: Database, retention_days: float) -> None:
        self._database = database
        self._retention_days = retention_days

    def note(
        self, action: str, target_type: str, target_id: str, account_id: str | None, changes: Changes
    ) -> None:
        """A row for what changes no row of ours (a realtime session's start and end), in a
        transaction of its own."""
        with self._database.transaction() as session:
            record(session, action, target_type, target_id, account_id, changes)

    def page(
        self, filters: Filters, after: str | None, limit: int, order: str
    ) -> tuple[list[AuditRow], bool]:
        with self._database.transaction() as session:
            query = select(AuditRow).where(*_conditions(filters))
            cursor = None
            if after is not None:
                cursor = session.scalars(query.where(AuditRow.id == after)).one_or_none()
            if after is not None and cursor is None:  # none, or not the caller's: the same 404
                raise NotFound(f"No such audit row: {after}", param="after", code="audit_row_not_found")
            return keyset_page(session, query, AuditRow, cursor, limit, order)

    def verify(self) -> Verification:
        """Recompute the chain from the last pruned row to the head. Reads the head first, then the rows
        up to it: rows appended meanwhile are past it and not read."""
        with self._database.transaction() as session:
            head = session.get(AuditHead, HEAD_ID)
            assert head is not None, "the audit head row is made by migration 0017"
        last_seq, head_hash = head.seq, head.hash
        problems: list[Problem] = []
        expected_seq, previous, rows, first = head.pruned_seq + 1, head.pruned_hash, 0, None
        for row in self._rows(head.pruned_seq, last_seq):
            rows += 1
            first = row.seq if first is None else first
            if row.seq != expected_seq:
                problems.append(Problem(row.seq, row.id, f"rows {expected_seq}..{row.seq - 1} are missing"))
            elif row.prev_hash != previous:
                problems.append(Problem(row.seq, row.id, f"does not follow row {row.seq - 1} (chain broken)"))
            if chain_hash(row.prev_hash, _fields(row)) != row.hash:
                problems.append(Problem(row.seq, row.id, "its contents do not match its hash (edited)"))
            expected_seq, previous = row.seq + 1, row.hash
        if expected_seq != last_seq + 1:
            problems.append(Problem(last_seq, None, f"rows {expected_seq}..{last_seq} are missing"))
        elif previous != head_hash:
            problems.append(Problem(last_seq, None, "the last row does not match the chain head"))
        return Verification(not problems, rows, first, last_seq, head_hash, head.pruned_seq, problems)

    def _rows(self, after_seq: int, last_seq: int) -> Iterator[AuditRow]:
        while True:
            with self._database.transaction() as session:
                chunk = session.scalars(
                    select(AuditRow)
                    .where(AuditRow.seq > after_seq, AuditRow.seq <= last_seq)
                    .order_by(AuditRow.seq)
                    .limit(_VERIFY_CHUNK)
                ).all()
            yield from chunk
            if len(chunk) < _VERIFY_CHUNK:
                return
            after_seq = chunk[-1].seq

    def prune(self) -> int:
        """Delete the rows older than the retention (none with 0: kept forever); how many. The last
        pruned row's seq and hash stay in the head, where `verify` starts."""
        if not self._retention_days:
            return 0
        cutoff = utcnow() - timedelta(days=self._retention_days)
        with self._database.transaction() as session:
            # the head's lock first, as an append takes it: no row is appended or pruned meanwhile
            session.execute(
                update(AuditHead).where(AuditHead.id == HEAD_ID).values(pruned_seq=AuditHead.pruned_seq)
            )
            last = session.scalar(select(func.max(AuditRow.seq)).where(AuditRow.created_at < cutoff))
            if last is None:
                return 0
            last_hash = session.scalar(select(AuditRow.hash).where(AuditRow.seq == last))
            deleted = session.execute(delete(AuditRow).where(AuditRow.seq <= last))
            session.execute(
                update(AuditHead)
                .where(AuditHead.id == HEAD_ID)
                .values(pruned_seq=last, pruned_hash=last_hash)
            )
            return int(deleted.rowcount)  # type: ignore[attr-defined]


def _fields(row: AuditRow) -> dict[str, Any]:
    return {name: getattr(row, name) for name in _HASHED + _HASHED_WHERE_SET}


def _conditions(filters: Filters) -> list[Any]:
    found: list[Any] = []
    for column, value in (
        (AuditRow.account_id, filters.account_id),
        (AuditRow.action, filters.action),
        (AuditRow.target_type, filters.target_type),
        (AuditRow.target_id, filters.target_id),
        (AuditRow.actor_key_id, filters.actor_key_id),
    ):
        if value is not None:
            found.append(column == value)
    if filters.since is not None:
        found.append(AuditRow.created_at >= filters.since)
    if filters.until is not None:
        found.append(AuditRow.created_at < filters.until)
    return found
