"""OpenAI video jobs (`/v1/videos`; api.md §4.2, docs/videos.md): the job's options from a create
request, and the store's jobs (`jobs.store`) as OpenAI's typed `Video` objects, pages and deletions.
Creating a job only records it; a gateway's `VideoRunner` runs it (`jobs.runner`)."""

from __future__ import annotations

from typing import Any

from modelhost.protocol.videos import Video, VideoCreateRequest, VideoDeleted, VideoList


def video_options(body: VideoCreateRequest) -> dict[str, Any]:
    """What the job keeps of a create request for its run (and a remix of it)."""
    return {
        "seconds": float(body.seconds),
        "size": body.size,
        "fps": body.fps,
        "num_inference_steps": body.num_inference_steps,
        "guidance_scale": body.guidance_scale,
        "seed": body.seed,
    }


def video(job: dict[str, Any]) -> Video:
    """A job as the store shows it (`jobs.store.view`), typed."""
    return Video.model_validate(job)


def video_page(jobs: list[dict[str, Any]], more: bool) -> VideoList:
    """A page of jobs, with the cursor IDs of its first and last."""
    first, last = (jobs[0]["id"], jobs[-1]["id"]) if jobs else (None, None)
    return VideoList(data=[video(job) for job in jobs], first_id=first, last_id=last, has_more=more)


def video_deleted(video_id: str) -> VideoDeleted:
    return VideoDeleted(id=video_id)
