"""The Files API (OpenAI's `/v1/files`, docs/batch.md) and generated files behind signed links.

`GET /v1/files/{id}/content` serves both: with `expires` and `signature` in the query it is a generated
image's link (the link itself is the key); without them it needs an API key and serves a file of the
key's account (a batch's input, output or error file).
"""

from __future__ import annotations

import asyncio
from typing import Annotated, Literal

import orjson
from fastapi import APIRouter, Query, Request, Response

from modelhost.api.bodies import FormFile, read_form
from modelhost.api.deps import CallerPrincipal, ServicesDep, owner_of, require_caller
from modelhost.api.errors import error_responses
from modelhost.api.lists import After, Order, list_body
from modelhost.batches.files import PURPOSES
from modelhost.errors import InvalidRequest, NotFound
from modelhost.protocol.batches import FileDeleted, FileList, FileObject

router = APIRouter(tags=["files"], responses=error_responses(400, 401, 404))

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
    responses={200: {"content": {"application/json": {"example": FILE_EXAMPLE}}}, **error_responses(413)},
)
async def upload_file(request: Request, services: ServicesDep, principal: CallerPrincipal) -> Response:
    if not (request.headers.get("content-type") or "").startswith("multipart/form-data"):
        raise InvalidRequest("Upload a file as multipart/form-data with 'file' and 'purpose'.", param="file")
    fields: dict[str, str] = {}
    upload: FormFile | None = None
    for name, value in await read_form(request):
        if isinstance(value, FormFile):
            if name == "file":
                upload = value
        else:
            fields[name] = value
    if upload is None:
        raise InvalidRequest("'file' is required: the file itself, as a multipart file part.", param="file")
    if "purpose" not in fields:
        raise InvalidRequest("'purpose' is required.", param="purpose")
    expires_after = _expires_after(fields)
    created = await asyncio.to_thread(
        services.uploads.upload,
        owner_of(principal),
        upload.filename or "file",
        fields["purpose"],
        upload.data,
        expires_after,
    )
    return _json(created)


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
    summary="A file's bytes: with an API key, a file of the account; with `expires` and `signature`, a "
    "generated image's link (no key)",
    responses={200: {"content": {"application/octet-stream": {}, "image/png": {}, "application/jsonl": {}}}},
)
async def file_content(
    file_id: str,
    request: Request,
    services: ServicesDep,
    expires: Annotated[
        int | None, Query(description="A generated file's link: Unix time it expires at.")
    ] = None,
    signature: Annotated[
        str | None,
        Query(max_length=128, pattern="^[0-9a-f]*$", description="A generated file's link: its signature."),
    ] = None,
) -> Response:
    if expires is not None or signature is not None:
        if expires is None or signature is None:
            raise NotFound("File not found (or the link has expired).", code="file_not_found")
        try:
            data, content_type = await asyncio.to_thread(services.files.read, file_id, expires, signature)
        except OverflowError:  # an absurd `expires`
            raise NotFound("File not found (or the link has expired).", code="file_not_found") from None
        return Response(data, media_type=content_type, headers={"Cache-Control": "private, max-age=300"})
    principal = await require_caller(request)
    data, filename = await asyncio.to_thread(services.uploads.content, owner_of(principal), file_id)
    kind: Literal["application/jsonl", "application/octet-stream"] = (
        "application/jsonl" if filename.endswith(".jsonl") else "application/octet-stream"
    )
    return Response(
        data, media_type=kind, headers={"Content-Disposition": f'attachment; filename="{_safe(filename)}"'}
    )


def _safe(filename: str) -> str:
    """A file name fit for a header: no quotes, backslashes or control characters."""
    return "".join(c for c in filename if c.isascii() and c.isprintable() and c not in '"\\') or "file"
