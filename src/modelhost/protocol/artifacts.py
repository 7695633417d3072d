"""Model artifacts and upload sessions (api.md §2.3, §2.4, §4.13, §4.14; management.md)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from pydantic import BaseModel, Field

from modelhost.protocol.common import StrictModel

# The pipeline tasks a deployment can serve: the wire vocabulary of `pipeline`.
Pipeline = Literal[
    "token-classification",
    "fill-mask",
    "feature-extraction",
    "zero-shot-image-classification",
    "video-classification",
    "audio-classification",
    "image-segmentation",
    "visual-question-answering",
    "image-to-text",
    "image-feature-extraction",
    "text-generation",
    "text-to-image",
    "image-to-image",
    "inpainting",
    "text-to-speech",
    "automatic-speech-recognition",
    "text-to-video",
    "text-classification",
    "text-ranking",
    "zero-shot-classification",
    "image-classification",
    "object-detection",
    "depth-estimation",
    "question-answering",
    "summarization",
    "translation",
    "text2text-generation",
    "image-text-to-text",
]
ArtifactStatus = Literal["created", "ingesting", "ready", "failed"]
UploadStatus = Literal["open", "completing", "completed", "failed", "aborted", "expired"]


class ArtifactCreate(StrictModel):
    display_name: Annotated[str, Field(min_length=1, max_length=200)]
    pipeline: Pipeline


class ArtifactError(BaseModel):
    code: str
    message: str


class Adapter(BaseModel):
    """What inspection found in a LoRA adapter (PEFT's `adapter_config.json` and its weights)."""

    peft_type: Literal["LORA"]
    rank: int
    alpha: float
    target_modules: list[str] | str = Field(
        description="The modules it adapts, by name (or PEFT's regular expression, or `all-linear`)."
    )
    base_model_name_or_path: str | None = Field(description="The base it was trained on, as PEFT wrote it.")
    bytes: int = Field(description="Size of its weights.")


class ModelArtifact(BaseModel):
    id: str
    display_name: str
    pipeline: Pipeline
    status: ArtifactStatus
    kind: Literal["model", "adapter"] = Field(
        default="model",
        description="What inspection found: a full model, or a LoRA adapter deployed on a base "
        "(docs/adapters.md). `model` until an upload is inspected.",
    )
    adapter: Adapter | None = Field(default=None, description="The adapter, where `kind` is `adapter`.")
    size_gb: float = Field(description="Size of the served files in GB (10^9 bytes).")
    created_at: datetime
    updated_at: datetime
    error: ArtifactError | None = Field(default=None, description="Why the last inspection failed.")
    upload_id: str | None = Field(default=None, description="The open upload session, while ingesting.")


class UploadStarted(BaseModel):
    upload_id: str
    message: str
    artifact: ModelArtifact


class UploadFinished(BaseModel):
    message: str
    artifact: ModelArtifact


class UploadedFile(BaseModel):
    path: str
    size: int
    sha256: str


class UploadSession(BaseModel):
    upload_id: str
    artifact_id: str
    status: UploadStatus
    files: list[UploadedFile]
    created_at: datetime
    expires_at: datetime
