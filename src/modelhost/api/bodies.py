"""Media as the raw request body: `Content-Type: image/png` with the other parameters in the query string.

`curl --data-binary @cat.jpg -H 'Content-Type: image/jpeg' '.../v1/images/to-text?model=blip'` is how
many clients send one image. Such a request is turned into the JSON body the route already takes (the
file as base64 in the media field, each query parameter converted to its field's type), so the route,
its validation and the media rules stay one code path.

Query parameters: a parameter given several times is a list (`candidate_labels=cat&candidate_labels=dog`);
a list field given once is a list of one; object fields (`generate_kwargs`) are JSON text.
"""

from __future__ import annotations

import base64
import types
from collections.abc import Callable, Coroutine
from typing import Annotated, Any, Union, get_args, get_origin

import orjson
from fastapi import Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from pydantic import BaseModel, ValidationError
from starlette.types import Message

# route path → (the body field that takes the media, the content types accepted as the raw body)
RAW_MEDIA_FIELDS: dict[str, tuple[str, tuple[str, ...]]] = {
    "/v1/classifications/zero-shot/image": ("image", ("image/",)),
    "/v1/images/segmentation": ("inputs", ("image/",)),
    "/v1/question-answering/visual": ("image", ("image/",)),
    "/v1/images/to-text": ("inputs", ("image/",)),
    "/v1/images/feature-extraction": ("inputs", ("image/",)),
    "/v1/classifications/audio": ("inputs", ("audio/",)),
}


def raw_body_openapi(path: str) -> dict[str, Any]:
    """The extra request-body content type /docs shows for a route that takes raw media."""
    _, prefixes = RAW_MEDIA_FIELDS[path]
    return {
        f"{prefix}*": {
            "schema": {"type": "string", "format": "binary"},
            "description": "The file itself; the other parameters go in the query string.",
        }
        for prefix in prefixes
    }


class MediaBodyRoute(APIRoute):
    """An APIRoute that also accepts its media as the raw body (see the module docstring)."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()
        accepted = RAW_MEDIA_FIELDS.get(self.path)
        if accepted is None or self.body_field is None:
            return handler
        field, prefixes = accepted
        model = self.body_field.field_info.annotation
        assert isinstance(model, type) and issubclass(model, BaseModel)

        async def route(request: Request) -> Response:
            content_type = request.headers.get("content-type", "").lower()
            if content_type.startswith(prefixes):
                request = await _as_json_request(request, model, field)
            return await handler(request)

        return route


async def _as_json_request(request: Request, model: type[BaseModel], field: str) -> Request:
    """The same request with the JSON body it stands for: query parameters + the file in `field`."""
    raw = await request.body()
    params = _query_values(request, model, exclude=field)
    try:
        parsed = model.model_validate({**params, field: "media"}, strict=False)
    except ValidationError as exc:
        raise RequestValidationError(
            [{**e, "loc": ("query", *e["loc"])} for e in exc.errors(include_url=False)]
        ) from None
    body = parsed.model_dump(mode="json", exclude_unset=True)
    body[field] = base64.b64encode(raw).decode("ascii")
    payload = orjson.dumps(body)
    headers = [(k, v) for k, v in request.scope["headers"] if k not in (b"content-type", b"content-length")]
    headers += [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]
    sent = False

    async def receive() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": payload, "more_body": False}
        return await request.receive()  # after the body: disconnect notices, as before

    return Request({**request.scope, "headers": headers}, receive)


def _query_values(request: Request, model: type[BaseModel], exclude: str) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for name in request.query_params:
        if name == exclude:
            raise RequestValidationError(
                [
                    {
                        "loc": ("query", name),
                        "msg": f"the body holds `{name}`; do not repeat it",
                        "type": "extra",
                    }
                ]
            )
        given = request.query_params.getlist(name)
        info = model.model_fields.get(name)
        if info is not None and _takes_object(info.annotation):
            values[name] = _json_or_text(given[-1])
        elif info is not None and (len(given) > 1 or _only_list(info.annotation)):
            values[name] = given
        else:
            values[name] = given[-1]
    return values


def _members(annotation: Any) -> list[Any]:
    """The types a field accepts, with `Annotated`, `Optional` and unions unwrapped."""
    if get_origin(annotation) is Annotated:
        return _members(get_args(annotation)[0])
    if get_origin(annotation) in (Union, types.UnionType):
        return [m for arg in get_args(annotation) for m in _members(arg)]
    return [annotation]


def _only_list(annotation: Any) -> bool:
    members = [m for m in _members(annotation) if m is not type(None)]
    return bool(members) and all(get_origin(m) is list for m in members)


def _takes_object(annotation: Any) -> bool:
    return any(isinstance(m, type) and issubclass(m, BaseModel) for m in _members(annotation))


def _json_or_text(value: str) -> Any:
    try:
        return orjson.loads(value)
    except orjson.JSONDecodeError:
        return value
