"""`GET /v1/files/{file_id}/content`: generated files behind signed, expiring links (no API key)."""

from __future__ import annotations

import asyncio
from typing import Annotated

from fastapi import APIRouter, Query, Request, Response

from modelhost.api.deps import ServicesDep
from modelhost.api.errors import error_responses
from modelhost.errors import NotFound

router = APIRouter(tags=["files"], responses=error_responses(404))


@router.get(
    "/v1/files/{file_id}/content",
    summary="A generated file (the `url` of an image generation answer); the link itself is the key",
    responses={200: {"content": {"image/png": {}, "image/jpeg": {}, "image/webp": {}}}},
)
async def file_content(
    file_id: str,
    request: Request,
    services: ServicesDep,
    expires: Annotated[int, Query(description="Unix time the link expires at.")],
    signature: Annotated[
        str, Query(max_length=128, pattern="^[0-9a-f]*$", description="The link's signature.")
    ],
) -> Response:
    try:
        data, content_type = await asyncio.to_thread(services.files.read, file_id, expires, signature)
    except OverflowError:  # an absurd `expires`
        raise NotFound("File not found (or the link has expired).", code="file_not_found") from None
    return Response(data, media_type=content_type, headers={"Cache-Control": "private, max-age=300"})
