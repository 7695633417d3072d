"""The Files API's files (`/v1/files`): uploaded by an account (batch input) or written by a batch (its
output and error files), stored in the blob store with their SHA-256, billed as storage like artifacts
(`storage_changed`), seen only by their own account.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from modelhost.artifacts.blobstore import BlobStore
from modelhost.batches.input import check_jsonl
from modelhost.errors import InvalidRequest, NotFound
from modelhost.store.db import Database
from modelhost.store.models import UploadedFile
from modelhost.store.pages import keyset_page
from modelhost.store.types import new_id, unix_seconds, utcnow

# OpenAI's purposes a file may be uploaded with, and the one batches write theirs with
UPLOAD_PURPOSES = ("assistants", "batch", "fine-tune", "vision", "user_data", "evals")
OUTPUT_PURPOSE = "batch_output"
PURPOSES = (*UPLOAD_PURPOSES, OUTPUT_PURPOSE)
EXPIRY_SECONDS = (3600, 30 * 24 * 3600)  # what OpenAI accepts for `expires_after.seconds`
StorageChanged = Callable[[Session, str], None]


@dataclass(frozen=True, slots=True)
class Owner:
    """Who asks: the account and the key. An account key sees every file and batch of its account; a
    deployment key (`scoped`) only those made with it, so that a key handed to one team does not read
    another team's batch output."""

    account_id: str
    key_id: str
    scoped: bool = False

    def sees(self, account_id: str, key_id: str) -> bool:
        return account_id == self.account_id and (not self.scoped or key_id == self.key_id)

    def filter(self, table: Any) -> list[Any]:
        """The same as `sees`, as a query's conditions on `table` (it has account_id and key_id)."""
        conditions = [table.account_id == self.account_id]
        return [*conditions, table.key_id == self.key_id] if self.scoped else conditions


class Files:
    def __init__(
        self, database: Database, blobs: BlobStore, max_batch_bytes: int, storage_changed: StorageChanged
    ) -> None:
        self._database = database
        self._blobs = blobs
        self._max_batch_bytes = max_batch_bytes
        self._storage_changed = storage_changed

    def upload(
        self, owner: Owner, filename: str, purpose: str, data: bytes, expires_after: int | None
    ) -> dict[str, Any]:
        """A new file of the account. Batch input is checked here (JSONL within the limits)."""
        if purpose not in UPLOAD_PURPOSES:
            raise InvalidRequest(
                f"'{purpose}' is not one of {', '.join(UPLOAD_PURPOSES)} - 'purpose'.", param="purpose"
            )
        if expires_after is not None and not EXPIRY_SECONDS[0] <= expires_after <= EXPIRY_SECONDS[1]:
            raise InvalidRequest(
                f"'expires_after.seconds' must be between {EXPIRY_SECONDS[0]} and {EXPIRY_SECONDS[1]}.",
                param="expires_after.seconds",
            )
        if purpose == "batch":
            check_jsonl(data, self._max_batch_bytes)
        expires_at = None if expires_after is None else utcnow() + timedelta(seconds=expires_after)
        return self.store(owner, filename, purpose, data, expires_at)

    def store(
        self, owner: Owner, filename: str, purpose: str, data: bytes, expires_at: datetime | None
    ) -> dict[str, Any]:
        """Write the bytes, then the row: a crash between leaves an unreferenced blob, never a row
        without its bytes."""
        file_id = new_id("file")
        key = f"files/{file_id}"
        writer = self._blobs.writer(key)
        writer.write(data)
        digest = writer.hexdigest()
        writer.commit()
        with self._database.transaction() as session:
            row = UploadedFile(
                id=file_id,
                account_id=owner.account_id,
                key_id=owner.key_id,
                filename=filename[:255] or "file",
                purpose=purpose,
                bytes=len(data),
                sha256=digest,
                blob_key=key,
                expires_at=expires_at,
            )
            session.add(row)
            session.flush()
            self._storage_changed(session, file_id)
            return view(row)

    def get(self, owner: Owner, file_id: str) -> dict[str, Any]:
        with self._database.transaction() as session:
            return view(self._owned(session, owner, file_id))

    def page(
        self, owner: Owner, after: str | None, limit: int, order: str, purpose: str | None
    ) -> tuple[list[dict[str, Any]], bool]:
        with self._database.transaction() as session:
            query = select(UploadedFile).where(*owner.filter(UploadedFile))
            if purpose is not None:
                query = query.where(UploadedFile.purpose == purpose)
            cursor = None if after is None else self._owned(session, owner, after)
            rows, more = keyset_page(session, query, UploadedFile, cursor, limit, order)
            return [view(r) for r in rows], more

    def content(self, owner: Owner, file_id: str) -> tuple[bytes, str]:
        """The file's bytes and its name."""
        with self._database.transaction() as session:
            row = self._owned(session, owner, file_id)
            key, filename = row.blob_key, row.filename
        with self._blobs.open(key) as handle:
            return handle.read(), filename

    def read(self, owner: Owner, file_id: str, purpose: str) -> bytes:
        """A file of the account with this purpose (a batch's input); 400 naming its purpose if not."""
        with self._database.transaction() as session:
            row = self._owned(session, owner, file_id, param="input_file_id")
            if row.purpose != purpose:
                raise InvalidRequest(
                    f"File {file_id} has purpose '{row.purpose}'; a batch's input must have purpose "
                    f"'{purpose}'.",
                    param="input_file_id",
                )
            key = row.blob_key
        with self._blobs.open(key) as handle:
            return handle.read()

    def located(self, owner: Owner, file_id: str, purpose: str) -> tuple[str, int]:
        """Where a file of the account with this purpose is (a batch's input): its blob key and size,
        for a copy streamed from it; 400 naming its purpose if it has another."""
        with self._database.transaction() as session:
            row = self._owned(session, owner, file_id, param="input_file_id")
            if row.purpose != purpose:
                raise InvalidRequest(
                    f"File {file_id} has purpose '{row.purpose}'; a batch's input must have purpose "
                    f"'{purpose}'.",
                    param="input_file_id",
                )
            return row.blob_key, row.bytes

    def write(self, key: str, chunks: Iterable[bytes]) -> tuple[int, str]:
        """Write a file's bytes as they come, never whole in memory: their size and SHA-256. The row
        comes after (`add_in`), so a crash between leaves bytes without a row, never the reverse."""
        writer = self._blobs.writer(key)
        size = 0
        try:
            for chunk in chunks:
                writer.write(chunk)
                size += len(chunk)
        except BaseException:
            writer.abort()
            raise
        digest = writer.hexdigest()
        writer.commit()
        return size, digest

    def add_in(
        self,
        session: Session,
        owner: Owner,
        written: tuple[str, str, int, str],
        filename: str,
        purpose: str,
        expires_at: datetime | None,
    ) -> None:
        """The row of a file whose bytes `write` wrote (`written`: its ID, blob key, size and SHA-256),
        in the caller's transaction: a batch's files and its end are one transaction."""
        file_id, key, size, digest = written
        session.add(
            UploadedFile(
                id=file_id,
                account_id=owner.account_id,
                key_id=owner.key_id,
                filename=filename[:255] or "file",
                purpose=purpose,
                bytes=size,
                sha256=digest,
                blob_key=key,
                expires_at=expires_at,
            )
        )
        session.flush()
        self._storage_changed(session, file_id)

    def delete(self, owner: Owner, file_id: str) -> dict[str, Any]:
        self._delete(owner, file_id, expired_too=False)
        return {"id": file_id, "object": "file", "deleted": True}

    def _delete(self, owner: Owner, file_id: str, expired_too: bool = True) -> None:
        with self._database.transaction() as session:
            row = self._owned(session, owner, file_id, expired_too=expired_too)
            key = row.blob_key
            session.delete(row)
            session.flush()
            self._storage_changed(session, file_id)
        self._blobs.delete_prefix(key)

    def sweep(self) -> int:
        """Delete expired files; how many."""
        with self._database.transaction() as session:
            expired = session.execute(
                select(UploadedFile.id, UploadedFile.account_id, UploadedFile.key_id).where(
                    UploadedFile.expires_at < utcnow()
                )
            ).all()
        for file_id, account_id, key_id in expired:
            with contextlib.suppress(NotFound):  # deleted meanwhile
                self._delete(Owner(account_id, key_id), file_id)
        return len(expired)

    def _owned(
        self,
        session: Session,
        owner: Owner,
        file_id: str,
        param: str | None = None,
        expired_too: bool = False,
    ) -> UploadedFile:
        row = session.get(UploadedFile, file_id)
        if row is None or not owner.sees(row.account_id, row.key_id) or (_expired(row) and not expired_too):
            raise NotFound(f"No such File object: {file_id}", code="file_not_found", param=param)
        return row


def _expired(row: UploadedFile) -> bool:
    return row.expires_at is not None and row.expires_at < utcnow()


def view(row: UploadedFile) -> dict[str, Any]:
    """OpenAI's file object."""
    return {
        "id": row.id,
        "object": "file",
        "bytes": row.bytes,
        "created_at": unix_seconds(row.created_at),
        "expires_at": unix_seconds(row.expires_at),
        "filename": row.filename,
        "purpose": row.purpose,
        "status": "processed",
        "status_details": None,
    }
