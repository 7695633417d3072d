"""OpenAI's Evals API (`/v1/evals`, docs/evals.md): evals, their runs, each run's output items.

Creating or updating an eval, and creating a run (which starts work: its generations and grader calls
are billed as batch lines), pass admission as every state-changing route does; cancelling a run
(`POST .../runs/{run_id}`, OpenAI's cancel) and deleting do not (`api.admission.STOPS`). Another
account's evals, runs and items are 404; a deployment key sees the ones it made.
"""

from __future__ import annotations

import asyncio
from typing import Annotated, Literal

import orjson
from fastapi import APIRouter, Query, Response

from modelhost.api.deps import CallerPrincipal, ServicesDep, owner_of
from modelhost.api.errors import error_responses
from modelhost.api.lists import After, Limit, Order, list_body
from modelhost.protocol.evals import (
    EvalCreateRequest,
    EvalDeleted,
    EvalList,
    EvalObject,
    EvalRunList,
    EvalRunObject,
    EvalUpdateRequest,
    OutputItemList,
    OutputItemObject,
    RunCreateRequest,
    RunDeleted,
)

router = APIRouter(tags=["evals"], responses=error_responses(400, 401, 404, 429))
RunStatus = Literal["queued", "in_progress", "completed", "canceled", "failed"]


def _json(payload: object) -> Response:
    return Response(orjson.dumps(payload), media_type="application/json")


@router.post("/v1/evals", summary="Create an eval", response_model=EvalObject, responses=error_responses(402))
async def create_eval(body: EvalCreateRequest, services: ServicesDep, principal: CallerPrincipal) -> Response:
    created = await asyncio.to_thread(
        services.evals.create,
        owner_of(principal),
        body.name,
        body.data_source_config,
        body.testing_criteria,
        body.metadata,
    )
    return _json(created)


@router.get(
    "/v1/evals",
    summary="List the evals, oldest first unless `order` is `desc` (OpenAI's)",
    response_model=EvalList,
)
async def list_evals(
    services: ServicesDep,
    principal: CallerPrincipal,
    after: After = None,
    limit: Limit = 20,
    order: Order = "asc",
) -> Response:
    items, more = await asyncio.to_thread(services.evals.store.page, owner_of(principal), after, limit, order)
    return _json(list_body(items, more))


@router.get("/v1/evals/{eval_id}", summary="An eval", response_model=EvalObject)
async def get_eval(eval_id: str, services: ServicesDep, principal: CallerPrincipal) -> Response:
    return _json(await asyncio.to_thread(services.evals.store.get, owner_of(principal), eval_id))


@router.post(
    "/v1/evals/{eval_id}",
    summary="Update an eval's name and metadata",
    response_model=EvalObject,
    responses=error_responses(402),
)
async def update_eval(
    eval_id: str, body: EvalUpdateRequest, services: ServicesDep, principal: CallerPrincipal
) -> Response:
    owner = owner_of(principal)
    return _json(
        await asyncio.to_thread(services.evals.store.update, owner, eval_id, body.name, body.metadata)
    )


@router.delete(
    "/v1/evals/{eval_id}", summary="Delete an eval, its runs and their results", response_model=EvalDeleted
)
async def delete_eval(eval_id: str, services: ServicesDep, principal: CallerPrincipal) -> Response:
    return _json(await asyncio.to_thread(services.evals.store.delete, owner_of(principal), eval_id))


@router.post(
    "/v1/evals/{eval_id}/runs",
    summary="Start a run of an eval against a deployment (low priority, billed as batch lines)",
    response_model=EvalRunObject,
    responses=error_responses(402, 409),
)
async def create_run(
    eval_id: str, body: RunCreateRequest, services: ServicesDep, principal: CallerPrincipal
) -> Response:
    owner = owner_of(principal)
    run = await services.evals.create_run(
        principal, owner, eval_id, body.name, body.data_source, body.metadata
    )
    services.wake("evals")  # claimed now, not at the runner's next poll
    return _json(run)


@router.get("/v1/evals/{eval_id}/runs", summary="List an eval's runs", response_model=EvalRunList)
async def list_runs(
    eval_id: str,
    services: ServicesDep,
    principal: CallerPrincipal,
    after: After = None,
    limit: Limit = 20,
    order: Order = "asc",
    status: Annotated[RunStatus | None, Query()] = None,
) -> Response:
    owner = owner_of(principal)
    page = services.evals.store.page_runs
    items, more = await asyncio.to_thread(page, owner, eval_id, after, limit, order, status)
    return _json(list_body(items, more))


@router.get("/v1/evals/{eval_id}/runs/{run_id}", summary="A run", response_model=EvalRunObject)
async def get_run(eval_id: str, run_id: str, services: ServicesDep, principal: CallerPrincipal) -> Response:
    return _json(await asyncio.to_thread(services.evals.store.get_run, owner_of(principal), eval_id, run_id))


@router.post(
    "/v1/evals/{eval_id}/runs/{run_id}",
    summary="Cancel a run: it stops, the items graded so far are kept",
    response_model=EvalRunObject,
    responses=error_responses(409),
)
async def cancel_run(
    eval_id: str, run_id: str, services: ServicesDep, principal: CallerPrincipal
) -> Response:
    return _json(
        await asyncio.to_thread(services.evals.store.cancel_run, owner_of(principal), eval_id, run_id)
    )


@router.delete(
    "/v1/evals/{eval_id}/runs/{run_id}", summary="Delete a run and its results", response_model=RunDeleted
)
async def delete_run(
    eval_id: str, run_id: str, services: ServicesDep, principal: CallerPrincipal
) -> Response:
    return _json(
        await asyncio.to_thread(services.evals.store.delete_run, owner_of(principal), eval_id, run_id)
    )


@router.get(
    "/v1/evals/{eval_id}/runs/{run_id}/output_items",
    summary="A run's results, one per item",
    response_model=OutputItemList,
)
async def list_output_items(
    eval_id: str,
    run_id: str,
    services: ServicesDep,
    principal: CallerPrincipal,
    after: After = None,
    limit: Limit = 20,
    order: Order = "asc",
    status: Annotated[Literal["pass", "fail", "error"] | None, Query()] = None,
) -> Response:
    owner = owner_of(principal)
    page = services.evals.store.page_items
    items, more = await asyncio.to_thread(page, owner, eval_id, run_id, after, limit, order, status)
    return _json(list_body(items, more))


@router.get(
    "/v1/evals/{eval_id}/runs/{run_id}/output_items/{output_item_id}",
    summary="One item's result",
    response_model=OutputItemObject,
)
async def get_output_item(
    eval_id: str, run_id: str, output_item_id: str, services: ServicesDep, principal: CallerPrincipal
) -> Response:
    owner = owner_of(principal)
    return _json(
        await asyncio.to_thread(services.evals.store.get_item, owner, eval_id, run_id, output_item_id)
    )
