"""The Responses API (OpenAI-compatible; docs/responses.md): `POST /v1/responses` on text-generation
and image-text-to-text deployments (`input_image` parts), and the stored responses (`GET`, `DELETE`,
`POST .../cancel`, `GET .../input_items`); a background response's events stream again from any
gateway process (`GET ...?stream=true&starting_after=N`).

Parse → prepare (chain from `previous_response_id`, checks) → open the generation (a prompt that does
not fit is a 400 before any answer) → the whole response, or its events as Server-Sent Events
(`event: <type>` + `data: {...}`, numbered by `sequence_number`), or, with `background`, `queued` at
once. Stored responses are per account; a deployment key sees only its deployments' responses.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Annotated, Any

import orjson
from fastapi import APIRouter, Path, Query, Request, Response
from fastapi.responses import StreamingResponse

from modelhost.api.deps import (
    CallerPrincipal,
    ServicesDep,
    account_id_of,
    await_or_disconnect,
    deployment_for,
)
from modelhost.api.errors import error_responses
from modelhost.api.lists import After, Limit, Order, list_body
from modelhost.auth.principal import Principal
from modelhost.errors import ModelhostError
from modelhost.frontend import Target
from modelhost.protocol.responses import InputItemList, ResponseCreateRequest, ResponseDeleted, ResponseObject
from modelhost.serving.responses.store import Scope

router = APIRouter(tags=["openai"], responses=error_responses(400, 401, 402, 404, 413, 429, 502, 503))
ResponseId = Annotated[str, Path(description="A response's ID (`resp_...`).")]
SSE = {
    "text/event-stream": {
        "example": 'event: response.created\ndata: {"type": "response.created", "sequence_number": 0}\n\n'
    }
}
EXAMPLE = {
    "id": "resp_4f1c0e2a9b7d5c3e1a0f8b6d",
    "object": "response",
    "created_at": 1767225600,
    "completed_at": 1767225601,
    "status": "completed",
    "model": "chat",
    "output": [
        {
            "id": "msg_0a1b2c3d4e5f60718293a4b5",
            "type": "message",
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": "Hello! How can I help?", "annotations": []}],
        }
    ],
    "usage": {
        "input_tokens": 12,
        "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
        "output_tokens": 7,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 19,
    },
}


def _scope(principal: Principal) -> Scope:
    return principal.deployment_ids


def _json(payload: object) -> Response:
    return Response(orjson.dumps(payload), media_type="application/json")


@router.post(
    "/v1/responses",
    summary="Create a response (OpenAI Responses API; `stream: true` answers Server-Sent Events)",
    response_model=ResponseObject,
    responses={200: {"content": {"application/json": {"example": EXAMPLE}, **SSE}}},
)
async def create_response(
    body: ResponseCreateRequest, request: Request, services: ServicesDep, principal: CallerPrincipal
) -> Response:
    deployment = await deployment_for(request, principal, body.model)
    responses = services.responses
    prepared = await responses.prepare(
        body,
        account_id_of(principal),
        _scope(principal),
        Target.of(deployment, principal),
    )
    if prepared.background:
        subjects, person = principal.limited(), principal.person()

        def charge(tokens: int) -> None:  # its tokens, once it ends: the key's, account's and person's
            services.limits.charge(subjects, tokens)
            if person is not None:
                services.quotas.ended(person, tokens)

        queued = await responses.submit(prepared, charge)
        if not body.stream:
            return _json(queued)
        # its stream follows the task (which goes on if this client leaves: it resumes with GET)
        return _sse(
            responses.follow(prepared.account_id, _scope(principal), prepared.id, None), numbered=True
        )
    generation = await responses.open(prepared)
    if body.stream:
        return _sse(responses.run(prepared, generation, record=prepared.store))

    async def last() -> dict[str, Any]:
        final: dict[str, Any] = {}
        async for event in responses.run(prepared, generation, record=prepared.store):
            final = event
        return final

    final = await await_or_disconnect(request, last())
    return _json(final["response"])


@router.get(
    "/v1/responses/{response_id}",
    summary="A stored response; with `stream=true`, a background response's events (after "
    "`starting_after`), then the new ones until it ends",
    response_model=ResponseObject,
    responses={200: {"content": {"application/json": {"example": EXAMPLE}, **SSE}}},
)
async def get_response(
    response_id: ResponseId,
    request: Request,
    services: ServicesDep,
    principal: CallerPrincipal,
    stream: Annotated[
        bool, Query(description="Stream a background response's events as Server-Sent Events.")
    ] = False,
    starting_after: Annotated[
        int | None,
        Query(ge=-1, description="With `stream`: the sequence number after which to start (default: all)."),
    ] = None,
    include: Annotated[list[str] | None, Query(description="Accepted; items are always whole.")] = None,
    include_obfuscation: Annotated[
        bool | None, Query(description="Accepted; no obfuscation is added.")
    ] = None,
) -> Response:
    account_id, scope = account_id_of(principal), _scope(principal)
    responses = services.responses
    if stream:
        await responses.streamed(account_id, scope, response_id)  # 404, or 400 if not background
        events = responses.follow(account_id, scope, response_id, starting_after)
        return _sse(events, numbered=True, first=0 if starting_after is None else starting_after + 1)
    return _json(await asyncio.to_thread(responses.store.get, account_id, scope, response_id))


@router.delete(
    "/v1/responses/{response_id}", summary="Delete a stored response", response_model=ResponseDeleted
)
async def delete_response(
    response_id: ResponseId, request: Request, services: ServicesDep, principal: CallerPrincipal
) -> Response:
    await services.responses.delete(account_id_of(principal), _scope(principal), response_id)
    return _json({"id": response_id, "object": "response.deleted", "deleted": True})


@router.post(
    "/v1/responses/{response_id}/cancel",
    summary="Cancel a background response (one that has finished is answered as it is)",
    response_model=ResponseObject,
)
async def cancel_response(
    response_id: ResponseId, request: Request, services: ServicesDep, principal: CallerPrincipal
) -> Response:
    return _json(await services.responses.cancel(account_id_of(principal), _scope(principal), response_id))


@router.get(
    "/v1/responses/{response_id}/input_items",
    summary="The items a stored response was generated from (the chain before it, then its input)",
    response_model=InputItemList,
)
async def list_input_items(
    response_id: ResponseId,
    request: Request,
    services: ServicesDep,
    principal: CallerPrincipal,
    after: After = None,
    limit: Limit = 20,
    order: Order = "desc",
    include: Annotated[list[str] | None, Query(description="Accepted; items are always whole.")] = None,
) -> Response:
    store = services.responses.store
    items, more = await asyncio.to_thread(
        store.input_items, account_id_of(principal), _scope(principal), response_id, after, limit, order
    )
    return _json(list_body(items, more))


def _sse(
    events: AsyncIterator[dict[str, Any]], *, numbered: bool = False, first: int = 0
) -> StreamingResponse:
    """OpenAI's Responses stream: each event named and numbered from `first` (here, unless `numbered`
    already: a background response's, numbered by its task); no `[DONE]` line."""

    async def body() -> AsyncIterator[bytes]:
        sequence = first
        try:
            async for event in events:
                if numbered:
                    sequence = event["sequence_number"]
                    yield _frame(event)
                else:
                    yield _frame({**event, "sequence_number": sequence})
                sequence += 1
        except ModelhostError as exc:  # after the 200 has gone out: report in the stream
            error = {"type": "error", "code": exc.code, "message": exc.message, "param": exc.param}
            yield _frame({**error, "sequence_number": sequence})

    return StreamingResponse(body(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})


def _frame(event: dict[str, Any]) -> bytes:
    kind: str = event["type"]
    return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(event) + b"\n\n"
