"""Shapes shared by several API families."""

from __future__ import annotations

from typing import Generic, Literal, TypeVar

from pydantic import BaseModel, ConfigDict

T = TypeVar("T")


class StrictModel(BaseModel):
    """Request bodies: unknown fields are refused, so typos do not pass silently."""

    model_config = ConfigDict(extra="forbid")


class ListOf(BaseModel, Generic[T]):
    object: Literal["list"] = "list"
    data: list[T]


class Deleted(BaseModel):
    id: str
    object: str
    deleted: bool = True
