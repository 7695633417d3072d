"""People in the caller's account (`users:read`, `users:write`) and who a key acts as (`/v1/me`)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

from fastapi import APIRouter, Path

from modelhost.api.deps import AccountPrincipal, ServicesDep, account_id_of
from modelhost.api.errors import error_responses
from modelhost.auth.quotas import PeriodUse as UsedInPeriod
from modelhost.auth.quotas import Person, Quota
from modelhost.auth.roles import Role
from modelhost.protocol.common import Deleted, ListOf
from modelhost.protocol.management import (
    Invitation,
    InvitationCreate,
    Me,
    PeriodUse,
    PersonQuota,
    QuotaUse,
    RoleQuotas,
    RoleQuotasPatch,
    RoleWeights,
    RoleWeightsPatch,
    SignedOutEverywhere,
    TenantWeights,
    User,
    UserCreate,
    UserPatch,
)
from modelhost.services.users import KEEP, Invited, Member

router = APIRouter(tags=["users"], responses=error_responses(400, 401, 403))


def present(member: Member) -> User:
    return User(
        id=member.id,
        email=member.email,
        name=member.name,
        role=member.role.value,
        disabled=member.disabled,
        signs_in=member.signs_in,
        created_at=member.created_at,
        quota=present_quota(member.quota),
    )


def present_quota(quota: Quota | None) -> PersonQuota | None:
    return None if quota is None else PersonQuota(**quota.stored())


def quota_of(body: PersonQuota | None) -> Quota | None:
    return None if body is None else Quota.of(body.model_dump())


def present_invitation(invited: Invited) -> Invitation:
    return Invitation(
        id=invited.id,
        account_id=invited.account_id,
        email=invited.email,
        role=invited.role.value,
        created_at=invited.created_at,
        expires_at=invited.expires_at,
    )


@router.post(
    "/v1/invitations",
    summary="Invite an email to a role: offered to whoever signs in with it (verified), a member once "
    "they accept",
    status_code=201,
    responses=error_responses(409),
)
def invite(body: InvitationCreate, principal: AccountPrincipal, services: ServicesDep) -> Invitation:
    invited = services.users.invite(account_id_of(principal), body.email, Role(body.role), principal)
    return present_invitation(invited)


@router.get("/v1/invitations", summary="List the account's invitations not yet accepted")
async def list_invitations(principal: AccountPrincipal, services: ServicesDep) -> ListOf[Invitation]:
    found = await asyncio.to_thread(services.users.invitations, account_id_of(principal))
    return ListOf[Invitation](data=[present_invitation(i) for i in found])


@router.delete(
    "/v1/invitations/{invitation_id}",
    summary="Withdraw an invitation",
    responses=error_responses(404),
)
def revoke_invitation(
    principal: AccountPrincipal, services: ServicesDep, invitation_id: str = Path(max_length=64)
) -> Deleted:
    services.users.revoke_invitation(account_id_of(principal), invitation_id, principal)
    return Deleted(id=invitation_id, object="invitation.deleted")


@router.post(
    "/v1/users",
    summary="Add a person without sign-in to the account with a role (made on first use of their email; "
    "to let someone who signs in join, invite them)",
    status_code=201,
    responses=error_responses(409),
)
def add_user(body: UserCreate, principal: AccountPrincipal, services: ServicesDep) -> User:
    member = services.users.add(account_id_of(principal), body.email, body.name, Role(body.role), principal)
    return present(member)


@router.get("/v1/users", summary="List the account's people and their roles")
async def list_users(principal: AccountPrincipal, services: ServicesDep) -> ListOf[User]:
    members = await asyncio.to_thread(services.users.list_members, account_id_of(principal))
    return ListOf[User](data=[present(m) for m in members])


@router.get("/v1/role-quotas", summary="The default quota of each role's people in the account")
async def get_role_quotas(principal: AccountPrincipal, services: ServicesDep) -> RoleQuotas:
    quotas = await asyncio.to_thread(services.users.role_quotas, account_id_of(principal))
    return RoleQuotas(**{role.value: present_quota(quota) for role, quota in quotas.items()})


@router.patch(
    "/v1/role-quotas",
    summary="Set or remove roles' default quotas (a person's own quota replaces their role's)",
)
def set_role_quotas(body: RoleQuotasPatch, principal: AccountPrincipal, services: ServicesDep) -> RoleQuotas:
    changes = {Role(name): quota_of(getattr(body, name)) for name in body.model_fields_set}
    quotas = services.users.set_role_quotas(account_id_of(principal), changes, principal)
    return RoleQuotas(**{role.value: present_quota(quota) for role, quota in quotas.items()})


@router.get("/v1/role-weights", summary="The weight of each role inside the account (fair shares)")
async def get_role_weights(principal: AccountPrincipal, services: ServicesDep) -> RoleWeights:
    weights = await asyncio.to_thread(services.users.role_weights, account_id_of(principal))
    return RoleWeights(**{role.value: weight for role, weight in weights.items()})


@router.patch(
    "/v1/role-weights",
    summary="Set roles' weights inside the account (a key's share is its own weight times its role's)",
)
def set_role_weights(
    body: RoleWeightsPatch, principal: AccountPrincipal, services: ServicesDep
) -> RoleWeights:
    changes = {Role(name): getattr(body, name) for name in body.model_fields_set}
    weights = services.users.set_role_weights(account_id_of(principal), changes, principal)
    return RoleWeights(**{role.value: weight for role, weight in weights.items()})


@router.get("/v1/users/{user_id}", summary="Get a person of the account", responses=error_responses(404))
def get_user(principal: AccountPrincipal, services: ServicesDep, user_id: str = Path(max_length=64)) -> User:
    return present(services.users.get(account_id_of(principal), user_id))


@router.patch(
    "/v1/users/{user_id}",
    summary="Change a person's role or quota, or disable them (their keys follow at once)",
    responses=error_responses(404),
)
def update_user(
    body: UserPatch, principal: AccountPrincipal, services: ServicesDep, user_id: str = Path(max_length=64)
) -> User:
    role = Role(body.role) if body.role is not None else None
    quota = quota_of(body.quota) if "quota" in body.model_fields_set else KEEP
    member = services.users.update(account_id_of(principal), user_id, role, body.disabled, principal, quota)
    return present(member)


@router.delete(
    "/v1/users/{user_id}",
    summary="Remove a person from the account (their keys here stop at once)",
    responses=error_responses(404),
)
def remove_user(
    principal: AccountPrincipal, services: ServicesDep, user_id: str = Path(max_length=64)
) -> Deleted:
    services.users.remove(account_id_of(principal), user_id, principal)
    return Deleted(id=user_id, object="user.deleted")


@router.post(
    "/v1/users/{user_id}/sign-out-everywhere",
    summary="Sign a person out of the account everywhere: their sessions here end (none opened before acts "
    "here again) and every key of theirs in the account is revoked",
    responses=error_responses(404),
)
def sign_out_everywhere(
    principal: AccountPrincipal, services: ServicesDep, user_id: str = Path(max_length=64)
) -> SignedOutEverywhere:
    done = services.users.sign_out_everywhere(account_id_of(principal), user_id, principal)
    return SignedOutEverywhere(
        id=done.user_id, sessions_ended=done.sessions_ended, keys_revoked=done.keys_revoked
    )


@router.get(
    "/v1/me", summary="Who this key acts as: its account, role, person, what it may do and its person's quota"
)
def whoami(principal: AccountPrincipal, services: ServicesDep) -> Me:
    account_id = account_id_of(principal)
    assert principal.key_id is not None
    person, quota = None, None
    if principal.user_id is not None:
        person = present(services.users.get(account_id, principal.user_id))
        limits, source = services.users.quota_of(account_id, principal.user_id)
        use = services.quotas.use_now(Person(account_id, principal.user_id))
        limit = limits or Quota()
        quota = QuotaUse(
            limits=present_quota(limits),
            source=source,
            day=_period(use.day, limit.requests_per_day, limit.tokens_per_day),
            month=_period(use.month, limit.requests_per_month, limit.tokens_per_month),
        )
    return Me(
        account_id=account_id,
        key_id=principal.key_id,
        role=principal.role.value,
        actions=sorted(principal.actions),
        user=person,
        quota=quota,
        weights=TenantWeights(account=principal.weights[0], key=principal.weights[1]),
    )


def _period(use: UsedInPeriod, requests: int | None, tokens: int | None) -> PeriodUse:
    return PeriodUse(
        period=use.period,
        requests=use.requests,
        tokens=use.tokens,
        requests_remaining=None if requests is None else max(0, requests - use.requests),
        tokens_remaining=None if tokens is None else max(0, tokens - use.tokens),
        resets_at=datetime.fromtimestamp(use.ends_ms / 1000, UTC),
    )
