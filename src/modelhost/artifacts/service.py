"""Artifact lifecycle: `created → ingesting → ready | failed`, with upload sessions as the only way in.

Every state change is one transaction with a guarded `UPDATE ... WHERE status = ...`, so concurrent
callers (threads, gateways) cannot both win. Files are staged per session and published by moving
the whole staging folder under a new version; the artifact row then points at that version.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

import anyio
from sqlalchemy import delete, select, update
from sqlalchemy.orm import Session

from modelhost import audit
from modelhost.artifacts.blobstore import PARTIAL_DIR, BlobStore, BlobWriter
from modelhost.artifacts.disk import require_room_for_upload
from modelhost.artifacts.inspection import Inspection, inspect_artifact
from modelhost.artifacts.paths import clean_upload_path
from modelhost.artifacts.quantization import serving_table
from modelhost.config import Settings
from modelhost.errors import Conflict, InvalidRequest, NotFound, PayloadTooLarge
from modelhost.store.db import Database
from modelhost.store.models import ArtifactImport, ModelArtifact, UploadFile, UploadSession
from modelhost.store.types import new_id, utcnow

log = logging.getLogger("modelhost.artifacts")

STARTABLE = ("created", "ready", "failed")
WRITE_CHUNK = 1024 * 1024
STALE_COMPLETION = timedelta(minutes=15)


def staging_prefix(upload_id: str) -> str:
    return f"staging/{upload_id}"


def version_prefix(artifact_id: str, version: str) -> str:
    return f"artifacts/{artifact_id}/{version}"


def _artifact_not_found() -> NotFound:
    return NotFound("Model artifact not found", param="artifact_id", code="artifact_not_found")


def _upload_not_found() -> NotFound:
    return NotFound("Upload session not found", param="upload_id", code="upload_not_found")


@dataclass(frozen=True, slots=True)
class ImportProgress:
    """The import filling an artifact's open upload session (`modelhost.imports`), as last recorded."""

    id: str
    status: str
    bytes_done: int
    bytes_total: int | None


@dataclass(frozen=True, slots=True)
class ArtifactView:
    """An artifact row with the id of its open upload session, if any, and the import filling it."""

    artifact: ModelArtifact
    upload_id: str | None
    importing: ImportProgress | None = None


class ArtifactService:
    def __init__(
        self,
        database: Database,
        blobs: BlobStore,
        settings: Settings,
        storage_changed: Callable[[Session, str], None] | None = None,
        devices: tuple[str, ...] = ("cpu",),
    ) -> None:
        self._database = database
        self._blobs = blobs
        self._settings = settings
        # The device kinds this server's replicas run on (`cpu`, `cuda`): a quantized artifact says
        # whether each engine can serve it on each
        self._devices = devices
        # Billing's storage meter follows the stored files, in the transaction that changes them.
        self._storage_changed = storage_changed or (lambda _session, _artifact_id: None)

    # ---------------------------------------------------------------- artifacts

    def create(self, account_id: str, display_name: str, pipeline: str) -> ArtifactView:
        with self._database.transaction() as session:
            artifact = ModelArtifact(
                id=new_id("art"), account_id=account_id, display_name=display_name, pipeline=pipeline
            )
            session.add(artifact)
            session.flush()
            fields = audit.created({"display_name": display_name, "pipeline": pipeline})
            audit.record(session, "artifact.created", "artifact", artifact.id, account_id, fields)
            return ArtifactView(artifact, None)

    def list_artifacts(self, account_id: str) -> list[ArtifactView]:
        with self._database.transaction() as session:
            artifacts = session.scalars(
                select(ModelArtifact)
                .where(ModelArtifact.account_id == account_id)
                .order_by(ModelArtifact.created_at, ModelArtifact.id)
            ).all()
            rows = session.execute(
                select(UploadSession.artifact_id, UploadSession.id).where(
                    UploadSession.account_id == account_id, UploadSession.status.in_(("open", "completing"))
                )
            )
            open_sessions = {artifact_id: upload_id for artifact_id, upload_id in rows}
            importing = _imports_filling(session, list(open_sessions.values()))
            return [
                ArtifactView(a, open_sessions.get(a.id), importing.get(open_sessions.get(a.id, "")))
                for a in artifacts
            ]

    def get(self, account_id: str, artifact_id: str) -> ArtifactView:
        with self._database.transaction() as session:
            return self._view(session, self._owned(session, account_id, artifact_id))

    def files_dir(self, artifact: ModelArtifact) -> str | None:
        """Blob prefix of the served files of a ready artifact."""
        if artifact.published_version is None:
            return None
        return version_prefix(artifact.id, artifact.published_version)

    def delete(self, account_id: str, artifact_id: str) -> None:
        """Delete an artifact no deployment uses; its sessions, staged and published files go too."""
        with self._database.transaction() as session:
            artifact = self._owned(session, account_id, artifact_id)
            gone = audit.removed({"display_name": artifact.display_name, "status": artifact.status})
            upload_ids = session.scalars(
                select(UploadSession.id).where(UploadSession.artifact_id == artifact_id)
            ).all()
            deleted = session.execute(
                delete(ModelArtifact).where(
                    ModelArtifact.id == artifact_id, ModelArtifact.deployment_count == 0
                )
            )
            if deleted.rowcount != 1:  # type: ignore[attr-defined]
                raise Conflict(
                    "Model artifact is in use by a deployment; delete the deployment first.",
                    param="artifact_id",
                    code="artifact_busy",
                )
            self._storage_changed(session, artifact_id)
            audit.record(session, "artifact.deleted", "artifact", artifact_id, account_id, gone)
        for upload_id in upload_ids:
            self._blobs.delete_prefix(staging_prefix(upload_id))
        self._blobs.delete_prefix(f"artifacts/{artifact_id}")

    # ---------------------------------------------------------------- sessions

    def start_upload(self, account_id: str, artifact_id: str) -> tuple[UploadSession, ArtifactView]:
        """Open a session unless the artifact is ingesting or deployed (409 `artifact_busy`).

        The transition is one guarded UPDATE: of two concurrent calls, exactly one matches a row.
        """
        with self._database.transaction() as session:
            artifact = self._owned(session, account_id, artifact_id)
            previous = artifact.status
            now = utcnow()
            moved = session.execute(
                update(ModelArtifact)
                .where(
                    ModelArtifact.id == artifact_id,
                    ModelArtifact.status.in_(STARTABLE),
                    ModelArtifact.deployment_count == 0,
                )
                .values(status="ingesting", updated_at=now)
                .execution_options(synchronize_session=False)
            )
            if moved.rowcount != 1:  # type: ignore[attr-defined]
                session.refresh(artifact)
                reason = (
                    "it is in use by a deployment"
                    if artifact.deployment_count
                    else "an upload is already in progress"
                    if artifact.status == "ingesting"
                    else f"it is {artifact.status}"
                )
                raise Conflict(
                    f"Cannot start an upload: {reason}.", param="artifact_id", code="artifact_busy"
                )
            upload = UploadSession(
                id=new_id("upl"),
                artifact_id=artifact_id,
                account_id=account_id,
                previous_status=previous,
                created_at=now,
                expires_at=now + timedelta(seconds=self._settings.upload_session_ttl_seconds),
            )
            session.add(upload)
            session.flush()
            session.refresh(artifact)
            changes: audit.Changes = {
                "status": {"before": previous, "after": "ingesting"},
                "upload_id": {"before": None, "after": upload.id},
            }
            audit.record(session, "artifact.upload_started", "artifact", artifact_id, account_id, changes)
            return upload, ArtifactView(artifact, upload.id)

    def get_session(
        self, account_id: str, artifact_id: str, upload_id: str
    ) -> tuple[UploadSession, list[UploadFile]]:
        with self._database.transaction() as session:
            upload = self._owned_session(session, account_id, artifact_id, upload_id)
            files = session.scalars(
                select(UploadFile).where(UploadFile.session_id == upload_id).order_by(UploadFile.path)
            ).all()
            return upload, list(files)

    async def put_file(
        self,
        account_id: str,
        artifact_id: str,
        upload_id: str,
        path: str,
        chunks: AsyncIterator[bytes],
        expected_sha256: str | None,
        declared_size: int | None = None,
    ) -> UploadFile:
        """Stream one file into the session's staging area; record it only once it is whole and verified.

        Refused before a byte is read when the disk is (or `declared_size` would take it) below the
        floor. A full disk mid-way is a 507 too: the partial file goes, the session stays open, and the
        same PUT succeeds once space is freed."""
        path = clean_upload_path(path)
        if expected_sha256 is not None:
            expected_sha256 = expected_sha256.strip().lower()
            if len(expected_sha256) != 64 or any(c not in "0123456789abcdef" for c in expected_sha256):
                raise InvalidRequest("X-Content-SHA256 must be 64 hex digits.", param="X-Content-SHA256")
        await anyio.to_thread.run_sync(self._check_writable, account_id, artifact_id, upload_id, path)
        await anyio.to_thread.run_sync(require_room_for_upload, self._settings, declared_size)
        writer = await anyio.to_thread.run_sync(self._blobs.writer, f"{staging_prefix(upload_id)}/{path}")
        try:
            await self._stream_into(writer, chunks)
            digest = writer.hexdigest()
            if expected_sha256 is not None and digest != expected_sha256:
                raise InvalidRequest(
                    f"Checksum mismatch for {path}: received data hashes to {digest}.",
                    param="X-Content-SHA256",
                    code="checksum_mismatch",
                )
            return await anyio.to_thread.run_sync(self._record_file, upload_id, path, writer)
        except BaseException:
            await anyio.to_thread.run_sync(writer.abort)
            raise

    async def _stream_into(self, writer: BlobWriter, chunks: AsyncIterator[bytes]) -> None:
        limit = self._settings.max_upload_file_bytes
        buffer = bytearray()
        async for chunk in chunks:
            buffer += chunk
            if writer.size + len(buffer) > limit:
                raise PayloadTooLarge(f"File exceeds the upload limit of {limit} bytes.")
            if len(buffer) >= WRITE_CHUNK:
                await anyio.to_thread.run_sync(writer.write, bytes(buffer))
                buffer.clear()
        if buffer:
            await anyio.to_thread.run_sync(writer.write, bytes(buffer))

    def _check_writable(self, account_id: str, artifact_id: str, upload_id: str, path: str) -> None:
        with self._database.transaction() as session:
            upload = self._owned_session(session, account_id, artifact_id, upload_id)
            self._require_open(upload)
            known = session.get(UploadFile, (upload_id, path)) is not None
            count = len(
                session.scalars(select(UploadFile.path).where(UploadFile.session_id == upload_id)).all()
            )
            if not known and count >= self._settings.max_upload_files:
                raise InvalidRequest(
                    f"An upload session holds at most {self._settings.max_upload_files} files.",
                    param="path",
                    code="too_many_files",
                )

    def _record_file(self, upload_id: str, path: str, writer: BlobWriter) -> UploadFile:
        """Publish the staged file and record it, while holding the session open (guarded no-op UPDATE).

        `complete` flips the same row, so a file lands either before completion (and is included)
        or is refused with 409 — never half-included.
        """
        with self._database.transaction() as session:
            held = session.execute(
                update(UploadSession)
                .where(UploadSession.id == upload_id, UploadSession.status == "open")
                .values(status="open")
                .execution_options(synchronize_session=False)
            )
            if held.rowcount != 1:  # type: ignore[attr-defined]
                raise Conflict("Upload session is no longer open.", param="upload_id", code="upload_not_open")
            try:
                writer.commit()
            except (IsADirectoryError, NotADirectoryError, FileExistsError) as exc:
                raise InvalidRequest(
                    f"Path {path} conflicts with another uploaded file or folder.",
                    param="path",
                    code="invalid_path",
                ) from exc
            record = session.get(UploadFile, (upload_id, path))
            if record is None:
                record = UploadFile(
                    session_id=upload_id, path=path, size=writer.size, sha256=writer.hexdigest()
                )
                session.add(record)
            else:
                record.size, record.sha256 = writer.size, writer.hexdigest()
            return record

    def complete(self, account_id: str, artifact_id: str, upload_id: str) -> tuple[ArtifactView, str]:
        """Finalize the session: inspect the staged files, publish them or record why not."""
        with self._database.transaction() as session:
            upload = self._owned_session(session, account_id, artifact_id, upload_id)
            self._require_open(upload)
            self._claim_for_completion(session, upload_id)
            artifact = session.get(ModelArtifact, artifact_id)
            assert artifact is not None
            pipeline = artifact.pipeline
            recorded = set(session.scalars(select(UploadFile.path).where(UploadFile.session_id == upload_id)))
        missing = self._reconcile_staging(upload_id, recorded)
        if missing:
            return self._finish_failed(
                artifact_id,
                upload_id,
                "missing_files",
                f"Recorded files are missing from staging: {missing[0]}.",
            )
        staged = staging_prefix(upload_id)
        inspection = self._inspect(self._blobs.local_dir(staged), pipeline)
        if not inspection.ok:
            assert inspection.code is not None and inspection.message is not None
            return self._finish_failed(artifact_id, upload_id, inspection.code, inspection.message)
        self._blobs.move_prefix(staged, version_prefix(artifact_id, upload_id))
        return self._finish_ready(artifact_id, upload_id, inspection), "Upload complete: artifact is ready."

    def _inspect(self, folder: Path, pipeline: str) -> Inspection:
        settings = self._settings
        return inspect_artifact(
            folder, pipeline, allow_pickle=settings.allow_pickle_weights, max_lora_rank=settings.max_lora_rank
        )

    def abort(self, account_id: str, artifact_id: str, upload_id: str) -> ArtifactView:
        """Abort an open session; the artifact returns to the status it had before the upload."""
        with self._database.transaction() as session:
            upload = self._owned_session(session, account_id, artifact_id, upload_id)
            if not self._close_session(session, upload, "aborted"):
                raise Conflict("Upload session is no longer open.", param="upload_id", code="upload_not_open")
            changes: audit.Changes = {
                "status": {"before": "ingesting", "after": upload.previous_status},
                "upload_id": {"before": upload_id, "after": None},
            }
            audit.record(session, "artifact.upload_aborted", "artifact", artifact_id, account_id, changes)
        self._blobs.delete_prefix(staging_prefix(upload_id))
        return self.get(account_id, artifact_id)

    def keep_open(self, upload_id: str) -> str | None:
        """Push back an open session's expiry by a full TTL (a server-side import fills it for as long as
        it takes); returns the session's status (None: no such session)."""
        with self._database.transaction() as session:
            session.execute(
                update(UploadSession)
                .where(UploadSession.id == upload_id, UploadSession.status == "open")
                .values(expires_at=utcnow() + timedelta(seconds=self._settings.upload_session_ttl_seconds))
                .execution_options(synchronize_session=False)
            )
            return session.scalars(select(UploadSession.status).where(UploadSession.id == upload_id)).first()

    def fail_upload(
        self, account_id: str, artifact_id: str, upload_id: str, code: str, message: str
    ) -> tuple[ArtifactView, str]:
        """End an open session as failed, as an inspection that failed would (the artifact `failed` with
        `code`, or still ready with its previous version): a server-side import whose source failed."""
        with self._database.transaction() as session:
            self._owned_session(session, account_id, artifact_id, upload_id)
            self._claim_for_completion(session, upload_id)
        return self._finish_failed(artifact_id, upload_id, code, message)

    # ---------------------------------------------------------------- housekeeping

    def sweep(self, now: datetime | None = None) -> int:
        """Expire overdue open sessions and recover stale completions. Returns how many were handled."""
        now = now or utcnow()
        with self._database.transaction() as session:
            overdue = session.scalars(
                select(UploadSession).where(UploadSession.status == "open", UploadSession.expires_at < now)
            ).all()
            expired = [u.id for u in overdue if self._close_session(session, u, "expired")]
        for upload_id in expired:
            self._blobs.delete_prefix(staging_prefix(upload_id))
        return len(expired) + self.recover(stale_before=now - STALE_COMPLETION)

    def recover(self, stale_before: datetime | None = None) -> int:
        """Bring sessions left `completing` by a crash to a consistent state.

        Published already (crash after the move) → finish as ready. Staging intact → reopen the
        session so the client can complete again. Neither → fail with `interrupted`.
        """
        with self._database.transaction() as session:
            query = select(UploadSession).where(UploadSession.status == "completing")
            if stale_before is not None:
                query = query.where(UploadSession.updated_at < stale_before)
            stuck = [(u.id, u.artifact_id) for u in session.scalars(query)]
        for upload_id, artifact_id in stuck:
            published = self._blobs.list(version_prefix(artifact_id, upload_id))
            if published:  # inspected before the move: what it found is read again from the files
                with self._database.transaction() as session:
                    artifact = session.get(ModelArtifact, artifact_id)
                    pipeline = artifact.pipeline if artifact is not None else ""
                folder = self._blobs.local_dir(version_prefix(artifact_id, upload_id))
                self._finish_ready(artifact_id, upload_id, self._inspect(folder, pipeline))
            elif self._blobs.exists(staging_prefix(upload_id)):
                with self._database.transaction() as session:
                    session.execute(
                        update(UploadSession)
                        .where(UploadSession.id == upload_id, UploadSession.status == "completing")
                        .values(status="open", updated_at=utcnow())
                        .execution_options(synchronize_session=False)
                    )
            else:
                self._finish_failed(
                    artifact_id, upload_id, "interrupted", "The server stopped while completing."
                )
            log.info("recovered upload session %s", upload_id)
        return len(stuck)

    # ---------------------------------------------------------------- internals

    def _finish_ready(self, artifact_id: str, upload_id: str, inspection: Inspection) -> ArtifactView:
        with self._database.transaction() as session:
            artifact = session.get(ModelArtifact, artifact_id)
            assert artifact is not None
            old_version = artifact.published_version
            before = _audited(artifact)
            artifact.status, artifact.published_version = "ready", upload_id
            artifact.size_bytes, artifact.kind = inspection.size_bytes, inspection.kind
            artifact.adapter = inspection.adapter.as_dict() if inspection.adapter is not None else None
            quantization = inspection.quantization
            artifact.quantization = quantization.as_dict() if quantization is not None else None
            artifact.serving = (
                serving_table(quantization, self._devices) if quantization is not None else None
            )
            artifact.gguf = inspection.gguf
            artifact.error_code = artifact.error_message = None
            self._set_session_status(session, upload_id, "completed")
            session.flush()
            self._storage_changed(session, artifact_id)
            changes = audit.diff(before, _audited(artifact))
            audit.record(session, "artifact.published", "artifact", artifact_id, artifact.account_id, changes)
            view = ArtifactView(artifact, None)
        if old_version and old_version != upload_id:
            self._blobs.delete_prefix(version_prefix(artifact_id, old_version))
        return view

    def _finish_failed(
        self, artifact_id: str, upload_id: str, code: str, message: str
    ) -> tuple[ArtifactView, str]:
        """Record why; a previously ready version stays ready and served (only the re-upload failed)."""
        with self._database.transaction() as session:
            artifact = session.get(ModelArtifact, artifact_id)
            assert artifact is not None
            keeps_previous = artifact.published_version is not None
            before = _audited(artifact)
            artifact.status = "ready" if keeps_previous else "failed"
            artifact.error_code, artifact.error_message = code, message
            upload = self._set_session_status(session, upload_id, "failed")
            upload.error_code, upload.error_message = code, message
            changes = audit.diff(before, _audited(artifact))
            audit.record(
                session, "artifact.upload_failed", "artifact", artifact_id, artifact.account_id, changes
            )
            view = ArtifactView(artifact, None)
        self._blobs.delete_prefix(staging_prefix(upload_id))
        suffix = " The previous version stays ready." if keeps_previous else ""
        return view, f"Inspection failed ({code}): {message}{suffix}"

    def _reconcile_staging(self, upload_id: str, recorded: set[str]) -> list[str]:
        """Drop staged files the session never recorded (crash leftovers); list recorded ones missing."""
        prefix = staging_prefix(upload_id)
        self._blobs.delete_prefix(f"{prefix}/{PARTIAL_DIR}")
        staged = {b.key[len(prefix) + 1 :] for b in self._blobs.list(prefix)}
        for stray in staged - recorded:
            self._blobs.delete_prefix(f"{prefix}/{stray}")
        return sorted(recorded - staged)

    @staticmethod
    def _claim_for_completion(session: Session, upload_id: str) -> None:
        """open → completing, one guarded UPDATE: of two callers (a completion, a failure, an abort), one
        wins; the other is 409 `upload_not_open`."""
        claimed = session.execute(
            update(UploadSession)
            .where(UploadSession.id == upload_id, UploadSession.status == "open")
            .values(status="completing", updated_at=utcnow())
            .execution_options(synchronize_session=False)
        )
        if claimed.rowcount != 1:  # type: ignore[attr-defined]
            raise Conflict("Upload session is no longer open.", param="upload_id", code="upload_not_open")

    @staticmethod
    def _set_session_status(session: Session, upload_id: str, status: str) -> UploadSession:
        upload = session.get(UploadSession, upload_id)
        assert upload is not None
        upload.status = status
        return upload

    @staticmethod
    def _close_session(session: Session, upload: UploadSession, status: str) -> bool:
        """open → aborted/expired, and the artifact back from ingesting to its previous status."""
        closed = session.execute(
            update(UploadSession)
            .where(UploadSession.id == upload.id, UploadSession.status == "open")
            .values(status=status)
            .execution_options(synchronize_session=False)
        )
        if closed.rowcount != 1:  # type: ignore[attr-defined]
            return False
        session.execute(
            update(ModelArtifact)
            .where(ModelArtifact.id == upload.artifact_id, ModelArtifact.status == "ingesting")
            .values(status=upload.previous_status, updated_at=utcnow())
            .execution_options(synchronize_session=False)
        )
        return True

    def _require_open(self, upload: UploadSession) -> None:
        if upload.status != "open":
            raise Conflict(f"Upload session is {upload.status}.", param="upload_id", code="upload_not_open")
        if upload.expires_at < utcnow():
            raise Conflict("Upload session has expired.", param="upload_id", code="upload_not_open")

    @staticmethod
    def _owned(session: Session, account_id: str, artifact_id: str) -> ModelArtifact:
        artifact = session.get(ModelArtifact, artifact_id)
        if artifact is None or artifact.account_id != account_id:
            raise _artifact_not_found()
        return artifact

    def _owned_session(
        self, session: Session, account_id: str, artifact_id: str, upload_id: str
    ) -> UploadSession:
        self._owned(session, account_id, artifact_id)
        upload = session.get(UploadSession, upload_id)
        if upload is None or upload.artifact_id != artifact_id:
            raise _upload_not_found()
        return upload

    @staticmethod
    def _view(session: Session, artifact: ModelArtifact) -> ArtifactView:
        upload_id = session.scalars(
            select(UploadSession.id).where(
                UploadSession.artifact_id == artifact.id, UploadSession.status.in_(("open", "completing"))
            )
        ).first()
        importing = _imports_filling(session, [upload_id]) if upload_id else {}
        return ArtifactView(artifact, upload_id, importing.get(upload_id or ""))


def _imports_filling(session: Session, upload_ids: list[str]) -> dict[str, ImportProgress]:
    """The active imports filling these upload sessions, by session."""
    if not upload_ids:
        return {}
    rows = session.scalars(
        select(ArtifactImport).where(
            ArtifactImport.upload_id.in_(upload_ids), ArtifactImport.status.in_(("queued", "running"))
        )
    )
    return {r.upload_id: ImportProgress(r.id, r.status, r.bytes_done, r.bytes_total) for r in rows}


def _audited(artifact: ModelArtifact) -> dict[str, object]:
    """What an audit row says of an artifact's state."""
    return {
        "status": artifact.status,
        "version": artifact.published_version,
        "size_bytes": artifact.size_bytes,
        "kind": artifact.kind,
        "error_code": artifact.error_code,
    }
