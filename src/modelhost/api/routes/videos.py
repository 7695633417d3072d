"""Video generation jobs (api.md §4.2, §2.2, §3.1): create, retrieve, list, delete, download content.

Creating a job only records it (status `queued`); a gateway's `VideoRunner` claims and runs it. The
`input_reference` is read (fetched, decoded from base64, or read below the media root) when the job is
created, so a bad reference is a 400 at once rather than a failed job later.
"""

from __future__ import annotations

import asyncio
from typing import Annotated, Literal

import orjson
from fastapi import APIRouter, Query, Request, Response

from modelhost.api.bodies import MediaBodyRoute, form_openapi
from modelhost.api.deps import CallerPrincipal, account_id_of, deployment_for, get_services
from modelhost.api.errors import error_responses
from modelhost.api.lists import After, Limit, Order, list_body
from modelhost.auth.principal import Principal, PrincipalKind
from modelhost.errors import InvalidRequest
from modelhost.media.sources import load_media
from modelhost.protocol.videos import ImageReference, Video, VideoCreateRequest, VideoDeleted, VideoList

router = APIRouter(tags=["videos"], responses=error_responses(400, 401, 402, 404), route_class=MediaBodyRoute)
MAX_FRAMES = 1024
VIDEO_EXAMPLE = {
    "id": "video_5d1e8c0f4a2b",
    "object": "video",
    "created_at": 1767225600,
    "completed_at": None,
    "expires_at": None,
    "model": "t2v",
    "prompt": "a cat walking",
    "seconds": 2.0,
    "size": "256x256",
    "status": "queued",
    "progress": 0,
    "error": None,
    "remixed_from_video_id": None,
}


def _scope(principal: Principal) -> set[str] | None:
    """A deployment key sees the jobs of its deployments only; an account key sees all."""
    if principal.kind is PrincipalKind.DEPLOYMENT:
        return set(principal.deployment_ids or ())
    return None


def _json(payload: object, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(orjson.dumps(payload), status_code=status, media_type="application/json", headers=headers)


@router.post(
    "/v1/videos",
    summary="Create a video generation job (JSON, or multipart as the openai SDK sends it)",
    response_model=Video,
    openapi_extra={"requestBody": {"content": form_openapi("/v1/videos", VideoCreateRequest)}},
    responses={200: {"content": {"application/json": {"example": VIDEO_EXAMPLE}}}},
)
async def create_video(body: VideoCreateRequest, request: Request, principal: CallerPrincipal) -> Response:
    deployment = await deployment_for(request, principal, body.model)
    frames = round(float(body.seconds) * body.fps)
    if frames > MAX_FRAMES:
        raise InvalidRequest(f"seconds × fps gives {frames} frames; at most {MAX_FRAMES}.", param="seconds")
    services = get_services(request)
    reference = None
    if body.input_reference is not None:
        value = body.input_reference
        text = value.image_url if isinstance(value, ImageReference) else value
        reference = await load_media(
            text, services.media, param="input_reference", timeout=None, allow_paths=True
        )
    options = {
        "seconds": float(body.seconds),
        "size": body.size,
        "fps": body.fps,
        "num_inference_steps": body.num_inference_steps,
        "guidance_scale": body.guidance_scale,
        "seed": body.seed,
    }
    job = await asyncio.to_thread(
        services.videos.create,
        account_id_of(principal),
        deployment.id,
        deployment.model,
        body.prompt,
        options,
        reference,
    )
    return _json(job)


@router.get("/v1/videos", summary="List video jobs (newest first by default)", response_model=VideoList)
async def list_videos(
    request: Request,
    principal: CallerPrincipal,
    after: After = None,
    limit: Limit = 20,
    order: Order = "desc",
) -> Response:
    jobs, more = await asyncio.to_thread(
        get_services(request).videos.list, account_id_of(principal), after, limit, order, _scope(principal)
    )
    return _json(list_body(jobs, more))


@router.get(
    "/v1/videos/{video_id}",
    summary="Retrieve a video job (`openai-poll-after-ms` while it is queued or running)",
    response_model=Video,
)
async def retrieve_video(video_id: str, request: Request, principal: CallerPrincipal) -> Response:
    services = get_services(request)
    job = await asyncio.to_thread(services.videos.get, account_id_of(principal), video_id, _scope(principal))
    headers = None
    if job["status"] in ("queued", "in_progress"):
        headers = {"openai-poll-after-ms": str(services.settings.video_poll_after_ms)}
    return _json(job, headers=headers)


@router.delete(
    "/v1/videos/{video_id}",
    summary="Delete a video job and its content; a running generation is stopped",
    response_model=VideoDeleted,
)
async def delete_video(video_id: str, request: Request, principal: CallerPrincipal) -> Response:
    services = get_services(request)
    await asyncio.to_thread(services.videos.delete, account_id_of(principal), video_id, _scope(principal))
    await services.video_runner.cancel(video_id)
    return _json({"id": video_id, "object": "video.deleted", "deleted": True})


@router.get(
    "/v1/videos/{video_id}/content",
    summary="Download the MP4 of a completed job (409 `video_not_ready` before; 404 `video_expired` after)",
    responses={**error_responses(409), 200: {"content": {"video/mp4": {}}}},
)
async def video_content(
    video_id: str,
    request: Request,
    principal: CallerPrincipal,
    variant: Annotated[Literal["video"], Query(description="Only `video` (the MP4) is produced.")] = "video",
) -> Response:
    videos = get_services(request).videos
    key = await asyncio.to_thread(videos.content_key, account_id_of(principal), video_id, _scope(principal))
    data = await asyncio.to_thread(videos.read, key)
    return Response(
        data, media_type="video/mp4", headers={"Content-Disposition": f'inline; filename="{video_id}.mp4"'}
    )
