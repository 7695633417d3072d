"""Wire types of image generation and editing (api.md §4.3, OpenAI's `/v1/images/*`; docs/images.md).

Generations take a JSON body; edits take the same options as multipart form fields (the files apart),
validated by the same model so that both answer the same 400s.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, Field, PlainValidator, WithJsonSchema

from modelhost.protocol.common import NO_EFFECT, StrictModel

# The sizes §4.3 lists, plus OpenAI's newer landscape and portrait ones.
SIZES = ("256x256", "512x512", "1024x1024", "1792x1024", "1024x1792", "1536x1024", "1024x1536")
# `[width, height]` pairs: multiples of 16 (what every diffusers family divides by) in this range.
SIDE_MIN, SIDE_MAX, SIDE_STEP = 64, 2048, 16
MAX_N = 10
MAX_PROMPT_CHARS = 32_000  # OpenAI's own limit; CLIP-style encoders read far fewer tokens anyway
MAX_SEED = 2**63 - 1

SIZE_CHOICES = (
    f"one of {', '.join(f'`{s}`' for s in SIZES)}, or any `WIDTHxHEIGHT` (or a [width, height] pair) of "
    f"multiples of {SIDE_STEP} between {SIDE_MIN} and {SIDE_MAX}"
)
SIZE_RULE = f"size must be `auto`, {SIZE_CHOICES}"
_SIZE_TEXT = re.compile(r"^(\d{1,5})x(\d{1,5})$")


def _side(value: Any) -> bool:
    return type(value) is int and SIDE_MIN <= value <= SIDE_MAX and value % SIDE_STEP == 0


def parse_size(value: Any) -> tuple[int, int] | None:
    """`(width, height)`, or None for `auto` (the model's default size; an edit's: its image's size).

    One validator rather than a union, so that every refusal names `size` itself."""
    if value is None or value == "auto":
        return None
    text = _SIZE_TEXT.match(value) if isinstance(value, str) else None
    if text is not None and (value in SIZES or all(_side(int(side)) for side in text.groups())):
        return int(text.group(1)), int(text.group(2))
    if isinstance(value, list) and len(value) == 2 and all(_side(v) for v in value):
        return value[0], value[1]
    raise ValueError(SIZE_RULE)


SIZE_SCHEMA: dict[str, Any] = {
    "anyOf": [
        {"type": "string", "enum": ["auto", *SIZES]},
        {"type": "string", "pattern": _SIZE_TEXT.pattern},
        {
            "type": "array",
            "items": {"type": "integer", "minimum": SIDE_MIN, "maximum": SIDE_MAX, "multipleOf": SIDE_STEP},
            "minItems": 2,
            "maxItems": 2,
        },
        {"type": "null"},
    ]
}
Size = Annotated[tuple[int, int] | None, PlainValidator(parse_size), WithJsonSchema(SIZE_SCHEMA)]


def _opaque(value: str | None) -> str | None:
    if value == "transparent":
        raise ValueError(
            "transparent backgrounds are not available: diffusion pipelines paint every pixel (send "
            "`opaque` or `auto`)"
        )
    return value


def _refused(why: str) -> Any:
    """A field OpenAI offers that modelhost cannot honour: null or absent only."""

    def check(value: Any) -> Any:
        if value is not None:
            raise ValueError(why)
        return value

    return AfterValidator(check)


NO_GIF = _refused("GIF output is not available: output_format is png, jpeg or webp")


class ImageOptions(StrictModel):
    """What generations and edits share."""

    model: str | None = Field(
        default=None,
        description="Your deployment's model ID (not needed with a key scoped to one deployment).",
        examples=["painter"],
    )
    negative_prompt: str | None = Field(
        default=None, max_length=MAX_PROMPT_CHARS, description="Elements to avoid."
    )
    n: int = Field(default=1, ge=1, le=MAX_N, description="Number of images (per input image for edits).")
    size: Size = Field(
        default=None,
        description="`auto` (default): the model's default size (edits: the first image's size); "
        f"else {SIZE_CHOICES}.",
    )
    response_format: Literal["url", "b64_json"] = Field(
        default="url",
        description="`url`: an unguessable link that expires (no API key needed); `b64_json`: the file.",
    )
    output_format: Literal["png", "jpeg", "webp"] = Field(default="png", description="The files' format.")
    num_inference_steps: int | None = Field(
        default=None, ge=1, le=500, description="Denoising steps; default: the pipeline's (50 for SD)."
    )
    guidance_scale: float | None = Field(
        default=None,
        ge=0,
        le=100,
        description="Higher values follow the prompt more closely; default: the pipeline's (7.5 for SD).",
    )
    seed: int | None = Field(
        default=None,
        ge=0,
        le=MAX_SEED,
        description="Same seed and parameters → the same bytes; the i-th image uses `seed + i`.",
    )
    stream: bool | None = Field(
        default=None,
        description="Server-Sent Events: one `image_generation.completed` (`image_edit.completed`) event "
        "per image, with `b64_json`, once the images are made (no partial images).",
    )
    background: Annotated[Literal["transparent", "opaque", "auto"] | None, AfterValidator(_opaque)] = Field(
        default=None, description="`opaque` or `auto` (the images are always opaque); `transparent` → 400."
    )
    quality: str | None = Field(default=None, description=NO_EFFECT + " Use `num_inference_steps`.")
    moderation: str | None = Field(default=None, description=NO_EFFECT)
    output_compression: int | None = Field(
        default=None, ge=0, le=100, description=NO_EFFECT + " Files use the encoder's default quality."
    )
    partial_images: int | None = Field(
        default=None, ge=0, le=3, description=NO_EFFECT + " No partial images are streamed."
    )
    complexity: str | None = Field(default=None, description=NO_EFFECT)
    frame_count: Annotated[int | None, NO_GIF] = Field(default=None, description="GIF output: refused.")
    frame_duration_ms: Annotated[int | None, NO_GIF] = Field(default=None, description="GIF output: refused.")
    svg: Annotated[dict[str, Any] | None, _refused("SVG output is not available")] = Field(
        default=None, description="SVG output: refused."
    )
    safety_identifier: str | None = Field(default=None, description=NO_EFFECT)
    user: str | None = Field(default=None, description=NO_EFFECT)


class ImageGenerationRequest(ImageOptions):
    prompt: str | None = Field(
        default=None,
        max_length=MAX_PROMPT_CHARS,
        description="Text guiding generation; omitted: unconditional generation.",
        examples=["a watercolor fox in the snow"],
    )
    style: str | None = Field(default=None, description=NO_EFFECT + " Describe the style in the prompt.")


class ImageEditRequest(ImageOptions):
    """The text fields of an edit's form (`image`, `image[]` and `mask` are its files)."""

    input_fidelity: str | None = Field(default=None, description=NO_EFFECT + " See `strength`.")

    prompt: str = Field(min_length=1, max_length=MAX_PROMPT_CHARS, description="How to edit the images.")
    strength: float | None = Field(
        default=None,
        gt=0,
        le=1,
        description="How much of each image is repainted (1: all); default: the pipeline's "
        "(0.8 image-to-image, 1.0 inpainting for SD).",
    )


class Image(BaseModel):
    """One generated image (OpenAI's `Image`). Both keys are always present; the one `response_format`
    did not ask for is null."""

    url: str | None
    b64_json: str | None


class ImagesResponse(BaseModel):
    """The answer of `POST /v1/images/generations` and `/v1/images/edits` (OpenAI's `ImagesResponse`)."""

    model: str
    created: int
    id: str
    data: list[Image]
    size: str = Field(description="`WIDTHxHEIGHT` of the images.")
    output_format: Literal["png", "jpeg", "webp"]


class ImageCompletedEvent(BaseModel):
    """`stream: true`: one Server-Sent Event per image (OpenAI's `image_generation.completed` and
    `image_edit.completed`), sent once every image is made."""

    type: Literal["image_generation.completed", "image_edit.completed"]
    b64_json: str
    created_at: int
    size: str
    output_format: Literal["png", "jpeg", "webp"]
    quality: Literal["auto"] = "auto"
    background: Literal["opaque"] = "opaque"
