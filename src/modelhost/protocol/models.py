"""`GET /v1/models` in OpenAI's shape, with each model's pipeline task added under `modelhost`.

Our additions stay out of the names clients give meaning to: Open WebUI reads a model's `pipeline` as its
own Pipelines setting (and `info`, `tags`, `filters`, `actions`, `provider`, `status` likewise), so a
`pipeline` string broke its model list (issue 59). `parent` and `root` are vLLM's, read as vLLM means them.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field


class ModelExtensions(BaseModel):
    task: str = Field(
        description="The deployment's pipeline task, which decides the endpoints it answers (docs/tasks.md)."
    )


class Model(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str
    modelhost: ModelExtensions = Field(description="modelhost's own fields, under a name no client reserves.")
    parent: str | None = Field(
        default=None, description="An adapter deployment's base model (vLLM's convention); null otherwise."
    )
    root: str | None = Field(
        default=None, description="The full model that runs it: an adapter's base, else the model itself."
    )


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[Model]
