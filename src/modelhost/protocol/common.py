"""Shapes shared by several API families."""

from __future__ import annotations

from typing import Annotated, Generic, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field

T = TypeVar("T")

# The description of an OpenAI field that changes nothing here (docs/openai-compat.md says why each is
# safe to ignore): accepted so that clients sending it work unchanged.
NO_EFFECT = "Accepted for OpenAI compatibility; no effect here (docs/openai-compat.md)."
# OpenAI's `metadata`: at most 16 pairs, keys up to 64 characters, values up to 512.
Metadata = Annotated[
    dict[Annotated[str, Field(max_length=64)], Annotated[str, Field(max_length=512)]], Field(max_length=16)
]

PRIORITY_BOUND = 1000  # vLLM's `priority` number, here from -this to this (beyond: a 400 naming it)
# OpenAI's `service_tier` (docs/runtime.md, "Service tiers"): `auto` and `scale` run as `default`.
ServiceTier = Literal["auto", "default", "flex", "priority", "scale"]
SERVICE_TIER = (
    "`priority` goes ahead of your key's default requests; `flex` waits behind every interactive request "
    "and is held back while they run (docs/runtime.md, Service tiers); `auto`, `scale`: `default`. "
    "The answer's `service_tier` says which applied."
)
PRIORITY_FIELD = (
    "Extension (as vLLM): lower runs sooner (default 0; -1 with `service_tier: priority`); orders your "
    "key's own waiting requests only. From -1000 to 1000."
)


class StrictModel(BaseModel):
    """Request bodies: unknown fields and wrong types are refused (no `true` → 1, no `"5"` → 5), so
    mistakes do not pass silently. Whole numbers are still accepted where a number is expected."""

    model_config = ConfigDict(extra="forbid", strict=True)


class ListOf(BaseModel, Generic[T]):
    object: Literal["list"] = "list"
    data: list[T]


class PageOf(ListOf[T], Generic[T]):
    """A page of a cursor-paged list (`after`, `limit`): its first and last IDs, and whether more follow."""

    first_id: str | None
    last_id: str | None
    has_more: bool


class Deleted(BaseModel):
    id: str
    object: str
    deleted: bool = True
