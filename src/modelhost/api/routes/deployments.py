"""Deployments (account key): a model ID bound to a ready artifact, with live runtime state."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

from fastapi import APIRouter, Path
from pydantic import BaseModel
from starlette.concurrency import run_in_threadpool

from modelhost.api.deps import AccountPrincipal, ServicesDep, account_id_of
from modelhost.api.errors import error_responses
from modelhost.auth.principal import Principal
from modelhost.batches.files import Owner
from modelhost.container import Services
from modelhost.errors import CapacityConflict, InvalidRequest, ModelhostError
from modelhost.generation.deployment_settings import GenerationSettings
from modelhost.generation.families import family_named
from modelhost.protocol.common import Deleted, ListOf
from modelhost.protocol.management import (
    Deployment,
    DeploymentCreate,
    DeploymentPatch,
    DeploymentSwitch,
    DeploymentVersion,
    GenerationDefaults,
    GenerationSettingsFields,
    Rollout,
    RolloutGate,
    ScalingStep,
)
from modelhost.runtime.spec import LiveStatus
from modelhost.services import gated
from modelhost.services.gates import Gate
from modelhost.store import models as rows

router = APIRouter(prefix="/v1/deployments", tags=["deployments"], responses=error_responses(400, 401))

DeploymentId = Path(max_length=64, description="Deployment ID (`dep_...`).")


async def present(deployment: rows.Deployment, services: Services) -> Deployment:
    if deployment.detached_reason is not None:  # no base, no replicas: it says why to its owner
        live = LiveStatus(state="failed", reason=deployment.detached_reason)
    else:
        live = await services.runtime.status(deployment.id)
    return Deployment(
        id=deployment.id,
        model=deployment.model,
        artifact_id=deployment.artifact_id,
        pipeline=deployment.pipeline,
        readiness=deployment.readiness,
        state=live.state,
        state_reason=live.reason,
        replicas=live.replicas,
        desired_replicas=live.desired_replicas,
        last_scaling=None
        if live.last_scaling is None
        else ScalingStep(
            at=live.last_scaling.at,
            from_=live.last_scaling.before,
            to=live.last_scaling.after,
            reason=live.last_scaling.reason,
        ),
        min_replicas=deployment.min_replicas,
        max_replicas=deployment.max_replicas,
        engine=deployment.engine,
        engine_in_use=deployment.engine_in_use,
        engine_reason=deployment.engine_reason,
        precision=deployment.precision,
        precision_quality=deployment.precision_quality,
        memory_gb=live.memory_gb,
        last_cold_start_seconds=live.last_cold_start_seconds,
        base_deployment=deployment.base_deployment_id,
        shared=deployment.shared,
        generation_defaults=deployment.generation_defaults or {},
        versions=[
            DeploymentVersion(**v)
            for v in deployment.versions
            or [
                {
                    "artifact_id": deployment.artifact_id,
                    "traffic": 100,
                    "state": "active",
                    "since": _iso(deployment.created_at),
                }
            ]
        ],
        sticky=deployment.sticky,
        history=[DeploymentSwitch.model_validate(h) for h in deployment.history or []],
        rollout=None if (shown := gated.shown(deployment.rollout)) is None else Rollout.model_validate(shown),
        **_settings_shown(deployment.generation_settings),
        **_parsers_in_use(deployment.family, deployment.generation_settings),
        created_at=deployment.created_at,
        updated_at=deployment.updated_at,
    )


@router.post(
    "",
    summary="Deploy a ready model artifact under a model ID (an adapter on its base)",
    status_code=201,
    responses=error_responses(404, 409),
    description="409 `insufficient_capacity`: a hot deployment that cannot fit in the memory budget beside "
    "the hot deployments already pinned, or one larger than the whole budget (nothing is created). "
    "A LoRA adapter artifact needs `base_deployment` (400 `base_required`); 400 `adapter_base_mismatch` "
    "names the first module or tensor that does not fit the base, `adapter_base_unsupported` says why the "
    "base cannot serve adapters (docs/adapters.md).",
)
async def create_deployment(
    body: DeploymentCreate, principal: AccountPrincipal, services: ServicesDep
) -> Deployment:
    if body.chat_template is not None:  # a tenant's code: compiled in a compile process, not here
        await services.grammars.check_chat_template(body.chat_template)
    deployment = await run_in_threadpool(
        services.deployments.create,
        account_id_of(principal),
        body.model,
        body.artifact_id,
        body.readiness,
        body.min_replicas,
        body.max_replicas,
        body.engine,
        body.precision,
        body.base_deployment,
        _set_fields(body.generation_defaults),
        _settings_given(body),
    )
    try:
        # warm and hot start loading now; an adapter's base reloads with LoRA on if it had none
        await services.runtime.apply(deployment.id)
    except CapacityConflict:
        await remove_deployment(account_id_of(principal), deployment.id, services)
        raise
    if body.precision == "int8":
        deployment = await probe_int8(deployment, account_id_of(principal), services)
    return await present(deployment, services)


async def remove_deployment(account_id: str, deployment_id: str, services: Services) -> None:
    """The deployment's row gone (its artifact free again), then its replicas stopped."""
    await run_in_threadpool(services.deployments.delete, account_id, deployment_id)
    await services.runtime.remove(deployment_id)


async def probe_int8(deployment: rows.Deployment, account_id: str, services: Services) -> rows.Deployment:
    """int8 is accepted only where its quality probe holds, measured by the replica at its first load:
    the deployment loads now, and a refusal (or any failure to load) deletes it again and answers 400
    with the figures, so that a deployment with `precision: int8` always runs in int8."""
    try:
        await services.runtime.load(deployment.id)
    except ModelhostError as exc:
        await remove_deployment(account_id, deployment.id, services)
        raise InvalidRequest(
            f"precision int8 was not accepted for this artifact: {exc.message}",
            param="precision",
            code="precision_refused",
        ) from None
    return await run_in_threadpool(services.deployments.get, account_id, deployment.id)


@router.get("", summary="List deployments with their live state")
async def list_deployments(principal: AccountPrincipal, services: ServicesDep) -> ListOf[Deployment]:
    rows_ = await run_in_threadpool(services.deployments.list_deployments, account_id_of(principal))
    return ListOf[Deployment](data=list(await asyncio.gather(*(present(d, services) for d in rows_))))


@router.get(
    "/{deployment_id}", summary="Get a deployment with its live state", responses=error_responses(404)
)
async def get_deployment(
    principal: AccountPrincipal, services: ServicesDep, deployment_id: str = DeploymentId
) -> Deployment:
    deployment = await run_in_threadpool(services.deployments.get, account_id_of(principal), deployment_id)
    return await present(deployment, services)


@router.patch(
    "/{deployment_id}",
    summary="Change readiness, replica bounds, engine, generation settings, or roll to another artifact",
    responses=error_responses(404, 409),
    description="New generation settings (`max_model_len`, `chat_template`, `chat_template_kwargs`, "
    "`tool_parser`, `reasoning_parser`) reload the deployment's replicas once their requests in flight "
    "have finished. 409 `insufficient_capacity`: made hot (or given more replicas while hot) where it cannot "
    "fit in the memory budget beside the other hot deployments; its readiness and replica bounds stay as "
    "they were. 409 `base_in_use`: an engine other than vLLM for a base with adapters attached. 400 "
    "`adapter_follows_base`: readiness, replicas or engine of an adapter deployment (they are its base's). "
    "`artifact_id` or `traffic` start a rollout or a canary (docs/deploy.md): 404 `artifact_not_found` (not "
    "the account's), 409 `artifact_not_ready`, 400 `pipeline_mismatch`, 409 `adapter_base_mismatch` (an "
    "attached adapter does not fit the new artifact), 409 `insufficient_capacity` (both versions cannot fit: "
    'nothing changed; `"strategy": "replace"` stops the old one first). `gate` with `artifact_id`: a gated '
    "rollout (404 `eval_not_found` or 400 naming `gate.eval_id` for an eval not the key's or without a "
    "`completions` run; 409 `deployment_not_loaded`); a new rollout cancels a gate still deciding.",
)
async def update_deployment(
    body: DeploymentPatch,
    principal: AccountPrincipal,
    services: ServicesDep,
    deployment_id: str = DeploymentId,
) -> Deployment:
    account_id = account_id_of(principal)
    before = await run_in_threadpool(services.deployments.get, account_id, deployment_id)
    gate = None if body.gate is None else await _gate_of(body.gate, principal, services)
    if body.chat_template is not None:  # a tenant's code: compiled in a compile process, not here
        await services.grammars.check_chat_template(body.chat_template)
    deployment = await run_in_threadpool(
        services.deployments.update,
        account_id,
        deployment_id,
        body.readiness,
        body.min_replicas,
        body.max_replicas,
        body.engine,
        _set_fields(body.generation_defaults),
        _settings_given(body),
    )
    traffic = body.traffic if body.artifact_id is None else {body.artifact_id: 100}
    if traffic is not None or "sticky" in body.model_fields_set:
        live = await services.runtime.status(deployment_id)  # loaded: a rollout; else a switch
        deployment = await run_in_threadpool(
            lambda: services.deployments.roll(
                account_id,
                deployment_id,
                traffic,
                loaded=live.state in ("ready", "loading"),
                replacing=body.strategy == "replace",
                sticky=body.sticky,
                sticky_given="sticky" in body.model_fields_set,
                gate=gate,
            )
        )
    try:
        await services.runtime.apply(deployment.id)  # takes effect without a restart
    except CapacityConflict:  # the runtime changed nothing: neither does the store
        await run_in_threadpool(services.deployments.restore, deployment_id, before)
        await run_in_threadpool(
            services.deployments.update,
            account_id,
            deployment_id,
            before.readiness,
            before.min_replicas,
            before.max_replicas,
            generation_settings=_settings_shown(before.generation_settings),
        )
        raise
    return await present(deployment, services)


async def _gate_of(body: RolloutGate, principal: Principal, services: Services) -> Gate:
    """The gate asked for, its eval the key's own with a `completions` run to take items from (404
    `eval_not_found`, 400 naming `gate.eval_id`)."""
    assert principal.account_id is not None and principal.key_id is not None
    owner = Owner(principal.account_id, principal.key_id)
    try:
        await run_in_threadpool(services.evals.store.latest_source, owner, body.eval_id)
    except ModelhostError as exc:
        exc.param = "gate.eval_id"
        raise
    return Gate.of(body.model_dump())


@router.delete(
    "/{deployment_id}",
    summary="Delete a deployment (unloads it, frees its artifact)",
    responses=error_responses(404, 409),
    description="409 `base_in_use`: a base with adapter deployments attached (they are named).",
)
async def delete_deployment(
    principal: AccountPrincipal, services: ServicesDep, deployment_id: str = DeploymentId
) -> Deleted:
    await remove_deployment(account_id_of(principal), deployment_id, services)
    return Deleted(id=deployment_id, object="deployment.deleted")


SETTINGS_FIELDS = tuple(GenerationSettingsFields.model_fields)


def _settings_given(body: GenerationSettingsFields) -> dict[str, Any]:
    """The generation settings the body gives (a PATCH's `null` included: back to unset)."""
    given = {name: getattr(body, name) for name in SETTINGS_FIELDS if name in body.model_fields_set}
    return {name: v.model_dump() if isinstance(v, BaseModel) else v for name, v in given.items()}


def _settings_shown(stored: dict[str, Any] | None) -> dict[str, Any]:
    """Every generation setting as the deployment object shows it (unset: null, `{}` for the kwargs)."""
    shown: dict[str, Any] = {name: (stored or {}).get(name) for name in SETTINGS_FIELDS}
    shown["chat_template_kwargs"] = shown["chat_template_kwargs"] or {}
    shown["fair_token_weights"] = shown["fair_token_weights"] or {}
    return shown


def _parsers_in_use(family_name: str | None, stored: dict[str, Any] | None) -> dict[str, Any]:
    """The detected family and the parsers the replicas use: the deployment's own where set, else the
    family's (`GenerationSettings.family`, as the replicas apply them)."""
    detected = family_named(family_name) if family_name else None
    if detected is None:
        return {"family": None, "tool_parser_in_use": None, "reasoning_parser_in_use": None}
    in_use = GenerationSettings.of(stored).family(detected)
    return {
        "family": detected.name,
        "tool_parser_in_use": in_use.tool_parser,
        "reasoning_parser_in_use": in_use.reasoning_parser,
    }


def _iso(when: datetime) -> str:
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _set_fields(defaults: GenerationDefaults | None) -> dict[str, int | float] | None:
    """The fields of `generation_defaults` that are set, as stored; None when the body had none."""
    return None if defaults is None else defaults.model_dump(exclude_none=True)
