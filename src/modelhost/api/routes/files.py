"""The Files API (OpenAI's `/v1/files`, docs/batch.md) and generated files behind signed links.

`GET /v1/files/{id}/content` serves every file from one store (`services.files.FileStore`), with one of
two credentials: `expires` and `signature` in the query (a generated image's link: the link itself is
the key), or an API key, which reads any file of the key's account by its ID: a batch's input, output
or error file (streamed), or a generated image or video reference.

Every request of the Files API with a key counts against the key's and the account's rate limits; an
upload also needs credits (402) and stays within the account's spend caps, as inference does, and is
refused (507) below the data directory's free-disk floor, as an artifact's upload is.
"""

from __future__ import annotations

import asyncio
from typing import Annotated

import orjson
from fastapi import APIRouter, Depends, Query, Request, Response
from fastapi.responses import StreamingResponse

from modelhost.api.bodies import FilePart, FormField, stream_form
from modelhost.api.deps import CallerPrincipal, ServicesDep, owner_of, require_caller_unless_signed
from modelhost.api.errors import error_responses
from modelhost.api.lists import After, Order, list_body
from modelhost.auth.principal import Principal
from modelhost.batches.files import PURPOSES, FileUpload
from modelhost.container import Services
from modelhost.errors import InvalidRequest
from modelhost.protocol.batches import FileDeleted, FileList, FileObject

router = APIRouter(tags=["files"], responses=error_responses(400, 401, 404, 429))

FILE_EXAMPLE = {
    "id": "file_5d1e8c0f4a2b9e7c1f0a3b2c",
    "object": "file",
    "bytes": 1024,
    "created_at": 1767225600,
    "expires_at": None,
    "filename": "requests.jsonl",
    "purpose": "batch",
    "status": "processed",
    "status_details": None,
}
UPLOAD_FORM = {
    "multipart/form-data": {
        "schema": {
            "type": "object",
            "required": ["file", "purpose"],
            "properties": {
                "file": {"type": "string", "format": "binary"},
                "purpose": {
                    "type": "string",
                    "enum": ["assistants", "batch", "fine-tune", "vision", "user_data", "evals"],
                },
                "expires_after[anchor]": {"type": "string", "enum": ["created_at"]},
                "expires_after[seconds]": {"type": "integer", "minimum": 3600, "maximum": 2592000},
            },
        }
    }
}


PURPOSE_LIST = ", ".join(PURPOSES)


def _json(payload: object) -> Response:
    return Response(orjson.dumps(payload), media_type="application/json")


@router.post(
    "/v1/files",
    summary="Upload a file (multipart `file` and `purpose`; a batch's input is checked as JSONL here)",
    response_model=FileObject,
    openapi_extra={"requestBody": {"content": UPLOAD_FORM, "required": True}},
    responses={
        200: {"content": {"application/json": {"example": FILE_EXAMPLE}}},
        **error_responses(402, 413, 507),
    },
)
async def upload_file(request: Request, services: ServicesDep, principal: CallerPrincipal) -> Response:
    if not (request.headers.get("content-type") or "").startswith("multipart/form-data"):
        raise InvalidRequest("Upload a file as multipart/form-data with 'file' and 'purpose'.", param="file")
    received = Received()
    try:
        await received.read(request, services)
        if received.upload is None:
            raise InvalidRequest(
                "'file' is required: the file itself, as a multipart file part.", param="file"
            )
        if "purpose" not in received.fields:
            raise InvalidRequest("'purpose' is required.", param="purpose")
        expires_after = _expires_after(received.fields)
        owner = owner_of(principal)
        created = await received.upload.finish(
            owner, received.filename, received.fields["purpose"], expires_after
        )
    except BaseException:
        if received.upload is not None:
            await received.upload.abort()
        raise
    return _json(created)


class Received:
    """An upload's form as it arrives: its text fields, and its `file` part's bytes handed to the blob
    store as they come (`batches.files.FileUpload`), never held whole."""

    def __init__(self) -> None:
        self.fields: dict[str, str] = {}
        self.upload: FileUpload | None = None
        self.filename = "file"

    async def read(self, request: Request, services: Services) -> None:
        length = request.headers.get("content-length")
        declared = int(length) if length and length.isdigit() else None
        receiving = False  # whether the bytes arriving are the file's
        async for part in stream_form(request):
            if isinstance(part, bytes):
                if receiving and self.upload is not None:
                    await self.upload.write(part)
            elif isinstance(part, FormField):
                self.fields[part.name] = part.value
            else:
                receiving = self._is_the_file(part)
                if receiving:
                    purpose = self.fields.get("purpose")  # known now if the form sent it first
                    self.upload = await asyncio.to_thread(services.uploads.begin, purpose, declared)
                    self.filename = part.filename or "file"

    def _is_the_file(self, part: FilePart) -> bool:
        """Whether a file part is the upload's `file` (other file parts are skipped); one only."""
        if part.name != "file":
            return False
        if self.upload is not None:
            raise InvalidRequest("Send one 'file' part only.", param="file")
        return True


def _expires_after(fields: dict[str, str]) -> int | None:
    """`expires_after[anchor]` and `expires_after[seconds]`, as the openai SDK writes the object."""
    anchor, seconds = fields.get("expires_after[anchor]"), fields.get("expires_after[seconds]")
    if anchor is None and seconds is None:
        return None
    if anchor != "created_at":
        raise InvalidRequest("'expires_after.anchor' must be 'created_at'.", param="expires_after.anchor")
    if seconds is None or not seconds.isdigit():
        raise InvalidRequest("'expires_after.seconds' must be a whole number.", param="expires_after.seconds")
    return int(seconds)


@router.get("/v1/files", summary="List the account's files, newest first", response_model=FileList)
async def list_files(
    services: ServicesDep,
    principal: CallerPrincipal,
    after: After = None,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 10_000,
    order: Order = "desc",
    purpose: Annotated[
        str | None, Query(description=f"Only files of this purpose: {', '.join(PURPOSES)}.")
    ] = None,
) -> Response:
    items, more = await asyncio.to_thread(
        services.uploads.page, owner_of(principal), after, limit, order, purpose
    )
    return _json(list_body(items, more))


@router.get("/v1/files/{file_id}", summary="A file's object", response_model=FileObject)
async def get_file(file_id: str, services: ServicesDep, principal: CallerPrincipal) -> Response:
    return _json(await asyncio.to_thread(services.uploads.get, owner_of(principal), file_id))


@router.delete("/v1/files/{file_id}", summary="Delete a file and its bytes", response_model=FileDeleted)
async def delete_file(file_id: str, services: ServicesDep, principal: CallerPrincipal) -> Response:
    return _json(await asyncio.to_thread(services.uploads.delete, owner_of(principal), file_id))


@router.get(
    "/v1/files/{file_id}/content",
    summary="A file's bytes: with an API key, any file of the account (uploaded or generated); with "
    "`expires` and `signature`, a generated image's link (no key)",
    responses={200: {"content": {"application/octet-stream": {}, "image/png": {}, "application/jsonl": {}}}},
    openapi_extra={"security": [{"HTTPBearer": []}, {}]},  # a key, or none with a signed link
)
async def file_content(
    file_id: str,
    services: ServicesDep,
    principal: Annotated[Principal | None, Depends(require_caller_unless_signed)],
    expires: Annotated[
        int | None, Query(description="A generated file's link: Unix time it expires at.")
    ] = None,
    signature: Annotated[
        str | None,
        Query(max_length=128, pattern="^[0-9a-f]*$", description="A generated file's link: its signature."),
    ] = None,
) -> Response:
    if principal is None:
        content = await asyncio.to_thread(services.file_store.linked, file_id, expires, signature)
    else:
        content = await asyncio.to_thread(services.file_store.owned, owner_of(principal), file_id)
    if isinstance(content.body, bytes):
        return Response(content.body, media_type=content.media_type, headers=content.headers)
    return StreamingResponse(content.body, media_type=content.media_type, headers=content.headers)
