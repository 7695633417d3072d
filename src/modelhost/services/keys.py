"""Account and deployment keys: creation (secret shown once), listing, limits, revocation."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from modelhost.auth.authenticator import Authenticator
from modelhost.auth.secrets import display_prefix, hash_secret, new_secret
from modelhost.errors import Conflict, InvalidRequest, NotFound
from modelhost.store.db import Database
from modelhost.store.models import Account, ApiKey, Deployment
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


class KeyService:
    def __init__(self, database: Database, authenticator: Authenticator) -> None:
        self._database = database
        self._authenticator = authenticator

    @staticmethod
    def create_in(
        session: Session,
        account_id: str,
        name: str | None,
        deployment_ids: list[str] | None,
        limits: StoredLimits | None = None,
    ) -> tuple[ApiKey, str]:
        """Insert a key inside the caller's transaction; returns the row and its secret."""
        secret = new_secret()
        key = ApiKey(
            id=new_id("key"),
            account_id=account_id,
            name=name,
            secret_hash=hash_secret(secret),
            secret_prefix=display_prefix(secret),
            deployment_ids=deployment_ids,
            limits=stored_limits(limits),
        )
        session.add(key)
        session.flush()
        return key, secret

    def create(
        self,
        account_id: str,
        name: str | None,
        deployment_ids: list[str] | None,
        limits: StoredLimits | None = None,
    ) -> tuple[ApiKey, str]:
        with self._database.transaction() as session:
            _check_within_account(session, account_id, limits)
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
            return self.create_in(session, account_id, name, deployment_ids, limits)

    def update(self, account_id: str, key_id: str, changes: dict[str, object]) -> ApiKey:
        """Rename a key or replace its limits (`changes`: the fields given, `limits` None for none);
        every gateway process reads the key again on its next request."""
        with self._database.transaction() as session:
            key = session.get(ApiKey, key_id, with_for_update=True)
            if key is None or key.account_id != account_id or key.revoked_at is not None:
                raise NotFound("Key not found", param="key_id", code="key_not_found")
            if "name" in changes:
                key.name = changes["name"]  # type: ignore[assignment]
            if "limits" in changes:
                limits = stored_limits(changes["limits"])  # type: ignore[arg-type]
                _check_within_account(session, account_id, limits)
                key.limits = limits
        self.forget_principals()
        return key

    def forget_principals(self) -> None:
        """Keys or their account changed: every gateway process reads keys again."""
        self._authenticator.forget_all()

    def list_keys(self, account_id: str) -> list[ApiKey]:
        with self._database.transaction() as session:
            query = (
                select(ApiKey).where(ApiKey.account_id == account_id).order_by(ApiKey.created_at, ApiKey.id)
            )
            return list(session.scalars(query))

    def revoke(self, account_id: str, key_id: str) -> ApiKey:
        """Revoke at once. The last live account key cannot be revoked: the account would be locked out."""
        with self._database.transaction() as session:
            key = session.get(ApiKey, key_id, with_for_update=True)
            if key is None or key.account_id != account_id or key.revoked_at is not None:
                raise NotFound("Key not found", param="key_id", code="key_not_found")
            if key.deployment_ids is None:
                live_account_keys = session.scalars(
                    select(ApiKey.id).where(
                        ApiKey.account_id == account_id,
                        ApiKey.deployment_ids.is_(None),
                        ApiKey.revoked_at.is_(None),
                    )
                ).all()
                if len(live_account_keys) <= 1:
                    raise Conflict(
                        "Cannot revoke the account's last account key; create another first.",
                        code="last_account_key",
                        param="key_id",
                    )
            key.revoked_at = utcnow()
        self._authenticator.forget_all()
        return key
