"""Video jobs in the database: the table is the queue, and every move is one guarded UPDATE.

    queued ──claim──> in_progress ──complete──> completed ──(retention)──> content swept
       ^                  │  └────fail──────> failed
       └──requeue (once)──┘  stale heartbeat: re-queued once, then failed with `interrupted`

A claim is `UPDATE ... SET status='in_progress' WHERE id=? AND status='queued'`: of several gateways on
one database, exactly one wins each job. A running job's heartbeat (`updated_at`) shows it is alive;
one that stops beating (its gateway crashed or was killed) is re-queued once, then failed. Deleting a
job removes its row; the gateway running it notices at its next update and stops the generation.

A completed job's files sit under `videos/<id>/`: the MP4 and its previews (VARIANTS), and the input
reference, if any. A remix is a new job with the source's options and a copy of its reference.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from sqlalchemy import and_, select, update

from modelhost.artifacts.blobstore import BlobStore
from modelhost.errors import Conflict, NotFound
from modelhost.store.db import Database
from modelhost.store.models import VideoJob
from modelhost.store.pages import keyset_page
from modelhost.store.types import new_id, unix_seconds, utcnow

MAX_ATTEMPTS = 2  # the first run and one re-run after an interruption
INTERRUPTED = "The generation was interrupted twice (its server stopped); it is not retried again."
# What `GET /v1/videos/{id}/content?variant=` serves: the file each variant is stored as.
VARIANTS = {"video": "video.mp4", "thumbnail": "thumbnail.webp", "spritesheet": "spritesheet.jpg"}
PREVIEWS = ("thumbnail", "spritesheet")  # made beside the MP4 by the worker


@dataclass(frozen=True)
class Claimed:
    id: str
    deployment_id: str
    model: str
    prompt: str
    options: dict[str, Any]
    traceparent: str  # the request that created it, which the job's span links to ("": none)


@dataclass(frozen=True)
class RemixSource:
    """What a remix takes from the video it remixes: its model, options and input reference."""

    model: str
    options: dict[str, Any]
    reference: bytes | None


class VideoJobs:
    def __init__(self, database: Database, blobs: BlobStore, retention_seconds: float) -> None:
        self._database = database
        self._blobs = blobs
        self._retention = timedelta(seconds=retention_seconds)

    # ---------------------------------------------------------------- the API's side

    def create(
        self,
        account_id: str,
        deployment_id: str,
        model: str,
        prompt: str,
        options: dict[str, Any],
        reference: bytes | None,
        traceparent: str = "",
    ) -> dict[str, Any]:
        """A queued job. `traceparent` is the creating request's span (`tracing.parent()`), kept for the
        job's span to link to, however late (a re-run after a restart too) it runs."""
        job_id = new_id("video")
        if reference is not None:
            key = f"videos/{job_id}/reference"
            writer = self._blobs.writer(key)
            writer.write(reference)
            writer.commit()
            options = {**options, "reference_key": key}
        with self._database.transaction() as session:
            job = VideoJob(
                id=job_id,
                account_id=account_id,
                deployment_id=deployment_id,
                model=model,
                prompt=prompt,
                options=options,
                traceparent=traceparent or None,
            )
            session.add(job)
            session.flush()
            return view(job)

    def get(self, account_id: str, job_id: str, deployments: set[str] | None = None) -> dict[str, Any]:
        with self._database.transaction() as session:
            return view(self._owned(session, account_id, job_id, deployments))

    def list(
        self, account_id: str, after: str | None, limit: int, order: str, deployments: set[str] | None = None
    ) -> tuple[list[dict[str, Any]], bool]:
        """A page of the account's jobs, newest first for `desc`; and whether more follow."""
        with self._database.transaction() as session:
            query = select(VideoJob).where(VideoJob.account_id == account_id)
            if deployments is not None:
                query = query.where(VideoJob.deployment_id.in_(deployments))
            cursor = None if after is None else self._owned(session, account_id, after, deployments)
            rows, more = keyset_page(session, query, VideoJob, cursor, limit, order)
            return [view(r) for r in rows], more

    def delete(self, account_id: str, job_id: str, deployments: set[str] | None = None) -> None:
        """Remove the job and its files; a running generation stops when its runner next checks in."""
        with self._database.transaction() as session:
            job = self._owned(session, account_id, job_id, deployments)
            session.delete(job)
        self._blobs.delete_prefix(f"videos/{job_id}")

    def content_key(
        self, account_id: str, job_id: str, deployments: set[str] | None = None, variant: str = "video"
    ) -> str:
        """The blob key of a completed, unexpired job's `variant` (VARIANTS)."""
        with self._database.transaction() as session:
            self._completed(self._owned(session, account_id, job_id, deployments), "its content exists")
        key = f"videos/{job_id}/{VARIANTS[variant]}"
        if variant != "video" and not self._blobs.exists(key):
            raise NotFound(
                f"This video has no {variant}: it was made before previews were produced.",
                code="video_variant_not_found",
                param="variant",
            )
        return key

    def remix_source(self, account_id: str, job_id: str, deployments: set[str] | None = None) -> RemixSource:
        """A completed, unexpired job's model, options and reference, for a remix of it."""
        with self._database.transaction() as session:
            job = self._completed(self._owned(session, account_id, job_id, deployments), "it can be remixed")
            model, options = job.model, dict(job.options)
        key = options.pop("reference_key", None)
        options.pop("remixed_from_video_id", None)
        return RemixSource(model, options, self.read(str(key)) if key else None)

    @staticmethod
    def _completed(job: VideoJob, then: str) -> VideoJob:
        """The job, if completed (else 409 `video_not_ready`) and not expired (else 404 `video_expired`)."""
        if job.status != "completed":
            raise Conflict(f"The video is {job.status}; {then} once it is completed.", code="video_not_ready")
        if job.content_key is None:
            raise NotFound("The video's content has expired.", code="video_expired")
        return job

    def read(self, key: str) -> bytes:
        try:
            with self._blobs.open(key) as handle:
                return handle.read()
        except FileNotFoundError:  # the job was deleted (or swept) since its key was read
            raise NotFound("Video not found", code="video_not_found") from None

    def _owned(self, session: Any, account_id: str, job_id: str, deployments: set[str] | None) -> VideoJob:
        job = session.get(VideoJob, job_id)
        if (
            job is None
            or job.account_id != account_id
            or (deployments is not None and job.deployment_id not in deployments)
        ):
            raise NotFound("Video not found", code="video_not_found")
        return job  # type: ignore[no-any-return]

    # ---------------------------------------------------------------- the runner's side

    def claim(self, runner: str) -> Claimed | None:
        """Take the oldest queued job, or None. Safe against other gateways on the same database."""
        while True:
            with self._database.transaction() as session:
                candidate = session.scalars(
                    select(VideoJob.id)
                    .where(VideoJob.status == "queued")
                    .order_by(VideoJob.created_at)
                    .limit(1)
                ).first()
                if candidate is None:
                    return None
                won = session.execute(
                    update(VideoJob)
                    .where(VideoJob.id == candidate, VideoJob.status == "queued")
                    .values(
                        status="in_progress",
                        claimed_by=runner,
                        attempts=VideoJob.attempts + 1,
                        updated_at=utcnow(),
                    )
                ).rowcount  # type: ignore[attr-defined]
                if won:
                    job = session.get(VideoJob, candidate)
                    assert job is not None
                    return Claimed(
                        job.id,
                        job.deployment_id,
                        job.model,
                        job.prompt,
                        dict(job.options),
                        job.traceparent or "",
                    )

    def reference(self, claimed: Claimed) -> bytes | None:
        key = claimed.options.get("reference_key")
        return self.read(key) if key else None

    def beat(self, job_id: str, runner: str, progress: int | None = None) -> bool:
        """Heartbeat (and progress) of a running job; False when it is no longer this runner's (deleted)."""
        values: dict[str, Any] = {"updated_at": utcnow()}
        if progress is not None:
            values["progress"] = progress
        return self._guarded(job_id, runner, values)

    def complete(
        self, job_id: str, runner: str, video: bytes, previews: Mapping[str, bytes] | None = None
    ) -> bool:
        """Store the MP4 and its previews (by variant name), then mark the job completed."""
        files = {"video": video, **(previews or {})}
        for variant, data in files.items():
            writer = self._blobs.writer(f"videos/{job_id}/{VARIANTS[variant]}")
            writer.write(data)
            writer.commit()
        key = f"videos/{job_id}/{VARIANTS['video']}"
        now = utcnow()
        done = self._guarded(
            job_id, runner, {"status": "completed", "progress": 100, "content_key": key, "completed_at": now,
                             "expires_at": now + self._retention, "updated_at": now},
        )  # fmt: skip
        if not done:  # deleted meanwhile: its files go too
            self._blobs.delete_prefix(f"videos/{job_id}")
        return done

    def fail(self, job_id: str, runner: str, code: str, message: str) -> bool:
        now = utcnow()
        values = {
            "status": "failed",
            "error_code": code,
            "error_message": message,
            "completed_at": now,
            "updated_at": now,
        }
        return self._guarded(job_id, runner, values)

    def release(self, job_id: str, runner: str) -> bool:
        """Give a job back to the queue without counting the attempt (clean shutdown)."""
        values = {"status": "queued", "claimed_by": None, "progress": 0, "attempts": VideoJob.attempts - 1}
        return self._guarded(job_id, runner, values)

    def recover_stale(self, stale_seconds: float) -> int:
        """Jobs whose runner stopped beating: re-queued if they have a run left, else failed."""
        cutoff = utcnow() - timedelta(seconds=stale_seconds)
        stale = and_(VideoJob.status == "in_progress", VideoJob.updated_at < cutoff)
        with self._database.transaction() as session:
            requeued = session.execute(
                update(VideoJob)
                .where(stale, VideoJob.attempts < MAX_ATTEMPTS)
                .values(status="queued", claimed_by=None, progress=0, updated_at=utcnow())
            ).rowcount  # type: ignore[attr-defined]
            failed = session.execute(
                update(VideoJob)
                .where(stale, VideoJob.attempts >= MAX_ATTEMPTS)
                .values(
                    status="failed",
                    error_code="interrupted",
                    error_message=INTERRUPTED,
                    completed_at=utcnow(),
                    updated_at=utcnow(),
                )
            ).rowcount  # type: ignore[attr-defined]
        return int(requeued) + int(failed)

    def sweep_expired(self) -> int:
        """Delete the content of completed jobs past their `expires_at` (the job itself stays visible)."""
        with self._database.transaction() as session:
            rows = session.scalars(
                select(VideoJob).where(VideoJob.expires_at < utcnow(), VideoJob.content_key.is_not(None))
            ).all()
            for job in rows:
                self._blobs.delete_prefix(f"videos/{job.id}")
                job.content_key = None
            return len(rows)

    def _guarded(self, job_id: str, runner: str, values: dict[str, Any]) -> bool:
        with self._database.transaction() as session:
            changed = session.execute(
                update(VideoJob)
                .where(VideoJob.id == job_id, VideoJob.status == "in_progress", VideoJob.claimed_by == runner)
                .values(**values)
            ).rowcount  # type: ignore[attr-defined]
        return bool(changed)


def view(job: VideoJob) -> dict[str, Any]:
    """The job as api.md §2.2 shows it (plus `progress`), timestamps in Unix seconds."""
    options = job.options
    error = {"code": job.error_code, "message": job.error_message or ""} if job.status == "failed" else None
    return {
        "id": job.id,
        "object": "video",
        "created_at": unix_seconds(job.created_at),
        "completed_at": unix_seconds(job.completed_at),
        "expires_at": unix_seconds(job.expires_at),
        "model": job.model,
        "prompt": job.prompt,
        "seconds": options["seconds"],
        "size": options["size"],
        "status": job.status,
        "progress": job.progress,
        "error": error,
        "remixed_from_video_id": options.get("remixed_from_video_id"),
    }
