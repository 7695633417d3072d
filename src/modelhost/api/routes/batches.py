"""The Batch API (OpenAI's `/v1/batches`, docs/batch.md): create, retrieve, cancel, list.

Creating a batch records it (`validating`) and copies its input, as an upload would: it counts against
the key's rate limits, and is refused with 402 when the account has no credits left (429 past its spend
caps), 507 below the free-disk floor (reading, listing and cancelling batches are not limited: a client
polls its batch until it ends); the supervisor's batch runner
checks its lines, answers each once at low priority and writes the output and error files
(`modelhost.batches`).
"""

from __future__ import annotations

import asyncio
from typing import Annotated

import orjson
from fastapi import APIRouter, Query, Response

from modelhost import tracing
from modelhost.api.deps import CallerPrincipal, ServicesDep, owner_of
from modelhost.api.errors import error_responses
from modelhost.api.lists import After, list_body
from modelhost.protocol.batches import Batch, BatchCreateRequest, BatchList

router = APIRouter(tags=["batches"], responses=error_responses(400, 401, 404, 429))

BATCH_EXAMPLE = {
    "id": "batch_5d1e8c0f4a2b9e7c1f0a3b2c",
    "object": "batch",
    "endpoint": "/v1/embeddings",
    "model": "minilm",
    "errors": None,
    "input_file_id": "file_5d1e8c0f4a2b9e7c1f0a3b2c",
    "completion_window": "24h",
    "status": "in_progress",
    "output_file_id": None,
    "error_file_id": None,
    "created_at": 1767225600,
    "in_progress_at": 1767225601,
    "expires_at": 1767312000,
    "finalizing_at": None,
    "completed_at": None,
    "failed_at": None,
    "expired_at": None,
    "cancelling_at": None,
    "cancelled_at": None,
    "request_counts": {"total": 1000, "completed": 420, "failed": 0},
    "usage": {"input_tokens": 5040, "output_tokens": 0, "total_tokens": 5040},
    "metadata": {"job": "nightly"},
}


def _json(payload: object) -> Response:
    return Response(orjson.dumps(payload), media_type="application/json")


@router.post(
    "/v1/batches",
    summary="Create a batch from an uploaded JSONL file (purpose batch)",
    response_model=Batch,
    responses={
        200: {"content": {"application/json": {"example": BATCH_EXAMPLE}}},
        **error_responses(402, 507),
    },
)
async def create_batch(
    body: BatchCreateRequest, services: ServicesDep, principal: CallerPrincipal
) -> Response:
    created = await asyncio.to_thread(
        services.batches.create,
        owner_of(principal),
        body.input_file_id,
        body.endpoint,
        services.settings.batch_completion_window_seconds,
        body.completion_window,
        body.metadata,
        body.output_expires_after.seconds if body.output_expires_after else None,
        tracing.parent(),  # its lines' spans link to this request's
    )
    services.wake("batches")  # claimed now, not at the runner's next poll
    return _json(created)


@router.get("/v1/batches/{batch_id}", summary="A batch's object", response_model=Batch)
async def get_batch(batch_id: str, services: ServicesDep, principal: CallerPrincipal) -> Response:
    return _json(await asyncio.to_thread(services.batches.get, owner_of(principal), batch_id))


@router.post(
    "/v1/batches/{batch_id}/cancel",
    summary="Cancel a batch: `cancelling` until the lines in flight finish, then `cancelled` with the "
    "answers so far in its files",
    response_model=Batch,
    responses=error_responses(409),
)
async def cancel_batch(batch_id: str, services: ServicesDep, principal: CallerPrincipal) -> Response:
    return _json(await asyncio.to_thread(services.batches.cancel, owner_of(principal), batch_id))


@router.get("/v1/batches", summary="List the account's batches, newest first", response_model=BatchList)
async def list_batches(
    services: ServicesDep,
    principal: CallerPrincipal,
    after: After = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
) -> Response:
    items, more = await asyncio.to_thread(services.batches.page, owner_of(principal), after, limit)
    return _json(list_body(items, more))
