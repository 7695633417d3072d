"""A tenant's weights for the fair shares of a shared model (issue 72; docs/limits.md, "Fair shares").

Two levels, as `generation.fairness` counts them: the account's weight against other accounts (set by the
operator), and the key's inside its account. The latter is the key's own weight (`keys:manage`) times the
weight the account's admins give a role (`Account.role_weights`): its person's role in the account (whatever
narrower role the key was made with, as a person's quota follows their role), a service key's own role. So an
account can favour its developers' keys over its viewers' without setting every key. A sign-in session has no
key of its own: its person's role's weight alone. Read with the key or session (`auth.authenticator`,
`services.sessions`), so a change reaches every gateway process as a key change does."""

from __future__ import annotations

from collections.abc import Mapping

from modelhost.store.models import Account


def role_weight(role_weights: Mapping[str, float] | None, role: str) -> float:
    """The role's weight in the account: 1 where none is set."""
    return float((role_weights or {}).get(role, 1.0))


def tenant_weights(account: Account | None, role: str, key_weight: float = 1.0) -> tuple[float, float]:
    """(the account's weight, the key's inside it) for a request acting as `role`."""
    if account is None:
        return 1.0, key_weight
    return account.weight, key_weight * role_weight(account.role_weights, role)
