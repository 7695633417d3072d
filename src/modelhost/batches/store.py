"""Batches in the database: the table is the queue (as for video jobs), every move a guarded UPDATE.

    validating ──> in_progress ──> finalizing ──> completed
        │              │  └──(window passed)──> finalizing ──> expired
        └──> failed    └──cancel──> cancelling ──> finalizing ──> cancelled

A runner claims a batch (`claim`: unclaimed, or its runner silent for `stale` seconds: a server that
was killed) and beats `updated_at` while it works. The answer to each line is a row keyed by (batch,
line): recorded once (`record` skips lines already there), so a batch resumed after a crash runs only
the lines without an answer and its files hold each `custom_id` exactly once. `finalize` streams the
output and error files from those rows, in the input's order, then in one transaction adds the files,
deletes the rows and ends the batch: a restart while `finalizing` writes the files again (the same
blob keys and file IDs) and ends it once.

What a batch holds outside the Files API (its input copy, its answers) is billed as storage while it
holds it (`stored_bytes`, a storage meter under the batch's ID), and its answers count against the
output budget (`output_bytes`, `MODELHOST_BATCH_MAX_OUTPUT_BYTES`).
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, BinaryIO

from sqlalchemy import delete, insert, or_, select, update
from sqlalchemy.orm import Session

from modelhost.artifacts.blobstore import BlobStore
from modelhost.artifacts.disk import require_room_for_upload
from modelhost.batches.answers import Answer
from modelhost.batches.files import OUTPUT_PURPOSE, Files, Owner, StorageChanged
from modelhost.config import Settings
from modelhost.errors import Conflict, NotFound
from modelhost.store.db import Database
from modelhost.store.models import Batch, BatchLine
from modelhost.store.pages import keyset_page
from modelhost.store.turns import in_turn
from modelhost.store.types import new_id, unix_seconds, utcnow

ACTIVE = ("validating", "in_progress", "finalizing", "cancelling")
COPY_CHUNK = 1024 * 1024
# Rows `finalize` holds at once: a few answers of the largest size a line may have
FINALIZE_BYTES = 32 * 1024 * 1024


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
    output_bytes: int = 0  # its answers recorded so far, against the output budget
    failing: bool = False  # failed while running (its budget): what it ends as if taken over finalizing


class Batches:
    def __init__(
        self,
        database: Database,
        blobs: BlobStore,
        files: Files,
        settings: Settings,
        storage_changed: StorageChanged,
    ) -> None:
        self._database = database
        self._blobs = blobs
        self._files = files
        self._settings = settings
        self._storage_changed = storage_changed

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
        (its file may be deleted while the batch runs), streamed, under the rules of any upload: the
        free-disk floor (507), and billed as storage while the batch holds it. `traceparent` is the
        creating request's span (`tracing.parent()`), kept for its lines' spans to link to."""
        source, size = self._files.located(owner, input_file_id, "batch")
        require_room_for_upload(self._settings, size)
        batch_id = new_id("batch")
        key = f"batches/{batch_id}/input.jsonl"
        with self._blobs.open(source) as handle:
            self._files.write(key, iter(lambda: handle.read(COPY_CHUNK), b""))
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
                output_bytes=0,
                stored_bytes=size,
                expires_at=utcnow() + timedelta(seconds=window_seconds),
            )
            session.add(row)
            session.flush()
            self._storage_changed(session, batch_id)
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

    def claim(self, runner: str, stale_seconds: float, per_account: int) -> Claimed | None:
        """An active batch nobody runs (or whose runner has been silent `stale_seconds`), taken in turn
        between accounts: of the accounts running fewer than `per_account` batches (on any server),
        the one running fewest, then the one waiting longest; its oldest batch. So one account's
        queue of batches never holds another's back."""
        stale = utcnow() - timedelta(seconds=stale_seconds)
        claimable = (Batch.status.in_(ACTIVE), or_(Batch.claimed_by.is_(None), Batch.updated_at < stale))
        running = (Batch.status.in_(ACTIVE), Batch.claimed_by.is_not(None), Batch.updated_at >= stale)
        with self._database.transaction() as session:
            for row in in_turn(session, Batch, claimable, running, per_account):
                if self._take(session, row, runner):
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
                        row.output_bytes,
                        bool(row.errors),
                    )
        return None

    @staticmethod
    def _take(session: Session, row: Batch, runner: str) -> bool:
        """Claim `row` unless another runner did since it was read."""
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
        return bool(taken.rowcount == 1)  # type: ignore[attr-defined]

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

    def input(self, claimed: Claimed) -> BinaryIO:
        """The batch's copy of its input, open (seekable): the runner reads its lines as it sends them."""
        return self._blobs.open(claimed.input_key)

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
        with self._database.transaction() as session:
            self._move_in(
                session,
                batch_id,
                runner,
                "validating",
                status="failed",
                failed_at=utcnow(),
                errors=errors,
                claimed_by=None,
                stored_bytes=0,
            )
            self._storage_changed(session, batch_id)
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
            size = sum(len(a.record) + 1 for a in fresh)  # as in its file, with its newline
            row.output_bytes += size
            row.stored_bytes += size  # billed from the next storage tick
            row.input_tokens += sum(a.tokens[0] for a in fresh)
            row.output_tokens += sum(a.tokens[1] for a in fresh)
            row.completed += sum(1 for a in fresh if a.ok)
            row.failed += sum(1 for a in fresh if not a.ok)
            row.updated_at = utcnow()
            return True

    def finalize(
        self, batch_id: str, runner: str, final: str, errors: list[dict[str, Any]] | None = None
    ) -> None:
        """Write the output and error files from the recorded answers, then end the batch as `final`
        (completed, expired, cancelled, or failed with `errors`). The files are streamed (a page of
        rows in memory, whatever the batch's size) under keys and IDs derived from the batch, and
        added in the transaction that deletes the answers and ends the batch: a runner that dies
        before it leaves the batch `finalizing` with its answers, and the next one writes the same
        files again and ends it once."""
        with self._database.transaction() as session:
            row = session.get(Batch, batch_id)
            if row is None or row.claimed_by != runner:
                return
            if row.finalizing_at is None:
                row.finalizing_at = utcnow()
            row.status = "finalizing"
            if errors:
                row.errors = errors  # a runner taking over knows it ends `failed`
            owner, expires = Owner(row.account_id, row.key_id), row.output_expires_seconds
        written = {ok: self._write_answers(batch_id, ok) for ok in (True, False)}
        with self._database.transaction() as session:
            row = session.get(Batch, batch_id, with_for_update=True)
            ours = row is not None and row.claimed_by == runner and row.status == "finalizing"
            if row is not None and ours:
                self._end(session, row, owner, expires, final, written)
        if not ours:  # another runner took it over meanwhile: it ends it, with files of its own
            for _, key, _, _, _ in written.values():
                self._blobs.delete_prefix(key)
            return
        self._blobs.delete_prefix(f"batches/{batch_id}")  # its copy of the input: it has ended
        for _, key, _, _, count in written.values():
            if not count:
                self._blobs.delete_prefix(key)  # an empty file is not made

    def _end(
        self,
        session: Session,
        row: Batch,
        owner: Owner,
        expires: int | None,
        final: str,
        written: dict[bool, tuple[str, str, int, str, int]],
    ) -> None:
        """The batch's files added and its answers deleted as it ends `final`, in `session`."""
        batch_id = row.id
        ids: dict[bool, str | None] = {}
        for ok, (file_id, key, size, digest, count) in written.items():
            ids[ok] = file_id if count else None
            if count:
                name = f"{batch_id}_{'output' if ok else 'error'}.jsonl"
                self._files.add_in(
                    session, owner, (file_id, key, size, digest), name, OUTPUT_PURPOSE, expires
                )
        session.execute(delete(BatchLine).where(BatchLine.batch_id == batch_id))
        row.status, row.output_file_id, row.error_file_id = final, ids[True], ids[False]
        row.completed, row.failed, row.claimed_by = written[True][4], written[False][4], None
        row.stored_bytes = 0
        setattr(row, f"{final}_at", utcnow())
        session.flush()
        self._storage_changed(session, batch_id)  # its answers are gone: its meter closes

    def _write_answers(self, batch_id: str, ok: bool) -> tuple[str, str, int, str, int]:
        """Stream the output (`ok`) or error file's lines into its blob: (file ID, blob key, size,
        SHA-256, lines). The ID is derived from the batch's, so a second try makes the same file; the
        blob key is each try's own, so a runner that lost the batch while it wrote (and then deletes its
        blobs) never overwrites the files of the runner that ended it."""
        kind = "output" if ok else "error"
        file_id = "file_" + hashlib.sha256(f"{batch_id}:{kind}".encode()).hexdigest()[:24]
        key = f"files/{file_id}.{secrets.token_hex(8)}"  # one length: no key is another's prefix
        count = 0

        def records() -> Iterator[bytes]:
            nonlocal count
            page = max(1, min(1000, FINALIZE_BYTES // self._settings.batch_max_answer_bytes))
            with self._database.transaction() as session:
                rows = session.scalars(
                    select(BatchLine.record)
                    .where(BatchLine.batch_id == batch_id, BatchLine.ok == ok)
                    .order_by(BatchLine.line)
                    .execution_options(yield_per=page)  # a server-side cursor where there is one
                )
                for record in rows:
                    count += 1
                    yield record.encode() + b"\n"

        size, digest = self._files.write(key, records())
        return file_id, key, size, digest, count

    def _move(self, batch_id: str, runner: str, source: str, **values: Any) -> None:
        with self._database.transaction() as session:
            self._move_in(session, batch_id, runner, source, **values)

    @staticmethod
    def _move_in(session: Session, batch_id: str, runner: str, source: str, **values: Any) -> None:
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
