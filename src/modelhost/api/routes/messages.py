"""The Anthropic Messages API (docs/messages.md): `POST /v1/messages` and `POST /v1/messages/count_tokens`
on text-generation and image-text-to-text deployments. Parse, call the serving (`serving.messages`),
respond with its JSON or its event stream. Errors on these routes are in Anthropic's shape
(`api.errors.ANTHROPIC_PATHS`); `anthropic-version` and `anthropic-beta` headers are accepted and read by
nothing (docs/messages.md, "Headers")."""

from __future__ import annotations

import orjson
from fastapi import APIRouter, Request, Response
from fastapi.responses import StreamingResponse

from modelhost.api.deps import (
    CallerPrincipal,
    ServicesDep,
    account_id_of,
    await_or_disconnect,
    deployment_for,
)
from modelhost.frontend import Target, Until
from modelhost.protocol.messages import (
    AnthropicError,
    CountTokensRequest,
    Message,
    MessagesRequest,
    TokenCount,
)
from modelhost.serving import messages

STATUSES = (400, 401, 402, 404, 413, 429, 502, 503)
router = APIRouter(tags=["anthropic"], responses={status: {"model": AnthropicError} for status in STATUSES})
SSE = {
    "text/event-stream": {
        "example": 'event: message_start\ndata: {"type": "message_start", "message": {...}}\n\n'
    }
}
EXAMPLE = {
    "id": "msg_4f1c0e2a9b7d5c3e1a0f8b6d",
    "type": "message",
    "role": "assistant",
    "model": "chat",
    "content": [{"type": "text", "text": "Hello! How can I help?"}],
    "stop_reason": "end_turn",
    "stop_sequence": None,
    "usage": {
        "input_tokens": 12,
        "output_tokens": 7,
        "cache_read_input_tokens": 0,
        "cache_creation_input_tokens": 0,
    },
}


@router.post(
    "/v1/messages",
    summary="Create a message (Anthropic Messages API; `stream: true` answers Anthropic's event stream)",
    response_model=Message,
    responses={200: {"content": {"application/json": {"example": EXAMPLE}, **SSE}}},
)
async def create_message(
    body: MessagesRequest, request: Request, services: ServicesDep, principal: CallerPrincipal
) -> Response:
    user = body.metadata.user_id if body.metadata is not None else None
    deployment = await deployment_for(request, principal, body.model, user=user)
    answer = await messages.create_message(
        body,
        services.generation,
        Target.of(deployment, principal),
        _until(request),
        services.mcp,
        account_id_of(principal),
    )
    if isinstance(answer, dict):
        return _json(answer)
    return StreamingResponse(answer, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})


@router.post(
    "/v1/messages/count_tokens",
    summary="The input tokens of a message's prompt, by the deployment's own chat template and tokenizer",
    response_model=TokenCount,
)
async def count_tokens(
    body: CountTokensRequest, request: Request, services: ServicesDep, principal: CallerPrincipal
) -> Response:
    deployment = await deployment_for(request, principal, body.model)
    counted = await messages.count_tokens(body, services.generation, Target.of(deployment), _until(request))
    return _json(counted)


def _until(request: Request) -> Until:
    """A whole answer is waited for until the client goes away (499)."""
    return lambda work: await_or_disconnect(request, work)


def _json(payload: object) -> Response:
    return Response(orjson.dumps(payload), media_type="application/json")
