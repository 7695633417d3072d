"""What the API shows of fine-tuning jobs: OpenAI's `fine_tuning.job`, `fine_tuning.job.event` and
`fine_tuning.job.checkpoint` objects, from their rows, and the fine-tuned model's name."""

from __future__ import annotations

from typing import Any

from modelhost.store.models import FineTuningCheckpoint, FineTuningEvent, FineTuningJob
from modelhost.store.types import unix_seconds


def view(job: FineTuningJob) -> dict[str, Any]:
    """The job as OpenAI's FineTuningJob object, and what modelhost adds: `waiting_reason` (why a queued
    or running job is not training yet), `step`, `total_steps`, `artifact_id`, `deployment_id`."""
    error = (
        {"code": job.error_code, "message": job.error_message or "", "param": job.error_param}
        if job.status == "failed"
        else None
    )
    hyperparameters = dict(job.hyperparameters)
    return {
        "id": job.id,
        "object": "fine_tuning.job",
        "created_at": unix_seconds(job.created_at),
        "error": error,
        "fine_tuned_model": job.fine_tuned_model,
        "finished_at": unix_seconds(job.finished_at),
        "hyperparameters": hyperparameters,
        "model": job.model,
        "organization_id": job.account_id,
        "result_files": [],
        "seed": job.seed,
        "status": job.status,
        "trained_tokens": job.trained_tokens if job.status == "succeeded" else None,
        "training_file": job.training_file,
        "validation_file": job.validation_file,
        "estimated_finish": None,
        "integrations": None,
        "metadata": job.job_metadata,
        "method": {"type": "supervised", "supervised": {"hyperparameters": hyperparameters}},
        "user_provided_suffix": job.suffix,
        "waiting_reason": job.waiting_reason,
        "step": job.step,
        "total_steps": job.total_steps,
        "artifact_id": job.artifact_id,
        "deployment_id": job.deployment_id,
    }


def event_view(event: FineTuningEvent) -> dict[str, Any]:
    return {
        "id": event.id,
        "object": "fine_tuning.job.event",
        "created_at": unix_seconds(event.created_at),
        "level": event.level,
        "message": event.message,
        "type": event.type,
        "data": event.data,
    }


def fine_tuned_name(model: str, suffix: str | None, job_id: str) -> str:
    """OpenAI's `ft:<base model>:<suffix>:<job id>` (the suffix part empty when none was given)."""
    return f"ft:{model}:{suffix or ''}:{job_id}"


def checkpoint_view(job: FineTuningJob, checkpoint: FineTuningCheckpoint) -> dict[str, Any]:
    name = fine_tuned_name(job.model, job.suffix, job.id)
    return {
        "id": checkpoint.id,
        "object": "fine_tuning.job.checkpoint",
        "created_at": unix_seconds(checkpoint.created_at),
        "fine_tuned_model_checkpoint": f"{name}:ckpt-step-{checkpoint.step}",
        "fine_tuning_job_id": job.id,
        "metrics": checkpoint.metrics,
        "step_number": checkpoint.step,
    }
