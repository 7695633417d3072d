"""Video generation jobs (api.md §2.2, §3.1, §4.2), in the shape of OpenAI's videos API."""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import BaseModel, BeforeValidator, Field, field_validator

from modelhost.protocol.common import StrictModel

NUMBER = re.compile(r"^[0-9]+(\.[0-9]+)?$")
SIZE = re.compile(r"^([1-9][0-9]{0,4})x([1-9][0-9]{0,4})$")
MAX_SIDE = 4096


def _number_from_text(value: object) -> object:
    """`"4"` → 4.0 (what the SDK sends); anything else is left for the type check to refuse."""
    if isinstance(value, str) and NUMBER.match(value):
        return float(value)
    return value


class ImageReference(StrictModel):
    """OpenAI's reference object: `{"image_url": "https://..."}` (a URL or data URI)."""

    image_url: Annotated[str, Field(min_length=1)]


class VideoCreateRequest(StrictModel):
    model: str | None = Field(
        default=None, description="Deployment model ID; optional with a key scoped to one deployment."
    )
    prompt: Annotated[str, Field(min_length=1, max_length=10_000)] = Field(examples=["a cat walking"])
    input_reference: Annotated[str, Field(min_length=1)] | ImageReference | None = Field(
        default=None,
        description="An image or video guiding generation: URL, data URI, base64, a path below "
        "MODELHOST_MEDIA_ROOT, or a file (multipart).",
    )
    seconds: Annotated[float, BeforeValidator(_number_from_text)] = Field(
        default=4, description="Duration (a number; the openai SDK sends a numeric string, also accepted)."
    )
    size: str = Field(default="256x256", description="`<width>x<height>` in pixels.", examples=["256x256"])
    fps: Annotated[int, Field(ge=1, le=60)] = Field(default=8, description="Frames per second.")
    num_inference_steps: Annotated[int, Field(ge=1, le=1000)] | None = None
    guidance_scale: Annotated[float, Field(ge=0, le=100)] | None = None
    seed: Annotated[int, Field(ge=0)] | None = Field(default=None, description="Same seed → same video.")

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
    remixed_from_video_id: None = None


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
