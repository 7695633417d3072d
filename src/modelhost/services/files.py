"""Generated files behind unguessable, expiring links (`response_format: "url"` of image generation),
and `FileStore`, the one store whose bytes `GET /v1/files/{id}/content` serves.

A link is `/v1/files/{id}/content?expires=<unix>&signature=<hmac>`: the HMAC-SHA256 of the file ID and
expiry under a server secret. It works without an API key (so a browser or `<img>` can fetch it) and
only until it expires; a wrong signature, an expired link and a missing file all answer the same 404.
The bytes live in the blob store; `sweep` deletes expired files.

The Files API's own files (uploads, a batch's output: `batches.files`) and generated files are kept in
two tables, with their own lifetimes and billing; `FileStore` answers for both by ID. The query string
of `/content` only chooses the credential: a link's signature, or an API key (which reads either kind
of file of its account: the openai SDK's `client.files.content(id)` works for a generated image's ID
too). docs/batch.md, "Files".
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

from sqlalchemy import select

from modelhost.artifacts.blobstore import BlobStore
from modelhost.batches.files import Files, Owner
from modelhost.errors import NotFound
from modelhost.store.db import Database
from modelhost.store.models import GeneratedFile
from modelhost.store.types import new_id, utcnow

PREFIX = "generated"


@dataclass(frozen=True)
class StoredFile:
    id: str
    expires_at: datetime


def file_secret(data_dir: Path, configured: str | None) -> bytes:
    """The signing secret: the operator's, else one made once and kept in the data directory (so links
    survive restarts and are shared by gateways on the same data)."""
    if configured:
        return configured.encode()
    path = data_dir / "file-url-secret"
    if not path.exists():
        data_dir.mkdir(parents=True, exist_ok=True)
        path.write_text(secrets.token_hex(32))
        path.chmod(0o600)
    return path.read_text().strip().encode()


class FileService:
    def __init__(self, database: Database, blobs: BlobStore, secret: bytes, ttl_seconds: float) -> None:
        self._database = database
        self._blobs = blobs
        self._secret = secret
        self._ttl = timedelta(seconds=ttl_seconds)

    def store(self, account_id: str, data: bytes, content_type: str, suffix: str) -> StoredFile:
        file_id = new_id("file")
        key = f"{PREFIX}/{file_id}.{suffix}"
        writer = self._blobs.writer(key)
        writer.write(data)
        writer.commit()
        expires = utcnow() + self._ttl
        with self._database.transaction() as session:
            session.add(
                GeneratedFile(
                    id=file_id,
                    account_id=account_id,
                    blob_key=key,
                    content_type=content_type,
                    size=len(data),
                    expires_at=expires,
                )
            )
        return StoredFile(file_id, expires)

    def url(self, base_url: str, stored: StoredFile) -> str:
        expires = int(stored.expires_at.timestamp())
        signature = self._sign(stored.id, expires)
        return f"{base_url.rstrip('/')}/v1/files/{stored.id}/content?expires={expires}&signature={signature}"

    def read(self, file_id: str, expires: int, signature: str) -> tuple[bytes, str]:
        """The file's bytes and content type, if the link is genuine and unexpired."""
        genuine = hmac.compare_digest(self._sign(file_id, expires).encode(), signature.encode())
        with self._database.transaction() as session:
            row = session.get(GeneratedFile, file_id)
            if not genuine or row is None or utcnow().timestamp() > expires or utcnow() > row.expires_at:
                raise NotFound("File not found (or the link has expired).", code="file_not_found")
            key, content_type = row.blob_key, row.content_type
        with self._blobs.open(key) as handle:
            return handle.read(), content_type

    def read_owned(self, account_id: str, file_id: str) -> tuple[bytes, str]:
        """An unexpired file of the account by its ID alone (an API call, where the key is the proof;
        e.g. a video's `input_reference: {file_id}`)."""
        data, content_type, _ = self.read_named(account_id, file_id)
        return data, content_type

    def read_named(self, account_id: str, file_id: str) -> tuple[bytes, str, str]:
        """`read_owned`, and the file's name (its ID and suffix, e.g. `file_9a....png`)."""
        with self._database.transaction() as session:
            row = session.get(GeneratedFile, file_id)
            if row is None or row.account_id != account_id or utcnow() > row.expires_at:
                raise NotFound("File not found (or it has expired).", code="file_not_found")
            key, content_type = row.blob_key, row.content_type
        with self._blobs.open(key) as handle:
            return handle.read(), content_type, key.rsplit("/", 1)[-1]

    def sweep(self) -> int:
        """Delete expired files; how many."""
        with self._database.transaction() as session:
            rows = session.scalars(select(GeneratedFile).where(GeneratedFile.expires_at < utcnow())).all()
            for row in rows:
                self._blobs.delete_prefix(row.blob_key)
                session.delete(row)
            return len(rows)

    def _sign(self, file_id: str, expires: int) -> str:
        message = f"{file_id}:{expires}".encode()
        return hmac.new(self._secret, message, hashlib.sha256).hexdigest()


@dataclass(frozen=True)
class FileContent:
    """A file's bytes as `GET /v1/files/{id}/content` sends them: whole (a generated file, small), or
    in chunks (an uploaded file, however large), with their media type and headers."""

    body: bytes | Iterator[bytes]
    media_type: str
    headers: dict[str, str]


class FileStore:
    """Every file a `/v1/files/{id}/content` may name, by its ID: the Files API's (`uploads`) and the
    generated ones (`generated`). The two kinds share the `file_` prefix and never an ID."""

    def __init__(self, generated: FileService, uploads: Files) -> None:
        self._generated = generated
        self._uploads = uploads

    def linked(self, file_id: str, expires: int | None, signature: str | None) -> FileContent:
        """A generated file by its signed link (no key): 404 unless the link is whole and genuine."""
        if expires is None or signature is None:
            raise NotFound("File not found (or the link has expired).", code="file_not_found")
        try:
            data, content_type = self._generated.read(file_id, expires, signature)
        except OverflowError:  # an absurd `expires`
            raise NotFound("File not found (or the link has expired).", code="file_not_found") from None
        return FileContent(data, content_type, {"Cache-Control": "private, max-age=300"})

    def owned(self, owner: Owner, file_id: str) -> FileContent:
        """A file of the key's account: an uploaded one (as its key may see it), else a generated one;
        the Files API's 404 for neither. Blocking: in a thread."""
        try:
            chunks, filename, size = self._uploads.content(owner, file_id)
        except NotFound as missing:
            try:
                data, content_type, name = self._generated.read_named(owner.account_id, file_id)
            except NotFound:
                raise missing from None
            return FileContent(data, content_type, {"Content-Disposition": f'inline; filename="{name}"'})
        kind = "application/jsonl" if filename.endswith(".jsonl") else "application/octet-stream"
        headers = {
            "Content-Disposition": f'attachment; filename="{_safe(filename)}"',
            "Content-Length": str(size),
        }
        return FileContent(chunks, kind, headers)


def _safe(filename: str) -> str:
    """A file name fit for a header: no quotes, backslashes or control characters."""
    return "".join(c for c in filename if c.isascii() and c.isprintable() and c not in '"\\') or "file"
