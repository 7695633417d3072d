"""Fine-tuning jobs in the database: the table is the queue, and every move is one guarded UPDATE.

    queued ──claim──> running ──complete──> succeeded
      ^  ^              │  │ └──fail──────> failed
      │  └─release/stale┘  └──pause──> paused ──resume──> queued
      └──────────── (any of queued, running, paused) ──cancel──> cancelled

A claim is `UPDATE ... SET status='running' WHERE id=? AND status='queued'`: of several servers on one
database exactly one runs a job. A running job's heartbeat (`updated_at`) shows its runner is alive; a
job whose runner stopped beating (its server was killed) is re-queued and resumes from its last
checkpoint, up to MAX_ATTEMPTS runs, then fails `interrupted`. Cancel and pause are moves of the row
that the runner notices at its next beat (its guarded UPDATE matches nothing): it stops the trainer.

A job's checkpoints are kept in the blob store while it may still resume from them (queued, running,
paused), billed as storage at their size (`stored_bytes`, a storage meter under the job's ID:
docs/billing.md). Once it has ended nothing reads them again (the adapter it made is an artifact of
its own): the runner's sweep deletes their files (`ended_checkpoints`, `forget_checkpoints`) and the
meter closes; their rows stay, listed with their metrics.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from sqlalchemy import func, or_, select, update
from sqlalchemy.orm import Session

from modelhost import audit
from modelhost.batches.files import Owner, StorageChanged
from modelhost.errors import Conflict, NotFound, RateLimitExceeded
from modelhost.fine_tuning.objects import checkpoint_view, event_view, fine_tuned_name, view
from modelhost.store.db import Database
from modelhost.store.models import Account, FineTuningCheckpoint, FineTuningEvent, FineTuningJob
from modelhost.store.pages import keyset_page
from modelhost.store.types import new_id, utcnow

MAX_ATTEMPTS = 3  # runs of a job: the first and two resumptions after its server stopped
ACTIVE = ("queued", "running", "paused")
ENDED = ("succeeded", "failed", "cancelled")
ABLE = {"cancelled": "cancellable", "paused": "pausable", "resumed": "resumable"}  # 409 codes
INTERRUPTED = "The job's server stopped three times while it trained; it is not resumed again."


@dataclass(frozen=True)
class NewJob:
    base_deployment_id: str
    model: str
    training_file: str
    validation_file: str | None
    training_key: str
    validation_key: str | None
    hyperparameters: dict[str, Any]
    total_steps: int
    suffix: str | None
    seed: int
    metadata: dict[str, str] | None
    deploy: bool  # deploy the adapter on its base once trained, as `fine_tuned_model`


@dataclass(frozen=True)
class Claimed:
    id: str
    account_id: str
    base_deployment_id: str
    model: str
    training_key: str
    validation_key: str | None
    hyperparameters: dict[str, Any]
    total_steps: int
    suffix: str | None
    seed: int
    deploy: str | None
    last_checkpoint: tuple[int, str] | None  # (step, blob prefix) to resume from


def not_found() -> NotFound:
    return NotFound("Fine-tuning job not found", code="fine_tuning_job_not_found", param="fine_tuning_job_id")


class FineTuningJobs:
    def __init__(
        self, database: Database, max_active_per_account: int, storage_changed: StorageChanged | None = None
    ) -> None:
        self._database = database
        self._max_active = max_active_per_account
        self._storage_changed = storage_changed or (lambda _session, _job_id: None)

    # ---------------------------------------------------------------- the API's side

    def create(self, owner: Owner, new: NewJob) -> dict[str, Any]:
        """The job, queued; a 429 when the account would have more than its limit of active jobs. The
        job is added before the account's active jobs are counted, in one transaction that first locks
        the account's row (PostgreSQL; SQLite's writers take turns at the insert): of two creates at
        once, the second counts the first's job, so the limit is never passed."""
        with self._database.transaction() as session:
            session.get(Account, owner.account_id, with_for_update=True)
            job_id = new_id("ftjob")
            job = FineTuningJob(
                id=job_id,
                account_id=owner.account_id,
                key_id=owner.key_id,
                base_deployment_id=new.base_deployment_id,
                model=new.model,
                training_file=new.training_file,
                validation_file=new.validation_file,
                training_key=new.training_key,
                validation_key=new.validation_key,
                hyperparameters=new.hyperparameters,
                total_steps=new.total_steps,
                suffix=new.suffix,
                seed=new.seed,
                job_metadata=new.metadata,
                deploy=fine_tuned_name(new.model, new.suffix, job_id) if new.deploy else None,
                status="queued",
                step=0,
                trained_tokens=0,
                attempts=0,
                compute_ms=0,
            )
            session.add(job)
            session.flush()
            active = session.scalar(
                select(func.count())
                .select_from(FineTuningJob)
                .where(FineTuningJob.account_id == owner.account_id, FineTuningJob.status.in_(ACTIVE))
            )
            if (active or 0) > self._max_active:
                raise RateLimitExceeded(
                    f"This account has {(active or 1) - 1} fine-tuning jobs queued, running or paused, "
                    "its limit (MODELHOST_FINE_TUNING_MAX_ACTIVE_PER_ACCOUNT); cancel one or wait for one "
                    "to end.",
                    code="too_many_fine_tuning_jobs",
                )
            session.flush()
            _event(session, job.id, f"Created fine-tuning job: {job.id}")
            fields = {"model": new.model, "training_file": new.training_file, "status": "queued"}
            audit.record(
                session,
                "fine_tuning_job.created",
                "fine_tuning_job",
                job.id,
                owner.account_id,
                audit.created(fields),
            )
            return view(job)

    def get(self, owner: Owner, job_id: str) -> dict[str, Any]:
        with self._database.transaction() as session:
            return view(self._owned(session, owner, job_id))

    def page(self, owner: Owner, after: str | None, limit: int) -> tuple[list[dict[str, Any]], bool]:
        with self._database.transaction() as session:
            query = select(FineTuningJob).where(*owner.filter(FineTuningJob))
            cursor = None if after is None else self._owned(session, owner, after)
            rows, more = keyset_page(session, query, FineTuningJob, cursor, limit, "desc")
            return [view(r) for r in rows], more

    def events(
        self, owner: Owner, job_id: str, after: str | None, limit: int
    ) -> tuple[list[dict[str, Any]], bool]:
        """The job's events, newest first (as OpenAI lists them)."""
        with self._database.transaction() as session:
            self._owned(session, owner, job_id)
            query = select(FineTuningEvent).where(FineTuningEvent.job_id == job_id)
            cursor = None if after is None else session.get(FineTuningEvent, after)
            if after is not None and (cursor is None or cursor.job_id != job_id):
                raise NotFound("No such event of this job.", param="after")
            rows, more = keyset_page(session, query, FineTuningEvent, cursor, limit, "desc")
            return [event_view(r) for r in rows], more

    def checkpoints(
        self, owner: Owner, job_id: str, after: str | None, limit: int
    ) -> tuple[list[dict[str, Any]], bool]:
        with self._database.transaction() as session:
            job = self._owned(session, owner, job_id)
            query = select(FineTuningCheckpoint).where(FineTuningCheckpoint.job_id == job_id)
            cursor = None if after is None else session.get(FineTuningCheckpoint, after)
            if after is not None and (cursor is None or cursor.job_id != job_id):
                raise NotFound("No such checkpoint of this job.", param="after")
            rows, more = keyset_page(session, query, FineTuningCheckpoint, cursor, limit, "desc")
            return [checkpoint_view(job, r) for r in rows], more

    def cancel(self, owner: Owner, job_id: str) -> dict[str, Any]:
        return self._move(owner, job_id, ACTIVE, "cancelled", "Fine-tuning job cancelled.", "cancelled")

    def pause(self, owner: Owner, job_id: str) -> dict[str, Any]:
        return self._move(
            owner,
            job_id,
            ("queued", "running"),
            "paused",
            "Fine-tuning job paused; it resumes from its last checkpoint.",
            "paused",
        )

    def resume(self, owner: Owner, job_id: str) -> dict[str, Any]:
        return self._move(owner, job_id, ("paused",), "queued", "Fine-tuning job resumed.", "resumed")

    def _move(
        self, owner: Owner, job_id: str, sources: tuple[str, ...], target: str, said: str, action: str
    ) -> dict[str, Any]:
        """Move the job from one of `sources` to `target` (409 from any other state), with an event and
        the audit row `fine_tuning_job.<action>`."""
        with self._database.transaction() as session:
            job = self._owned(session, owner, job_id)
            before = job.status
            moved = session.execute(
                update(FineTuningJob)
                .where(FineTuningJob.id == job_id, FineTuningJob.status.in_(sources))
                .values(
                    status=target,
                    claimed_by=None,
                    waiting_reason=None,
                    updated_at=utcnow(),
                    **({"finished_at": utcnow()} if target == "cancelled" else {}),
                )
                .execution_options(synchronize_session=False)
            ).rowcount  # type: ignore[attr-defined]
            if not moved:
                raise Conflict(
                    f"The job is {before}: only a {', '.join(sources)} job can be {action}.",
                    code=f"fine_tuning_job_not_{ABLE[action]}",
                )
            _event(session, job_id, said)
            changes: audit.Changes = {"status": {"before": before, "after": target}}
            audit.record(
                session, f"fine_tuning_job.{action}", "fine_tuning_job", job_id, owner.account_id, changes
            )
            session.refresh(job)
            return view(job)

    def _owned(self, session: Session, owner: Owner, job_id: str) -> FineTuningJob:
        job = session.get(FineTuningJob, job_id)
        if job is None or not owner.sees(job.account_id, job.key_id):
            raise not_found()
        return job

    # ---------------------------------------------------------------- the runner's side

    def claim(self, runner: str) -> Claimed | None:
        """Take the oldest queued job, or None. Safe against other servers on the same database."""
        while True:
            with self._database.transaction() as session:
                candidate = session.scalars(
                    select(FineTuningJob.id)
                    .where(FineTuningJob.status == "queued")
                    .order_by(FineTuningJob.created_at)
                    .limit(1)
                ).first()
                if candidate is None:
                    return None
                won = session.execute(
                    update(FineTuningJob)
                    .where(FineTuningJob.id == candidate, FineTuningJob.status == "queued")
                    .values(
                        status="running",
                        claimed_by=runner,
                        attempts=FineTuningJob.attempts + 1,
                        updated_at=utcnow(),
                    )
                ).rowcount  # type: ignore[attr-defined]
                if not won:
                    continue
                job = session.get(FineTuningJob, candidate)
                assert job is not None
                last = session.scalars(
                    select(FineTuningCheckpoint)
                    .where(FineTuningCheckpoint.job_id == job.id)
                    .order_by(FineTuningCheckpoint.step.desc())
                    .limit(1)
                ).first()
                return Claimed(
                    job.id,
                    job.account_id,
                    job.base_deployment_id,
                    job.model,
                    job.training_key,
                    job.validation_key,
                    dict(job.hyperparameters),
                    job.total_steps,
                    job.suffix,
                    job.seed,
                    job.deploy,
                    None if last is None else (last.step, last.blob_key),
                )

    def beat(self, job_id: str, runner: str, **values: Any) -> bool:
        """Heartbeat (and progress: step, trained_tokens, waiting_reason); False when the job is no longer
        this runner's to run (cancelled, paused, taken over)."""
        return self._guarded(job_id, runner, {"updated_at": utcnow(), **values})

    def add_event(
        self,
        job_id: str,
        message: str,
        kind: str = "message",
        data: dict[str, Any] | None = None,
        level: str = "info",
    ) -> None:
        with self._database.transaction() as session:
            _event(session, job_id, message, kind, data, level)

    def add_checkpoint(
        self, job_id: str, runner: str, step: int, metrics: dict[str, Any], key: str, size: int
    ) -> bool:
        """Record a checkpoint (its `size` bytes of files are stored under `key` already) while the job
        is this runner's; they are billed as the job's storage from now."""
        with self._database.transaction() as session:
            held = session.execute(
                update(FineTuningJob)
                .where(
                    FineTuningJob.id == job_id,
                    FineTuningJob.status == "running",
                    FineTuningJob.claimed_by == runner,
                )
                .values(step=step, updated_at=utcnow(), stored_bytes=FineTuningJob.stored_bytes + size)
            ).rowcount  # type: ignore[attr-defined]
            if not held:
                return False
            session.add(
                FineTuningCheckpoint(
                    id=new_id("ftckpt"), job_id=job_id, step=step, metrics=metrics, blob_key=key
                )
            )
            _event(session, job_id, f"Checkpoint created at step {step}")
            self._storage_changed(session, job_id)  # the time before billed at the old size
            return True

    def succeed(
        self, job_id: str, runner: str, model: str, artifact_id: str, deployment_id: str | None
    ) -> bool:
        now = utcnow()
        done = self._guarded(
            job_id,
            runner,
            {
                "status": "succeeded",
                "fine_tuned_model": model,
                "artifact_id": artifact_id,
                "deployment_id": deployment_id,
                "finished_at": now,
                "waiting_reason": None,
                "updated_at": now,
            },
        )
        if done:
            with self._database.transaction() as session:
                _event(session, job_id, f"New fine-tuned model created: {model}")
                _event(session, job_id, "The job has successfully completed")
        return done

    def fail(self, job_id: str, runner: str, code: str, message: str, param: str | None = None) -> bool:
        now = utcnow()
        failed = self._guarded(
            job_id,
            runner,
            {
                "status": "failed",
                "error_code": code,
                "error_message": message,
                "error_param": param,
                "finished_at": now,
                "waiting_reason": None,
                "updated_at": now,
            },
        )
        if failed:
            self.add_event(job_id, f"The job failed: {message}", level="error")
        return failed

    def release(self, job_id: str, runner: str) -> bool:
        """Give a running job back to the queue without counting the run (a clean shutdown)."""
        return self._guarded(
            job_id,
            runner,
            {
                "status": "queued",
                "claimed_by": None,
                "attempts": FineTuningJob.attempts - 1,
                "waiting_reason": None,
            },
        )

    def ended_datasets(self, limit: int = 100) -> list[tuple[str, list[str]]]:
        """Ended jobs whose dataset copies are still stored: each job's ID and the copies' keys."""
        with self._database.transaction() as session:
            rows = session.execute(
                select(FineTuningJob.id, FineTuningJob.training_key, FineTuningJob.validation_key)
                .where(FineTuningJob.status.in_(ENDED), FineTuningJob.training_key != "")
                .limit(limit)
            ).all()
        return [(job_id, [k for k in (training, validation) if k]) for job_id, training, validation in rows]

    def forget_datasets(self, job_id: str) -> None:
        """The ended job's dataset copies were deleted."""
        with self._database.transaction() as session:
            session.execute(
                update(FineTuningJob)
                .where(FineTuningJob.id == job_id, FineTuningJob.status.in_(ENDED))
                .values(training_key="", validation_key=None)
            )

    def ended_checkpoints(self, limit: int = 100) -> list[str]:
        """Ended jobs whose checkpoints' files are still stored (or still billed): their IDs."""
        kept = select(FineTuningCheckpoint.job_id).where(FineTuningCheckpoint.blob_key != "")
        with self._database.transaction() as session:
            return list(
                session.scalars(
                    select(FineTuningJob.id)
                    .where(
                        FineTuningJob.status.in_(ENDED),
                        or_(FineTuningJob.stored_bytes > 0, FineTuningJob.id.in_(kept)),
                    )
                    .limit(limit)
                )
            )

    def forget_checkpoints(self, job_id: str) -> None:
        """The ended job's checkpoints' files were deleted: their rows stay (listed, with their metrics),
        without a blob key, and the job holds nothing more (its storage meter closes)."""
        with self._database.transaction() as session:
            ended = session.execute(
                update(FineTuningJob)
                .where(FineTuningJob.id == job_id, FineTuningJob.status.in_(ENDED))
                .values(stored_bytes=0)
            ).rowcount  # type: ignore[attr-defined]
            if not ended:
                return
            session.execute(
                update(FineTuningCheckpoint).where(FineTuningCheckpoint.job_id == job_id).values(blob_key="")
            )
            session.flush()
            self._storage_changed(session, job_id)

    def recover_stale(self, stale_seconds: float) -> int:
        """Jobs whose runner stopped beating: re-queued (to resume) if they have a run left, else failed."""
        cutoff = utcnow() - timedelta(seconds=stale_seconds)
        stale = (FineTuningJob.status == "running", FineTuningJob.updated_at < cutoff)
        with self._database.transaction() as session:
            requeued = session.execute(
                update(FineTuningJob)
                .where(*stale, FineTuningJob.attempts < MAX_ATTEMPTS)
                .values(status="queued", claimed_by=None, updated_at=utcnow())
            ).rowcount  # type: ignore[attr-defined]
            failed = session.execute(
                update(FineTuningJob)
                .where(*stale, FineTuningJob.attempts >= MAX_ATTEMPTS)
                .values(
                    status="failed",
                    error_code="interrupted",
                    error_message=INTERRUPTED,
                    finished_at=utcnow(),
                    updated_at=utcnow(),
                )
            ).rowcount  # type: ignore[attr-defined]
        return int(requeued) + int(failed)

    def charge(self, job_id: str, compute_ms: int) -> None:
        with self._database.transaction() as session:
            session.execute(
                update(FineTuningJob)
                .where(FineTuningJob.id == job_id)
                .values(compute_ms=FineTuningJob.compute_ms + compute_ms)
            )

    def status(self, job_id: str) -> str | None:
        with self._database.transaction() as session:
            return session.scalar(select(FineTuningJob.status).where(FineTuningJob.id == job_id))

    def _guarded(self, job_id: str, runner: str, values: dict[str, Any]) -> bool:
        with self._database.transaction() as session:
            changed = session.execute(
                update(FineTuningJob)
                .where(
                    FineTuningJob.id == job_id,
                    FineTuningJob.status == "running",
                    FineTuningJob.claimed_by == runner,
                )
                .values(**values)
            ).rowcount  # type: ignore[attr-defined]
        return bool(changed)


def _event(
    session: Session,
    job_id: str,
    message: str,
    kind: str = "message",
    data: dict[str, Any] | None = None,
    level: str = "info",
) -> None:
    session.add(
        FineTuningEvent(
            id=new_id("ftevent"),
            job_id=job_id,
            level=level,
            message=message,
            type=kind,
            data=data,
            created_at=utcnow(),
        )
    )
    session.flush()
