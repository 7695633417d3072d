"""`modelhost users` (the people of your account and their roles) and `modelhost whoami`
(docs/access.md)."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any
from urllib.parse import quote

import typer

from modelhost.cli.client import ApiClient
from modelhost.cli.options import DEFAULT_URL, AccountKey, Json, Url
from modelhost.cli.output import out, show

users_app = typer.Typer(help="People of your account and their roles (docs/access.md).", no_args_is_help=True)

USER_COLUMNS = ("id", "email", "name", "role", "disabled", "signs_in", "created_at")
INVITATION_COLUMNS = ("id", "email", "role", "created_at", "expires_at")


class RoleChoice(StrEnum):
    """`auth.roles.Role`, as the CLI offers it (the CLI does not import the server's modules)."""

    OWNER = "owner"
    ADMIN = "admin"
    DEVELOPER = "developer"
    VIEWER = "viewer"
    BILLING = "billing"


UserId = Annotated[str, typer.Argument(help="User ID (user_...).")]
RoleOption = Annotated[RoleChoice, typer.Option("--role", help="Their role in the account.")]


def _path(user_id: str) -> str:
    return f"/v1/users/{quote(user_id, safe='')}"


@users_app.command("add")
def users_add(
    email: Annotated[str, typer.Argument(help="Their email (one person, any number of accounts).")],
    role: RoleOption,
    name: Annotated[str | None, typer.Option(help="Their name.")] = None,
    url: Url = DEFAULT_URL,
    key: AccountKey = None,
    as_json: Json = False,
) -> None:
    """Add a person to your account with a role.

    A person without sign-in: the holder of keys you make for them (`keys create --user`). Someone who
    signs in through your identity provider joins by invitation instead (`users invite`)."""
    body: dict[str, Any] = {"email": email, "role": role.value, "name": name}
    show(ApiClient(url, key).call("POST", "/v1/users", json=body), USER_COLUMNS, as_json)


@users_app.command("list")
def users_list(url: Url = DEFAULT_URL, key: AccountKey = None, as_json: Json = False) -> None:
    """List your account's people and their roles."""
    show(ApiClient(url, key).call("GET", "/v1/users"), USER_COLUMNS, as_json)


@users_app.command("role")
def users_role(
    user_id: UserId, role: RoleOption, url: Url = DEFAULT_URL, key: AccountKey = None, as_json: Json = False
) -> None:
    """Change a person's role: their keys follow at once."""
    show(ApiClient(url, key).call("PATCH", _path(user_id), json={"role": role.value}), USER_COLUMNS, as_json)


@users_app.command("disable")
def users_disable(
    user_id: UserId, url: Url = DEFAULT_URL, key: AccountKey = None, as_json: Json = False
) -> None:
    """Disable a person in your account: their keys here are refused (401 user_disabled)."""
    show(ApiClient(url, key).call("PATCH", _path(user_id), json={"disabled": True}), USER_COLUMNS, as_json)


@users_app.command("enable")
def users_enable(
    user_id: UserId, url: Url = DEFAULT_URL, key: AccountKey = None, as_json: Json = False
) -> None:
    """Enable a disabled person again."""
    show(ApiClient(url, key).call("PATCH", _path(user_id), json={"disabled": False}), USER_COLUMNS, as_json)


@users_app.command("remove")
def users_remove(
    user_id: UserId, url: Url = DEFAULT_URL, key: AccountKey = None, as_json: Json = False
) -> None:
    """Remove a person from your account: their keys here stop at once."""
    show(ApiClient(url, key).call("DELETE", _path(user_id)), ("id", "object", "deleted"), as_json)


@users_app.command("invite")
def users_invite(
    email: Annotated[str, typer.Argument(help="Their email, as the identity provider knows it.")],
    role: RoleOption,
    url: Url = DEFAULT_URL,
    key: AccountKey = None,
    as_json: Json = False,
) -> None:
    """Invite an email to your account with a role: offered to whoever signs in with it (verified by the
    identity provider), a member once they accept."""
    body = {"email": email, "role": role.value}
    show(ApiClient(url, key).call("POST", "/v1/invitations", json=body), INVITATION_COLUMNS, as_json)


@users_app.command("invitations")
def users_invitations(url: Url = DEFAULT_URL, key: AccountKey = None, as_json: Json = False) -> None:
    """List your account's invitations not yet accepted."""
    show(ApiClient(url, key).call("GET", "/v1/invitations"), INVITATION_COLUMNS, as_json)


@users_app.command("uninvite")
def users_uninvite(
    invitation_id: Annotated[str, typer.Argument(help="Invitation ID (inv_...).")],
    url: Url = DEFAULT_URL,
    key: AccountKey = None,
    as_json: Json = False,
) -> None:
    """Withdraw an invitation."""
    path = f"/v1/invitations/{quote(invitation_id, safe='')}"
    show(ApiClient(url, key).call("DELETE", path), ("id", "object", "deleted"), as_json)


@users_app.command("sign-out-everywhere")
def users_sign_out_everywhere(
    user_id: UserId, url: Url = DEFAULT_URL, key: AccountKey = None, as_json: Json = False
) -> None:
    """Sign a person out of your account everywhere: their sessions here end, their keys here are revoked."""
    answer = ApiClient(url, key).call("POST", _path(user_id) + "/sign-out-everywhere")
    show(answer, ("id", "sessions_ended", "keys_revoked"), as_json)


def whoami(url: Url = DEFAULT_URL, key: AccountKey = None, as_json: Json = False) -> None:
    """Who your key acts as: account, role, person and what it may do."""
    data = ApiClient(url, key).call("GET", "/v1/me")
    person = data.get("user") or {}
    summary = {
        "account_id": data["account_id"],
        "key_id": data["key_id"],
        "role": data["role"],
        "user": person.get("email") or "(service key)",
    }
    show(data if as_json else summary, tuple(summary), as_json)
    if not as_json:
        out.print("may: " + ", ".join(data["actions"]), markup=False, highlight=False)
        for line in quota_lines(data.get("quota")):
            out.print(line, markup=False, highlight=False)
        weights = data["weights"]
        out.print(
            f"weights: account {weights['account']:g}, key {weights['key']:g}", markup=False, highlight=False
        )


def quota_lines(quota: dict[str, Any] | None) -> list[str]:
    """A person's quota and use as `whoami` prints them (none for a service key)."""
    if quota is None:
        return []
    source = {"person": "their own", "role": "their role's default"}.get(quota["source"], "none")
    lines = [f"quota: {source}"]
    for name, label in (("day", "today"), ("month", "this month")):
        use = quota[name]
        parts = []
        for what in ("requests", "tokens"):
            remaining = use[f"{what}_remaining"]
            limit = "" if remaining is None else f" of {use[what] + remaining} ({remaining} left)"
            parts.append(f"{use[what]} {what}{limit}")
        lines.append(f"{label} ({use['period']}, UTC): " + ", ".join(parts))
    return lines


QUOTA_FIELDS = ("requests_per_day", "requests_per_month", "tokens_per_day", "tokens_per_month")


def _quota_body(
    requests_per_day: int | None,
    requests_per_month: int | None,
    tokens_per_day: int | None,
    tokens_per_month: int | None,
) -> dict[str, int | None] | None:
    """The quota to send: None (removed) when no limit is given."""
    body = {
        "requests_per_day": requests_per_day,
        "requests_per_month": requests_per_month,
        "tokens_per_day": tokens_per_day,
        "tokens_per_month": tokens_per_month,
    }
    return body if any(v is not None for v in body.values()) else None


# The limits of a quota, as both `users quota` and `users role-quota` take them
RequestsPerDay = Annotated[int | None, typer.Option("--requests-per-day", min=1)]
RequestsPerMonth = Annotated[int | None, typer.Option("--requests-per-month", min=1)]
TokensPerDay = Annotated[int | None, typer.Option("--tokens-per-day", min=1)]
TokensPerMonth = Annotated[int | None, typer.Option("--tokens-per-month", min=1)]


@users_app.command("quota")
def users_quota(
    user_id: UserId,
    requests_per_day: RequestsPerDay = None,
    requests_per_month: RequestsPerMonth = None,
    tokens_per_day: TokensPerDay = None,
    tokens_per_month: TokensPerMonth = None,
    url: Url = DEFAULT_URL,
    key: AccountKey = None,
    as_json: Json = False,
) -> None:
    """Set a person's own quota over every key they own and their sessions (the limits not given are
    unlimited); none given: remove it, and their role's default applies (docs/limits.md)."""
    quota = _quota_body(requests_per_day, requests_per_month, tokens_per_day, tokens_per_month)
    answer = ApiClient(url, key).call("PATCH", _path(user_id), json={"quota": quota})
    show(answer, (*USER_COLUMNS, "quota"), as_json)


@users_app.command("role-quota")
def users_role_quota(
    role: Annotated[RoleChoice | None, typer.Argument(help="The role to set; omitted: list them.")] = None,
    requests_per_day: RequestsPerDay = None,
    requests_per_month: RequestsPerMonth = None,
    tokens_per_day: TokensPerDay = None,
    tokens_per_month: TokensPerMonth = None,
    url: Url = DEFAULT_URL,
    key: AccountKey = None,
    as_json: Json = False,
) -> None:
    """Set a role's default quota in your account (no limit given: remove it), or list them; a person's
    own quota replaces their role's (docs/limits.md)."""
    client = ApiClient(url, key)
    if role is None:
        answer = client.call("GET", "/v1/role-quotas")
    else:
        quota = _quota_body(requests_per_day, requests_per_month, tokens_per_day, tokens_per_month)
        answer = client.call("PATCH", "/v1/role-quotas", json={role.value: quota})
    rows = [{"role": r.value, **(answer.get(r.value) or {})} for r in RoleChoice]
    show(answer if as_json else {"data": rows}, ("role", *QUOTA_FIELDS), as_json)


@users_app.command("role-weight")
def users_role_weight(
    role: Annotated[RoleChoice | None, typer.Argument(help="The role to set; omitted: list them.")] = None,
    weight: Annotated[
        float | None, typer.Argument(help="Its weight inside the account (0.01 to 1000; 1: the default).")
    ] = None,
    url: Url = DEFAULT_URL,
    key: AccountKey = None,
    as_json: Json = False,
) -> None:
    """Set a role's weight in your account, or list them: a key's share of a shared model is its own
    weight times its person's role's (docs/limits.md, "Fair shares")."""
    client = ApiClient(url, key)
    if role is None:
        answer = client.call("GET", "/v1/role-weights")
    else:
        answer = client.call("PATCH", "/v1/role-weights", json={role.value: weight})
    rows = [{"role": r.value, "weight": answer[r.value]} for r in RoleChoice]
    show(answer if as_json else {"data": rows}, ("role", "weight"), as_json)
