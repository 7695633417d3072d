"""The Files API's files (`/v1/files`): uploaded by an account (batch input) or written by a batch (its
output and error files), stored in the blob store with their SHA-256, billed as storage like artifacts
(`storage_changed`), seen only by their own account.

An upload is held to the rules of an artifact's (`artifacts.disk`): refused before a byte is read below
the data directory's free-disk floor (507), its bytes written to the blob store as they arrive (a full
disk mid-way is a 507 and leaves nothing behind), never held whole in memory; a batch's input is
checked line by line as it arrives (`batches.input.JsonlCheck`), so a bad file is refused at its first
bad line. Downloads stream the stored bytes in chunks.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, BinaryIO

from sqlalchemy import select
from sqlalchemy.orm import Session

from modelhost import audit
from modelhost.artifacts.blobstore import BlobStore, BlobWriter
from modelhost.artifacts.disk import require_room_for_upload
from modelhost.batches.input import JsonlCheck, check_jsonl, shown
from modelhost.config import Settings
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
CHUNK = 1024 * 1024  # bytes an upload hands to the blob store at once, and a download sends at once
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
        self, database: Database, blobs: BlobStore, settings: Settings, storage_changed: StorageChanged
    ) -> None:
        self._database = database
        self._blobs = blobs
        self._settings = settings
        self._storage_changed = storage_changed

    def begin(self, purpose: str | None, declared_bytes: int | None) -> FileUpload:
        """An upload whose bytes are about to arrive. `purpose`, when the form gave it before the file,
        is checked now, and a batch's input is then checked as it arrives; `declared_bytes` (the
        request's `Content-Length`) counts against the free-disk floor (507 before a byte is read)."""
        if purpose is not None:
            _check_purpose(purpose)
        require_room_for_upload(self._settings, declared_bytes)
        check = JsonlCheck(*self._jsonl_limits()) if purpose == "batch" else None
        file_id = new_id("file")
        return FileUpload(self, file_id, self._blobs.writer(f"files/{file_id}"), check)

    def upload(
        self,
        owner: Owner,
        upload: FileUpload,
        filename: str,
        purpose: str,
        expires_after: int | None,
    ) -> dict[str, Any]:
        """The file object of an upload whose bytes have all been written (`FileUpload.finish`)."""
        _check_purpose(purpose)
        if expires_after is not None and not EXPIRY_SECONDS[0] <= expires_after <= EXPIRY_SECONDS[1]:
            raise InvalidRequest(
                f"'expires_after.seconds' must be between {EXPIRY_SECONDS[0]} and {EXPIRY_SECONDS[1]}.",
                param="expires_after.seconds",
            )
        if upload.check is not None:
            upload.check.finish()
        writer = upload.writer
        size, digest = writer.size, writer.hexdigest()
        writer.commit()
        try:
            if purpose == "batch" and upload.check is None:  # the form named its purpose after the file
                with self._blobs.open(upload.key) as handle:
                    check_jsonl(iter(lambda: handle.read(CHUNK), b""), *self._jsonl_limits())
            return self._record(owner, upload.file_id, filename, purpose, size, digest, expires_after)
        except BaseException:
            self._blobs.delete_prefix(upload.key)
            raise

    def _jsonl_limits(self) -> tuple[int, int]:
        """A batch input file's size limit, and a line's: one line is one request, so at most a request
        body's size."""
        return self._settings.batch_max_file_bytes, self._settings.max_body_bytes

    def _record(
        self,
        owner: Owner,
        file_id: str,
        filename: str,
        purpose: str,
        size: int,
        digest: str,
        expires_after: int | None,
    ) -> dict[str, Any]:
        """The row of an uploaded file whose bytes are stored, and its storage meter."""
        with self._database.transaction() as session:
            written = (file_id, f"files/{file_id}", size, digest)
            return view(self.add_in(session, owner, written, filename, purpose, expires_after))

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

    def content(self, owner: Owner, file_id: str) -> tuple[Iterator[bytes], str, int]:
        """The file's bytes in chunks of `CHUNK` (bounded memory whatever its size), its name and size.
        The blob is opened here, so that a file deleted meanwhile is a 404, not a broken download."""
        with self._database.transaction() as session:
            row = self._owned(session, owner, file_id)
            key, filename, size = row.blob_key, row.filename, row.bytes
        return _chunks(self._blobs.open(key)), filename, size

    def located(
        self,
        owner: Owner,
        file_id: str,
        purpose: str,
        param: str = "input_file_id",
        what: str = "a batch's input",
    ) -> tuple[str, int]:
        """Where a file of the account with this purpose is (a batch's input, a fine-tuning dataset): its
        blob key and size, for a copy streamed from it; 400 naming its purpose if it has another."""
        with self._database.transaction() as session:
            row = self._owned(session, owner, file_id, param=param)
            if row.purpose != purpose:
                raise InvalidRequest(
                    f"File {file_id} has purpose '{row.purpose}'; {what} must have purpose '{purpose}'.",
                    param=param,
                )
            return row.blob_key, row.bytes

    def content_of(self, owner: Owner, file_id: str, param: str, limit: int) -> bytes:
        """The bytes of a small file of the account (an eval run's items), whatever its purpose; 400
        naming `param` past `limit` bytes."""
        with self._database.transaction() as session:
            row = self._owned(session, owner, file_id, param=param)
            key, size = row.blob_key, row.bytes
        if size > limit:
            raise InvalidRequest(
                f"File {file_id} has {size} bytes, more than the {limit} allowed here.", param=param
            )
        with self._blobs.open(key) as handle:
            return handle.read(limit + 1)[:limit]

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
        expires_after: int | None,
    ) -> UploadedFile:
        """The row of a file whose bytes are written (`written`: its ID, blob key, size and SHA-256), its
        storage meter and audit row, in the caller's transaction: a batch's files and its end are one
        transaction. It expires `expires_after` seconds after its `created_at`, to the second (one clock
        reading for both)."""
        file_id, key, size, digest = written
        created = utcnow()
        row = UploadedFile(
            id=file_id,
            account_id=owner.account_id,
            key_id=owner.key_id,
            filename=filename[:255] or "file",
            purpose=purpose,
            bytes=size,
            sha256=digest,
            blob_key=key,
            created_at=created,
            expires_at=None if expires_after is None else created + timedelta(seconds=expires_after),
        )
        session.add(row)
        session.flush()
        self._storage_changed(session, file_id)
        audit.record(session, "file.created", "file", file_id, owner.account_id, audit.created(_audited(row)))
        return row

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
            audit.record(
                session, "file.deleted", "file", file_id, owner.account_id, audit.removed(_audited(row))
            )
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
            # OpenAI's message, with no more of a made-up ID than a real one has
            raise NotFound(f"No such File object: {file_id[:64]}", code="file_not_found", param=param)
        return row


class FileUpload:
    """An upload in progress (`Files.begin`): `write` its bytes as they arrive (they go to the blob
    store in chunks of `CHUNK`, off the event loop; a batch's input is checked as they do), then
    `finish`; `abort` if anything fails, which leaves nothing behind."""

    def __init__(self, files: Files, file_id: str, writer: BlobWriter, check: JsonlCheck | None) -> None:
        self._files = files
        self.file_id = file_id
        self.key = f"files/{file_id}"
        self.writer = writer
        self.check = check
        self._buffer = bytearray()

    async def write(self, chunk: bytes) -> None:
        self._buffer += chunk
        if len(self._buffer) >= CHUNK:
            await self._flush()

    async def finish(
        self, owner: Owner, filename: str, purpose: str, expires_after: int | None
    ) -> dict[str, Any]:
        """The new file's object, once its last bytes are written and checked."""
        await self._flush()
        return await asyncio.to_thread(self._files.upload, owner, self, filename, purpose, expires_after)

    async def abort(self) -> None:
        await asyncio.to_thread(self.writer.abort)

    async def _flush(self) -> None:
        if self._buffer:
            data = bytes(self._buffer)
            self._buffer.clear()
            await asyncio.to_thread(self._write, data)

    def _write(self, data: bytes) -> None:
        if self.check is not None:
            self.check.feed(data)  # first: a bad line is refused before its bytes are stored
        self.writer.write(data)


def _check_purpose(purpose: str) -> None:
    if purpose not in UPLOAD_PURPOSES:
        raise InvalidRequest(
            f"{shown(purpose)} is not one of {', '.join(UPLOAD_PURPOSES)} - 'purpose'.", param="purpose"
        )


def _chunks(handle: BinaryIO) -> Iterator[bytes]:
    with handle:
        while chunk := handle.read(CHUNK):
            yield chunk


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


def _audited(row: UploadedFile) -> dict[str, Any]:
    """What an audit row says of a file (its name and size, never its contents)."""
    return {
        "filename": row.filename,
        "purpose": row.purpose,
        "bytes": row.bytes,
        "expires_at": row.expires_at,
    }
