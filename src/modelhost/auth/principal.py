"""Who a request acts as, derived from its bearer key."""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass, field
from enum import StrEnum

from modelhost.auth.limits import Limits, Subject
from modelhost.auth.quotas import Person, Quota
from modelhost.auth.roles import PERMISSIONS, Role


class PrincipalKind(StrEnum):
    ADMIN = "admin"
    ACCOUNT = "account"
    DEPLOYMENT = "deployment"


@dataclass(frozen=True, slots=True)
class Principal:
    """An authenticated caller.

    `deployment_ids` is None for account keys (every deployment of the account) and the exact
    scope for deployment keys. `limits` are the key's rate limits, `account_limits` its account's
    (auth/limits.py; None: unlimited). Cached as it is: `expires_ms` is checked on every use.
    `role` and `actions`: what the key may do (`auth.roles.allowed`: its own role, bounded by its
    owner's role in the account); `user_id` and `email` its owner (None: a service key). `refusal`:
    why a key that exists is refused anyway (its owner disabled or no longer a member), as
    (code, message). `cache_salt`: the key's prefix-cache salt (docs/access.md, "Cache salts").
    """

    kind: PrincipalKind
    account_id: str | None = None
    key_id: str | None = None
    deployment_ids: frozenset[str] | None = None
    limits: Limits | None = None
    account_limits: Limits | None = None
    # When the key stops working (Unix ms, `auth.Authenticator.expired`); None: never
    expires_ms: int | None = None
    role: Role = Role.OWNER
    actions: frozenset[str] = PERMISSIONS[Role.OWNER]
    user_id: str | None = None
    email: str | None = None
    subject: str | None = None  # the identity provider's `sub` for the owner, once they signed in
    refusal: tuple[str, str] | None = None
    # a sign-in session's CSRF token (`services.sessions`): its state-changing requests must send it
    csrf: str | None = None
    # the key's prefix-cache salt (`store.models.ApiKey.cache_salt`), which its generation requests carry
    # to the engine (`frontend.Target`); None: the deployment's shared cache
    cache_salt: str | None = None
    # (its account's weight, its own): their shares of a shared model (`generation.fairness`)
    weights: tuple[float, float] = (1.0, 1.0)
    # its person's quota in the account (`auth.quotas`: their own, else their role's); None: none
    quota: Quota | None = None
    # whom its requests count against (`limited`): made once, as a principal is cached
    _subjects: tuple[Subject, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        subjects = (
            Subject.of("key", self.key_id, self.limits),
            Subject.of("account", self.account_id, self.account_limits),
        )
        object.__setattr__(self, "_subjects", tuple(s for s in subjects if s is not None))

    def covers(self, deployment_id: str) -> bool:
        if self.kind is PrincipalKind.ACCOUNT:
            return True
        if self.kind is PrincipalKind.DEPLOYMENT:
            return self.deployment_ids is not None and deployment_id in self.deployment_ids
        return False

    def person(self) -> Person | None:
        """The person whose use its requests count towards (`auth.quotas`); None: a service key, the
        operator."""
        if self.user_id is None or self.account_id is None or self.kind is PrincipalKind.ADMIN:
            return None
        return Person(self.account_id, self.user_id)

    def limited(self) -> tuple[Subject, ...]:
        """Whom a request of this key counts against: the key and its account, where they have limits."""
        return self._subjects


ADMIN = Principal(kind=PrincipalKind.ADMIN)

# Whom the current request runs for, `<account>/<key>`: what a replica's fair queuing takes turns between
# (`runtime.worker.host`) and a generating engine's counters share it by (`generation.fairness`). Set
# when the request's deployment is resolved (`api.deps.deployment_for`).
_TENANT: ContextVar[str] = ContextVar("modelhost_tenant", default="")
# The current request's tenant's weights, (account, key): how a generating engine's counters weigh the
# service it gets (`generation.fairness`)
_WEIGHTS: ContextVar[tuple[float, float]] = ContextVar("modelhost_tenant_weights", default=(1.0, 1.0))
# Whether the current request is a batch line (`modelhost.batches`): replicas give it only the room
# interactive requests leave.
_LOW: ContextVar[bool] = ContextVar("modelhost_low_priority", default=False)


def acting_for(principal: Principal, low: bool = False) -> None:
    account, key = principal.account_id or "", principal.key_id or ""
    _TENANT.set(f"{account}/{key}" if account or key else "")
    _WEIGHTS.set(principal.weights)
    _LOW.set(low)


def current_tenant() -> str:
    return _TENANT.get()


def current_weights() -> tuple[float, float]:
    return _WEIGHTS.get()


def low_priority() -> bool:
    return _LOW.get()
