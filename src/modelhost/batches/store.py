"""Batches in the database: the table is the queue (as for video jobs), every move a guarded UPDATE.

    validating ──> in_progress ──> finalizing ──> completed
        │              │  └──(window passed)──> finalizing ──> expired
        └──> failed    └──cancel──> cancelling ──> finalizing ──> cancelled

A runner claims a batch (`claim`: unclaimed, or its runner silent for `stale` seconds: a server that
was killed) and beats `updated_at` while it works. The answer to each line is a row keyed by (batch,
line): recorded once (`record` skips lines already there), so a batch resumed after a crash runs only
the lines without an answer and its files hold each `custom_id` exactly once. `finalize` writes the
output and error files from those rows, in the input's order.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import orjson
from sqlalchemy import insert, or_, select, update

from modelhost.artifacts.blobstore import BlobStore
from modelhost.batches.files import OUTPUT_PURPOSE, Files, Owner
from modelhost.errors import Conflict, NotFound
from modelhost.store.db import Database
from modelhost.store.models import Batch, BatchLine
from modelhost.store.pages import keyset_page
from modelhost.store.types import new_id, unix_seconds, utcnow

USAGE = re.compile(rb'"usage"\s*:')
INPUT_TOKENS = re.compile(rb'"(input_tokens|prompt_tokens)"\s*:\s*(\d+)')
OUTPUT_TOKENS = re.compile(rb'"(output_tokens|completion_tokens)"\s*:\s*(\d+)')
ACTIVE = ("validating", "in_progress", "finalizing", "cancelling")
EXPIRED_LINE = {
    "code": "batch_expired",
    "message": "This request could not be executed before the completion window expired.",
}


@dataclass(frozen=True, slots=True)
class Claimed:
    id: str
    account_id: str
    key_id: str
    endpoint: str
    status: str
    input_key: str
    expires_at: datetime
    cancelled: bool  # cancelled before it ended (what a batch taken over while finalizing ends as)
    traceparent: str  # its creator's request, which each line's span links to ("": none)


@dataclass(frozen=True, slots=True)
class Answer:
    """One line's answer: its line of the output file (`ok`) or of the error file, as JSON, and the
    input and output tokens it used."""

    line: int
    ok: bool
    record: bytes
    tokens: tuple[int, int] = (0, 0)


def answered(batch_id: str, line: int, custom_id: str, status: int, request_id: str, body: bytes) -> Answer:
    """A line the app answered: a 2xx goes to the output file, any other answer to the error file. The
    answer's JSON body goes into the line as it came (a batch of embeddings is mostly numbers: parsing
    and writing them again would cost more than the rest of the line's way)."""
    if body[:1] not in (b"{", b"["):  # not the JSON every route answers: kept as text
        body = orjson.dumps(body.decode(errors="replace"))
    head = orjson.dumps({"id": line_id(batch_id, line), "custom_id": custom_id})[:-1]
    response = b',"response":{"status_code":%d,"request_id":%s,"body":' % (status, orjson.dumps(request_id))
    return Answer(line, 200 <= status < 300, head + response + body + b'},"error":null}', _usage(body))


def failed(batch_id: str, line: int, custom_id: str, error: dict[str, str]) -> Answer:
    """A line that got no answer (the window passed, the key was revoked)."""
    record = {"id": line_id(batch_id, line), "custom_id": custom_id, "response": None, "error": error}
    return Answer(line, False, orjson.dumps(record))


class Batches:
    def __init__(self, database: Database, blobs: BlobStore, files: Files) -> None:
        self._database = database
        self._blobs = blobs
        self._files = files

    # ---------------------------------------------------------------- the API's side

    def create(
        self,
        owner: Owner,
        input_file_id: str,
        endpoint: str,
        window_seconds: float,
        completion_window: str,
        metadata: dict[str, str] | None,
        output_expires_seconds: int | None,
        traceparent: str = "",
    ) -> dict[str, Any]:
        """A batch of the input file, `validating`: the runner checks its lines. The input is copied
        (its file may be deleted while the batch runs). `traceparent` is the creating request's span
        (`tracing.parent()`), kept for its lines' spans to link to."""
        data = self._files.read(owner, input_file_id, "batch")
        batch_id = new_id("batch")
        key = f"batches/{batch_id}/input.jsonl"
        writer = self._blobs.writer(key)
        writer.write(data)
        writer.commit()
        with self._database.transaction() as session:
            row = Batch(
                id=batch_id,
                account_id=owner.account_id,
                key_id=owner.key_id,
                endpoint=endpoint,
                input_file_id=input_file_id,
                input_key=key,
                completion_window=completion_window,
                status="validating",
                batch_metadata=metadata,
                output_expires_seconds=output_expires_seconds,
                traceparent=traceparent or None,
                total=0,
                completed=0,
                failed=0,
                input_tokens=0,
                output_tokens=0,
                expires_at=utcnow() + timedelta(seconds=window_seconds),
            )
            session.add(row)
            session.flush()
            return view(row)

    def get(self, owner: Owner, batch_id: str) -> dict[str, Any]:
        with self._database.transaction() as session:
            return view(self._owned(session, owner, batch_id))

    def page(
        self, owner: Owner, after: str | None, limit: int, order: str = "desc"
    ) -> tuple[list[dict[str, Any]], bool]:
        with self._database.transaction() as session:
            query = select(Batch).where(*owner.filter(Batch))
            cursor = None if after is None else self._owned(session, owner, after)
            rows, more = keyset_page(session, query, Batch, cursor, limit, order)
            return [view(r) for r in rows], more

    def cancel(self, owner: Owner, batch_id: str) -> dict[str, Any]:
        """`cancelling` until its runner has stopped (the lines answered so far are kept)."""
        with self._database.transaction() as session:
            row = self._owned(session, owner, batch_id)
            if row.status in ("validating", "in_progress"):
                row.status, row.cancelling_at = "cancelling", utcnow()
            elif row.status != "cancelling":
                raise Conflict(
                    f"Cannot cancel a batch with status '{row.status}'.", code="batch_not_cancellable"
                )
            session.flush()
            return view(row)

    # ---------------------------------------------------------------- the runner's side

    def claim(self, runner: str, stale_seconds: float) -> Claimed | None:
        """The oldest active batch nobody runs (or whose runner has been silent `stale_seconds`)."""
        stale = utcnow() - timedelta(seconds=stale_seconds)
        with self._database.transaction() as session:
            candidates = session.scalars(
                select(Batch)
                .where(
                    Batch.status.in_(ACTIVE),
                    or_(Batch.claimed_by.is_(None), Batch.updated_at < stale),
                )
                .order_by(Batch.created_at)
                .limit(5)
            ).all()
            for row in candidates:
                taken = session.execute(
                    update(Batch)
                    .where(
                        Batch.id == row.id,
                        Batch.updated_at == row.updated_at,
                        Batch.claimed_by.is_not_distinct_from(row.claimed_by),
                    )
                    .values(claimed_by=runner, updated_at=utcnow())
                    .execution_options(synchronize_session=False)
                )
                if taken.rowcount == 1:  # type: ignore[attr-defined]
                    return Claimed(
                        row.id,
                        row.account_id,
                        row.key_id,
                        row.endpoint,
                        row.status,
                        row.input_key,
                        row.expires_at,
                        row.cancelling_at is not None,
                        row.traceparent or "",
                    )
        return None

    def beat(self, batch_id: str, runner: str) -> str | None:
        """Still ours: its status now (a cancel shows here); None if another runner took it over."""
        with self._database.transaction() as session:
            moved = session.execute(
                update(Batch)
                .where(Batch.id == batch_id, Batch.claimed_by == runner)
                .values(updated_at=utcnow())
                .execution_options(synchronize_session=False)
            )
            if moved.rowcount != 1:  # type: ignore[attr-defined]
                return None
            row = session.get(Batch, batch_id)
            return None if row is None else row.status

    def release(self, batch_id: str, runner: str) -> None:
        """This runner stops (its server shuts down): another takes the batch over at once."""
        with self._database.transaction() as session:
            session.execute(
                update(Batch)
                .where(Batch.id == batch_id, Batch.claimed_by == runner)
                .values(claimed_by=None)
                .execution_options(synchronize_session=False)
            )

    def input(self, claimed: Claimed) -> bytes:
        with self._blobs.open(claimed.input_key) as handle:
            return handle.read()

    def validated(self, batch_id: str, runner: str, total: int, model: str | None) -> None:
        self._move(
            batch_id,
            runner,
            "validating",
            status="in_progress",
            in_progress_at=utcnow(),
            total=total,
            model=model,
        )

    def invalid(self, batch_id: str, runner: str, errors: list[dict[str, Any]]) -> None:
        self._move(
            batch_id,
            runner,
            "validating",
            status="failed",
            failed_at=utcnow(),
            errors=errors,
            claimed_by=None,
        )
        self._blobs.delete_prefix(f"batches/{batch_id}")  # its copy of the input: nothing will run

    def answered(self, batch_id: str) -> set[int]:
        with self._database.transaction() as session:
            return set(session.scalars(select(BatchLine.line).where(BatchLine.batch_id == batch_id)))

    def record(self, batch_id: str, runner: str, answers: list[Answer]) -> bool:
        """Record answers not recorded yet, and count them; False if the batch is no longer this
        runner's (nothing is recorded then)."""
        with self._database.transaction() as session:
            row = session.get(Batch, batch_id, with_for_update=True)
            if row is None or row.claimed_by != runner:
                return False
            numbers = [a.line for a in answers]
            known = set(
                session.scalars(
                    select(BatchLine.line).where(BatchLine.batch_id == batch_id, BatchLine.line.in_(numbers))
                )
            )
            fresh = [a for a in answers if a.line not in known]
            if fresh:
                rows = [
                    {"batch_id": batch_id, "line": a.line, "ok": a.ok, "record": a.record.decode()}
                    for a in fresh
                ]
                session.execute(insert(BatchLine), rows)
            row.input_tokens += sum(a.tokens[0] for a in fresh)
            row.output_tokens += sum(a.tokens[1] for a in fresh)
            row.completed += sum(1 for a in fresh if a.ok)
            row.failed += sum(1 for a in fresh if not a.ok)
            row.updated_at = utcnow()
            return True

    def finalize(self, batch_id: str, runner: str, final: str) -> None:
        """Write the output and error files from the recorded answers, then end the batch as `final`
        (completed, expired or cancelled)."""
        with self._database.transaction() as session:
            row = session.get(Batch, batch_id)
            if row is None or row.claimed_by != runner:
                return
            if row.finalizing_at is None:
                row.finalizing_at = utcnow()
            row.status = "finalizing"
            owner, expires = Owner(row.account_id, row.key_id), row.output_expires_seconds
        output, errors = bytearray(), bytearray()
        completed = failed = 0
        with self._database.transaction() as session:
            answered = session.execute(
                select(BatchLine.ok, BatchLine.record)
                .where(BatchLine.batch_id == batch_id)
                .order_by(BatchLine.line)
            )
            for ok, record in answered:  # rows, not ORM objects: a batch may have 50,000
                (output if ok else errors).extend(record.encode() + b"\n")
                completed += ok
                failed += not ok
        expires_at = None if expires is None else utcnow() + timedelta(seconds=expires)

        def stored(name: str, data: bytearray) -> str | None:
            if not data:
                return None
            return str(self._files.store(owner, name, OUTPUT_PURPOSE, bytes(data), expires_at)["id"])

        output_id = stored(f"{batch_id}_output.jsonl", output)
        error_id = stored(f"{batch_id}_error.jsonl", errors)
        now = utcnow()
        with self._database.transaction() as session:
            row = session.get(Batch, batch_id)
            if row is None:
                return
            row.status, row.output_file_id, row.error_file_id = final, output_id, error_id
            row.completed, row.failed, row.claimed_by = completed, failed, None
            setattr(row, f"{final}_at", now)
        self._blobs.delete_prefix(f"batches/{batch_id}")  # its copy of the input: it has ended

    def _move(self, batch_id: str, runner: str, source: str, **values: Any) -> None:
        with self._database.transaction() as session:
            session.execute(
                update(Batch)
                .where(Batch.id == batch_id, Batch.claimed_by == runner, Batch.status == source)
                .values(updated_at=utcnow(), **values)
                .execution_options(synchronize_session=False)
            )

    def _owned(self, session: Any, owner: Owner, batch_id: str) -> Batch:
        row: Batch | None = session.get(Batch, batch_id)
        if row is None or not owner.sees(row.account_id, row.key_id):
            raise NotFound(f"No such Batch object: {batch_id}", code="batch_not_found")
        return row


def line_id(batch_id: str, line: int) -> str:
    """The `id` of a line's answer: unique, and the same if the line runs again after a crash."""
    return f"batch_req_{batch_id.removeprefix('batch_')}_{line}"


def _usage(body: bytes) -> tuple[int, int]:
    """(input, output) tokens of one answer, from its body's `usage` (chat and completions name them
    prompt/completion tokens, the Responses API input/output tokens), read from the JSON text after
    its last `"usage"` key without parsing the rest. A string in the body cannot fake one: inside a
    JSON string every quote is escaped, so `"prompt_tokens":` never matches there."""
    starts = [match.start() for match in USAGE.finditer(body)]
    if not starts:
        return 0, 0
    tail = body[starts[-1] :]
    given = INPUT_TOKENS.search(tail)
    made = OUTPUT_TOKENS.search(tail)
    return int(given.group(2)) if given else 0, int(made.group(2)) if made else 0


def view(row: Batch) -> dict[str, Any]:
    """OpenAI's batch object."""
    return {
        "id": row.id,
        "object": "batch",
        "endpoint": row.endpoint,
        "model": row.model,
        "errors": None if not row.errors else {"object": "list", "data": row.errors},
        "input_file_id": row.input_file_id,
        "completion_window": row.completion_window,
        "status": row.status,
        "output_file_id": row.output_file_id,
        "error_file_id": row.error_file_id,
        "created_at": unix_seconds(row.created_at),
        "in_progress_at": unix_seconds(row.in_progress_at),
        "expires_at": unix_seconds(row.expires_at),
        "finalizing_at": unix_seconds(row.finalizing_at),
        "completed_at": unix_seconds(row.completed_at),
        "failed_at": unix_seconds(row.failed_at),
        "expired_at": unix_seconds(row.expired_at),
        "cancelling_at": unix_seconds(row.cancelling_at),
        "cancelled_at": unix_seconds(row.cancelled_at),
        "request_counts": {"total": row.total, "completed": row.completed, "failed": row.failed},
        "usage": {
            "input_tokens": row.input_tokens,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": row.output_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": row.input_tokens + row.output_tokens,
        },
        "metadata": row.batch_metadata,
    }
