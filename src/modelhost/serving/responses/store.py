"""Stored responses in the database, per account; a deployment key sees its deployments' alone.

    (stored when done)  completed | incomplete | failed
    background:  queued ──> in_progress ──> completed | incomplete | failed
                    └───────────┴──cancel──> cancelled       silent past the stale window: failed

A background response's runner (its `owner`, a gateway process) beats (`beat`) while it generates,
and writes its stream events (`response_events`, numbered as streamed) in small batches for any process
to replay and follow, each with the engine events that made it; every move of its status is one
guarded UPDATE, so a cancel from any gateway process wins over a finish that comes after it.

A response whose owner went silent past the stale window, or handed it back (`release`: its process
stopped), is claimed by another gateway process (`claim`: a guarded UPDATE naming the new owner, so one
process takes it however many look), which goes on from its written events (`taken`); every write of
the runner (`beat`, `add_events`, `finish`) names its owner, so a silent one that wakes up writes
nothing more. It is taken from a dead owner once: a response whose second owner dies, or that cannot be
taken (no job: one with MCP tools, or made before takeovers), is reported `failed` (`interrupted`) the
next time anyone reads it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import and_, delete, func, insert, or_, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from modelhost.errors import InvalidRequest, NotFound
from modelhost.store.db import Database
from modelhost.store.models import ResponseEvent, StoredResponse
from modelhost.store.types import new_id, unix_seconds, utcnow

ACTIVE = ("queued", "in_progress")
INTERRUPTED: dict[str, object] = {
    "code": "interrupted",
    "message": "The response was interrupted: the server generating it stopped.",
}
Scope = frozenset[str] | None  # the deployments a key may see; None: the whole account
Written = tuple[dict[str, Any], bytes | None]  # a written event and its engine events (msgpack)


@dataclass(frozen=True)
class Claimed:
    """A background response this process now owns: taken from a dead owner (`died`) or handed back."""

    id: str
    deployment_id: str
    died: bool


@dataclass(frozen=True)
class Taken:
    """What a taker goes on from: the stored response, its job and its written events in order."""

    account_id: str
    deployment_id: str
    model: str
    previous_response_id: str | None
    settings: dict[str, Any]
    context: list[Any]
    input_items: list[Any]
    created_at: datetime
    job: bytes
    written: list[Written]


class ResponseStore:
    def __init__(self, database: Database, stale_seconds: float) -> None:
        self._database = database
        self._stale = timedelta(seconds=stale_seconds)

    def create(
        self,
        account_id: str,
        deployment_id: str,
        model: str,
        *,
        status: str,
        background: bool,
        previous_response_id: str | None,
        settings: dict[str, Any],
        context: list[Any],
        input_items: list[Any],
        output: list[Any] | None = None,
        usage: dict[str, Any] | None = None,
        error: dict[str, Any] | None = None,
        incomplete_reason: str | None = None,
        response_id: str | None = None,
        created_at: datetime | None = None,
        owner: str | None = None,
        job: bytes | None = None,
    ) -> dict[str, Any]:
        """Store a response: finished, or a background one `queued` for its `owner` (with the `job` a
        taker would need; none where it cannot be taken over)."""
        with self._database.transaction() as session:
            now = utcnow()
            row = StoredResponse(
                id=response_id or new_id("resp"),
                created_at=created_at or now,
                updated_at=now,
                account_id=account_id,
                deployment_id=deployment_id,
                model=model,
                status=status,
                background=background,
                previous_response_id=previous_response_id,
                settings=settings,
                context=context,
                input_items=input_items,
                output=output or [],
                usage=usage,
                error=error,
                incomplete_reason=incomplete_reason,
                completed_at=None if status in ACTIVE else now,
                owner=owner,
                job=job,
            )
            session.add(row)
            session.flush()
            return response_view(row)

    def get(self, account_id: str, scope: Scope, response_id: str) -> dict[str, Any]:
        with self._database.transaction() as session:
            return response_view(self._row(session, account_id, scope, response_id))

    def chain(self, account_id: str, scope: Scope, response_id: str) -> list[Any]:
        """Everything a response continuing `response_id` starts from: its context, input and output."""
        with self._database.transaction() as session:
            try:
                row = self._row(session, account_id, scope, response_id)
            except NotFound:
                raise InvalidRequest(
                    f"Previous response with id {response_id!r} not found.",
                    param="previous_response_id",
                    code="previous_response_not_found",
                ) from None
            if row.status in ACTIVE:
                raise InvalidRequest(
                    f"Previous response {response_id!r} is still {row.status}; wait until it has finished.",
                    param="previous_response_id",
                )
            return [*row.context, *row.input_items, *row.output]

    def start(self, response_id: str, owner: str | None = None) -> bool:
        """queued → in_progress; False when it was cancelled (or deleted) meanwhile."""
        return self._move(response_id, ("queued",), owner=owner, status="in_progress")

    def beat(self, response_id: str, owner: str | None = None) -> bool:
        """A running background response's heartbeat; False when it is no longer active, or no longer
        `owner`'s (taken over while it was silent)."""
        return self._move(response_id, ACTIVE, owner=owner, updated_at=utcnow())

    def finish(
        self,
        response_id: str,
        final_event: dict[str, Any] | None = None,
        *,
        owner: str | None = None,
        **values: Any,
    ) -> bool:
        """Record the outcome of an active response (status, output, usage, error...), and with it its
        stream's final event: a stream that has read it finds the response finished. Its job goes."""
        return self._move(
            response_id, ACTIVE, final_event, owner=owner, completed_at=utcnow(), job=None, **values
        )

    def release(self, response_id: str, owner: str) -> bool:
        """Hand an active response back (its process stops): the next claim, anywhere, takes it at once,
        and it does not count as a takeover from a dead owner."""
        with self._database.transaction() as session:
            moved = session.execute(
                update(StoredResponse)
                .where(
                    StoredResponse.id == response_id,
                    StoredResponse.owner == owner,
                    StoredResponse.status.in_(ACTIVE),
                )
                .values(owner=None)
                .execution_options(synchronize_session=False)
            )
            return bool(getattr(moved, "rowcount", 0))

    def claim(self, owner: str) -> Claimed | None:
        """An active background response nobody runs, now `owner`'s: handed back, or silent past the
        stale window and never taken from a dead owner before. One guarded UPDATE per candidate, so of
        several processes looking at once exactly one takes it; it leaves the stale window at once
        (`updated_at`), and is `in_progress` (a queued one whose owner died before starting it too)."""
        stale = utcnow() - self._stale
        claimable = (
            StoredResponse.status.in_(ACTIVE),
            StoredResponse.job.is_not(None),
            or_(
                StoredResponse.owner.is_(None),
                and_(StoredResponse.updated_at < stale, StoredResponse.takeovers == 0),
            ),
        )
        with self._database.transaction() as session:
            candidates = session.execute(
                select(StoredResponse.id, StoredResponse.deployment_id, StoredResponse.owner)
                .where(*claimable)
                .order_by(StoredResponse.updated_at)
                .limit(8)
            ).all()
            for response_id, deployment_id, was in candidates:
                died = was is not None
                taken = session.execute(
                    update(StoredResponse)
                    .where(
                        StoredResponse.id == response_id,
                        *claimable,
                        StoredResponse.owner == was if died else StoredResponse.owner.is_(None),
                    )
                    .values(
                        owner=owner,
                        status="in_progress",
                        updated_at=utcnow(),
                        takeovers=StoredResponse.takeovers + (1 if died else 0),
                    )
                    .execution_options(synchronize_session=False)
                )
                if getattr(taken, "rowcount", 0) == 1:
                    return Claimed(response_id, deployment_id, died)
        return None

    def taken(self, response_id: str, owner: str) -> Taken | None:
        """What `owner`, having claimed the response, goes on from: read after the claim, so that every
        event its silent owner wrote is here; None when it is no longer `owner`'s (cancelled, deleted)."""
        with self._database.transaction() as session:
            row = session.get(StoredResponse, response_id)
            if row is None or row.owner != owner or row.status not in ACTIVE or row.job is None:
                return None
            written = session.execute(
                select(ResponseEvent.event, ResponseEvent.engine)
                .where(ResponseEvent.response_id == response_id)
                .order_by(ResponseEvent.sequence_number)
            ).all()
            return Taken(
                row.account_id,
                row.deployment_id,
                row.model,
                row.previous_response_id,
                row.settings,
                row.context,
                row.input_items,
                row.created_at,
                row.job,
                [(event, engine) for event, engine in written],
            )

    def cancel(self, account_id: str, scope: Scope, response_id: str) -> dict[str, Any]:
        with self._database.transaction() as session:
            row = self._row(session, account_id, scope, response_id)
            if not row.background:
                raise InvalidRequest(
                    "Only responses created with background: true can be cancelled.", param="response_id"
                )
        self._move(response_id, ACTIVE, status="cancelled", completed_at=utcnow(), job=None)
        return self.get(account_id, scope, response_id)

    def delete(self, account_id: str, scope: Scope, response_id: str) -> None:
        with self._database.transaction() as session:
            self._row(session, account_id, scope, response_id)
            session.execute(delete(StoredResponse).where(StoredResponse.id == response_id))

    def streamed(self, account_id: str, scope: Scope, response_id: str) -> dict[str, Any]:
        """A response whose events may be streamed (`GET ...?stream=true`): a background one."""
        with self._database.transaction() as session:
            row = self._row(session, account_id, scope, response_id)
            if not row.background:
                raise InvalidRequest(
                    "Only responses created with background: true can be streamed; "
                    "retrieve this one without stream.",
                    param="stream",
                )
            return response_view(row)

    def add_events(
        self,
        response_id: str,
        events: list[dict[str, Any]],
        owner: str | None = None,
        engine: list[bytes | None] | None = None,
    ) -> bool:
        """Write a batch of a background response's numbered events (each with its `engine` events);
        False when it was deleted, or is no longer `owner`'s: the owner's row is locked (and beaten)
        in the same transaction, so a claim comes wholly before or after the batch."""
        rows = [
            {
                "response_id": response_id,
                "sequence_number": e["sequence_number"],
                "event": e,
                "engine": engine[i] if engine else None,
            }
            for i, e in enumerate(events)
        ]
        try:
            with self._database.transaction() as session:
                if owner is not None:
                    mine = session.execute(
                        update(StoredResponse)
                        .where(StoredResponse.id == response_id, StoredResponse.owner == owner)
                        .values(updated_at=utcnow())
                        .execution_options(synchronize_session=False)
                    )
                    if not getattr(mine, "rowcount", 0):
                        return False
                session.execute(insert(ResponseEvent), rows)
        except IntegrityError:  # deleted meanwhile (its events went with it)
            return False
        return True

    def events_after(self, response_id: str, after: int, limit: int) -> list[dict[str, Any]]:
        """Up to `limit` of its written events numbered after `after`, in order."""
        with self._database.transaction() as session:
            events = session.scalars(
                select(ResponseEvent.event)
                .where(ResponseEvent.response_id == response_id, ResponseEvent.sequence_number > after)
                .order_by(ResponseEvent.sequence_number)
                .limit(limit)
            )
            return list(events)

    def last_event(self, response_id: str) -> int:
        """The number of its last written event; -1 when none was."""
        with self._database.transaction() as session:
            last = session.scalar(
                select(func.max(ResponseEvent.sequence_number)).where(
                    ResponseEvent.response_id == response_id
                )
            )
            return -1 if last is None else int(last)

    def input_items(
        self, account_id: str, scope: Scope, response_id: str, after: str | None, limit: int, order: str
    ) -> tuple[list[Any], bool]:
        """The items the model was given (the chain before it, then this request's input), paged."""
        with self._database.transaction() as session:
            row = self._row(session, account_id, scope, response_id)
            items = [*row.context, *row.input_items]
        if order == "desc":
            items.reverse()
        if after is not None:
            ids = [item.get("id") if isinstance(item, dict) else None for item in items]
            if after not in ids:
                raise InvalidRequest(f"No input item {after!r} in this response.", param="after")
            items = items[ids.index(after) + 1 :]
        return items[:limit], len(items) > limit

    def _row(self, session: Session, account_id: str, scope: Scope, response_id: str) -> StoredResponse:
        row = session.get(StoredResponse, response_id)
        if (
            row is None
            or row.account_id != account_id
            or (scope is not None and row.deployment_id not in scope)
        ):
            raise NotFound(f"No response {response_id!r}.", param="response_id")
        if row.status in ACTIVE and row.updated_at < utcnow() - self._stale:
            # silent: a gateway process takes it over (`claim`), unless it cannot be (again)
            takeable = row.job is not None and (row.owner is None or not row.takeovers)
            if not takeable:
                row.status, row.error, row.completed_at = "failed", INTERRUPTED, utcnow()
        return row

    def _move(
        self,
        response_id: str,
        sources: tuple[str, ...],
        event: dict[str, Any] | None = None,
        owner: str | None = None,
        **values: Any,
    ) -> bool:
        """One guarded move: from `sources`, and (for the runner's own moves) while `owner`'s."""
        guard = [] if owner is None else [StoredResponse.owner == owner]
        with self._database.transaction() as session:
            moved = session.execute(
                update(StoredResponse)
                .where(StoredResponse.id == response_id, StoredResponse.status.in_(sources), *guard)
                .values(**values)
            )
            done = bool(getattr(moved, "rowcount", 0))
            if done and event is not None:
                session.add(
                    ResponseEvent(
                        response_id=response_id, sequence_number=event["sequence_number"], event=event
                    )
                )
            return done


def response_view(row: StoredResponse) -> dict[str, Any]:
    """The Response object of OpenAI's API."""
    settings = dict(row.settings)
    return {
        "id": row.id,
        "object": "response",
        "created_at": unix_seconds(row.created_at),
        "completed_at": unix_seconds(row.completed_at) if row.status not in ACTIVE else None,
        "status": row.status,
        "background": row.background,
        "model": row.model,
        "output": row.output,
        "usage": row.usage,
        "error": row.error,
        "incomplete_details": {"reason": row.incomplete_reason} if row.incomplete_reason else None,
        "previous_response_id": row.previous_response_id,
        **settings,
    }
