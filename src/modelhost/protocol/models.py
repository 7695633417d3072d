"""`GET /v1/models` in OpenAI's shape."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel


class Model(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[Model]
