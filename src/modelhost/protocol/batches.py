"""The Files and Batch APIs (issue 41), in the shape of OpenAI's: what /docs shows and what a batch is
created with."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, Field

from modelhost.protocol.common import PageOf, StrictModel

BatchEndpoint = Literal[
    "/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses", "/v1/rerank"
]
BatchStatus = Literal[
    "validating", "failed", "in_progress", "finalizing", "completed", "expired", "cancelling", "cancelled"
]


class FileObject(BaseModel):
    id: str
    object: Literal["file"] = "file"
    bytes: int
    created_at: int
    expires_at: int | None = None
    filename: str
    purpose: str
    status: Literal["uploaded", "processed", "error"] = "processed"
    status_details: str | None = None


class FileDeleted(BaseModel):
    id: str
    object: Literal["file"] = "file"
    deleted: bool = True


class ExpiresAfter(StrictModel):
    """When a file expires: `seconds` after its creation (OpenAI's only anchor)."""

    anchor: Literal["created_at"]
    seconds: Annotated[int, Field(ge=3600, le=2_592_000)]


MAX_METADATA_PAIRS = 16  # OpenAI's bounds on a batch's `metadata`: 16 pairs, keys of at most 64
MAX_METADATA_KEY = 64  # characters and values of at most 512
MAX_METADATA_VALUE = 512


def _short_keys(value: Any) -> Any:
    """A key longer than OpenAI's 64 characters is refused before anything else is checked, so that no
    error names it (an error's `param` names the key of a wrong value, and would carry it back)."""
    if isinstance(value, dict) and any(isinstance(k, str) and len(k) > MAX_METADATA_KEY for k in value):
        raise ValueError(f"metadata keys may have at most {MAX_METADATA_KEY} characters")
    return value


Metadata = Annotated[
    dict[
        Annotated[str, Field(max_length=MAX_METADATA_KEY)],
        Annotated[str, Field(max_length=MAX_METADATA_VALUE)],
    ],
    Field(max_length=MAX_METADATA_PAIRS),
    BeforeValidator(_short_keys),
]


class BatchCreateRequest(StrictModel):
    input_file_id: Annotated[str, Field(min_length=1, max_length=64)]
    endpoint: BatchEndpoint
    completion_window: Literal["24h"]
    metadata: Metadata | None = None
    output_expires_after: ExpiresAfter | None = None


class BatchError(BaseModel):
    code: str | None
    line: int | None
    message: str | None
    param: str | None


class BatchErrors(BaseModel):
    object: Literal["list"] = "list"
    data: list[BatchError]


class BatchRequestCounts(BaseModel):
    total: int
    completed: int
    failed: int


class Batch(BaseModel):
    id: str
    object: Literal["batch"] = "batch"
    endpoint: str
    model: str | None
    errors: BatchErrors | None
    input_file_id: str
    completion_window: str
    status: BatchStatus
    output_file_id: str | None
    error_file_id: str | None
    created_at: int
    in_progress_at: int | None
    expires_at: int | None
    finalizing_at: int | None
    completed_at: int | None
    failed_at: int | None
    expired_at: int | None
    cancelling_at: int | None
    cancelled_at: int | None
    request_counts: BatchRequestCounts
    usage: dict[str, Any]
    metadata: dict[str, str] | None


FileList = PageOf[FileObject]
BatchList = PageOf[Batch]
