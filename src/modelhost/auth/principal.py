"""Who a request acts as, derived from its bearer key."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class PrincipalKind(StrEnum):
    ADMIN = "admin"
    ACCOUNT = "account"
    DEPLOYMENT = "deployment"


@dataclass(frozen=True, slots=True)
class Principal:
    """An authenticated caller.

    `deployment_ids` is None for account keys (every deployment of the account) and the exact
    scope for deployment keys.
    """

    kind: PrincipalKind
    account_id: str | None = None
    key_id: str | None = None
    deployment_ids: frozenset[str] | None = None

    def covers(self, deployment_id: str) -> bool:
        if self.kind is PrincipalKind.ACCOUNT:
            return True
        if self.kind is PrincipalKind.DEPLOYMENT:
            return self.deployment_ids is not None and deployment_id in self.deployment_ids
        return False


ADMIN = Principal(kind=PrincipalKind.ADMIN)
