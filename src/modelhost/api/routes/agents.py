"""Agents and their runs (api.md §2.1, §3.3, §4.15, §6.3; docs/agents.md). Account keys only.

Creating a run records it (`queued`, with its `run.created` event) and starts it on this gateway's
`AgentRunner`. Deleting a run stops it first (its task cancelled and awaited, so the generation stops
at its next decoding step), then erases it and its events: no event is written after the delete answers.
The spec declares no security scheme for the run deletion; modelhost requires the owning account's key
anyway (docs/agents.md).
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from typing import Annotated

import orjson
from fastapi import APIRouter, Query, Request, Response
from fastapi.responses import StreamingResponse

from modelhost import tracing
from modelhost.agents.store import ACTIVE
from modelhost.api.deps import AccountPrincipal, ServicesDep, account_id_of, deployment_for
from modelhost.api.errors import error_responses
from modelhost.api.lists import After, Limit, Order, list_body
from modelhost.errors import ModelhostError
from modelhost.frontend import Target
from modelhost.protocol.agents import (
    Agent,
    AgentCreateRequest,
    AgentDeleted,
    AgentList,
    Run,
    RunCreateRequest,
    RunDeleted,
    RunEventList,
    RunList,
)

router = APIRouter(tags=["agents"], responses=error_responses(400, 401, 402, 404, 429))
CHAT_ENDPOINT = "/v1/chat/completions"  # an agent's model must serve chat: a text-generation deployment
POLL_SECONDS = 0.1  # how often a followed event stream looks for new events


def _json(payload: object) -> Response:
    return Response(orjson.dumps(payload), media_type="application/json")


# ---------------------------------------------------------------- agents


@router.post("/v1/agent", summary="Create an agent on a text-generation deployment", response_model=Agent)
async def create_agent(
    body: AgentCreateRequest, request: Request, services: ServicesDep, principal: AccountPrincipal
) -> Response:
    await deployment_for(request, principal, body.model, CHAT_ENDPOINT)
    tools = [t.model_dump(exclude_none=True) for t in body.tools] if body.tools else None
    agent = await asyncio.to_thread(
        services.agents.create_agent,
        account_id_of(principal),
        body.name,
        body.model,
        body.instructions,
        tools,
    )
    return _json(agent)


@router.get("/v1/agent", summary="List agents (newest first by default)", response_model=AgentList)
async def list_agents(
    request: Request,
    services: ServicesDep,
    principal: AccountPrincipal,
    after: After = None,
    limit: Limit = 20,
    order: Order = "desc",
) -> Response:
    agents, more = await asyncio.to_thread(
        services.agents.list_agents, account_id_of(principal), after, limit, order
    )
    return _json(list_body(agents, more))


@router.get("/v1/agent/{agent_id}", summary="Retrieve an agent", response_model=Agent)
async def retrieve_agent(
    agent_id: str, request: Request, services: ServicesDep, principal: AccountPrincipal
) -> Response:
    agents = services.agents
    return _json(await asyncio.to_thread(agents.get_agent, account_id_of(principal), agent_id))


@router.delete(
    "/v1/agent/{agent_id}",
    summary="Delete an agent; its runs are stopped and deleted with their events",
    response_model=AgentDeleted,
)
async def delete_agent(
    agent_id: str, request: Request, services: ServicesDep, principal: AccountPrincipal
) -> Response:
    runs = await asyncio.to_thread(services.agents.begin_delete_agent, account_id_of(principal), agent_id)
    await services.agent_runner.stop_runs(runs)
    await asyncio.to_thread(services.agents.finish_delete_agent, agent_id)
    return _json({"id": agent_id, "object": "agent.deleted", "deleted": True})


# ---------------------------------------------------------------- runs


@router.post(
    "/v1/agent/{agent_id}/runs",
    summary="Start a run of the agent (it executes in the background; follow its events)",
    response_model=Run,
)
async def create_run(
    agent_id: str,
    body: RunCreateRequest,
    request: Request,
    services: ServicesDep,
    principal: AccountPrincipal,
) -> Response:
    account_id = account_id_of(principal)
    agent = await asyncio.to_thread(services.agents.get_agent, account_id, agent_id)
    deployment = await deployment_for(request, principal, agent["model"], CHAT_ENDPOINT)
    messages = (
        [{"role": "user", "content": body.input}]
        if isinstance(body.input, str)
        else [m.model_dump(exclude_none=True) for m in body.input]
    )
    options = body.model_dump(exclude={"input"}, exclude_none=True)
    run, job = await asyncio.to_thread(
        services.agents.create_run,
        account_id,
        agent_id,
        Target.of(deployment, principal),
        {"input": messages, **options},
        services.agent_runner.name,
        tracing.parent(),  # the run's span links to this request's
    )
    counted = dataclasses.replace(job, subjects=principal.limited(), person=principal.person())
    await services.agent_runner.submit(counted)
    return _json(run)


@router.get(
    "/v1/agent/{agent_id}/runs",
    summary="List the agent's runs (newest first by default)",
    response_model=RunList,
)
async def list_runs(
    agent_id: str,
    request: Request,
    services: ServicesDep,
    principal: AccountPrincipal,
    after: After = None,
    limit: Limit = 20,
    order: Order = "desc",
) -> Response:
    runs, more = await asyncio.to_thread(
        services.agents.list_runs, account_id_of(principal), agent_id, after, limit, order
    )
    return _json(list_body(runs, more))


@router.get("/v1/agent/{agent_id}/runs/{run_id}", summary="Retrieve a run", response_model=Run)
async def retrieve_run(
    agent_id: str, run_id: str, request: Request, services: ServicesDep, principal: AccountPrincipal
) -> Response:
    agents = services.agents
    return _json(await asyncio.to_thread(agents.get_run, account_id_of(principal), agent_id, run_id))


@router.post(
    "/v1/agent/{agent_id}/runs/{run_id}/cancel",
    summary="Cancel a queued or running run (409 `run_not_active` once it has finished)",
    response_model=Run,
    responses=error_responses(409),
)
async def cancel_run(
    agent_id: str, run_id: str, request: Request, services: ServicesDep, principal: AccountPrincipal
) -> Response:
    run = await asyncio.to_thread(services.agents.cancel_run, account_id_of(principal), agent_id, run_id)
    await services.agent_runner.stop_runs([run_id])
    return _json(run)


@router.get(
    "/v1/agent/{agent_id}/runs/{run_id}/events",
    summary="The run's stored events in order; `stream=true` follows them live (SSE) until the run ends",
    response_model=RunEventList,
    responses={
        200: {"content": {"text/event-stream": {"example": 'data: {"seq": 1, ...}\n\ndata: [DONE]\n\n'}}}
    },
)
async def run_events(
    agent_id: str,
    run_id: str,
    request: Request,
    services: ServicesDep,
    principal: AccountPrincipal,
    stream: Annotated[bool, Query(description="Follow new events as Server-Sent Events.")] = False,
    after: Annotated[int, Query(ge=0, description="Only events with a greater `seq`.")] = 0,
) -> Response:
    agents = services.agents
    account_id = account_id_of(principal)
    events, status = await asyncio.to_thread(agents.events, account_id, agent_id, run_id, after)
    if not stream:
        return _json({"object": "list", "data": events})

    async def follow() -> AsyncIterator[bytes]:
        nonlocal events, status
        seen = after
        while True:
            for event in events:
                seen = event["seq"]
                yield b"data: " + orjson.dumps(event) + b"\n\n"
            if status not in ACTIVE:
                break
            await asyncio.sleep(POLL_SECONDS)
            try:
                events, status = await asyncio.to_thread(agents.events, account_id, agent_id, run_id, seen)
            except ModelhostError as exc:  # deleted while followed: say so in the stream, then end
                error = {"message": exc.message, "type": exc.error_type, "code": exc.code, "param": exc.param}
                yield b"data: " + orjson.dumps({"error": error}) + b"\n\n"
                return
        yield b"data: [DONE]\n\n"

    return StreamingResponse(follow(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})


@router.delete(
    "/v1/agent/{agent_id}/runs/{run_id}",
    summary="Delete a run (api.md §4.15): an executing run is stopped first, then its events are deleted",
    response_model=RunDeleted,
)
async def delete_run(
    agent_id: str, run_id: str, request: Request, services: ServicesDep, principal: AccountPrincipal
) -> Response:
    await asyncio.to_thread(services.agents.begin_delete_run, account_id_of(principal), agent_id, run_id)
    await services.agent_runner.stop_runs([run_id])
    await asyncio.to_thread(services.agents.finish_delete_run, run_id)
    return _json({"id": run_id, "object": "agent.run.deleted", "deleted": True})
