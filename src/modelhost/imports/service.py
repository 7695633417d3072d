"""Imports in the database: created by a route (with the upload session they fill), claimed, beaten,
released and finished by the supervisor's runner (`imports.runner`), cancelled by a route.

`queued → running → completed | failed | cancelled`. Every move is one guarded UPDATE, so a cancel and
the runner's end, or two servers' claims, cannot both win. What the runner needs that is secret (the
source as given, the credentials) is sealed (`imports.sealing`) and dropped when the import ends.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from sqlalchemy import or_, update

from modelhost import audit
from modelhost.artifacts.service import ArtifactService
from modelhost.config import Settings
from modelhost.errors import Conflict, NotFound
from modelhost.imports.sealing import Sealer
from modelhost.imports.sources import source_of
from modelhost.store.db import Database
from modelhost.store.models import ArtifactImport
from modelhost.store.turns import in_turn
from modelhost.store.types import new_id, utcnow

ACTIVE = ("queued", "running")


def _not_found() -> NotFound:
    return NotFound("Import not found", param="import_id", code="import_not_found")


@dataclass(frozen=True, slots=True)
class Claimed:
    """What a runner needs of an import it took."""

    id: str
    account_id: str
    artifact_id: str
    upload_id: str
    include: list[str] | None
    exclude: list[str] | None
    sealed: str | None


class Imports:
    def __init__(
        self, database: Database, artifacts: ArtifactService, sealer: Sealer, settings: Settings
    ) -> None:
        self._database = database
        self._artifacts = artifacts
        self._sealer = sealer
        self._settings = settings

    # ---------------------------------------------------------------- routes

    def create(
        self,
        account_id: str,
        artifact_id: str,
        source: str | list[Any],
        include: list[str] | None,
        exclude: list[str] | None,
        credentials: dict[str, Any] | None,
    ) -> ArtifactImport:
        """Check the source's form (400), open the artifact's upload session (404, 409 `artifact_busy`)
        and queue the import that fills it."""
        shown = source_of(source, include, exclude, credentials, self._settings).description
        self._artifacts.get(account_id, artifact_id)  # 404 before a session is opened
        upload, _ = self._artifacts.start_upload(account_id, artifact_id)
        with self._database.transaction() as session:
            row = ArtifactImport(
                id=new_id("imp"),
                artifact_id=artifact_id,
                account_id=account_id,
                upload_id=upload.id,
                source=shown,
                include=include,
                exclude=exclude,
                sealed=self._sealer.seal({"source": source, "credentials": credentials}),
                status="queued",
                bytes_done=0,
                files=[],
            )
            session.add(row)
            session.flush()
            fields = {"import_id": row.id, "source": shown, "include": include, "exclude": exclude}
            audit.record(
                session, "artifact.import_started", "artifact", artifact_id, account_id, audit.created(fields)
            )
            return row

    def get(self, account_id: str, artifact_id: str, import_id: str) -> ArtifactImport:
        with self._database.transaction() as session:
            row = session.get(ArtifactImport, import_id)
            if row is None or row.account_id != account_id or row.artifact_id != artifact_id:
                raise _not_found()
            return row

    def cancel(self, account_id: str, artifact_id: str, import_id: str) -> ArtifactImport:
        """Stop an active import: its upload session is aborted (the artifact back to its previous status,
        staged files gone); the runner sees it at its next beat. 409 once it is inspecting or over."""
        row = self.get(account_id, artifact_id, import_id)
        if row.status not in ACTIVE:
            raise Conflict(f"Import is {row.status}.", param="import_id", code="import_not_active")
        try:
            self._artifacts.abort(account_id, artifact_id, row.upload_id)
        except Conflict:
            raise Conflict(
                "Import is being inspected and can no longer be cancelled.",
                param="import_id",
                code="import_not_active",
            ) from None
        with self._database.transaction() as session:
            session.execute(
                update(ArtifactImport)
                .where(ArtifactImport.id == import_id, ArtifactImport.status.in_(ACTIVE))
                .values(status="cancelled", sealed=None, finished_at=utcnow(), updated_at=utcnow())
                .execution_options(synchronize_session=False)
            )
            audit.record(
                session,
                "artifact.import_cancelled",
                "artifact",
                artifact_id,
                account_id,
                {"import_id": {"before": import_id, "after": None}},
            )
        return self.get(account_id, artifact_id, import_id)

    # ---------------------------------------------------------------- the runner

    def claim(self, runner: str) -> Claimed | None:
        """An active import nobody runs (queued, released, or its runner silent `import_stale_seconds`),
        now this runner's, taken in turn between accounts as batches are: of the accounts running fewer
        than `import_concurrency_per_account` imports (on any server), the one running fewest, then the
        one waiting longest; its oldest import. So one account's imports never hold another's back."""
        stale = utcnow() - timedelta(seconds=self._settings.import_stale_seconds)
        claimable = (
            ArtifactImport.status.in_(ACTIVE),
            or_(ArtifactImport.claimed_by.is_(None), ArtifactImport.updated_at < stale),
        )
        per_account = self._settings.import_concurrency_per_account
        running = (
            ArtifactImport.status == "running",
            ArtifactImport.claimed_by.is_not(None),
            ArtifactImport.updated_at >= stale,
        )
        with self._database.transaction() as session:
            for row in in_turn(session, ArtifactImport, claimable, running, per_account):
                taken = session.execute(
                    update(ArtifactImport)
                    .where(ArtifactImport.id == row.id, *claimable)
                    .values(status="running", claimed_by=runner, updated_at=utcnow())
                    .execution_options(synchronize_session=False)
                )
                if taken.rowcount == 1:  # type: ignore[attr-defined]
                    return Claimed(
                        row.id,
                        row.account_id,
                        row.artifact_id,
                        row.upload_id,
                        row.include,
                        row.exclude,
                        row.sealed,
                    )
        return None

    def opened(self, claimed: Claimed) -> tuple[str | list[Any], dict[str, Any] | None]:
        """The source as given and its credentials; ValueError when they cannot be read (the key changed)."""
        if claimed.sealed is None:
            raise ValueError("nothing sealed")
        value = self._sealer.open(claimed.sealed)
        return value["source"], value["credentials"]

    def beat(
        self,
        import_id: str,
        runner: str,
        bytes_done: int,
        bytes_total: int | None,
        files: list[dict[str, Any]],
    ) -> bool:
        """Record progress while this runner still has the import running; False once it does not (a
        cancel, or another server took it over)."""
        with self._database.transaction() as session:
            moved = session.execute(
                update(ArtifactImport)
                .where(
                    ArtifactImport.id == import_id,
                    ArtifactImport.status == "running",
                    ArtifactImport.claimed_by == runner,
                )
                .values(bytes_done=bytes_done, bytes_total=bytes_total, files=files, updated_at=utcnow())
                .execution_options(synchronize_session=False)
            )
            return bool(moved.rowcount == 1)  # type: ignore[attr-defined]

    def release(self, import_id: str, runner: str) -> None:
        """Hand a running import back (the server stops): the next claim resumes it at once."""
        with self._database.transaction() as session:
            session.execute(
                update(ArtifactImport)
                .where(ArtifactImport.id == import_id, ArtifactImport.claimed_by == runner)
                .values(claimed_by=None)
                .execution_options(synchronize_session=False)
            )

    def finish(
        self, import_id: str, runner: str, status: str, code: str | None = None, message: str | None = None
    ) -> None:
        """`completed` or `failed` (with why), while still this runner's; its secrets go."""
        with self._database.transaction() as session:
            session.execute(
                update(ArtifactImport)
                .where(
                    ArtifactImport.id == import_id,
                    ArtifactImport.status == "running",
                    ArtifactImport.claimed_by == runner,
                )
                .values(
                    status=status,
                    error_code=code,
                    error_message=message,
                    sealed=None,
                    finished_at=utcnow(),
                    updated_at=utcnow(),
                )
                .execution_options(synchronize_session=False)
            )
