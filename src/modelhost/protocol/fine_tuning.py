"""OpenAI's fine-tuning API (`/v1/fine_tuning/jobs`, issue 74): what a job is created with and how it is
shown, events and checkpoints included."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field

from modelhost.protocol.batches import Metadata
from modelhost.protocol.common import PageOf, StrictModel

Auto = Literal["auto"]
FineTuningStatus = Literal[
    "validating_files", "queued", "running", "succeeded", "failed", "cancelled", "paused"
]


class Hyperparameters(StrictModel):
    """Each `auto` (the default) is chosen from the dataset's size (docs/fine-tuning.md)."""

    n_epochs: Auto | Annotated[int, Field(ge=1, le=50)] = "auto"
    batch_size: Auto | Annotated[int, Field(ge=1, le=64)] = "auto"
    learning_rate_multiplier: Auto | Annotated[float, Field(gt=0, le=100, allow_inf_nan=False)] = "auto"


class Supervised(StrictModel):
    hyperparameters: Hyperparameters = Field(default_factory=Hyperparameters)


class Method(StrictModel):
    type: Literal["supervised"]
    supervised: Supervised = Field(default_factory=Supervised)


class FineTuningJobCreate(StrictModel):
    model: Annotated[str, Field(min_length=1, max_length=200)] = Field(
        description="A text-generation deployment of the account (ID or model name), or one the operator "
        "shares, on which adapters can be served: the base the adapter is trained on."
    )
    training_file: Annotated[str, Field(min_length=1, max_length=64)]
    validation_file: Annotated[str, Field(min_length=1, max_length=64)] | None = None
    method: Method | None = None
    hyperparameters: Hyperparameters | None = Field(
        default=None,
        description="Deprecated by OpenAI for `method`; the same fields, if `method` is not given.",
    )
    suffix: Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9._-]+$")] | None = None
    seed: Annotated[int, Field(ge=0, le=2_147_483_647)] | None = None
    metadata: Metadata | None = None
    integrations: Annotated[list[Any], Field(max_length=0)] | None = Field(
        default=None, description="Not supported: only an empty list (or none)."
    )
    deploy: bool = Field(
        default=False,
        description="modelhost's: once trained, also deploy the adapter on its base as `fine_tuned_model`.",
    )


class JobError(BaseModel):
    code: str
    message: str
    param: str | None


class FineTuningJob(BaseModel):
    id: str
    object: Literal["fine_tuning.job"] = "fine_tuning.job"
    created_at: int
    error: JobError | None
    fine_tuned_model: str | None
    finished_at: int | None
    hyperparameters: dict[str, Any]
    model: str
    organization_id: str
    result_files: list[str]
    seed: int
    status: FineTuningStatus
    trained_tokens: int | None
    training_file: str
    validation_file: str | None
    estimated_finish: int | None
    integrations: list[Any] | None
    metadata: dict[str, str] | None
    method: dict[str, Any]
    user_provided_suffix: str | None
    waiting_reason: str | None = Field(description="Why a queued or running job is not training yet.")
    step: int
    total_steps: int
    artifact_id: str | None
    deployment_id: str | None


class FineTuningEvent(BaseModel):
    id: str
    object: Literal["fine_tuning.job.event"] = "fine_tuning.job.event"
    created_at: int
    level: Literal["info", "warn", "error"]
    message: str
    type: Literal["message", "metrics"]
    data: dict[str, Any] | None


class FineTuningCheckpoint(BaseModel):
    id: str
    object: Literal["fine_tuning.job.checkpoint"] = "fine_tuning.job.checkpoint"
    created_at: int
    fine_tuned_model_checkpoint: str
    fine_tuning_job_id: str
    metrics: dict[str, Any]
    step_number: int


FineTuningJobList = PageOf[FineTuningJob]
FineTuningEventList = PageOf[FineTuningEvent]
FineTuningCheckpointList = PageOf[FineTuningCheckpoint]
