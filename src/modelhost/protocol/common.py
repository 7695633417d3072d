"""Shapes shared by several API families."""

from __future__ import annotations

from typing import Generic, Literal, TypeVar

from pydantic import BaseModel, ConfigDict

T = TypeVar("T")


class StrictModel(BaseModel):
    """Request bodies: unknown fields and wrong types are refused (no `true` → 1, no `"5"` → 5), so
    mistakes do not pass silently. Whole numbers are still accepted where a number is expected."""

    model_config = ConfigDict(extra="forbid", strict=True)


class ListOf(BaseModel, Generic[T]):
    object: Literal["list"] = "list"
    data: list[T]


class Deleted(BaseModel):
    id: str
    object: str
    deleted: bool = True
