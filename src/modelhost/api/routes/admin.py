"""Operator routes: accounts and credits, the server's memory capacity (admin key)."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Path

from modelhost.api.deps import AdminPrincipal, ServicesDep
from modelhost.api.errors import error_responses
from modelhost.api.routes.deployments import present as present_deployment
from modelhost.billing.rates import to_credits
from modelhost.protocol.common import ListOf
from modelhost.protocol.management import (
    Account,
    AccountCreate,
    AccountCreated,
    AccountPatch,
    Capacity,
    CreditsTopUp,
    DeploymentShare,
    RateLimits,
    SharedDeployment,
)
from modelhost.services.accounts import AccountView

router = APIRouter(prefix="/v1/admin", tags=["admin"], responses=error_responses(400, 401))


def present(view: AccountView) -> Account:
    return Account(
        id=view.account.id,
        name=view.account.name,
        credits=to_credits(view.balance_micro),
        credits_granted=to_credits(view.granted_micro),
        credits_used=to_credits(view.granted_micro - view.balance_micro),
        limits=RateLimits.model_validate(view.account.limits) if view.account.limits else None,
        weight=view.account.weight,
        created_at=view.account.created_at,
    )


@router.post("/accounts", summary="Create an account and its first account key", status_code=201)
def create_account(body: AccountCreate, _admin: AdminPrincipal, services: ServicesDep) -> AccountCreated:
    limits = body.limits.model_dump() if body.limits is not None else None
    account, secret = services.accounts.create(body.name, body.credits, limits, body.weight)
    return AccountCreated(**present(account).model_dump(), api_key=secret)


@router.get("/accounts", summary="List accounts")
def list_accounts(_admin: AdminPrincipal, services: ServicesDep) -> ListOf[Account]:
    return ListOf[Account](data=[present(a) for a in services.accounts.list_accounts()])


@router.get("/accounts/{account_id}", summary="Get an account", responses=error_responses(404))
def get_account(
    _admin: AdminPrincipal, services: ServicesDep, account_id: str = Path(max_length=64)
) -> Account:
    return present(services.accounts.get(account_id))


@router.patch(
    "/accounts/{account_id}",
    summary="Rename an account, change its rate limits or its weight (effective on its keys' next request)",
    responses=error_responses(404),
)
def update_account(
    body: AccountPatch, _admin: AdminPrincipal, services: ServicesDep, account_id: str = Path(max_length=64)
) -> Account:
    return present(services.accounts.update(account_id, body.model_dump(include=body.model_fields_set)))


@router.post(
    "/accounts/{account_id}/credits",
    summary="Add credits to an account (negative for corrections)",
    responses=error_responses(404),
)
async def add_credits(
    body: CreditsTopUp, _admin: AdminPrincipal, services: ServicesDep, account_id: str = Path(max_length=64)
) -> Account:
    """A top-up restores service at once on this gateway: the balance is read again and the account's
    warm and hot deployments load again."""
    view = await asyncio.to_thread(services.accounts.add_credits, account_id, body.credits)
    services.billing.forget(account_id)
    if view.balance_micro > 0:
        await services.runtime.resume_account(account_id)
    return present(view)


@router.get(
    "/capacity",
    summary="The memory budget, each GPU's, and every deployment holding memory (docs/runtime.md, Capacity)",
)
async def get_capacity(_admin: AdminPrincipal, services: ServicesDep) -> Capacity:
    return Capacity.model_validate(await services.runtime.capacity())


@router.patch(
    "/deployments/{deployment_id}",
    summary="Share a deployment with every account as a base for their adapters, or stop sharing it",
    responses=error_responses(404),
    description="A shared base serves the adapter deployments any account attaches to it "
    "(`base_deployment`); accounts see only their own adapters, requests and usage (docs/adapters.md). "
    "400 `adapter_base_unsupported` where it cannot serve adapters. `shared: false` detaches the adapter "
    "deployments of other accounts (counted in `detached_adapters`): each then answers 409 "
    "`base_not_shared`, its `state_reason` says why, and it costs the base's owner nothing more.",
)
async def share_deployment(
    body: DeploymentShare,
    _admin: AdminPrincipal,
    services: ServicesDep,
    deployment_id: str = Path(max_length=64, description="Deployment ID (`dep_...`)."),
) -> SharedDeployment:
    deployment, detached = await asyncio.to_thread(services.deployments.share, deployment_id, body.shared)
    if detached:  # the base's replicas drop them: no longer billed, nor served
        await services.runtime.apply(deployment_id)
        for adapter_id in detached:
            await services.runtime.remove(adapter_id)
    shown = await present_deployment(deployment, services)
    return SharedDeployment(**shown.model_dump(), detached_adapters=len(detached))
