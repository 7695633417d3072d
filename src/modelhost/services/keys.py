"""Account and deployment keys: creation (secret shown once), listing, limits, expiry, rotation,
revocation. Every change writes its audit row in its own transaction (`modelhost.audit`)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from modelhost import audit
from modelhost.auth.authenticator import Authenticator
from modelhost.auth.authority import KeyTarget, authorize_key, authorize_key_setting, sees_key
from modelhost.auth.principal import Principal
from modelhost.auth.roles import Role
from modelhost.auth.secrets import display_prefix, hash_secret, new_secret
from modelhost.clock import Clock
from modelhost.errors import Conflict, InvalidRequest, NotFound, PermissionDenied
from modelhost.store.db import Database
from modelhost.store.models import Account, ApiKey, Deployment, Membership
from modelhost.store.types import new_id, utcnow

StoredLimits = dict[str, float | None]
LIMIT_FIELDS = ("requests_per_minute", "tokens_per_minute", "concurrent_requests")


def stored_limits(limits: StoredLimits | None) -> StoredLimits | None:
    """What is stored: the limits set, None for none at all."""
    kept: StoredLimits = {name: value for name, value in (limits or {}).items() if value is not None}
    return kept or None


def check_within_account(key_limits: StoredLimits | None, account_limits: StoredLimits | None) -> None:
    """A key's limit may not exceed its account's (a limit the account does not have, it may set). Spend
    caps are an account's only: compute is billed per deployment's replicas, not per key."""
    for name in ("credits_per_day", "credits_per_month"):
        if (key_limits or {}).get(name) is not None:
            raise InvalidRequest(
                "Spend caps are set on accounts (credits are billed per deployment, not per key).",
                param=f"limits.{name}",
                code="spend_cap_on_key",
            )
    for name in LIMIT_FIELDS:
        mine, theirs = (key_limits or {}).get(name), (account_limits or {}).get(name)
        if mine is not None and theirs is not None and mine > theirs:
            raise InvalidRequest(
                f"The key's {name.replace('_', ' ')} ({mine}) would exceed its account's ({theirs}).",
                param=f"limits.{name}",
                code="limit_above_account",
            )


def _check_within_account(session: Session, account_id: str, limits: StoredLimits | None) -> None:
    account = session.get(Account, account_id)
    check_within_account(limits, account.limits if account is not None else None)


def target_of(session: Session, key: ApiKey) -> KeyTarget:
    """What an action on `key` reaches (`auth.authority`): its role, its owner and the owner's role in
    the account now."""
    owner_role = None
    if key.user_id is not None:
        membership = session.get(Membership, (key.user_id, key.account_id))
        owner_role = Role(membership.role) if membership is not None else None
    role = Role(key.role) if key.role is not None else None
    return KeyTarget(key.id, role, key.user_id, owner_role)


def audited(key: ApiKey) -> dict[str, Any]:
    """What an audit row says of a key: never its secret, its hash or its prefix."""
    return {
        "name": key.name,
        "kind": "account" if key.deployment_ids is None else "deployment",
        "user_id": key.user_id,
        "role": key.role,
        "deployments": key.deployment_ids,
        "limits": key.limits,
        "expires_at": key.expires_at,
        "cache_salt": key.cache_salt,
        "weight": key.weight,
    }


def _live(key: ApiKey | None, account_id: str, now: datetime) -> bool:
    return (
        key is not None
        and key.account_id == account_id
        and key.revoked_at is None
        and (key.expires_at is None or key.expires_at > now)
    )


def _not_found() -> NotFound:
    return NotFound("Key not found", param="key_id", code="key_not_found")


def _acted_on(session: Session, key: ApiKey | None, account_id: str, principal: Principal | None) -> ApiKey:
    """`key`, once the caller may act on it: 404 where it is not the account's, revoked, or not one the
    caller sees; 403 where it can do more than the caller (`auth.authority`)."""
    if key is None or key.account_id != account_id or key.revoked_at is not None:
        raise _not_found()
    target = target_of(session, key)
    if not sees_key(principal, target):
        raise _not_found()
    authorize_key(principal, target)
    return key


class KeyService:
    def __init__(self, database: Database, authenticator: Authenticator, clock: Clock) -> None:
        self._database = database
        self._authenticator = authenticator
        self._clock = clock  # expiry times are measured on it, as the authenticator checks them

    def now(self) -> datetime:
        return datetime.fromtimestamp(self._clock.now_ms() / 1000, UTC)

    @staticmethod
    def create_in(
        session: Session,
        account_id: str,
        name: str | None,
        deployment_ids: list[str] | None,
        limits: StoredLimits | None = None,
        expires_at: datetime | None = None,
        user_id: str | None = None,
        role: str | None = None,
        cache_salt: str | None = None,
        member_since: datetime | None = None,
        weight: float = 1.0,
    ) -> tuple[ApiKey, str]:
        """Insert a key inside the caller's transaction, with its audit row; returns the row and its
        secret. `user_id`: the person who owns it (None: a service key); `role`: its own (None: its
        owner's, or `owner` for a service key); `cache_salt`: its prefix-cache salt; `member_since`: the
        owner's membership it works under (its `created_at`: `ApiKey.member_since`)."""
        secret = new_secret()
        key = ApiKey(
            id=new_id("key"),
            account_id=account_id,
            name=name,
            secret_hash=hash_secret(secret),
            secret_prefix=display_prefix(secret),
            deployment_ids=deployment_ids,
            limits=stored_limits(limits),
            expires_at=expires_at,
            user_id=user_id,
            role=role,
            cache_salt=cache_salt,
            member_since=member_since,
            weight=weight,
        )
        session.add(key)
        session.flush()
        audit.record(session, "key.created", "key", key.id, account_id, audit.created(audited(key)))
        return key, secret

    def expiry(self, expires_at: datetime | None, expires_in: float | None) -> datetime | None:
        """When a new key expires: `expires_at`, or `expires_in` seconds from now (not both); in the
        future."""
        if expires_at is not None and expires_in is not None:
            raise InvalidRequest("Give expires_at or expires_in, not both.", param="expires_in")
        now = self.now()
        if expires_in is not None:
            return now + timedelta(seconds=expires_in)
        if expires_at is not None and expires_at <= now:
            raise InvalidRequest("expires_at must be in the future.", param="expires_at")
        return expires_at

    def create(
        self,
        account_id: str,
        name: str | None,
        deployment_ids: list[str] | None,
        limits: StoredLimits | None = None,
        expires_at: datetime | None = None,
        user_id: str | None = None,
        role: str | None = None,
        principal: Principal | None = None,
        service: bool = False,
        cache_salt: str | None = None,
        weight: float = 1.0,
    ) -> tuple[ApiKey, str]:
        """A new key of the account. Whom it belongs to: `user_id`, else the calling person (a service
        key's keys are service keys); no one with `service`. Its role: `role`, else the caller's. A
        service key or another person's key needs `keys:manage`, and no key is made that can do more
        than its creator, nor owned by someone who can; a `cache_salt` or a `weight` other than 1 needs
        `keys:manage` (`auth.authority`)."""
        if cache_salt is not None:
            authorize_key_setting(principal, "cache_salt")
        if weight != 1.0:
            authorize_key_setting(principal, "weight")
        if service and user_id is not None:
            raise InvalidRequest("A service key has no user_id.", param="user_id")
        caller_user = principal.user_id if principal is not None else None
        owner = None if service else (user_id or caller_user)
        if principal is not None and role is None:
            role = principal.role
        with self._database.transaction() as session:
            _check_within_account(session, account_id, limits)
            membership = session.get(Membership, (owner, account_id)) if owner is not None else None
            if owner is not None and membership is None:
                raise InvalidRequest(f"Unknown user in this account: {owner}", param="user_id")
            owner_role = Role(membership.role) if membership is not None else None
            target = KeyTarget(None, Role(role) if role else None, owner, owner_role)
            if not sees_key(principal, target):
                raise PermissionDenied(
                    "Making a service key or another person's key needs keys:manage (docs/access.md)."
                )
            authorize_key(principal, target)
            if deployment_ids is not None:
                deployment_ids = list(dict.fromkeys(deployment_ids))
                owned = set(
                    session.scalars(
                        select(Deployment.id).where(
                            Deployment.account_id == account_id, Deployment.id.in_(deployment_ids)
                        )
                    )
                )
                unknown = [d for d in deployment_ids if d not in owned]
                if unknown:
                    raise InvalidRequest(f"Unknown deployment: {unknown[0]}", param="deployments")
            since = membership.created_at if membership is not None else None
            return self.create_in(
                session,
                account_id,
                name,
                deployment_ids,
                limits,
                expires_at,
                owner,
                role,
                cache_salt,
                since,
                weight,
            )

    def rotate(
        self, account_id: str, key_id: str, grace_seconds: float, principal: Principal | None = None
    ) -> tuple[ApiKey, str]:
        """A new key of the same scope, name, limits and expiry (its secret returned once: a key that
        was to expire still does, at the same time); the old one keeps working for `grace_seconds` (0: no
        longer), then expires (an earlier expiry of its own stays)."""
        with self._database.transaction() as session:
            old = session.get(ApiKey, key_id, with_for_update=True)
            now = self.now()
            if old is None or not _live(old, account_id, now):
                raise _not_found()
            _acted_on(session, old, account_id, principal)  # its copy has its role: a grant of it
            before = old.expires_at
            new, secret = self.create_in(
                session,
                account_id,
                old.name,
                old.deployment_ids,
                old.limits,
                expires_at=before,
                user_id=old.user_id,
                role=old.role,
                cache_salt=old.cache_salt,
                member_since=old.member_since,  # under the membership the old key was made in
                weight=old.weight,
            )
            ends = now + timedelta(seconds=grace_seconds)
            old.expires_at = ends if before is None else min(before, ends)
            changes: audit.Changes = {
                "expires_at": {"before": before, "after": old.expires_at},
                "replaced_by": {"before": None, "after": new.id},  # its ID, never its secret
            }
            audit.record(session, "key.rotated", "key", old.id, account_id, changes)
        self._authenticator.forget_all()
        return new, secret

    def update(
        self, account_id: str, key_id: str, changes: dict[str, object], principal: Principal | None = None
    ) -> ApiKey:
        """Rename a key or replace its limits, its cache salt or its weight (`changes`: the fields given,
        `limits` and `cache_salt` None for none, `weight` None for 1); every gateway process reads the key
        again on its next request."""
        with self._database.transaction() as session:
            key = _acted_on(session, session.get(ApiKey, key_id, with_for_update=True), account_id, principal)
            before = audited(key)
            if "name" in changes:
                key.name = changes["name"]  # type: ignore[assignment]
            if "limits" in changes:
                limits = stored_limits(changes["limits"])  # type: ignore[arg-type]
                _check_within_account(session, account_id, limits)
                key.limits = limits
            if "cache_salt" in changes:
                authorize_key_setting(principal, "cache_salt")
                key.cache_salt = changes["cache_salt"]  # type: ignore[assignment]
            if "weight" in changes:
                authorize_key_setting(principal, "weight")
                key.weight = float(changes["weight"] or 1.0)  # type: ignore[arg-type]
            audit.record(session, "key.updated", "key", key.id, account_id, audit.diff(before, audited(key)))
        self.forget_principals()
        return key

    def forget_principals(self) -> None:
        """Keys or their account changed: every gateway process reads keys again."""
        self._authenticator.forget_all()

    def list_keys(self, account_id: str, principal: Principal | None = None) -> list[ApiKey]:
        """The account's keys the caller sees (`auth.authority.sees_key`)."""
        with self._database.transaction() as session:
            query = (
                select(ApiKey).where(ApiKey.account_id == account_id).order_by(ApiKey.created_at, ApiKey.id)
            )
            keys = list(session.scalars(query))
            return [key for key in keys if sees_key(principal, target_of(session, key))]

    def revoke(self, account_id: str, key_id: str, principal: Principal | None = None) -> ApiKey:
        """Revoke at once. The last live (unexpired) account key cannot be revoked: the account would
        be locked out."""
        with self._database.transaction() as session:
            key = _acted_on(session, session.get(ApiKey, key_id, with_for_update=True), account_id, principal)
            if key.deployment_ids is None:
                others = session.scalars(
                    select(ApiKey.id).where(
                        ApiKey.account_id == account_id,
                        ApiKey.id != key_id,
                        ApiKey.deployment_ids.is_(None),
                        ApiKey.revoked_at.is_(None),
                        or_(ApiKey.expires_at.is_(None), ApiKey.expires_at > self.now()),
                    )
                ).all()
                if not others:
                    raise Conflict(
                        "Cannot revoke the account's last account key; create another first.",
                        code="last_account_key",
                        param="key_id",
                    )
            key.revoked_at = utcnow()
            revoked = {"revoked_at": {"before": None, "after": key.revoked_at}}
            audit.record(session, "key.revoked", "key", key.id, account_id, revoked)
        self._authenticator.forget_all()
        return key
