"""`POST /v1/images/generations` (api.md §4.3) and `POST /v1/images/edits` (OpenAI's multipart form).

Thin: validate, route (Endpoint not supported before any work), send one item to the deployment's
worker (which decodes, generates and encodes); `serving.images` makes the item and shapes OpenAI's
answer. See docs/images.md.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError

from modelhost.api.answers import json_answer
from modelhost.api.bodies import FormFile, read_form
from modelhost.api.deps import (
    CallerPrincipal,
    ServicesDep,
    account_id_of,
    deployment_for,
    run_inference,
)
from modelhost.api.errors import error_responses
from modelhost.container import Services
from modelhost.errors import InvalidMedia, InvalidRequest, param_name
from modelhost.protocol.images import (
    MAX_N,
    SIZE_CHOICES,
    ImageEditRequest,
    ImageGenerationRequest,
    ImageOptions,
    ImagesResponse,
)
from modelhost.serving.images import completed_events, edit_item, generation_item, images_answer

router = APIRouter(
    tags=["openai"], responses=error_responses(400, 401, 402, 404, 413, 429, 502, 503, 504, 507)
)

MAX_IMAGES = MAX_N  # input images of one edit; with `n`, at most MAX_N results in all
IMAGE_FIELDS = ("image", "image[]")  # the SDK sends one file as `image`, a list as `image[]`
ANSWER_EXAMPLE = {
    "model": "painter",
    "created": 1767225600,
    "id": "img-5f0c2a9e7d41b3a8c6e1f072",
    "data": [{"url": "https://modelhost.example/v1/files/file_9a.../content?expires=...", "b64_json": None}],
    "size": "512x512",
    "output_format": "png",
}

EDIT_EXAMPLE = """For example:

```
curl https://modelhost.example/v1/images/edits -H "Authorization: Bearer mh-..." \\
  -F model=editor -F prompt="a tiger in the snow" -F image=@cat.png -F mask=@mask.png -F n=2 -F seed=42
```"""


def _answer_docs() -> dict[int | str, dict[str, Any]]:
    events = 'event: image_generation.completed\ndata: {"type": "image_generation.completed", ...}\n\n'
    content = {"application/json": {"example": ANSWER_EXAMPLE}, "text/event-stream": {"example": events}}
    return {200: {"content": content}}


def _form_field(schema: dict[str, Any]) -> dict[str, Any]:
    """A JSON-body field's schema as a form field: forms carry no null."""
    alternatives = [s for s in schema.get("anyOf", []) if s.get("type") != "null"]
    if len(alternatives) == 1:
        schema = {**{k: v for k, v in schema.items() if k != "anyOf"}, **alternatives[0]}
    return {k: v for k, v in schema.items() if not (k == "default" and v is None)}


def edit_form_schema() -> dict[str, Any]:
    """The multipart body /docs shows for edits (the route reads the form itself, see read_edit_form)."""
    fields = ImageEditRequest.model_json_schema()
    properties = {name: _form_field(schema) for name, schema in fields["properties"].items()}
    properties["size"] = {
        "type": "string",
        "description": f"`auto` (default): the first image's size; else {SIZE_CHOICES} written as JSON "
        "text, e.g. `[512, 768]`.",
    }
    binary = {"type": "string", "format": "binary"}
    return {
        "type": "object",
        "required": ["image", *fields.get("required", [])],
        "properties": {
            "image": {
                "type": "array",
                "items": binary,
                "minItems": 1,
                "maxItems": MAX_IMAGES,
                "description": "PNG, JPEG or WebP files, one `image` part each (`image[]` parts too). Each "
                "is edited with the prompt, `n` results per image, in order.",
            },
            "mask": {
                **binary,
                "description": "Grey levels: white is repainted, black kept (diffusers' convention); "
                "resized to the images' size. Required on inpainting deployments.",
            },
            **properties,
        },
    }


@router.post(
    "/v1/images/generations",
    summary="Generate images from a prompt (api.md §4.3, OpenAI-compatible) on a text-to-image deployment",
    response_model=ImagesResponse,
    responses=_answer_docs(),
    openapi_extra={
        "requestBody": {
            "content": {
                "application/json": {
                    "example": {
                        "model": "painter",
                        "prompt": "a watercolor fox in the snow",
                        "n": 1,
                        "size": "512x512",
                        "response_format": "url",
                        "seed": 42,
                    }
                }
            }
        }
    },
)
async def generate_images(
    body: ImageGenerationRequest, request: Request, services: ServicesDep, principal: CallerPrincipal
) -> Response:
    deployment = await deployment_for(request, principal, body.model)
    output = await run_inference(request, deployment.runtime_key, generation_item(body))
    return await _answer(request, services, principal, deployment.model, body, output)


@router.post(
    "/v1/images/edits",
    summary="Edit images with a prompt (OpenAI multipart form): image-to-image; with a mask, inpainting",
    description=EDIT_EXAMPLE,
    response_model=ImagesResponse,
    responses=_answer_docs(),
    openapi_extra={
        "requestBody": {"required": True, "content": {"multipart/form-data": {"schema": edit_form_schema()}}}
    },
)
async def edit_images(request: Request, services: ServicesDep, principal: CallerPrincipal) -> Response:
    form = await read_edit_form(request)
    body = form.options
    deployment = await deployment_for(request, principal, body.model)
    if deployment.pipeline == "inpainting" and form.mask is None:
        raise InvalidRequest(
            "This inpainting deployment needs a `mask` (white where the image is repainted).", param="mask"
        )
    settings = services.settings
    limits = {"max_pixels": settings.media_max_pixels, "max_seconds": settings.media_max_seconds}
    item = edit_item(body, form.images, form.mask, limits)
    output = await run_inference(request, deployment.runtime_key, item)
    return await _answer(request, services, principal, deployment.model, body, output)


async def _answer(
    request: Request,
    services: Services,
    principal: CallerPrincipal,
    model: str,
    body: ImageOptions,
    output: dict[str, Any],
) -> Response:
    if body.stream:
        events = completed_events(body, output)
        return Response(events, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
    base_url = services.settings.public_url or str(request.base_url)
    answer = await images_answer(services.files, base_url, account_id_of(principal), model, body, output)
    return json_answer(answer)


# ---------------------------------------------------------------- the edit form


@dataclass
class EditForm:
    options: ImageEditRequest
    images: list[bytes]
    mask: bytes | None


async def read_edit_form(request: Request) -> EditForm:
    """The multipart form of an edit: its files, and its text fields validated by ImageEditRequest
    (the JSON rules, with form strings converted), so both endpoints refuse the same things."""
    if not request.headers.get("content-type", "").lower().startswith("multipart/form-data"):
        raise InvalidRequest("Send an edit as multipart/form-data: `image` file(s), `prompt` and options.")
    images, mask, fields = _parts(await read_form(request))
    if not images:
        raise InvalidRequest("`image` is required: one or more PNG, JPEG or WebP files.", param="image")
    if len(images) > MAX_IMAGES:
        raise InvalidRequest(f"At most {MAX_IMAGES} images per edit.", param="image")
    options = _validated(fields)
    if options.n * len(images) > MAX_N:
        raise InvalidRequest(
            f"An edit makes n results per image, at most {MAX_N} in all ({options.n} × {len(images)}).",
            param="n",
        )
    for index, data in enumerate(images):
        _check_image_type(data, param_name("image", index, len(images)))
    if mask is not None:
        _check_image_type(mask, "mask")
    return EditForm(options, images, mask)


def _parts(parts: list[tuple[str, str | FormFile]]) -> tuple[list[bytes], bytes | None, dict[str, Any]]:
    """(images in the order sent, the mask, the text fields)."""
    images: list[bytes] = []
    mask: bytes | None = None
    fields: dict[str, Any] = {}
    for name, value in parts:
        if name == "markup":
            raise InvalidRequest(
                "markup is not supported: describe the edit in `prompt`, and send a `mask` for the area "
                "to repaint.",
                param="markup",
            )
        if name in (*IMAGE_FIELDS, "mask"):
            param = "mask" if name == "mask" else "image"
            if not isinstance(value, FormFile):
                raise InvalidMedia(f"`{param}` must be a file (PNG, JPEG or WebP).", param=param)
            if name == "mask" and mask is not None:
                raise InvalidRequest("Send at most one `mask`.", param="mask")
            data = value.data
            if name == "mask":
                mask = data
            else:
                images.append(data)
        elif not isinstance(value, str):
            raise InvalidRequest(f"`{name}` must be a text field, not a file.", param=name)
        elif name in fields:
            raise InvalidRequest(f"`{name}` is given more than once.", param=name)
        else:
            fields[name] = value
    return images, mask, fields


def _validated(fields: dict[str, Any]) -> ImageEditRequest:
    """Form strings through the JSON model (lax: `"2"` is 2); a size pair comes as JSON text `[w, h]`."""
    size = fields.get("size")
    if isinstance(size, str) and size.lstrip().startswith("["):
        with contextlib.suppress(ValueError):  # not JSON: left as text, which the size rule refuses
            fields["size"] = json.loads(size)
    try:
        return ImageEditRequest.model_validate(fields, strict=False)
    except ValidationError as exc:
        raise RequestValidationError(
            [{**e, "loc": ("body", *e["loc"])} for e in exc.errors(include_url=False)]
        ) from None


def _check_image_type(data: bytes, param: str) -> None:
    """PNG, JPEG or WebP by their signatures: other files are refused before they are queued (a file
    of the right type that does not decode is refused by the worker's decoder, naming the same field)."""
    png = data.startswith(b"\x89PNG\r\n\x1a\n")
    jpeg = data.startswith(b"\xff\xd8\xff")
    webp = data[:4] == b"RIFF" and data[8:12] == b"WEBP"
    if not (png or jpeg or webp):
        raise InvalidMedia(f"`{param}` is not a PNG, JPEG or WebP file.", param=param)
