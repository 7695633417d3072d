"""OpenAI's Conversations API (docs/responses.md, "Conversations"): `POST /v1/conversations`, `GET`,
`POST` (metadata) and `DELETE /v1/conversations/{id}`, and its items (list, add, retrieve, delete).

Parse → the conversation store (`serving.responses.conversations`), which checks the account, the key's
deployments and the limits. Items are read as `POST /v1/responses` reads its input items.
"""

from __future__ import annotations

import asyncio
from typing import Annotated

import orjson
from fastapi import APIRouter, Path, Query, Response

from modelhost.api.deps import CallerPrincipal, ServicesDep, account_id_of
from modelhost.api.errors import error_responses
from modelhost.api.lists import After, Limit, Order, list_body
from modelhost.protocol.conversations import (
    ConversationCreateRequest,
    ConversationDeleted,
    ConversationItemList,
    ConversationItemsCreateRequest,
    ConversationObject,
    ConversationUpdateRequest,
)
from modelhost.serving.responses.items import input_items

router = APIRouter(tags=["openai"], responses=error_responses(400, 401, 404, 413, 429))
ConversationId = Annotated[str, Path(description="A conversation's ID (`conv_...`).")]
ItemId = Annotated[str, Path(description="An item's ID (`msg_...`, `fc_...`...).")]
Include = Annotated[list[str] | None, Query(description="Accepted; items are always whole.")]


def _json(payload: object) -> Response:
    return Response(orjson.dumps(payload), media_type="application/json")


@router.post("/v1/conversations", summary="Create a conversation", response_model=ConversationObject)
async def create_conversation(
    body: ConversationCreateRequest, services: ServicesDep, principal: CallerPrincipal
) -> Response:
    items = input_items(body.items or [], "items")
    store = services.responses.conversations
    account, scope = account_id_of(principal), principal.deployment_ids
    return _json(await asyncio.to_thread(store.create, account, scope, body.metadata, items))


@router.get(
    "/v1/conversations/{conversation_id}", summary="A conversation", response_model=ConversationObject
)
async def get_conversation(
    conversation_id: ConversationId, services: ServicesDep, principal: CallerPrincipal
) -> Response:
    store = services.responses.conversations
    account, scope = account_id_of(principal), principal.deployment_ids
    return _json(await asyncio.to_thread(store.get, account, scope, conversation_id))


@router.post(
    "/v1/conversations/{conversation_id}",
    summary="Update a conversation's metadata",
    response_model=ConversationObject,
)
async def update_conversation(
    conversation_id: ConversationId,
    body: ConversationUpdateRequest,
    services: ServicesDep,
    principal: CallerPrincipal,
) -> Response:
    store = services.responses.conversations
    account, scope = account_id_of(principal), principal.deployment_ids
    return _json(await asyncio.to_thread(store.update, account, scope, conversation_id, body.metadata))


@router.delete(
    "/v1/conversations/{conversation_id}",
    summary="Delete a conversation and its items",
    response_model=ConversationDeleted,
)
async def delete_conversation(
    conversation_id: ConversationId, services: ServicesDep, principal: CallerPrincipal
) -> Response:
    store = services.responses.conversations
    account, scope = account_id_of(principal), principal.deployment_ids
    await asyncio.to_thread(store.delete, account, scope, conversation_id)
    return _json({"id": conversation_id, "object": "conversation.deleted", "deleted": True})


@router.get(
    "/v1/conversations/{conversation_id}/items",
    summary="A conversation's items, paged (`order` default `desc`: newest first)",
    response_model=ConversationItemList,
)
async def list_items(
    conversation_id: ConversationId,
    services: ServicesDep,
    principal: CallerPrincipal,
    after: After = None,
    limit: Limit = 20,
    order: Order = "desc",
    include: Include = None,
) -> Response:
    store = services.responses.conversations
    account, scope = account_id_of(principal), principal.deployment_ids
    items, more = await asyncio.to_thread(
        store.list_items, account, scope, conversation_id, after, limit, order
    )
    return _json(list_body(items, more))


@router.post(
    "/v1/conversations/{conversation_id}/items",
    summary="Add items at the end of a conversation (1 to 20)",
    response_model=ConversationItemList,
)
async def add_items(
    conversation_id: ConversationId,
    body: ConversationItemsCreateRequest,
    services: ServicesDep,
    principal: CallerPrincipal,
    include: Include = None,
) -> Response:
    items = input_items(body.items, "items")
    store = services.responses.conversations
    account, scope = account_id_of(principal), principal.deployment_ids
    added = await asyncio.to_thread(store.add, account, scope, conversation_id, items)
    return _json(list_body(added, False))


@router.get(
    "/v1/conversations/{conversation_id}/items/{item_id}",
    summary="One item of a conversation",
    response_model=dict[str, object],
)
async def get_item(
    conversation_id: ConversationId,
    item_id: ItemId,
    services: ServicesDep,
    principal: CallerPrincipal,
    include: Include = None,
) -> Response:
    store = services.responses.conversations
    account, scope = account_id_of(principal), principal.deployment_ids
    return _json(await asyncio.to_thread(store.get_item, account, scope, conversation_id, item_id))


@router.delete(
    "/v1/conversations/{conversation_id}/items/{item_id}",
    summary="Delete one item of a conversation (answers the conversation)",
    response_model=ConversationObject,
)
async def delete_item(
    conversation_id: ConversationId, item_id: ItemId, services: ServicesDep, principal: CallerPrincipal
) -> Response:
    store = services.responses.conversations
    account, scope = account_id_of(principal), principal.deployment_ids
    return _json(await asyncio.to_thread(store.delete_item, account, scope, conversation_id, item_id))
