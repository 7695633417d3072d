"""Weights per role (issue 72; docs/limits.md, "Fair shares"): an account's admins give its roles weights
inside the account; a key's share is its own weight times its role's (its person's role in the account; a
service key's own), a sign-in session's its person's role's; set by who may change the role's people, audited,
and read with every key at once, on SQLite and PostgreSQL."""

from __future__ import annotations

import httpx

from modelhost.container import Services
from tests.helpers import ADMIN_KEY, assert_error, bearer, new_account
from tests.test_quotas import _key_of, _me, _person, _signed_in


async def test_a_keys_share_is_its_own_weight_times_its_roles_and_a_sessions_is_its_roles(
    client: httpx.AsyncClient, services: Services
) -> None:
    account = await new_account(client, "weights")
    owner = account["api_key"]
    operator = await client.patch(
        f"/v1/admin/accounts/{account['id']}", json={"weight": 2}, headers=bearer(ADMIN_KEY)
    )
    assert operator.status_code == 200, operator.text
    dev_id, dev = await _person(client, owner, "dev@example.com", "developer")
    _, admin = await _person(client, owner, "admin@example.com", "admin")
    heavy = await client.post("/v1/keys", json={"user_id": dev_id, "weight": 2}, headers=bearer(owner))
    assert heavy.status_code == 201, heavy.text
    session = _signed_in(services, dev_id, account["id"])
    assert (await _me(client, dev))["weights"] == {"account": 2.0, "key": 1.0}

    patched = await client.patch("/v1/role-weights", json={"developer": 3}, headers=bearer(admin))
    assert patched.status_code == 200, patched.text
    assert patched.json() == {
        "object": "role_weights",
        "owner": 1.0,
        "admin": 1.0,
        "developer": 3.0,
        "viewer": 1.0,
        "billing": 1.0,
    }
    assert (await _me(client, dev))["weights"] == {"account": 2.0, "key": 3.0}  # at once, no key change
    assert (await _me(client, heavy.json()["api_key"]))["weights"]["key"] == 6.0
    assert (await _me(client, session))["weights"]["key"] == 3.0
    assert (await _me(client, owner))["weights"]["key"] == 1.0  # the owner's role keeps 1
    viewer_key = await client.post(
        "/v1/keys", json={"user_id": dev_id, "role": "viewer"}, headers=bearer(owner)
    )
    assert (await _me(client, viewer_key.json()["api_key"]))["weights"]["key"] == 3.0  # its person's role

    assert (await client.get("/v1/role-weights", headers=bearer(dev))).status_code == 403  # users:read
    too_high = await client.patch("/v1/role-weights", json={"owner": 5}, headers=bearer(admin))
    assert_error(too_high, 403, "permission_denied")  # an owner can do more than an admin
    for bad in (0, 1001, "x"):
        assert_error(await client.patch("/v1/role-weights", json={"viewer": bad}, headers=bearer(owner)), 400)
    reset = await client.patch("/v1/role-weights", json={"developer": None}, headers=bearer(owner))
    assert reset.status_code == 200 and reset.json()["developer"] == 1.0, reset.text
    assert (await _me(client, await _key_of(client, owner, dev_id)))["weights"]["key"] == 1.0
    audit = await client.get(
        "/v1/audit", params={"action": "account.role_weights_updated"}, headers=bearer(owner)
    )
    assert audit.status_code == 200, audit.text
    assert len(audit.json()["data"]) == 2
