"""Video generation jobs (api.md §4.2, §2.2, §3.1): create, remix, retrieve, list, delete, download
content (the MP4, its thumbnail or spritesheet).

Creating a job only records it (status `queued`); a gateway's `VideoRunner` claims and runs it. The
`input_reference` is read (fetched, decoded from base64, read below the media root, or a file of the
account by `file_id`) when the job is created, so a bad reference is a 400 at once rather than a failed
job later. A remix is a new job with the source's options and reference and a new prompt.
"""

from __future__ import annotations

import asyncio
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request, Response

from modelhost import tracing
from modelhost.api.answers import json_answer
from modelhost.api.bodies import MediaBodyRoute, form_openapi
from modelhost.api.deps import CallerPrincipal, ServicesDep, account_id_of, deployment_for
from modelhost.api.errors import error_responses
from modelhost.api.lists import After, Limit, Order
from modelhost.auth.principal import Principal, PrincipalKind
from modelhost.container import Services
from modelhost.errors import InvalidRequest, NotFound
from modelhost.media.sources import load_media
from modelhost.protocol.videos import (
    ImageReference,
    Video,
    VideoCreateRequest,
    VideoDeleted,
    VideoList,
    VideoRemixRequest,
    VideoVariant,
)
from modelhost.serving.videos import video, video_deleted, video_options, video_page

router = APIRouter(
    tags=["videos"], responses=error_responses(400, 401, 402, 404, 429, 507), route_class=MediaBodyRoute
)
MAX_FRAMES = 1024
CONTENT_TYPES = {"video": "video/mp4", "thumbnail": "image/webp", "spritesheet": "image/jpeg"}
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


@router.post(
    "/v1/videos",
    summary="Create a video generation job (JSON, or multipart as the openai SDK sends it)",
    response_model=Video,
    openapi_extra={"requestBody": {"content": form_openapi("/v1/videos", VideoCreateRequest)}},
    responses={200: {"content": {"application/json": {"example": VIDEO_EXAMPLE}}}},
)
async def create_video(
    body: VideoCreateRequest, request: Request, services: ServicesDep, principal: CallerPrincipal
) -> Response:
    deployment = await deployment_for(request, principal, body.model)
    frames = round(float(body.seconds) * body.fps)
    if frames > MAX_FRAMES:
        raise InvalidRequest(f"seconds × fps gives {frames} frames; at most {MAX_FRAMES}.", param="seconds")
    reference = await _reference(services, principal, body.input_reference)
    options = video_options(body)
    job = await asyncio.to_thread(
        services.videos.create,
        account_id_of(principal),
        deployment.id,
        deployment.model,
        body.prompt,
        options,
        reference,
        tracing.parent(),  # the job's span links to this request's
    )
    services.wake("videos")  # claimed now, not at the runner's next poll
    return json_answer(video(job))


async def _reference(
    services: Services, principal: Principal, value: str | ImageReference | None
) -> bytes | None:
    """The reference's bytes: a file of the account by `file_id`, else what `load_media` reads."""
    if value is None:
        return None
    if isinstance(value, ImageReference) and value.file_id is not None:
        try:
            data, _ = await asyncio.to_thread(
                services.files.read_owned, account_id_of(principal), value.file_id
            )
        except NotFound:
            raise InvalidRequest(
                f"input_reference: no file {value.file_id!r} of this account (unknown or expired).",
                param="input_reference",
                code="file_not_found",
            ) from None
        return data
    text = value.image_url if isinstance(value, ImageReference) else value
    assert text is not None
    return await load_media(text, services.media, param="input_reference", timeout=None, allow_paths=True)


@router.post(
    "/v1/videos/{video_id}/remix",
    summary="Remix a completed video: a new job with a new prompt and the source's other options",
    response_model=Video,
    responses={**error_responses(409), 200: {"content": {"application/json": {"example": VIDEO_EXAMPLE}}}},
)
async def remix_video(
    video_id: str,
    body: VideoRemixRequest,
    request: Request,
    services: ServicesDep,
    principal: CallerPrincipal,
) -> Response:
    account_id = account_id_of(principal)
    source = await asyncio.to_thread(services.videos.remix_source, account_id, video_id, _scope(principal))
    deployment = await deployment_for(request, principal, source.model, "/v1/videos")
    options: dict[str, Any] = {**source.options, "remixed_from_video_id": video_id}
    job = await asyncio.to_thread(
        services.videos.create,
        account_id,
        deployment.id,
        deployment.model,
        body.prompt,
        options,
        source.reference,
        tracing.parent(),
    )
    services.wake("videos")
    return json_answer(video(job))


@router.get("/v1/videos", summary="List video jobs (newest first by default)", response_model=VideoList)
async def list_videos(
    request: Request,
    services: ServicesDep,
    principal: CallerPrincipal,
    after: After = None,
    limit: Limit = 20,
    order: Order = "desc",
) -> Response:
    jobs, more = await asyncio.to_thread(
        services.videos.list, account_id_of(principal), after, limit, order, _scope(principal)
    )
    return json_answer(video_page(jobs, more))


@router.get(
    "/v1/videos/{video_id}",
    summary="Retrieve a video job (`openai-poll-after-ms` while it is queued or running)",
    response_model=Video,
)
async def retrieve_video(
    video_id: str, request: Request, services: ServicesDep, principal: CallerPrincipal
) -> Response:
    job = await asyncio.to_thread(services.videos.get, account_id_of(principal), video_id, _scope(principal))
    headers = None
    if job["status"] in ("queued", "in_progress"):
        headers = {"openai-poll-after-ms": str(services.settings.video_poll_after_ms)}
    return json_answer(video(job), headers=headers)


@router.delete(
    "/v1/videos/{video_id}",
    summary="Delete a video job and its content; a running generation is stopped",
    response_model=VideoDeleted,
)
async def delete_video(
    video_id: str, request: Request, services: ServicesDep, principal: CallerPrincipal
) -> Response:
    await asyncio.to_thread(services.videos.delete, account_id_of(principal), video_id, _scope(principal))
    await services.video_runner.cancel(video_id)
    return json_answer(video_deleted(video_id))


@router.get(
    "/v1/videos/{video_id}/content",
    summary="Download a completed job's MP4, thumbnail or spritesheet (409 `video_not_ready` before; "
    "404 `video_expired` after)",
    responses={**error_responses(409), 200: {"content": {t: {} for t in CONTENT_TYPES.values()}}},
)
async def video_content(
    video_id: str,
    request: Request,
    services: ServicesDep,
    principal: CallerPrincipal,
    variant: Annotated[
        VideoVariant,
        Query(
            description="`video`: the MP4; `thumbnail`: its first frame (WebP, the video's size); "
            "`spritesheet`: a grid of frames (JPEG)."
        ),
    ] = "video",
) -> Response:
    videos = services.videos
    key = await asyncio.to_thread(
        videos.content_key, account_id_of(principal), video_id, _scope(principal), variant
    )
    data = await asyncio.to_thread(videos.read, key)
    extension = key.rsplit(".", 1)[1]
    filename = f"{video_id}.{extension}" if variant == "video" else f"{video_id}-{variant}.{extension}"
    return Response(
        data,
        media_type=CONTENT_TYPES[variant],
        headers={"Content-Disposition": f'inline; filename="{filename}"'},
    )
