"""People, roles and keys bounded by them (issue 60; docs/access.md): the permission table against every
keyed route of the OpenAPI document, a person's keys following their role, no one handing out more than
they hold, audit rows naming the person."""

from __future__ import annotations

import hashlib
import re
import secrets
from pathlib import Path
from typing import Any

import httpx
import pytest

from modelhost.auth.roles import CALL, PERMISSIONS, Role, action_of, table
from modelhost.container import Services
from modelhost.store.models import SsoSession
from modelhost.store.types import new_id, utcnow
from tests.helpers import ADMIN_KEY, assert_error, bearer, new_account, new_deployment

DOCS = Path(__file__).parents[1] / "docs" / "access.md"


async def _person(http: httpx.AsyncClient, owner_key: str, email: str, role: str) -> tuple[str, str]:
    """A person added with `role`, and a key the owner made for them: (user ID, key)."""
    added = await http.post("/v1/users", json={"email": email, "role": role}, headers=bearer(owner_key))
    assert added.status_code == 201, added.text
    user_id = added.json()["id"]
    made = await http.post("/v1/keys", json={"user_id": user_id, "role": role}, headers=bearer(owner_key))
    assert made.status_code == 201, made.text
    assert (made.json()["user_id"], made.json()["role"]) == (user_id, role)
    return user_id, made.json()["api_key"]


def test_the_permission_table_in_the_docs_is_the_codes() -> None:
    assert table() in DOCS.read_text()
    # the table pinned by hand where it matters most
    assert (
        "deployments:write" in PERMISSIONS[Role.DEVELOPER] and "users:read" not in PERMISSIONS[Role.DEVELOPER]
    )
    assert PERMISSIONS[Role.VIEWER] >= {"deployments:read", "artifacts:read"}
    assert "models:call" not in PERMISSIONS[Role.VIEWER] | PERMISSIONS[Role.BILLING]
    assert PERMISSIONS[Role.BILLING] == {"me:read", "usage:read"}
    assert PERMISSIONS[Role.ADMIN] < PERMISSIONS[Role.OWNER]  # only owners make owners


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
async def test_every_keyed_route_refuses_exactly_what_the_role_does_not_give(
    client: httpx.AsyncClient, services: Services
) -> None:
    """Every keyed route of the OpenAPI document × every role's person key, a viewer's sign-in session
    (as a CLI's bearer token and as the console's cookie), a service key, a deployment key and the admin
    key: a 403 where (and only where) the key's role lacks the route's action; the operator's routes
    refuse every other kind with a 401, and the operator's key is refused (401) on an account's routes."""
    account = await new_account(client, "matrix")
    owner_key = account["api_key"]
    keys = {
        role.value: (await _person(client, owner_key, f"{role.value}@example.com", role.value))[1]
        for role in Role
    }
    deployment = await new_deployment(client, services, account, "matrix-model")
    viewer_id = (await client.get("/v1/me", headers=bearer(keys["viewer"]))).json()["user"]["id"]
    scoped = {"deployments": [deployment["id"]], "user_id": viewer_id}  # a viewer's: calls nothing
    viewer_scoped = (await client.post("/v1/keys", json=scoped, headers=bearer(owner_key))).json()
    assert viewer_scoped["role"] == "owner"  # the owner made it: the owner's role, bounded by the viewer's
    session = _signed_in(services, viewer_id, account["id"])
    as_viewer_session = {
        "bearer session": bearer(session),
        "cookie session": {"cookie": f"modelhost_session={session}", "x-csrf-token": CSRF},
    }
    document = (await client.get("/openapi.json")).json()
    keyed = [
        (method.upper(), path)
        for path, item in document["paths"].items()
        for method, operation in item.items()
        if operation.get("security")
    ]
    assert len(keyed) > 90
    unexpected: list[tuple[str, str, str, int]] = []
    for method, path in keyed:
        concrete = re.sub(r"\{[^}]+\}", "x", path)
        operators = path.startswith("/v1/admin")
        action = action_of(method, path)
        for role, key in keys.items():
            answer = await client.request(method, concrete, headers=bearer(key))
            if operators:
                if answer.status_code != 401:
                    unexpected.append((method, path, role, answer.status_code))
                continue
            refused = answer.status_code == 403
            if refused != (action not in PERMISSIONS[Role(role)]):
                unexpected.append((method, path, role, answer.status_code))
            if refused and path.startswith("/v1/messages"):  # Anthropic's error shape
                assert answer.json()["error"]["type"] == "permission_error", answer.text
            elif refused:
                assert_error(answer, 403, "permission_denied", "permission_error")
        for name, headers in as_viewer_session.items():
            status = (await client.request(method, concrete, headers=headers)).status_code
            if operators:
                fits = status == 401
            elif action not in PERMISSIONS[Role.VIEWER]:
                fits = status == 403
            else:
                fits = status not in (401, 403)
            if not fits:
                unexpected.append((method, path, name, status))
        for name, key in (("service", owner_key), ("admin", ADMIN_KEY)):
            answer = await client.request(method, concrete, headers=bearer(key))
            if answer.status_code == 403 or (operators and name == "service" and answer.status_code != 401):
                unexpected.append((method, path, name, answer.status_code))
        if action == CALL and not operators:  # a deployment key's routes: refused by its owner's role
            answer = await client.request(method, concrete, headers=bearer(viewer_scoped["api_key"]))
            if answer.status_code != 403:
                unexpected.append((method, path, "viewer's deployment key", answer.status_code))
    assert unexpected == []


CSRF = "c" * 43


def _signed_in(services: Services, user_id: str, account_id: str) -> str:
    """A sign-in session of the person in the account, as the identity provider's callback opens one
    (the sign-in itself: tests/test_sso.py): its secret."""
    secret = "mhs-" + secrets.token_urlsafe(32)
    with services.database.transaction() as session:
        session.add(
            SsoSession(
                id=new_id("ses"),
                secret_hash=hashlib.sha256(secret.encode()).hexdigest(),
                user_id=user_id,
                account_id=account_id,
                operator=False,
                csrf_token=CSRF,
                id_token="-",
                created_at=utcnow(),
                last_seen_at=utcnow(),
            )
        )
    return secret


async def test_a_persons_keys_follow_their_role_and_stop_when_disabled_or_removed(
    client: httpx.AsyncClient, services: Services
) -> None:
    account = await new_account(client, "people")
    owner = bearer(account["api_key"])
    alice, alice_key = await _person(client, account["api_key"], "Alice@Example.com", "developer")
    as_alice = bearer(alice_key)
    me = (await client.get("/v1/me", headers=as_alice)).json()
    assert (me["role"], me["user"]["email"], me["user"]["id"]) == ("developer", "alice@example.com", alice)
    assert (await client.get("/v1/models", headers=as_alice)).status_code == 200
    assert_error(await client.get("/v1/users", headers=as_alice), 403, "permission_denied")

    # demoted to viewer: her key (made as a developer's) does what a viewer may, at once
    demoted = await client.patch(f"/v1/users/{alice}", json={"role": "viewer"}, headers=owner)
    assert demoted.json()["role"] == "viewer"
    assert_error(await client.get("/v1/models", headers=as_alice), 403, "permission_denied")
    assert (await client.get("/v1/deployments", headers=as_alice)).status_code == 200

    await client.patch(f"/v1/users/{alice}", json={"role": "developer", "disabled": True}, headers=owner)
    assert_error(await client.get("/v1/deployments", headers=as_alice), 401, "user_disabled")
    await client.patch(f"/v1/users/{alice}", json={"disabled": False}, headers=owner)
    assert (await client.get("/v1/models", headers=as_alice)).status_code == 200

    assert (await client.delete(f"/v1/users/{alice}", headers=owner)).status_code == 200
    assert_error(await client.get("/v1/deployments", headers=as_alice), 401, "not_a_member")
    assert_error(await client.get(f"/v1/users/{alice}", headers=owner), 404, "user_not_found")

    # one person, several accounts: a role in each
    other = await new_account(client, "other")
    again = await client.post(
        "/v1/users", json={"email": "alice@example.com", "role": "billing"}, headers=bearer(other["api_key"])
    )
    assert (again.json()["id"], again.json()["role"]) == (alice, "billing")
    duplicate = await client.post(
        "/v1/users", json={"email": "ALICE@example.com", "role": "viewer"}, headers=bearer(other["api_key"])
    )
    assert_error(duplicate, 409, "member_exists")


async def test_no_one_hands_out_more_than_they_hold(client: httpx.AsyncClient, services: Services) -> None:
    account = await new_account(client, "bounds")
    owner_key = account["api_key"]
    _, admin_key = await _person(client, owner_key, "admin@example.com", "admin")
    dev_id, dev_key = await _person(client, owner_key, "dev@example.com", "developer")
    boss_id, _ = await _person(client, owner_key, "boss@example.com", "owner")
    as_admin, as_dev = bearer(admin_key), bearer(dev_key)

    # admins manage people, but make or change no owner
    owner_invite = {"email": "new@example.com", "role": "owner"}
    assert_error(
        await client.post("/v1/users", json=owner_invite, headers=as_admin), 403, "permission_denied"
    )
    demote = await client.patch(f"/v1/users/{boss_id}", json={"role": "viewer"}, headers=as_admin)
    assert_error(demote, 403, "permission_denied")
    assert (
        await client.patch(f"/v1/users/{dev_id}", json={"role": "viewer"}, headers=as_admin)
    ).status_code == 200
    await client.patch(f"/v1/users/{dev_id}", json={"role": "developer"}, headers=as_admin)

    # a developer makes keys for themselves only, never above their role
    own = await client.post("/v1/keys", json={"name": "mine"}, headers=as_dev)
    assert (own.status_code, own.json()["user_id"], own.json()["role"]) == (201, dev_id, "developer")
    for body in ({"service": True}, {"user_id": boss_id}, {"role": "admin"}):
        assert_error(await client.post("/v1/keys", json=body, headers=as_dev), 403, "permission_denied")
    listed = (await client.get("/v1/keys", headers=as_dev)).json()["data"]
    assert {k["user_id"] for k in listed} == {dev_id} and len(listed) == 2
    service_key_id = (await client.get("/v1/keys", headers=bearer(owner_key))).json()["data"][0]["id"]
    assert_error(await client.delete(f"/v1/keys/{service_key_id}", headers=as_dev), 404, "key_not_found")

    # an admin's service key carries the admin's role, not the owner's
    service = await client.post("/v1/keys", json={"service": True}, headers=as_admin)
    assert (service.json()["user_id"], service.json()["role"]) == (None, "admin")
    me = (await client.get("/v1/me", headers=bearer(service.json()["api_key"]))).json()
    assert me["user"] is None and "users:owners" not in me["actions"]


async def test_audit_rows_name_the_person_and_people_changes_are_audited(
    client: httpx.AsyncClient, services: Services
) -> None:
    account = await new_account(client, "audited")
    owner = bearer(account["api_key"])
    carol, carol_key = await _person(client, account["api_key"], "carol@example.com", "developer")
    made = await client.post("/v1/keys", json={"name": "carols"}, headers=bearer(carol_key))
    await client.patch(f"/v1/users/{carol}", json={"role": "viewer"}, headers=owner)
    rows = (await client.get("/v1/audit", headers=owner)).json()["data"]
    by_action: dict[str, dict[str, Any]] = {}
    for row in rows:
        by_action.setdefault(row["action"], row)  # newest first
    key_row = next(r for r in rows if r["target"]["id"] == made.json()["id"])
    assert (key_row["actor"]["user_id"], key_row["actor"]["email"]) == (carol, "carol@example.com")
    assert by_action["user.added"]["target"] == {"type": "user", "id": carol}
    assert by_action["user.updated"]["changes"] == {"role": {"before": "developer", "after": "viewer"}}
    assert by_action["user.updated"]["actor"]["user_id"] is None  # the owner's service key: no person
    verified = (await client.get("/v1/admin/audit/verify", headers=bearer(ADMIN_KEY))).json()
    assert verified["ok"] is True, verified
