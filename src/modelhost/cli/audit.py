"""`modelhost audit`: the audit log (docs/operations.md, Audit log): its rows, and the check of its chain."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from modelhost.cli.batches import After, drop_none
from modelhost.cli.client import ApiClient, fail
from modelhost.cli.options import DEFAULT_URL, AccountKey, AdminKey, Json, PageLimit, Url
from modelhost.cli.output import out, show

audit_app = typer.Typer(
    help="The audit log: who changed what (an account key: its account's rows; the admin key: all).",
    no_args_is_help=True,
)
COLUMNS = ("seq", "created_at", "action", "target", "actor", "address", "changes")
Filter = Annotated[str | None, typer.Option(show_default=False)]


@audit_app.command("list")
def audit_list(
    action: Annotated[
        str | None, typer.Option(help="Only this action (key.created, ...).", show_default=False)
    ] = None,
    target_type: Filter = None,
    target_id: Filter = None,
    actor_key: Annotated[
        str | None, typer.Option(help="Only changes made with this key ID.", show_default=False)
    ] = None,
    since: Annotated[str | None, typer.Option(help="ISO 8601: rows at or after.", show_default=False)] = None,
    until: Annotated[str | None, typer.Option(help="ISO 8601: rows before.", show_default=False)] = None,
    after: After = None,
    limit: PageLimit = 20,
    url: Url = DEFAULT_URL,
    key: AccountKey = None,
    admin_key: AdminKey = None,
    as_json: Json = False,
) -> None:
    """List audit rows, newest first (with --admin-key: every account's)."""
    params = drop_none(
        {
            "action": action,
            "target_type": target_type,
            "target_id": target_id,
            "actor_key_id": actor_key,
            "since": since,
            "until": until,
            "after": after,
            "limit": limit,
        }
    )
    data = ApiClient(url, admin_key or key).call("GET", "/v1/audit", params=params)
    if as_json:
        show(data, COLUMNS, True)
        return
    show([_row(item) for item in data["data"]], COLUMNS, False)
    if data.get("has_more"):
        out.print(f"more: --after {data['last_id']}", markup=False, highlight=False)


def _row(item: dict[str, Any]) -> dict[str, Any]:
    actor = item["actor"]
    changes = ", ".join(
        f"{name}: {_short(change.get('before'))} -> {_short(change.get('after'))}"
        for name, change in item["changes"].items()
    )
    return {
        "seq": item["seq"],
        "created_at": item["created_at"],
        "action": item["action"],
        "target": f"{item['target']['type']} {item['target']['id']}",
        "actor": f"{actor['kind']} {actor['key_id'] or ''}".strip(),
        "address": actor["address"],
        "changes": changes or None,
    }


def _short(value: Any) -> str:
    text = "-" if value is None else str(value)
    return text if len(text) <= 60 else text[:57] + "..."


@audit_app.command("verify")
def audit_verify(url: Url = DEFAULT_URL, admin_key: AdminKey = None, as_json: Json = False) -> None:
    """Recompute the audit log's hash chain (admin key); exits 1 naming each edited, deleted or missing
    row. Keep the head hash it prints elsewhere: a rewritten chain no longer ends with it."""
    found = ApiClient(url, admin_key).call("GET", "/v1/admin/audit/verify")
    if as_json:
        show(found, (), True)
    else:
        out.print(
            f"rows checked: {found['rows']} (seq {found['first_seq']}..{found['last_seq']}, pruned through "
            f"{found['pruned_through']}); head hash: {found['head_hash']}",
            markup=False,
            highlight=False,
            soft_wrap=True,
        )
    if not found["ok"]:
        problems = "; ".join(
            f"row {p['seq']}" + (f" ({p['id']})" if p["id"] else "") + f": {p['reason']}"
            for p in found["problems"]
        )
        fail(f"the audit log does not verify: {problems}")
    if not as_json:
        out.print("ok: every row matches its hash and follows the one before", markup=False, highlight=False)
