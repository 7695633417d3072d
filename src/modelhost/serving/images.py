"""OpenAI images served on a text-to-image, image-to-image or inpainting deployment
(`POST /v1/images/generations`, `POST /v1/images/edits`; api.md §4.3, docs/images.md).

The route parses (JSON, or the edit's multipart form), `generation_item` / `edit_item` make the one
item the worker decodes, generates and encodes, and `images_answer` shapes what it made into OpenAI's
`ImagesResponse`: base64 in the body, or `url`s to generated files behind signed, expiring links
(`services.files`). `stream: true` is `completed_events` instead.
"""

from __future__ import annotations

import asyncio
import base64
import secrets
import time
from typing import Any

import orjson

from modelhost.protocol.images import (
    Image,
    ImageCompletedEvent,
    ImageEditRequest,
    ImageGenerationRequest,
    ImageOptions,
    ImagesResponse,
)
from modelhost.services.files import FileService


def generation_item(body: ImageGenerationRequest) -> dict[str, Any]:
    """What the worker needs to generate images from a prompt."""
    return {**_options_item(body), "prompt": body.prompt or ""}


def edit_item(
    body: ImageEditRequest, images: list[bytes], mask: bytes | None, limits: dict[str, Any]
) -> dict[str, Any]:
    """What the worker needs to edit `images` (with a mask: inpainting); `limits` bound their decoding."""
    return {
        **_options_item(body),
        "prompt": body.prompt,
        "strength": body.strength,
        "images": images,
        "mask": mask,
        "limits": limits,
    }


def _options_item(body: ImageOptions) -> dict[str, Any]:
    """What the worker needs of the options both endpoints share."""
    width, height = body.size or (None, None)
    return {
        "negative_prompt": body.negative_prompt,
        "n": body.n,
        "width": width,
        "height": height,
        "num_inference_steps": body.num_inference_steps,
        "guidance_scale": body.guidance_scale,
        "seed": body.seed,
        "output_format": body.output_format,
    }


async def images_answer(
    files: FileService,
    base_url: str,
    account_id: str,
    model: str,
    body: ImageOptions,
    output: dict[str, Any],
) -> ImagesResponse:
    """§4.3's shape: every image has `url` and `b64_json`, the one not asked for null. `url` answers
    store each image as a generated file of `account_id` first."""
    images: list[bytes] = output["images"]
    if body.response_format == "b64_json":
        data = [Image(url=None, b64_json=base64.b64encode(image).decode("ascii")) for image in images]
    else:
        urls = await asyncio.to_thread(
            _links, files, base_url, account_id, images, output["content_type"], body
        )
        data = [Image(url=url, b64_json=None) for url in urls]
    return ImagesResponse(
        model=model,
        created=int(time.time()),
        id=f"img-{secrets.token_hex(12)}",
        data=data,
        size=f"{output['width']}x{output['height']}",
        output_format=body.output_format,
    )


def completed_events(body: ImageOptions, output: dict[str, Any]) -> bytes:
    """`stream: true`: OpenAI's Server-Sent Events, one completed event per image (the images are all
    made by then: no partial images, which OpenAI too may send fewer of than asked)."""
    edit = isinstance(body, ImageEditRequest)
    kind = "image_edit.completed" if edit else "image_generation.completed"
    created = int(time.time())
    events = b""
    for image in output["images"]:
        event = ImageCompletedEvent(
            type=kind,
            b64_json=base64.b64encode(image).decode("ascii"),
            created_at=created,
            size=f"{output['width']}x{output['height']}",
            output_format=body.output_format,
        )
        events += f"event: {kind}\ndata: ".encode() + orjson.dumps(event.model_dump()) + b"\n\n"
    return events


def _links(
    files: FileService,
    base_url: str,
    account_id: str,
    images: list[bytes],
    content_type: str,
    body: ImageOptions,
) -> list[str]:
    """Store each image as a generated file (blob store + row); its signed link. Blocking: in a thread."""
    return [
        files.url(base_url, files.store(account_id, image, content_type, body.output_format))
        for image in images
    ]
