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
import secrets
import time
from typing import Protocol

from modelhost import tracing
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


class VideoRunner:
    def __init__(self, jobs: VideoJobs, runtime: Runtime, settings: Settings) -> None:
        self.jobs = jobs
        self.runtime = runtime
        self.settings = settings
        self.name = f"gw-{secrets.token_hex(6)}"  # this gateway process, in `claimed_by`
        self._running: dict[str, asyncio.Task[None]] = {}
        self._loop: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()

    def start(self) -> None:
        self._loop = asyncio.create_task(self._claim_forever())

    async def stop(self) -> None:
        """Stop claiming; give running jobs back to the queue (they run again, counting no attempt)."""
        if self._loop is not None:
            self._loop.cancel()
        tasks = list(self._running.items())
        for _, task in tasks:
            task.cancel()
        await asyncio.gather(*(t for _, t in tasks), return_exceptions=True)
        for job_id, _ in tasks:
            await asyncio.to_thread(self.jobs.release, job_id, self.name)

    def wake(self) -> None:
        """A job was queued through a gateway of this server: look now rather than at the next poll
        (the poll is for jobs queued through other servers)."""
        self._wake.set()

    async def cancel(self, job_id: str) -> None:
        """A deleted job running here stops at once (on another server: at its next heartbeat)."""
        self._stop(job_id)

    def _stop(self, job_id: str) -> None:
        task = self._running.get(job_id)
        if task is not None:
            task.cancel()

    async def _claim_forever(self) -> None:
        last_housekeeping = 0.0
        while True:
            try:
                if time.monotonic() - last_housekeeping > min(
                    10.0, self.settings.video_job_stale_seconds / 2
                ):
                    last_housekeeping = time.monotonic()
                    await asyncio.to_thread(self.jobs.recover_stale, self.settings.video_job_stale_seconds)
                    await asyncio.to_thread(self.jobs.sweep_expired)
                claimed = None
                if len(self._running) < self.settings.video_concurrency:
                    claimed = await asyncio.to_thread(self.jobs.claim, self.name)
                if claimed is None:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._wake.wait(), self.settings.video_poll_seconds)
                    self._wake.clear()
                    continue
                self._running[claimed.id] = asyncio.create_task(self._run(claimed))
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("video job runner")
                await asyncio.sleep(self.settings.video_poll_seconds)

    async def _run(self, job: Claimed) -> None:
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
            self._running.pop(job.id, None)
            self._wake.set()  # a slot is free: a job waiting for one is claimed now

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
