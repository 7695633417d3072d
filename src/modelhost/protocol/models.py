"""`GET /v1/models` in OpenAI's shape, with each model's pipeline task added."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field


class Model(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str
    pipeline: str = Field(
        description="The deployment's pipeline task, which decides the endpoints it answers (docs/tasks.md)."
    )
    parent: str | None = Field(
        default=None, description="An adapter deployment's base model (vLLM's convention); null otherwise."
    )
    root: str | None = Field(
        default=None, description="The full model that runs it: an adapter's base, else the model itself."
    )


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[Model]
