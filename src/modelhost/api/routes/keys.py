"""Account and deployment keys (account key)."""

from __future__ import annotations

import asyncio
import dataclasses

from fastapi import APIRouter, Path

from modelhost.api.deps import AccountPrincipal, ServicesDep, account_id_of
from modelhost.api.errors import error_responses
from modelhost.auth.limits import Limits, Subject
from modelhost.auth.roles import Role
from modelhost.protocol.common import Deleted, ListOf
from modelhost.protocol.management import (
    Key,
    KeyCreate,
    KeyCreated,
    KeyPatch,
    KeyRotate,
    KeyUse,
    RateLimits,
)
from modelhost.store import models as rows

router = APIRouter(prefix="/v1/keys", tags=["keys"], responses=error_responses(400, 401))


def present(key: rows.ApiKey) -> Key:
    return Key(
        id=key.id,
        name=key.name,
        kind="account" if key.deployment_ids is None else "deployment",
        deployments=key.deployment_ids,
        prefix=key.secret_prefix,
        limits=RateLimits.model_validate(key.limits) if key.limits else None,
        created_at=key.created_at,
        revoked_at=key.revoked_at,
        expires_at=key.expires_at,
        role=key.role or Role.OWNER,
        user_id=key.user_id,
        cache_salt=key.cache_salt,
        weight=key.weight,
    )


@router.post(
    "",
    summary="Create a key (account key, or deployment key with `deployments`): yours, a service key or "
    "another person's (docs/access.md)",
    status_code=201,
    responses=error_responses(403),
)
def create_key(body: KeyCreate, principal: AccountPrincipal, services: ServicesDep) -> KeyCreated:
    limits = body.limits.model_dump() if body.limits is not None else None
    expires_at = services.keys.expiry(body.expires_at, body.expires_in)
    key, secret = services.keys.create(
        account_id_of(principal),
        body.name,
        body.deployments,
        limits,
        expires_at,
        body.user_id,
        body.role,
        principal,
        service=body.service,
        cache_salt=body.cache_salt,
        weight=body.weight,
    )
    return KeyCreated(**present(key).model_dump(), api_key=secret)


@router.post(
    "/{key_id}/rotate",
    summary="Rotate a key: a new key of the same scope (its secret shown once); the old one works for "
    "`grace_seconds` more, then expires",
    status_code=201,
    responses=error_responses(404),
)
def rotate_key(
    principal: AccountPrincipal,
    services: ServicesDep,
    body: KeyRotate | None = None,
    key_id: str = Path(max_length=64),
) -> KeyCreated:
    grace = body.grace_seconds if body is not None else 0
    key, secret = services.keys.rotate(account_id_of(principal), key_id, grace, principal)
    return KeyCreated(**present(key).model_dump(), api_key=secret)


@router.get(
    "",
    summary="List keys (secrets are never shown again), with what limited keys have left: all of the "
    "account's with `keys:manage`, else your own",
)
async def list_keys(principal: AccountPrincipal, services: ServicesDep) -> ListOf[Key]:
    found = await asyncio.to_thread(services.keys.list_keys, account_id_of(principal), principal)
    keys = [present(row) for row in found]
    subjects = [
        Subject.of("key", row.id, Limits.of(row.limits)) if row.revoked_at is None else None for row in found
    ]
    limited = [(key, subject) for key, subject in zip(keys, subjects, strict=True) if subject is not None]
    uses = [services.limits.use(subject) for _, subject in limited]
    for (key, _), use in zip(limited, uses, strict=True):
        key.use = KeyUse(**dataclasses.asdict(use))
    return ListOf[Key](data=keys)


@router.patch(
    "/{key_id}",
    summary="Rename a key or change its rate limits (effective on its next request)",
    responses=error_responses(404),
)
def update_key(
    body: KeyPatch, principal: AccountPrincipal, services: ServicesDep, key_id: str = Path(max_length=64)
) -> Key:
    changes = body.model_dump(include=body.model_fields_set)
    return present(services.keys.update(account_id_of(principal), key_id, changes, principal))


@router.delete(
    "/{key_id}",
    summary="Revoke a key, effective at once",
    responses=error_responses(404, 409),
)
def revoke_key(
    principal: AccountPrincipal, services: ServicesDep, key_id: str = Path(max_length=64)
) -> Deleted:
    key = services.keys.revoke(account_id_of(principal), key_id, principal)
    return Deleted(id=key.id, object="api_key.deleted")
