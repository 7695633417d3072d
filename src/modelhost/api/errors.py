"""One handler turns every failure into `{"error": {message, type, code, param}}`."""

from __future__ import annotations

import logging
import re
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import compile_path

from modelhost.errors import (
    InsufficientStorage,
    InvalidRequest,
    MethodNotAllowed,
    ModelhostError,
    NotFound,
    PayloadTooLarge,
    anthropic_body,
    is_disk_full,
)
from modelhost.logs import REQUEST_ID
from modelhost.protocol.errors import ErrorBody
from modelhost.store.db import database_full

log = logging.getLogger("modelhost.api")


# The routes that answer errors in Anthropic's shape (the Messages API's: `errors.anthropic_body`).
ANTHROPIC_PATHS = ("/v1/messages",)


def error_response(exc: ModelhostError, path: str = "") -> JSONResponse:
    """The one error body; under `ANTHROPIC_PATHS` (`path`: the request's), the same error in
    Anthropic's shape, whoever raised it (the key check, the body limit, the route)."""
    anthropic = path.startswith(ANTHROPIC_PATHS)
    body: dict[str, Any] = anthropic_body(exc) if anthropic else exc.body()
    request_id = REQUEST_ID.get()
    if exc.status_code >= 500 and request_id is not None:  # ours to look into: the ID finds its log lines
        body["error"]["message"] = f"{body['error']['message']} (request ID {request_id})"
    return JSONResponse(body, status_code=exc.status_code, headers=exc.headers or None)


# the names pydantic gives the members of a union in an error's location: never a field of ours
UNION_MEMBER_TYPES = frozenset({"str", "int", "float", "bool", "list", "dict", "none"})


UNION_MEMBER = re.compile(r"[a-z-]+\[.+\]|constrained-[a-z]+|[A-Z]\w*")


def _is_union_member(part: str) -> bool:
    """`constrained-str`, `list[constrained-str]`, `function-after[...]`, `str` or a model's class name
    (`TextPair`): pydantic names the union member it tried. Our fields are lower-case identifiers, or a
    form's `name[]`."""
    return part in UNION_MEMBER_TYPES or UNION_MEMBER.fullmatch(part) is not None


def _param_of(loc: tuple[Any, ...] | list[Any]) -> str | None:
    """`("body", "messages", 0, "role")` → `messages[0].role`; the location kind and the names of union
    members (`inputs.constrained-str` → `inputs`) are dropped."""
    parts = list(loc)
    if parts and parts[0] in ("body", "query", "path", "header", "cookie"):
        parts = parts[1:]
    text = ""
    for part in parts:
        if isinstance(part, int):
            text += f"[{part}]"
        elif not _is_union_member(str(part)):
            text += f".{part}" if text else str(part)
    return text or None


def validation_error(exc: RequestValidationError) -> InvalidRequest:
    errors = exc.errors()
    if not errors:
        return InvalidRequest("Invalid request.")
    first = errors[0]
    if first.get("type") == "json_invalid":
        return InvalidRequest("Request body is not valid JSON.", code="invalid_json")
    param = _param_of(first.get("loc", ()))
    message = str(first.get("msg", "Invalid value"))
    text = f"{param}: {message}" if param else message
    if len(errors) > 1:
        text += f" (and {len(errors) - 1} more error{'s' if len(errors) > 2 else ''})"
    return InvalidRequest(text, param=param)


def _allowed_methods(request: Request) -> list[str]:
    """Every method the API documents for this path (Starlette's own header names only one route's)."""
    methods: set[str] = set()
    for template, operations in request.app.openapi().get("paths", {}).items():
        if compile_path(template)[0].match(request.url.path):
            methods.update(method.upper() for method in operations)
    return sorted(methods)


def install_error_handlers(app: FastAPI) -> None:
    async def on_modelhost_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, ModelhostError)
        return error_response(exc, request.url.path)

    async def on_validation_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        return error_response(validation_error(exc), request.url.path)

    async def on_http_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        mapped: ModelhostError
        if exc.status_code == 404:
            mapped = NotFound(f"Route not found: {request.method} {request.url.path}", code="route_not_found")
        elif exc.status_code == 405:
            allowed = _allowed_methods(request)
            mapped = MethodNotAllowed(
                f"Method {request.method} is not allowed on {request.url.path}; use {', '.join(allowed)}."
            )
            mapped.headers = {"Allow": ", ".join(allowed)}
        elif exc.status_code == 413:
            mapped = PayloadTooLarge(str(exc.detail))
        else:
            mapped = ModelhostError(str(exc.detail))
            mapped.status_code = exc.status_code
            mapped.error_type = "invalid_request_error" if exc.status_code < 500 else "server_error"
            mapped.code = f"http_{exc.status_code}"
        mapped.headers = {**(exc.headers or {}), **mapped.headers}
        return error_response(mapped, request.url.path)

    async def on_unexpected(request: Request, exc: Exception) -> JSONResponse:
        if is_disk_full(exc) or database_full(exc):
            # A write the stores did not name (they raise `InsufficientStorage` themselves): still a
            # full disk, which the client may retry once space is freed, not a bug.
            log.warning("a disk is full on %s %s: %s", request.method, request.url.path, exc)
            full = InsufficientStorage("Insufficient storage: a disk of the server is full.")
            return error_response(full, request.url.path)
        log.exception("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
        return error_response(ModelhostError("Internal server error."), request.url.path)

    app.add_exception_handler(ModelhostError, on_modelhost_error)
    app.add_exception_handler(RequestValidationError, on_validation_error)
    app.add_exception_handler(StarletteHTTPException, on_http_error)
    app.add_exception_handler(Exception, on_unexpected)


_DESCRIPTIONS = {
    400: "Invalid request (validation error, bad JSON, unsupported endpoint for the deployment).",
    401: "Missing, malformed, wrong, revoked or out-of-scope API key (`InvalidAPIKeyError`).",
    402: "Out of credits (`insufficient_credits`).",
    403: "The key's role does not allow this route's action (`permission_denied`; docs/access.md).",
    404: "Not found (or not visible to this key).",
    409: "Conflict with the resource's current state.",
    413: "Request body too large (`payload_too_large`).",
    429: "Over a key's or account's rate limit (`rate_limit_exceeded`, `type` naming the limit: "
    "`requests`, `tokens` or `concurrent_requests`; docs/limits.md), or the deployment's queue is full "
    "(`overloaded`). See `Retry-After`; limited keys also get `x-ratelimit-*` headers.",
    502: "The replica running the request died while running it (`replica_crashed`): the request is "
    "not sent again, since it may be what killed it (`x-should-retry: false`).",
    503: "Service or deployment unavailable.",
    504: "Request timed out.",
    507: "A store is full (`insufficient_storage`): the message names it (the data directory's blob "
    "store, the database). Nothing was half-written; retry once space is freed.",
}


def error_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI `responses` entries for the given statuses, all with the one error body."""
    return {status: {"model": ErrorBody, "description": _DESCRIPTIONS[status]} for status in statuses}
