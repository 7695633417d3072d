"""Authority over other principals (issue 70, S1; docs/security.md, "Authority over principals"): one
check, `auth.authority`, whenever a caller acts on a key, a person or a membership: no one acts on a
principal that can do more than they can, nor hands out such a role. The last test is generated over
the OpenAPI document: every route that acts on a key or a person (by its path's `{key_id}` / `{user_id}`,
or a body naming a `user_id` or a `role`) refuses an admin acting on an owner."""

from __future__ import annotations

import re
from typing import Any

import httpx
import pytest

from tests.helpers import assert_error, bearer, new_account

pytestmark = pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)


async def _person(http: httpx.AsyncClient, owner_key: str, email: str, role: str) -> tuple[str, str]:
    """A person added with `role`, and a key of their own made by the owner: (user ID, key)."""
    added = await http.post("/v1/users", json={"email": email, "role": role}, headers=bearer(owner_key))
    assert added.status_code == 201, added.text
    made = await http.post(
        "/v1/keys", json={"user_id": added.json()["id"], "role": role}, headers=bearer(owner_key)
    )
    assert made.status_code == 201, made.text
    return added.json()["id"], made.json()["api_key"]


async def _world(http: httpx.AsyncClient, name: str) -> dict[str, Any]:
    """An account whose first key (an owner service key) made an owner person, an admin person and a
    developer person, each with a key of their own."""
    account = await new_account(http, name)
    first = account["api_key"]
    world: dict[str, Any] = {"account": account, "first": first}
    for role in ("owner", "admin", "developer"):
        world[f"{role}_id"], world[f"{role}_key"] = await _person(http, first, f"{role}@{name}.test", role)
    listed = (await http.get("/v1/keys", headers=bearer(first))).json()["data"]
    world["first_id"] = next(k["id"] for k in listed if k["user_id"] is None)
    world["owner_key_id"] = next(k["id"] for k in listed if k["user_id"] == world["owner_id"])
    world["developer_key_id"] = next(k["id"] for k in listed if k["user_id"] == world["developer_id"])
    return world


async def test_an_admin_cannot_rotate_the_accounts_owner_key_into_an_owner_key_of_their_own(
    client: httpx.AsyncClient,
) -> None:
    """S1 as the review did it: the admin rotated the account's first key (an owner service key) and got
    an owner key (201), then made themselves owner with it. Now the rotation is refused, and the old key
    keeps working."""
    world = await _world(client, "rotate")
    admin = bearer(world["admin_key"])
    rotated = await client.post(f"/v1/keys/{world['first_id']}/rotate", json={}, headers=admin)
    assert_error(rotated, 403, "permission_denied", "permission_error")
    promoted = await client.patch(f"/v1/users/{world['admin_id']}", json={"role": "owner"}, headers=admin)
    assert_error(promoted, 403, "permission_denied", "permission_error")
    assert (await client.get("/v1/me", headers=bearer(world["first"]))).status_code == 200


async def test_an_admin_cannot_make_change_or_revoke_an_owners_keys(client: httpx.AsyncClient) -> None:
    """A key acts, and is audited, as its owner: making one for an owner, renaming or limiting an owner's
    key or revoking it is acting on the owner (`users:owners`), whatever role the key itself has."""
    world = await _world(client, "owners")
    admin = bearer(world["admin_key"])
    for body in ({"user_id": world["owner_id"]}, {"user_id": world["owner_id"], "role": "viewer"}):
        made = await client.post("/v1/keys", json=body, headers=admin)
        assert_error(made, 403, "permission_denied", "permission_error")
    key = world["owner_key_id"]
    changed = await client.patch(
        f"/v1/keys/{key}", json={"limits": {"requests_per_minute": 1}}, headers=admin
    )
    assert_error(changed, 403, "permission_denied", "permission_error")
    assert_error(await client.delete(f"/v1/keys/{key}", headers=admin), 403, "permission_denied")
    assert (await client.get("/v1/me", headers=bearer(world["owner_key"]))).status_code == 200
    assert_error(
        await client.delete(f"/v1/users/{world['owner_id']}", headers=admin), 403, "permission_denied"
    )


async def test_an_admin_still_manages_developers_and_an_owner_manages_everyone(
    client: httpx.AsyncClient,
) -> None:
    """The controls: the same actions on someone who can do no more than the caller are allowed."""
    world = await _world(client, "controls")
    admin, owner = bearer(world["admin_key"]), bearer(world["owner_key"])
    made = await client.post("/v1/keys", json={"user_id": world["developer_id"]}, headers=admin)
    assert made.status_code == 201, made.text
    assert made.json()["role"] == "admin"  # the creator's role, bounded by the developer's at each call
    rotated = await client.post(f"/v1/keys/{world['developer_key_id']}/rotate", json={}, headers=admin)
    assert rotated.status_code == 201, rotated.text
    assert (
        await client.post(f"/v1/keys/{world['first_id']}/rotate", json={}, headers=owner)
    ).status_code == 201
    demoted = await client.patch(f"/v1/users/{world['admin_id']}", json={"role": "developer"}, headers=owner)
    assert demoted.status_code == 200, demoted.text


async def test_a_developer_sees_only_their_own_keys_and_cannot_rotate_anothers(
    client: httpx.AsyncClient,
) -> None:
    world = await _world(client, "devs")
    developer = bearer(world["developer_key"])
    other = await client.post(f"/v1/keys/{world['owner_key_id']}/rotate", json={}, headers=developer)
    assert_error(other, 404, "key_not_found")
    own = await client.post(f"/v1/keys/{world['developer_key_id']}/rotate", json={}, headers=developer)
    assert own.status_code == 201, own.text


def _filled(schema: dict[str, Any], components: dict[str, Any]) -> dict[str, Any]:
    """A body holding each required property of `schema` with a plain value of its type."""
    while "$ref" in schema:
        schema = components[schema["$ref"].rsplit("/", 1)[1]]
    body: dict[str, Any] = {}
    for name in schema.get("required", []):
        kind = schema.get("properties", {}).get(name, {}).get("type", "string")
        plain = {"string": "someone@example.com" if name == "email" else "x", "integer": 1, "boolean": False}
        body[name] = plain.get(kind, [] if kind == "array" else {})
    return body


def _body_schema(operation: dict[str, Any], components: dict[str, Any]) -> dict[str, Any]:
    content = operation.get("requestBody", {}).get("content", {}).get("application/json", {})
    schema: dict[str, Any] = content.get("schema", {})
    for option in schema.get("anyOf", [schema]):  # an optional body: its model or null
        while "$ref" in option:
            option = components[option["$ref"].rsplit("/", 1)[1]]
        if option.get("properties"):
            return option
    return schema


async def test_every_route_that_acts_on_a_key_or_a_person_refuses_an_admin_acting_on_an_owner(
    client: httpx.AsyncClient,
) -> None:
    """Generated over the OpenAPI document, so a route added later is covered: every state-changing
    route with a `{key_id}` or `{user_id}` in its path, called by an admin on the owner's key or on the
    owner, and every one whose body takes a `user_id` (the owner's) or a `role` (`owner`), answers 403."""
    world = await _world(client, "generated")
    admin = bearer(world["admin_key"])
    document = (await client.get("/openapi.json")).json()
    components = document["components"]["schemas"]
    targets = {"key_id": world["owner_key_id"], "user_id": world["owner_id"]}
    tried: list[str] = []
    allowed: list[tuple[str, str, str, int]] = []
    for path, item in document["paths"].items():
        for method, operation in item.items():
            if method in ("get", "head") or not operation.get("security"):
                continue
            names = set(re.findall(r"\{(\w+)\}", path))
            properties = _body_schema(operation, components).get("properties", {})
            cases: list[tuple[str, dict[str, Any]]] = []
            if names & targets.keys():
                cases.append(("path", _filled(_body_schema(operation, components), components)))
            for field, value in (("user_id", world["owner_id"]), ("role", "owner")):
                if field in properties and not names:
                    cases.append(
                        (field, {**_filled(_body_schema(operation, components), components), field: value})
                    )
            concrete = re.sub(r"\{(\w+)\}", lambda m: targets.get(m.group(1), "x"), path)
            for case, body in cases:
                tried.append(f"{method.upper()} {path} ({case})")
                answer = await client.request(method.upper(), concrete, json=body, headers=admin)
                if answer.status_code != 403:
                    allowed.append((method.upper(), path, case, answer.status_code))
    assert len(tried) >= 7, tried  # keys: create ×2, rotate, patch, revoke; users: add, patch, remove
    assert allowed == []
