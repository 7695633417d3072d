"""Video generation jobs (api.md §2.2, §3.1, §4.2), in the shape of OpenAI's videos API."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, Field, ValidationError, field_validator, model_validator
from pydantic_core import PydanticCustomError

from modelhost.protocol.common import StrictModel

NUMBER = re.compile(r"^[0-9]+(\.[0-9]+)?$")
SIZE = re.compile(r"^([1-9][0-9]{0,4})x([1-9][0-9]{0,4})$")
MAX_SIDE = 4096
FORM_REFERENCE = re.compile(r"^input_reference\[([a-z_]+)\]$")
VideoVariant = Literal["video", "thumbnail", "spritesheet"]


def _number_from_text(value: object) -> object:
    """`"4"` → 4.0 (what the SDK sends); anything else is left for the type check to refuse."""
    if isinstance(value, str) and NUMBER.match(value):
        return float(value)
    return value


class ImageReference(StrictModel):
    """OpenAI's reference object: `{"image_url": ...}` (a URL or data URI) or `{"file_id": ...}` (a file
    of this account: a generated image's `file-...` ID). Exactly one of the two."""

    image_url: Annotated[str, Field(min_length=1)] | None = None
    file_id: Annotated[str, Field(min_length=1, max_length=64)] | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> ImageReference:
        if (self.image_url is None) == (self.file_id is None):
            raise ValueError("give exactly one of `image_url` and `file_id`")
        return self


def _reference(value: object) -> object:
    """Checks the reference here, so that its errors name `input_reference` (not the members of the
    field's union); an object becomes an ImageReference."""
    problem = None
    if isinstance(value, dict):
        try:
            return ImageReference.model_validate(value)
        except ValidationError as exc:
            first = exc.errors(include_url=False)[0]
            where = ".".join(str(part) for part in first["loc"])
            problem = (f"{where}: " if where else "") + first["msg"].removeprefix("Value error, ")
    elif isinstance(value, str) and not value:
        problem = "must not be empty"
    elif value is not None and not isinstance(value, str | ImageReference):
        problem = "must be text (a URL, data URI, base64 or path) or an object with image_url or file_id"
    if problem is not None:
        raise PydanticCustomError("input_reference", problem)
    return value


class VideoCreateRequest(StrictModel):
    model: str | None = Field(
        default=None, description="Deployment model ID; optional with a key scoped to one deployment."
    )
    prompt: Annotated[str, Field(min_length=1, max_length=10_000)] = Field(examples=["a cat walking"])
    input_reference: Annotated[
        Annotated[str, Field(min_length=1)] | ImageReference | None, BeforeValidator(_reference)
    ] = Field(
        default=None,
        description="An image or video guiding generation: URL, data URI, base64, a path below "
        "MODELHOST_MEDIA_ROOT, a file (multipart), or `{image_url}` / `{file_id}` (in a form: "
        "`input_reference[image_url]` / `input_reference[file_id]`).",
    )
    seconds: Annotated[float, BeforeValidator(_number_from_text)] = Field(
        default=4, description="Duration (a number; the openai SDK sends a numeric string, also accepted)."
    )
    size: str = Field(default="256x256", description="`<width>x<height>` in pixels.", examples=["256x256"])
    fps: Annotated[int, Field(ge=1, le=60)] = Field(default=8, description="Frames per second.")
    num_inference_steps: Annotated[int, Field(ge=1, le=1000)] | None = None
    guidance_scale: Annotated[float, Field(ge=0, le=100)] | None = None
    seed: Annotated[int, Field(ge=0)] | None = Field(default=None, description="Same seed → same video.")

    @model_validator(mode="before")
    @classmethod
    def _form_reference(cls, data: Any) -> Any:
        """The SDK sends the reference object as form fields `input_reference[image_url]` (or
        `[file_id]`): folded back into the object. Given beside `input_reference` itself, they stay
        unknown fields (refused)."""
        if not isinstance(data, dict) or "input_reference" in data:
            return data
        nested = {m.group(1): data[k] for k in data if isinstance(k, str) and (m := FORM_REFERENCE.match(k))}
        if not nested:
            return data
        rest = {k: v for k, v in data.items() if not (isinstance(k, str) and FORM_REFERENCE.match(k))}
        return {**rest, "input_reference": nested}

    @field_validator("size")
    @classmethod
    def _size(cls, value: str) -> str:
        match = SIZE.match(value)
        if match is None or max(int(match.group(1)), int(match.group(2))) > MAX_SIDE:
            raise ValueError(f"size must be <width>x<height> with sides of 1 to {MAX_SIDE} pixels")
        return value

    @field_validator("seconds")
    @classmethod
    def _seconds(cls, value: float) -> float:
        if not 0 < value <= 600:
            raise ValueError("seconds must be above 0 and at most 600")
        return value

    def dimensions(self) -> tuple[int, int]:
        width, height = self.size.split("x")
        return int(width), int(height)


class VideoRemixRequest(StrictModel):
    """`POST /v1/videos/{id}/remix`: a new job with this prompt and the source video's other options."""

    prompt: Annotated[str, Field(min_length=1, max_length=10_000)] = Field(examples=["the cat now runs"])


class VideoError(BaseModel):
    code: str
    message: str


class Video(BaseModel):
    id: str
    object: Literal["video"] = "video"
    created_at: int = Field(description="Unix seconds.")
    completed_at: int | None = Field(description="Unix seconds, once completed or failed.")
    expires_at: int | None = Field(
        description="Unix seconds after which the content is deleted (once completed)."
    )
    model: str
    prompt: str
    seconds: float
    size: str
    status: Literal["queued", "in_progress", "completed", "failed"]
    progress: int = Field(ge=0, le=100)
    error: VideoError | None = None
    remixed_from_video_id: str | None = Field(default=None, description="The source video of a remix.")


class VideoList(BaseModel):
    object: Literal["list"] = "list"
    data: list[Video]
    first_id: str | None
    last_id: str | None
    has_more: bool


class VideoDeleted(BaseModel):
    id: str
    object: Literal["video.deleted"] = "video.deleted"
    deleted: bool = True
