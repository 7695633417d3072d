"""OpenAI's fine-tuning API (`/v1/fine_tuning/jobs`, docs/fine-tuning.md): create, list, retrieve, events,
checkpoints, cancel, pause, resume, as the openai SDK's `client.fine_tuning.jobs` calls them.

Creating a job checks its base and datasets and queues it (`fine_tuning.service`); the supervisor's
fine-tuning runner trains it (`fine_tuning.runner`). An account key sees the account's jobs; a
deployment key only those it created. Another account's job is a 404."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
from fastapi import APIRouter, Response

from modelhost.api.deps import CallerPrincipal, ServicesDep, owner_of
from modelhost.api.errors import error_responses
from modelhost.api.lists import After, Limit, list_body
from modelhost.fine_tuning.service import Request
from modelhost.protocol.fine_tuning import (
    FineTuningCheckpointList,
    FineTuningEventList,
    FineTuningJob,
    FineTuningJobCreate,
    FineTuningJobList,
)

router = APIRouter(tags=["fine-tuning"], responses=error_responses(400, 401, 404, 429))
JOB = "/v1/fine_tuning/jobs/{fine_tuning_job_id}"


def _json(payload: object) -> Response:
    return Response(orjson.dumps(payload), media_type="application/json")


@router.post(
    "/v1/fine_tuning/jobs",
    summary="Create a fine-tuning job: a LoRA adapter trained on a deployment's base from Files API datasets",
    response_model=FineTuningJob,
    responses=error_responses(402),
)
async def create_job(
    body: FineTuningJobCreate, services: ServicesDep, principal: CallerPrincipal
) -> Response:
    hyperparameters = body.method.supervised.hyperparameters if body.method else body.hyperparameters
    given: dict[str, Any] = hyperparameters.model_dump() if hyperparameters else {}
    request = Request(
        model=body.model,
        training_file=body.training_file,
        validation_file=body.validation_file,
        hyperparameters=given,
        suffix=body.suffix,
        seed=body.seed,
        metadata=body.metadata,
        deploy=body.deploy,
    )
    created = await asyncio.to_thread(services.fine_tuning.create, owner_of(principal), request)
    services.wake("fine_tuning")
    return _json(created)


@router.get(
    "/v1/fine_tuning/jobs",
    summary="The account's fine-tuning jobs, newest first",
    response_model=FineTuningJobList,
)
async def list_jobs(
    services: ServicesDep, principal: CallerPrincipal, after: After = None, limit: Limit = 20
) -> Response:
    items, more = await asyncio.to_thread(services.fine_tuning.jobs.page, owner_of(principal), after, limit)
    return _json(list_body(items, more))


@router.get(JOB, summary="A fine-tuning job", response_model=FineTuningJob)
async def get_job(fine_tuning_job_id: str, services: ServicesDep, principal: CallerPrincipal) -> Response:
    return _json(
        await asyncio.to_thread(services.fine_tuning.jobs.get, owner_of(principal), fine_tuning_job_id)
    )


@router.get(
    f"{JOB}/events",
    summary="A job's events (messages and each step's metrics), newest first",
    response_model=FineTuningEventList,
)
async def list_events(
    fine_tuning_job_id: str,
    services: ServicesDep,
    principal: CallerPrincipal,
    after: After = None,
    limit: Limit = 20,
) -> Response:
    jobs = services.fine_tuning.jobs
    items, more = await asyncio.to_thread(jobs.events, owner_of(principal), fine_tuning_job_id, after, limit)
    return _json(list_body(items, more))


@router.get(
    f"{JOB}/checkpoints", summary="A job's checkpoints, newest first", response_model=FineTuningCheckpointList
)
async def list_checkpoints(
    fine_tuning_job_id: str,
    services: ServicesDep,
    principal: CallerPrincipal,
    after: After = None,
    limit: Limit = 10,
) -> Response:
    jobs = services.fine_tuning.jobs
    items, more = await asyncio.to_thread(
        jobs.checkpoints, owner_of(principal), fine_tuning_job_id, after, limit
    )
    return _json(list_body(items, more))


@router.post(
    f"{JOB}/cancel",
    summary="Cancel a queued, running or paused job",
    response_model=FineTuningJob,
    responses=error_responses(409),
)
async def cancel_job(fine_tuning_job_id: str, services: ServicesDep, principal: CallerPrincipal) -> Response:
    return _json(
        await asyncio.to_thread(services.fine_tuning.jobs.cancel, owner_of(principal), fine_tuning_job_id)
    )


@router.post(
    f"{JOB}/pause",
    summary="Pause a queued or running job (it keeps its checkpoints)",
    response_model=FineTuningJob,
    responses=error_responses(409),
)
async def pause_job(fine_tuning_job_id: str, services: ServicesDep, principal: CallerPrincipal) -> Response:
    return _json(
        await asyncio.to_thread(services.fine_tuning.jobs.pause, owner_of(principal), fine_tuning_job_id)
    )


@router.post(
    f"{JOB}/resume",
    summary="Resume a paused job from its last checkpoint",
    response_model=FineTuningJob,
    responses=error_responses(402, 409),
)
async def resume_job(fine_tuning_job_id: str, services: ServicesDep, principal: CallerPrincipal) -> Response:
    resumed = await asyncio.to_thread(
        services.fine_tuning.jobs.resume, owner_of(principal), fine_tuning_job_id
    )
    services.wake("fine_tuning")
    return _json(resumed)
