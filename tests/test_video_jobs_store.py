"""The video job queue in the database (SQLite and PostgreSQL): guarded moves, atomic claims, stale jobs."""

from __future__ import annotations

import threading
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import update

from modelhost.artifacts.blobstore import LocalBlobStore
from modelhost.errors import Conflict, NotFound
from modelhost.jobs.store import VARIANTS, VideoJobs
from modelhost.store import migrate
from modelhost.store.db import Database
from modelhost.store.models import Account, VideoJob
from modelhost.store.types import utcnow

OPTIONS = {"seconds": 1.0, "size": "32x32", "fps": 8}


@pytest.fixture
def jobs(database_url: str, tmp_path: Path) -> VideoJobs:
    database = Database(database_url)
    migrate.upgrade(database)
    with database.transaction() as session:
        session.add_all([Account(id="acct_a", name="a"), Account(id="acct_b", name="b")])
    return VideoJobs(database, LocalBlobStore(tmp_path / "blobs"), retention_seconds=60)


def new(jobs: VideoJobs, account: str = "acct_a", reference: bytes | None = None) -> str:
    job_id: str = jobs.create(account, "dep_1", "t2v", "a cat", OPTIONS, reference)["id"]
    return job_id


def age(jobs: VideoJobs, job_id: str, seconds: float) -> None:
    with jobs._database.transaction() as session:
        session.execute(
            update(VideoJob)
            .where(VideoJob.id == job_id)
            .values(updated_at=utcnow() - timedelta(seconds=seconds))
        )


def test_a_new_job_is_queued_with_unix_timestamps(jobs: VideoJobs) -> None:
    job = jobs.get("acct_a", new(jobs))
    assert job["status"] == "queued" and job["progress"] == 0 and job["error"] is None
    assert isinstance(job["created_at"], int) and job["completed_at"] is None and job["expires_at"] is None


def test_concurrent_claims_never_hand_out_a_job_twice(jobs: VideoJobs) -> None:
    created = {new(jobs) for _ in range(12)}
    claimed: list[str] = []

    def claimer(name: str) -> None:
        while (job := jobs.claim(name)) is not None:
            claimed.append(job.id)

    threads = [threading.Thread(target=claimer, args=(f"r{i}",)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(claimed) == sorted(created)


def test_only_the_claiming_runner_moves_its_job(jobs: VideoJobs) -> None:
    job_id = new(jobs)
    assert jobs.claim("r1") is not None
    assert not jobs.beat(job_id, "r2", 50) and not jobs.complete(job_id, "r2", b"mp4")
    assert jobs.beat(job_id, "r1", 50) and jobs.get("acct_a", job_id)["progress"] == 50
    assert jobs.complete(job_id, "r1", b"mp4-bytes")
    done = jobs.get("acct_a", job_id)
    assert done["status"] == "completed" and done["progress"] == 100
    assert done["expires_at"] - done["completed_at"] == 60
    assert jobs.read(jobs.content_key("acct_a", job_id)) == b"mp4-bytes"
    assert not jobs.fail(job_id, "r1", "x", "y")  # a finished job stays finished


def test_content_is_a_conflict_until_completed_and_gone_after_expiry(jobs: VideoJobs) -> None:
    job_id = new(jobs)
    with pytest.raises(Conflict):
        jobs.content_key("acct_a", job_id)
    jobs.claim("r1")
    jobs.complete(job_id, "r1", b"mp4")
    with jobs._database.transaction() as session:
        session.execute(update(VideoJob).values(expires_at=utcnow() - timedelta(seconds=1)))
    assert jobs.sweep_expired() == 1
    with pytest.raises(NotFound) as gone:
        jobs.content_key("acct_a", job_id)
    assert gone.value.code == "video_expired"
    assert jobs.get("acct_a", job_id)["status"] == "completed"  # the job stays visible


def test_previews_are_stored_beside_the_video_and_a_job_without_them_answers_404(jobs: VideoJobs) -> None:
    with_previews, without = new(jobs), new(jobs)
    jobs.claim("r1")
    jobs.complete(with_previews, "r1", b"mp4", {"thumbnail": b"webp", "spritesheet": b"jpeg"})
    jobs.claim("r1")
    jobs.complete(without, "r1", b"mp4")  # as a job completed before previews were made
    read = {v: jobs.read(jobs.content_key("acct_a", with_previews, variant=v)) for v in VARIANTS}
    assert read == {"video": b"mp4", "thumbnail": b"webp", "spritesheet": b"jpeg"}
    with pytest.raises(NotFound) as missing:
        jobs.content_key("acct_a", without, variant="thumbnail")
    assert (missing.value.code, missing.value.param) == ("video_variant_not_found", "variant")


def test_a_remix_takes_the_sources_options_and_a_copy_of_its_reference(jobs: VideoJobs) -> None:
    source = new(jobs, reference=b"png")
    with pytest.raises(Conflict):
        jobs.remix_source("acct_a", source)  # not completed yet
    jobs.claim("r1")
    jobs.complete(source, "r1", b"mp4")
    taken = jobs.remix_source("acct_a", source)
    assert (taken.model, taken.options, taken.reference) == ("t2v", OPTIONS, b"png")
    remix = jobs.create(
        "acct_a",
        "dep_1",
        taken.model,
        "a dog",
        {**taken.options, "remixed_from_video_id": source},
        taken.reference,
    )
    assert (
        remix["remixed_from_video_id"] == source
        and jobs.get("acct_a", source)["remixed_from_video_id"] is None
    )
    jobs.delete("acct_a", source)  # the remix keeps its own copy of the reference
    claimed = jobs.claim("r1")
    assert claimed is not None and claimed.id == remix["id"] and jobs.reference(claimed) == b"png"
    with pytest.raises(NotFound):
        jobs.remix_source("acct_a", source)


def test_an_expired_video_cannot_be_remixed(jobs: VideoJobs) -> None:
    job_id = new(jobs)
    jobs.claim("r1")
    jobs.complete(job_id, "r1", b"mp4")
    with jobs._database.transaction() as session:
        session.execute(update(VideoJob).values(expires_at=utcnow() - timedelta(seconds=1)))
    jobs.sweep_expired()
    with pytest.raises(NotFound) as gone:
        jobs.remix_source("acct_a", job_id)
    assert gone.value.code == "video_expired"


def test_a_stale_job_is_requeued_once_then_failed_as_interrupted(jobs: VideoJobs) -> None:
    job_id = new(jobs)
    jobs.claim("crashed-1")
    assert jobs.recover_stale(30) == 0  # still beating
    age(jobs, job_id, 60)
    assert jobs.recover_stale(30) == 1
    assert jobs.get("acct_a", job_id)["status"] == "queued"
    assert jobs.claim("crashed-2") is not None
    age(jobs, job_id, 60)
    jobs.recover_stale(30)
    failed = jobs.get("acct_a", job_id)
    assert failed["status"] == "failed" and failed["error"]["code"] == "interrupted"
    assert not jobs.beat(job_id, "crashed-2")  # the old runner, should it come back, is told to stop


def test_a_released_job_runs_again_without_spending_an_attempt(jobs: VideoJobs) -> None:
    job_id = new(jobs)
    jobs.claim("r1")
    assert jobs.release(job_id, "r1")
    for runner in ("r2", "r3"):  # two more interruptions are still one re-run and one failure
        assert jobs.claim(runner) is not None
        age(jobs, job_id, 60)
        jobs.recover_stale(30)
    assert jobs.get("acct_a", job_id)["error"]["code"] == "interrupted"


def test_deleting_removes_the_job_and_stops_its_runner(jobs: VideoJobs) -> None:
    job_id = new(jobs, reference=b"png")
    jobs.claim("r1")
    jobs.delete("acct_a", job_id)
    assert not jobs.beat(job_id, "r1")
    with pytest.raises(NotFound):
        jobs.get("acct_a", job_id)


def test_jobs_of_another_account_are_not_found(jobs: VideoJobs) -> None:
    job_id = new(jobs)
    for call in (jobs.get, jobs.delete, jobs.content_key, jobs.remix_source):
        with pytest.raises(NotFound):
            call("acct_b", job_id)


def test_listing_pages_by_cursor_in_both_orders(jobs: VideoJobs) -> None:
    ids = [new(jobs) for _ in range(5)]
    page, more = jobs.list("acct_a", None, 2, "desc")
    assert [j["id"] for j in page] == ids[::-1][:2] and more
    rest, more = jobs.list("acct_a", page[-1]["id"], 10, "desc")
    assert [j["id"] for j in rest] == ids[::-1][2:] and not more
    oldest, _ = jobs.list("acct_a", None, 3, "asc")
    assert [j["id"] for j in oldest] == ids[:3]
    assert jobs.list("acct_b", None, 10, "desc") == ([], False)
