"""Request bodies other than JSON, turned into the JSON body the route already takes, so the route, its
validation and the media rules stay one code path.

- Media as the raw body: `curl --data-binary @cat.jpg -H 'Content-Type: image/jpeg'
  '.../v1/images/to-text?model=blip'` is how many clients send one image. The file becomes base64 in the
  route's media field; the query parameters are the other fields. A body is taken for a file by its
  content type, or else by its bytes (`media.sources.media_kinds`): many clients send files as
  `application/octet-stream` or with no content type at all. No JSON text starts like a media file, so
  JSON stays JSON whatever its content type says; a body that is neither is a clear 400.
- Multipart forms (the `openai` SDK sends `videos.create` and audio transcriptions so): each form field
  is a field of the body (`name[]`, the SDK's spelling of a list, is `name`), and an uploaded file becomes
  a `data:` URI.

`read_form` is the one multipart reader of forms read whole (these routes and the image edits, whose
form is not a JSON body: several files and a mask), within the 16 MB body limit. A file that may be as
large as 200 MB (`POST /v1/files`) is read with `stream_form` instead: its bytes are handed on as they
arrive, never held whole.

Values arrive as text and are converted to their field's type: a parameter given several times is a
list (`candidate_labels=cat&candidate_labels=dog`), a list field given once is a list of one, numbers
and booleans are parsed, object fields (`generate_kwargs`) are JSON text.
"""

from __future__ import annotations

import base64
import types
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, Union, get_args, get_origin

import orjson
from fastapi import Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from pydantic import BaseModel, ValidationError
from python_multipart.exceptions import FormParserError
from python_multipart.multipart import MultipartParser, parse_options_header
from starlette.datastructures import ImmutableMultiDict, UploadFile
from starlette.exceptions import HTTPException
from starlette.types import Message

from modelhost.errors import InvalidMedia, InvalidRequest
from modelhost.media.sources import media_kinds
from modelhost.pipelines import RAW_MEDIA

if TYPE_CHECKING:
    from python_multipart.multipart import MultipartCallbacks

JSON_TYPES = ("application/json",)

FORM_TYPES = ("multipart/form-data", "application/x-www-form-urlencoded")
# route path → the fields whose value may be an uploaded file in a multipart form
FORM_ROUTES: dict[str, tuple[str, ...]] = {
    "/v1/videos": ("input_reference",),
    "/v1/audio/transcriptions": ("file",),
    "/v1/audio/translations": ("file",),
}
MAX_FORM_FILES = 64
MAX_FORM_FIELDS = 64
MAX_FIELD_BYTES = 64 * 1024  # a text field of a streamed form (`stream_form`): its files carry the bytes


@dataclass(frozen=True, slots=True)
class FormFile:
    """A file part of a form, read in full."""

    content_type: str | None
    data: bytes
    filename: str | None = None

    def data_uri(self) -> str:
        kind = self.content_type or "application/octet-stream"
        return f"data:{kind};base64,{base64.b64encode(self.data).decode()}"


async def read_form(request: Request) -> list[tuple[str, str | FormFile]]:
    """Every part of a multipart (or urlencoded) form in the order sent, files read into memory;
    python-multipart's refusals (a malformed body, too many parts) are a 400."""
    parts: list[tuple[str, str | FormFile]] = []
    try:
        async with request.form(max_files=MAX_FORM_FILES, max_fields=MAX_FORM_FIELDS) as form:
            for name, value in form.multi_items():
                if isinstance(value, UploadFile):  # Starlette's (FastAPI's is a subclass)
                    parts.append((name, FormFile(value.content_type, await value.read(), value.filename)))
                else:
                    parts.append((name, value))
    except HTTPException as exc:
        raise InvalidRequest(f"Malformed multipart form: {exc.detail}") from None
    return parts


@dataclass(frozen=True, slots=True)
class FormField:
    """A text field of a streamed form, whole."""

    name: str
    value: str


@dataclass(frozen=True, slots=True)
class FilePart:
    """A file part of a streamed form begins: its bytes follow, chunk by chunk."""

    name: str
    filename: str | None


async def stream_form(request: Request) -> AsyncIterator[FormField | FilePart | bytes]:
    """The parts of a multipart form in the order sent, as they arrive: each text field once whole (at
    most MAX_FIELD_BYTES), each file part's start and then its bytes as they come off the socket, so
    that nothing but the chunk being read is held. A malformed body, too many parts or too long a field
    is a 400, as in `read_form`."""
    _, params = parse_options_header(request.headers.get("content-type"))
    boundary = params.get(b"boundary")
    if not boundary:
        raise InvalidRequest("Malformed multipart form: Missing boundary in multipart.")
    parts = _StreamedParts()
    parser = MultipartParser(boundary, parts.callbacks())
    try:
        async for chunk in request.stream():
            parser.write(chunk)
            for event in parts.take():
                yield event
        parser.finalize()
    except FormParserError:
        raise InvalidRequest("Malformed multipart form: Invalid multipart data.") from None
    if not parts.ended:  # a body cut short: what came of its last part is not the whole of it
        raise InvalidRequest("Malformed multipart form: the body ended before the form's closing boundary.")
    for event in parts.take():
        yield event


class _StreamedParts:
    """python-multipart's callbacks for `stream_form`: the events of the chunk just parsed."""

    def __init__(self) -> None:
        self._events: list[FormField | FilePart | bytes] = []
        self._headers: dict[bytes, bytes] = {}
        self._header = (b"", b"")
        self._field: tuple[str, bytearray] | None = None  # the text field being read
        self._files = self._fields = 0
        self.ended = False  # whether the closing boundary has been read

    def take(self) -> list[FormField | FilePart | bytes]:
        events, self._events = self._events, []
        return events

    def callbacks(self) -> MultipartCallbacks:
        return {
            "on_part_begin": self._headers.clear,
            "on_header_field": self._on_header_field,
            "on_header_value": self._on_header_value,
            "on_header_end": self._on_header_end,
            "on_headers_finished": self._on_headers_finished,
            "on_part_data": self._on_part_data,
            "on_part_end": self._on_part_end,
            "on_end": self._on_end,
        }

    def _on_header_field(self, data: bytes, start: int, end: int) -> None:
        self._header = (self._header[0] + data[start:end], self._header[1])

    def _on_header_value(self, data: bytes, start: int, end: int) -> None:
        self._header = (self._header[0], self._header[1] + data[start:end])

    def _on_header_end(self) -> None:
        self._headers[self._header[0].lower()] = self._header[1]
        self._header = (b"", b"")

    def _on_headers_finished(self) -> None:
        _, options = parse_options_header(self._headers.get(b"content-disposition", b""))
        if b"name" not in options:
            raise InvalidRequest('Malformed multipart form: a part\'s Content-Disposition has no "name".')
        name = _text(options[b"name"])
        if b"filename" in options:
            self._files += 1
            if self._files > MAX_FORM_FILES:
                raise InvalidRequest(f"Malformed multipart form: more than {MAX_FORM_FILES} files.")
            self._events.append(FilePart(name, _text(options[b"filename"])))
            self._field = None
        else:
            self._fields += 1
            if self._fields > MAX_FORM_FIELDS:
                raise InvalidRequest(f"Malformed multipart form: more than {MAX_FORM_FIELDS} fields.")
            self._field = (name, bytearray())

    def _on_part_data(self, data: bytes, start: int, end: int) -> None:
        if self._field is None:
            self._events.append(data[start:end])
            return
        name, value = self._field
        value += data[start:end]
        if len(value) > MAX_FIELD_BYTES:
            raise InvalidRequest(
                f"Malformed multipart form: the field {name[:64]!r} has more than {MAX_FIELD_BYTES} bytes.",
                param=name[:64],
            )

    def _on_part_end(self) -> None:
        if self._field is not None:
            self._events.append(FormField(self._field[0], _text(bytes(self._field[1]))))
            self._field = None

    def _on_end(self) -> None:
        self.ended = True


def _text(data: bytes) -> str:
    return data.decode("utf-8", errors="replace")


def raw_body_openapi(path: str) -> dict[str, Any]:
    """The extra request-body content type /docs shows for a route that takes raw media."""
    prefixes = RAW_MEDIA[path].content_types
    return {
        f"{prefix}*": {
            "schema": {"type": "string", "format": "binary"},
            "description": "The file itself; the other parameters go in the query string.",
        }
        for prefix in prefixes
    }


def form_openapi(path: str, model: type[BaseModel]) -> dict[str, Any]:
    """The multipart request body /docs shows beside JSON for a route in FORM_ROUTES (list fields under
    the SDK's `name[]`, which is how they are usually sent; `name` is read too)."""
    properties: dict[str, Any] = {
        (info.alias or name): {"type": "string"} for name, info in model.model_fields.items()
    }
    for name in FORM_ROUTES[path]:
        properties[name] = {"type": "string", "format": "binary"}
    return {"multipart/form-data": {"schema": {"type": "object", "properties": properties}}}


class MediaBodyRoute(APIRoute):
    """An APIRoute that also accepts its media as the raw body, or a multipart form (module docstring)."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()
        if self.body_field is None or (self.path not in RAW_MEDIA and self.path not in FORM_ROUTES):
            return handler
        model = self.body_field.field_info.annotation
        assert isinstance(model, type) and issubclass(model, BaseModel)
        raw_media = RAW_MEDIA.get(self.path)
        field, prefixes = (raw_media.field, raw_media.content_types) if raw_media else ("", ())
        file_fields = FORM_ROUTES.get(self.path, ())

        async def route(request: Request) -> Response:
            content_type = request.headers.get("content-type", "").lower()
            if file_fields and content_type.startswith(FORM_TYPES):
                parts = [(_field_name(model, name), value) for name, value in await read_form(request)]
                files = {n: v.data_uri() for n, v in parts if n in file_fields and isinstance(v, FormFile)}
                rest = ImmutableMultiDict([(n, v) for n, v in parts if n not in files])
                values = _values(rest, model)
                request = _json_request(request, orjson.dumps(_typed(model, values, "body", files)))
            elif prefixes and (
                content_type.startswith(prefixes) or await _is_media(request, field, prefixes)
            ):
                raw = base64.b64encode(await request.body()).decode("ascii")
                body = _typed(
                    model, _values(request.query_params, model, skip=(field,)), "query", {field: raw}
                )
                request = _json_request(request, orjson.dumps(body))
            elif prefixes and not content_type.startswith(JSON_TYPES):
                request = _json_request(request, await _json_text(request, prefixes))
            return await handler(request)

        return route


def _field_name(model: type[BaseModel], name: str) -> str:
    """A form part's field: `name[]` (the SDK's spelling of a list) is the field `name`; a name the model
    does not have stays as sent, so that its error names what the client sent."""
    bare = name.removesuffix("[]")
    return bare if bare in model.model_fields else name


async def _is_media(request: Request, field: str, prefixes: tuple[str, ...]) -> bool:
    """Whether the body is a file of the kind the route takes, by its bytes; a file of another kind is
    a 400 naming the media field."""
    kinds = media_kinds(await request.body())
    wanted = {prefix.rstrip("/") for prefix in prefixes}
    if kinds and not kinds & wanted:
        found = " or ".join(sorted(kinds))
        raise InvalidMedia(
            f"The body is a file of {found}, but this endpoint takes {' or '.join(sorted(wanted))}.",
            param=field,
        )
    return bool(kinds)


async def _json_text(request: Request, prefixes: tuple[str, ...]) -> bytes:
    """A body sent with another content type (`application/octet-stream`, `text/plain`, none): JSON
    if it is JSON, else a 400 that says what the route takes."""
    data = await request.body()
    if not data:
        return data
    try:
        orjson.loads(data)
    except orjson.JSONDecodeError:
        kinds = " or ".join(prefix.rstrip("/") for prefix in prefixes)
        raise InvalidRequest(
            f"The body is neither JSON nor a recognised {kinds} file. Send a JSON object (Content-Type: "
            f"application/json), or the file itself with the other parameters in the query string.",
            code="invalid_body",
        ) from None
    return data


def _typed(
    model: type[BaseModel], values: dict[str, Any], where: str, media: dict[str, str]
) -> dict[str, Any]:
    """Text values converted to the model's field types (errors name the parameter), plus the media."""
    placeholders = {name: "media" for name in media}
    try:
        parsed = model.model_validate({**values, **placeholders}, strict=False)
    except ValidationError as exc:
        raise RequestValidationError(
            [{**e, "loc": (where, *e["loc"])} for e in exc.errors(include_url=False)]
        ) from None
    return {**parsed.model_dump(mode="json", exclude_unset=True), **media}


def _json_request(request: Request, payload: bytes) -> Request:
    """The same request, carrying `payload` (JSON text) as its body (the original has been read)."""
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


def _values(source: Any, model: type[BaseModel], skip: tuple[str, ...] = ()) -> dict[str, Any]:
    """Query parameters or form fields (text) keyed by field, lists where the field takes one. A field
    in `skip` (the one the body itself fills) may not be given this way too."""
    values: dict[str, Any] = {}
    for name in source:
        given = [v for v in source.getlist(name) if isinstance(v, str)]
        if name in skip:
            message = f"`{name}` is given by the body; do not repeat it"
            raise RequestValidationError([{"loc": ("query", name), "msg": message, "type": "extra"}])
        if not given:
            continue
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
