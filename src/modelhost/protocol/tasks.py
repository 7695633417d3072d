"""Hugging Face-style task endpoints (api.md §4.1, §4.4–§4.12)."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from modelhost.protocol.common import StrictModel

Text = Annotated[str, Field(min_length=1)]


class TaskRequest(StrictModel):
    """Fields every task endpoint accepts besides its own."""

    model: str | None = Field(
        default=None, description="Deployment model ID; optional with a key scoped to one deployment."
    )


class FeatureExtractionRequest(TaskRequest):
    inputs: Text | Annotated[list[Text], Field(min_length=1, max_length=2048)] = Field(
        description="A string or a list of strings.", examples=["Paris is the capital of France."]
    )
