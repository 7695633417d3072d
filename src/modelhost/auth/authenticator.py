"""Bearer header → Principal. The one auth path of the service."""

from __future__ import annotations

import hmac
from datetime import UTC, datetime, timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session

from modelhost.auth import roles
from modelhost.auth.limits import Limits
from modelhost.auth.principal import ADMIN, Principal, PrincipalKind
from modelhost.auth.quotas import quota_for
from modelhost.auth.roles import Role
from modelhost.auth.secrets import hash_secret, looks_like_secret
from modelhost.auth.weights import tenant_weights
from modelhost.cache import SingleFlight, TTLCache
from modelhost.clock import Clock, SystemClock
from modelhost.errors import InvalidAPIKey
from modelhost.store.db import Database
from modelhost.store.models import Account, ApiKey, Membership, User


def bearer_token(authorization: str | None, api_key: str | None = None) -> str:
    """Extract the token of an `Authorization: Bearer <token>` header, else of an `x-api-key: <token>`
    header (how Anthropic's SDKs send a key; accepted on every route: the same keys either way), or
    refuse."""
    if not authorization and api_key is not None:
        if not api_key.strip():
            raise InvalidAPIKey("Malformed x-api-key header: expected the key.")
        return api_key.strip()
    if not authorization:
        raise InvalidAPIKey("Missing API key: send 'Authorization: Bearer <key>' (or 'x-api-key: <key>').")
    scheme, _, token = authorization.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        raise InvalidAPIKey("Malformed Authorization header: expected 'Bearer <key>'.")
    return token


class Authenticator:
    """Resolves secrets to principals, with a short-lived cache that revocation clears."""

    def __init__(
        self,
        database: Database,
        admin_key: str | None,
        cache: TTLCache[Principal],
        clock: Clock | None = None,
        sign_in_key_seconds: float = 0,
    ) -> None:
        self._database = database
        self._admin_key = admin_key
        self.cache = cache
        # what key expiry, a person's last sign-in and sessions are measured against (tests move it)
        self.clock = clock or SystemClock()
        # a person who signs in: how long after their last sign-in their keys work (0: no bound)
        self.sign_in_keys = timedelta(seconds=sign_in_key_seconds) if sign_in_key_seconds else None
        self.loads: SingleFlight[Principal | None] = SingleFlight(lambda: cache.generation)

    def now(self) -> datetime:
        return datetime.fromtimestamp(self.clock.now_ms() / 1000, UTC)

    def cached(self, token: str) -> tuple[bool, Principal | None]:
        """A lookup that never touches the database: (known, principal)."""
        if self._admin_key is not None and hmac.compare_digest(
            token.encode("utf-8"), self._admin_key.encode("utf-8")
        ):
            return True, ADMIN
        if not looks_like_secret(token):
            raise InvalidAPIKey("Malformed API key.")
        return self.cache.get(hash_secret(token))

    def load(self, token: str) -> Principal | None:
        """Database lookup by hash; result cached (misses too). While the database is unavailable, a key
        this gateway has read before is still known (and a revoked one, forgotten, is not)."""
        digest = hash_secret(token)
        return self.cache.fresh_or_stale(digest, lambda: self._read(digest))

    def _read(self, digest: str) -> Principal | None:
        with self._database.transaction() as session:
            row = session.scalars(select(ApiKey).where(ApiKey.secret_hash == digest)).one_or_none()
            if (
                row is not None
                and row.revoked_at is None
                and hmac.compare_digest(row.secret_hash.encode(), digest.encode())
            ):
                return _principal_of(session, row, self._signed_in_since())
        return None

    def of_key(self, key_id: str) -> Principal | None:
        """The principal of a key by its ID (a batch runs as the key that created it); None once the
        key is revoked, expired or gone. Not cached: a batch reads it once per claim."""
        with self._database.transaction() as session:
            row = session.get(ApiKey, key_id)
            if row is None or row.revoked_at is not None:
                return None
            principal = _principal_of(session, row, self._signed_in_since())
        return None if self.expired(principal) or principal.refusal is not None else principal

    def expired(self, principal: Principal) -> bool:
        """Whether the key is past its `expires_at`: checked on every use, a cached principal included
        (the cache keeps a key for seconds, its expiry is to the millisecond)."""
        return principal.expires_ms is not None and self.clock.now_ms() >= principal.expires_ms

    def _signed_in_since(self) -> datetime | None:
        """The oldest last sign-in whose person's keys still work now (None: no bound)."""
        return None if self.sign_in_keys is None else self.now() - self.sign_in_keys

    def forget_all(self) -> None:
        """Called on revocation: the next request of any key re-reads the database."""
        self.cache.clear()


def _principal_of(session: Session, row: ApiKey, signed_in_since: datetime | None) -> Principal:
    """The key's principal: its scope and limits, and what it may do now (its role, bounded by its
    owner's role in the account: read at every cache miss, so a change reaches every gateway process
    within `key_cache_seconds`). A person's key is refused once they are no longer a member, while
    they are disabled, when it was made under an earlier membership (removed and added again), and,
    for a person who signs in, when their last sign-in is older than `signed_in_since`."""
    account = session.get(Account, row.account_id)
    account_limits = account.limits if account is not None else None
    deployment_ids = frozenset(row.deployment_ids) if row.deployment_ids is not None else None
    key_role = Role(row.role) if row.role is not None else Role.OWNER
    owner_role, email, subject, refusal, quota = None, None, None, None, None
    if row.user_id is not None:
        user = session.get(User, row.user_id)
        member = session.get(Membership, (row.user_id, row.account_id))
        email = user.email if user is not None else None
        subject = user.subject if user is not None else None
        if user is None or member is None:
            refusal = ("not_a_member", "The key's owner is no longer a member of this account.")
        elif row.member_since != member.created_at:
            refusal = ("not_a_member", "The key's owner was removed from this account since it was made.")
        elif member.disabled_at is not None:
            refusal = ("user_disabled", "The key's owner is disabled in this account.")
        elif _sign_in_lapsed(user, signed_in_since):
            refusal = (
                "sign_in_required",
                "The key's owner has not signed in for too long (MODELHOST_SIGN_IN_KEY_SECONDS): their "
                "keys work again once they sign in.",
            )
        else:
            owner_role = Role(member.role)
            quota = quota_for(member.quota, account.role_quotas if account else None, member.role)[0]
    actions = roles.allowed(key_role, owner_role) if refusal is None else frozenset()
    role = key_role if row.role is not None or owner_role is None else owner_role
    return Principal(
        kind=PrincipalKind.ACCOUNT if deployment_ids is None else PrincipalKind.DEPLOYMENT,
        account_id=row.account_id,
        key_id=row.id,
        deployment_ids=deployment_ids,
        limits=Limits.of(row.limits),
        account_limits=Limits.of(account_limits),
        expires_ms=None if row.expires_at is None else int(row.expires_at.timestamp() * 1000),
        role=role,
        actions=actions,
        user_id=row.user_id,
        email=email,
        subject=subject,
        refusal=refusal,
        cache_salt=row.cache_salt,
        weights=tenant_weights(account, (owner_role or key_role).value, row.weight),  # a person's: their role
        quota=quota,
    )


def _sign_in_lapsed(user: User, signed_in_since: datetime | None) -> bool:
    """A person who signs in whose last sign-in is too old (a person without sign-in never lapses)."""
    if user.subject is None or signed_in_since is None:
        return False
    return user.signed_in_at is None or user.signed_in_at < signed_in_since
