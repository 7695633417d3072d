"""OpenAI Conversations API wire types (`/v1/conversations` and its items; docs/responses.md).

A conversation's items are the Responses API's input items, read as `POST /v1/responses` reads them
(`protocol.responses.InputItem`): up to 20 at a time, as OpenAI's API takes them.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field

from modelhost.protocol.common import StrictModel
from modelhost.protocol.responses import InputItem, Metadata

Items = Annotated[list[InputItem], Field(max_length=20)]


class ConversationCreateRequest(StrictModel):
    items: Items | None = Field(default=None, description="Initial items (at most 20).")
    metadata: Metadata | None = Field(default=None, description="Up to 16 string pairs.")


class ConversationUpdateRequest(StrictModel):
    metadata: Metadata | None = Field(description="Replaces the conversation's metadata whole.")


class ConversationItemsCreateRequest(StrictModel):
    items: Annotated[Items, Field(min_length=1)] = Field(description="The items to add (1 to 20).")


# ---------------------------------------------------------------- answers (documentation of the shapes)


class ConversationObject(BaseModel):
    id: str
    object: Literal["conversation"] = "conversation"
    created_at: int
    metadata: dict[str, str] = {}


class ConversationDeleted(BaseModel):
    id: str
    object: Literal["conversation.deleted"] = "conversation.deleted"
    deleted: Literal[True] = True


class ConversationItemList(BaseModel):
    object: Literal["list"] = "list"
    data: list[dict[str, Any]]
    first_id: str | None
    last_id: str | None
    has_more: bool
