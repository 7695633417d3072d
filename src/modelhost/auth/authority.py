"""Authority over other principals: the one check made whenever a caller acts on a key, a person or a
membership (docs/security.md, "Authority over principals").

A role's actions say which routes a key may call (`auth.roles`); they do not say whose keys and people
it may change. That is decided here, for every such action, by one rule: **a caller may only act on a
principal that can do no more than the caller can**, and may only hand out a role it could hold itself.
What a principal "can do" is every role the action reaches:

- a key: its own role (for a person's key without one, its owner's role, which is what it then acts
  with) and, unless it is the caller's own, its owner's role in the account: a key acts and is audited
  as its owner, so rotating, changing or revoking a key of an owner, or making one for an owner, is
  acting on the owner (`users:owners`);
- a person (their membership): their role in the account.

Rotating a key copies its role, so it is a grant of that role as much as a new key is: checked the same
way. Whether a caller may *see* a key at all (a developer sees only their own) is `sees_key`: an unseen
key answers 404, a seen one the caller may not act on 403.

The operator (the admin key, the operator's session) stands above accounts, and the server's own calls
(`caller` None: the CLI on the server, sign-in following a person's groups) act with no caller: neither
is checked."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from modelhost.auth.principal import Principal, PrincipalKind
from modelhost.auth.roles import MANAGE_KEYS, Role, may_grant
from modelhost.errors import PermissionDenied


@dataclass(frozen=True, slots=True)
class KeyTarget:
    """What an action on a key reaches: its stored role (None: its owner's), its owner (None: a service
    key) and the owner's role in the account now (None: no owner, or no longer a member)."""

    key_id: str | None
    role: Role | None
    user_id: str | None
    owner_role: Role | None

    def reaches(self, caller: Principal | None) -> tuple[Role, ...]:
        """The roles an action on this key acts with (module docstring)."""
        own_role = self.role or self.owner_role or Role.OWNER
        mine = caller is not None and self.user_id is not None and self.user_id == caller.user_id
        if self.owner_role is None or mine:
            return (own_role,)
        return (own_role, self.owner_role)


def authorize(caller: Principal | None, reaches: Iterable[Role], grants: Role | None = None) -> None:
    """403 unless `caller` can do everything each role in `reaches` can (the target's roles), and
    everything `grants` (a role it hands out) can. The operator and the server itself pass."""
    if caller is None or caller.kind is PrincipalKind.ADMIN:
        return
    for role in reaches:
        if not may_grant(caller.actions, role):
            what = "an owner's" if role is Role.OWNER else f"a principal with the role {role}"
            raise PermissionDenied(
                f"You may not act on {what} keys or membership: it can do more than this key "
                "(docs/access.md)."
            )
    if grants is not None and not may_grant(caller.actions, grants):
        raise PermissionDenied(
            f"You may not give the role {grants}: it can do more than this key (docs/access.md)."
        )


def authorize_key(caller: Principal | None, key: KeyTarget, grants: Role | None = None) -> None:
    """`authorize` over what an action on `key` reaches."""
    authorize(caller, key.reaches(caller), grants)


def authorize_key_setting(caller: Principal | None, field: str) -> None:
    """403 unless `caller` may set or change a key's `field`, one that is the account's decision
    (`keys:manage`), never a key's own: its `cache_salt` (with which keys it shares a deployment's prefix
    cache: joining another key's salt reads what that key's prompts start with) and its `weight` (its
    share of what the account is served: a key raising its own takes its colleagues' share)."""
    if caller is not None and caller.kind is not PrincipalKind.ADMIN and MANAGE_KEYS not in caller.actions:
        raise PermissionDenied(f"Setting a key's {field} needs keys:manage (docs/access.md).")


def sees_key(caller: Principal | None, key: KeyTarget) -> bool:
    """Whether the caller may see `key` (list it, name it): every key of its account with `keys:manage`,
    else a person's own keys, a service key itself. None (the server's own call): every key."""
    if caller is None or caller.kind is PrincipalKind.ADMIN or MANAGE_KEYS in caller.actions:
        return True
    if caller.user_id is not None:
        return key.user_id == caller.user_id
    return key.key_id is not None and key.key_id == caller.key_id
