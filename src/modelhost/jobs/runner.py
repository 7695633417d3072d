"""The video job runner: claims queued jobs from the database and runs them on their deployment's
replicas, reporting progress and a heartbeat, until they complete or fail.

Each server's supervisor runs one (with `MODELHOST_VIDEO_CONCURRENCY` jobs at a time); any number of
servers may share one database, since a claim is atomic (`VideoJobs.claim`). Housekeeping runs here too: stale
jobs (a crashed gateway's) are re-queued once or failed, and expired content is swept.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from typing import Protocol

from modelhost import tracing
from modelhost.claims import ClaimLoop
from modelhost.clock import beat, heartbeat_seconds
from modelhost.config import Settings
from modelhost.errors import ModelhostError
from modelhost.generation.contract import Progress, VideoDone, VideoLimits, VideoRequest
from modelhost.jobs.store import PREVIEWS, Claimed, VideoJobs
from modelhost.runtime.gateway.interface import Runtime

log = logging.getLogger("modelhost.jobs")


class VideoCancel(Protocol):
    """What the routes use of the runner: the `VideoRunner` in the supervisor, a stand-in that asks the
    supervisor in its other gateway processes (`modelhost.server.remote`)."""

    async def cancel(self, job_id: str) -> None: ...


class VideoRunner(ClaimLoop[Claimed]):
    """Claims queued video jobs (`modelhost.claims.ClaimLoop`) and runs each to its end; each turn of
    the loop, when due, re-queues or fails stale jobs and sweeps expired content."""

    what = "video job"

    def __init__(self, jobs: VideoJobs, runtime: Runtime, settings: Settings) -> None:
        super().__init__(log)
        self.jobs = jobs
        self.runtime = runtime
        self.settings = settings
        self._housekept = 0.0  # when the stale jobs and expired content were last seen to

    def concurrency(self) -> int:
        return self.settings.video_concurrency

    def poll_seconds(self) -> float:
        return self.settings.video_poll_seconds

    def claim(self) -> Claimed | None:
        return self.jobs.claim(self.name)

    def release(self, claim_id: str) -> None:
        """Give a running job back to the queue (it runs again, counting no attempt)."""
        self.jobs.release(claim_id, self.name)

    async def turn(self) -> None:
        if time.monotonic() - self._housekept > min(10.0, self.settings.video_job_stale_seconds / 2):
            self._housekept = time.monotonic()
            await asyncio.to_thread(self.jobs.recover_stale, self.settings.video_job_stale_seconds)
            await asyncio.to_thread(self.jobs.sweep_expired)

    async def cancel(self, job_id: str) -> None:
        """A deleted job running here stops at once (on another server: at its next heartbeat)."""
        self._stop(job_id)

    def _stop(self, job_id: str) -> None:
        task = self.running.get(job_id)
        if task is not None:
            task.cancel()

    async def run(self, job: Claimed) -> None:
        beating = asyncio.create_task(self._heartbeat(job.id))
        try:
            await tracing.within(lambda: self._span(job), self._generate(job))
        except ModelhostError as exc:
            # A worker's own error code (invalid_size, out_of_memory...) names the failure; a generic
            # refusal or an unavailable replica is a generation error.
            code = (
                exc.code
                if exc.code not in ("invalid_request", "deployment_unavailable")
                else "generation_error"
            )
            await asyncio.to_thread(self.jobs.fail, job.id, self.name, code, exc.message)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # never leave a job in progress because of a bug here
            log.exception("video job %s", job.id)
            await asyncio.to_thread(
                self.jobs.fail, job.id, self.name, "generation_error", f"{type(exc).__name__}"
            )
        finally:
            beating.cancel()

    @staticmethod
    def _span(job: Claimed) -> tracing.Span:
        """The job's `video job` span, linked to the request that created it (on each run of it: a
        re-run after a restart too). Current while it generates: the replica's spans are its children."""
        attributes = {"modelhost.video.id": job.id, "gen_ai.request.model": job.model}
        return tracing.linked_span("video job", job.traceparent, attributes)

    async def _generate(self, job: Claimed) -> None:
        options = job.options
        width, height = (int(side) for side in str(options["size"]).split("x"))
        item = VideoRequest(
            prompt=job.prompt,
            width=width,
            height=height,
            fps=int(options["fps"]),
            frames=max(1, round(float(options["seconds"]) * int(options["fps"]))),
            num_inference_steps=options.get("num_inference_steps"),
            guidance_scale=options.get("guidance_scale"),
            seed=options.get("seed"),
            limits=VideoLimits(self.settings.media_max_pixels, self.settings.media_max_seconds),
            reference=await asyncio.to_thread(self.jobs.reference, job),
        )
        last_progress = -1
        async with contextlib.aclosing(self.runtime.stream(job.deployment_id, item)) as events:
            async for event in events:
                if isinstance(event, VideoDone):
                    previews = {name: getattr(event, name) for name in PREVIEWS}
                    await asyncio.to_thread(self.jobs.complete, job.id, self.name, event.video, previews)
                    return
                progress = event.percent if isinstance(event, Progress) else None
                if progress is not None and progress != last_progress:
                    last_progress = progress
                    if not await beat(functools.partial(self.jobs.beat, job.id, self.name, progress)):
                        return  # deleted: closing the stream stops the generation in the worker

    async def _heartbeat(self, job_id: str) -> None:
        """Beat while loading the model or encoding, when no progress events come."""
        while True:
            await asyncio.sleep(heartbeat_seconds(self.settings.video_job_stale_seconds))
            if not await beat(lambda: self.jobs.beat(job_id, self.name)):
                self._stop(job_id)
                return
