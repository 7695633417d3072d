"""Roles and what they may do: the one permission table of the service (docs/access.md shows it).

Every route that takes an account's or a deployment's key names one **action**: the resource its path
starts with (`RESOURCES`) and `read` for `GET`, `write` for any other method; every other keyed route
(inference: chat, completions, embeddings, files, batches, media...) is `models:call`. A role is a set of
actions (`PERMISSIONS`). A key acts with the actions its role gives (a service key's own role, `owner`
for the keys made before roles existed) and, where a person owns it, only those its owner's role in the
account still gives at the time of the call: demoting or removing a person bounds their keys at once.

Two actions are not routes: `keys:manage` (keys of other people and service keys: listing them all,
making, rotating, changing or revoking them) and `users:owners` (making someone an owner, or changing an
owner): the services check them on top of the route's own action.

The operator (the admin key) stands above accounts: it alone calls `/v1/admin/*` and reads every audit
row; it is not a role."""

from __future__ import annotations

from enum import StrEnum


class Role(StrEnum):
    OWNER = "owner"
    ADMIN = "admin"
    DEVELOPER = "developer"
    VIEWER = "viewer"
    BILLING = "billing"


# (path prefix, resource): a route under the prefix reads or writes the resource
RESOURCES: tuple[tuple[str, str], ...] = (
    ("/v1/model-artifacts", "artifacts"),
    ("/v1/deployments", "deployments"),
    ("/v1/agent", "agents"),
    ("/v1/keys", "keys"),
    ("/v1/users", "users"),
    ("/v1/invitations", "users"),  # an account's invitations are its people's business
    ("/v1/role-quotas", "users"),  # so are the default quotas of its roles' people
    ("/v1/role-weights", "users"),  # and its roles' weights
    ("/v1/usage", "usage"),
    ("/v1/audit", "audit"),
    ("/v1/me", "me"),
    ("/v1/mcp-servers", "mcp_servers"),
)
CALL = "models:call"  # every other keyed route: the inference API families
MANAGE_KEYS = "keys:manage"
MANAGE_OWNERS = "users:owners"

_READ_WRITE = ("artifacts", "deployments", "agents", "keys")
PERMISSIONS: dict[Role, frozenset[str]] = {
    Role.OWNER: frozenset(
        [CALL, "me:read", "usage:read", "audit:read", "users:read", "users:write", MANAGE_KEYS, MANAGE_OWNERS]
        + ["mcp_servers:read", "mcp_servers:write"]
        + [f"{resource}:{verb}" for resource in _READ_WRITE for verb in ("read", "write")]
    ),
    Role.DEVELOPER: frozenset(
        [CALL, "me:read"] + [f"{resource}:{verb}" for resource in _READ_WRITE for verb in ("read", "write")]
    ),
    Role.VIEWER: frozenset(["me:read", "artifacts:read", "deployments:read", "agents:read"]),
    Role.BILLING: frozenset(["me:read", "usage:read"]),
}
PERMISSIONS[Role.ADMIN] = PERMISSIONS[Role.OWNER] - {MANAGE_OWNERS}
ACTIONS: tuple[str, ...] = tuple(sorted(PERMISSIONS[Role.OWNER]))


# Every prefix is two segments: a path's first two find its resource in one lookup (every keyed request
# asks), as `path == prefix or path.startswith(prefix + "/")` would
_ACTIONS_BY_PREFIX: dict[str, tuple[str, str]] = {
    prefix: (f"{resource}:read", f"{resource}:write") for prefix, resource in RESOURCES
}
assert all(prefix.count("/") == 2 for prefix in _ACTIONS_BY_PREFIX)


def action_of(method: str, path: str) -> str:
    """The action a keyed route (its path template, e.g. `/v1/deployments/{deployment_id}`) needs."""
    end = path.find("/", path.find("/", 1) + 1)
    actions = _ACTIONS_BY_PREFIX.get(path if end < 0 else path[:end])
    if actions is None:
        return CALL
    return actions[0] if method in ("GET", "HEAD") else actions[1]


def allowed(key_role: Role, owner_role: Role | None) -> frozenset[str]:
    """What a key may do: its own role's actions, and of those only what its owner's role in the account
    gives now (`owner_role`; None for a service key, which no person owns)."""
    actions = PERMISSIONS[key_role]
    return actions if owner_role is None else actions & PERMISSIONS[owner_role]


def may_grant(granter: frozenset[str], role: Role) -> bool:
    """Whether a caller with these actions may give `role` (to a key or a person): only a role that can do
    no more than the caller can."""
    return PERMISSIONS[role] <= granter


def table() -> str:
    """The permission table as docs/access.md shows it (a test keeps the two equal)."""
    roles = list(Role)
    lines = ["| action | " + " | ".join(r.value for r in roles) + " |", "|---" * (len(roles) + 1) + "|"]
    for action in ACTIONS:
        marks = ["yes" if action in PERMISSIONS[r] else "-" for r in roles]
        lines.append(f"| `{action}` | " + " | ".join(marks) + " |")
    return "\n".join(lines)
