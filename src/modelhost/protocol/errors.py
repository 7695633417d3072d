"""The one error body every failure answers with."""

from __future__ import annotations

from pydantic import BaseModel, Field


class ErrorDetail(BaseModel):
    message: str = Field(description="Human-readable explanation.")
    type: str = Field(description="Error class, e.g. `invalid_request_error` or `InvalidAPIKeyError`.")
    code: str | None = Field(description="Stable machine-readable code, e.g. `model_not_found`.")
    param: str | None = Field(description="The request field at fault, when there is one.")


class ErrorBody(BaseModel):
    error: ErrorDetail
