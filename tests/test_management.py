"""Accounts, keys and deployments exactly as shared/spec/management.md describes them."""

from __future__ import annotations

import asyncio
import json
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from typing import Any

import httpx
import pytest
from sqlalchemy import delete, update

from modelhost.audit import AuditLog
from modelhost.auth.secrets import hash_secret
from modelhost.container import Services
from modelhost.generation.deployment_settings import GenerationSettings
from modelhost.generation.fairness import TokenWeights
from modelhost.store.models import AuditRow, Deployment, ModelArtifact
from tests.helpers import ADMIN_KEY, assert_error, bearer, new_account, new_deployment, ready_artifact

ADMIN = bearer(ADMIN_KEY)
# Tests of logic that is the same on both databases run on SQLite only (the CI budget)
SQLITE_ONLY = pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)


async def test_create_account_returns_its_key_once(client: httpx.AsyncClient) -> None:
    account = await new_account(client, "acme", credits=12.5)
    fields = {
        "id",
        "name",
        "credits",
        "credits_granted",
        "credits_used",
        "limits",
        "weight",
        "created_at",
        "api_key",
    }
    assert set(account) == fields
    assert account["id"].startswith("acct_") and account["api_key"].startswith("mh-")
    assert account["credits"] == 12.5
    assert datetime.fromisoformat(account["created_at"]).utcoffset() is not None
    listed = (await client.get("/v1/admin/accounts", headers=ADMIN)).json()
    assert listed["object"] == "list"
    assert [a["id"] for a in listed["data"]] == [account["id"]]
    assert "api_key" not in listed["data"][0]


async def test_top_up_adds_credits_and_negative_corrects(client: httpx.AsyncClient) -> None:
    account = await new_account(client, credits=10)
    path = f"/v1/admin/accounts/{account['id']}/credits"
    assert (await client.post(path, json={"credits": 5.25}, headers=ADMIN)).json()["credits"] == 15.25
    assert (await client.post(path, json={"credits": -3}, headers=ADMIN)).json()["credits"] == 12.25


async def test_top_up_of_unknown_account_is_404(client: httpx.AsyncClient) -> None:
    response = await client.post("/v1/admin/accounts/acct_nope/credits", json={"credits": 1}, headers=ADMIN)
    assert_error(response, 404, "account_not_found")


async def test_account_create_validates_its_body(client: httpx.AsyncClient) -> None:
    assert (
        assert_error(await client.post("/v1/admin/accounts", json={}, headers=ADMIN), 400)["param"] == "name"
    )
    bad = await client.post("/v1/admin/accounts", json={"name": "x", "credits": -1}, headers=ADMIN)
    assert assert_error(bad, 400, "invalid_request")["param"] == "credits"


async def test_weights_are_stored_on_accounts_and_keys_and_a_keys_principal_carries_both(
    client: httpx.AsyncClient, services: Services
) -> None:
    """Issue 72 (docs/limits.md, "Fair shares"), on SQLite and PostgreSQL: the account's weight and the
    key's, as stored, are what the key's requests carry to the engines."""
    account = await new_account(client, "weighed")
    assert account["weight"] == 1.0
    patched = await client.patch(f"/v1/admin/accounts/{account['id']}", json={"weight": 2.5}, headers=ADMIN)
    assert patched.status_code == 200 and patched.json()["weight"] == 2.5, patched.text
    made = await client.post("/v1/keys", json={"weight": 0.5}, headers=bearer(account["api_key"]))
    assert made.status_code == 201 and made.json()["weight"] == 0.5, made.text
    principal = services.authenticator.load(made.json()["api_key"])
    assert principal is not None and principal.weights == (2.5, 0.5)
    listed = (await client.get("/v1/keys", headers=bearer(account["api_key"]))).json()["data"]
    assert sorted(k["weight"] for k in listed) == [0.5, 1.0]
    reset = await client.patch(
        f"/v1/keys/{made.json()['id']}", json={"weight": None}, headers=bearer(account["api_key"])
    )
    assert reset.status_code == 200 and reset.json()["weight"] == 1.0, reset.text


async def test_keys_create_account_and_deployment_keys(client: httpx.AsyncClient, services: Services) -> None:
    account = await new_account(client)
    owner = bearer(account["api_key"])
    dep = await new_deployment(client, services, account, "m1")
    plain = (await client.post("/v1/keys", json={"name": "ci"}, headers=owner)).json()
    scoped = (await client.post("/v1/keys", json={"deployments": [dep["id"]]}, headers=owner)).json()
    assert plain["kind"] == "account" and plain["deployments"] is None and plain["name"] == "ci"
    assert scoped["kind"] == "deployment" and scoped["deployments"] == [dep["id"]]
    assert plain["api_key"].startswith(plain["prefix"])
    listed = (await client.get("/v1/keys", headers=owner)).json()["data"]
    assert {k["id"] for k in listed} >= {plain["id"], scoped["id"]}
    assert all("api_key" not in k for k in listed)


async def test_key_scoped_to_unknown_or_foreign_deployment_is_refused(
    client: httpx.AsyncClient, services: Services
) -> None:
    a = await new_account(client, "a")
    b = await new_account(client, "b")
    foreign = await new_deployment(client, services, b, "theirs")
    for deployments in (["dep_nope"], [foreign["id"]]):
        response = await client.post(
            "/v1/keys", json={"deployments": deployments}, headers=bearer(a["api_key"])
        )
        assert assert_error(response, 400, "invalid_request")["param"] == "deployments"
    empty = await client.post("/v1/keys", json={"deployments": []}, headers=bearer(a["api_key"]))
    assert assert_error(empty, 400)["param"] == "deployments"


async def test_deployment_record_has_the_contract_fields(
    client: httpx.AsyncClient, services: Services
) -> None:
    account = await new_account(client)
    dep = await new_deployment(client, services, account, "org/emb", readiness="warm")
    for field in (
        "id",
        "model",
        "artifact_id",
        "pipeline",
        "readiness",
        "state",
        "replicas",
        "memory_gb",
        "created_at",
    ):
        assert field in dep
    assert (
        dep["model"] == "org/emb" and dep["pipeline"] == "feature-extraction" and dep["readiness"] == "warm"
    )
    assert dep["state"] in {"unloaded", "loading", "ready", "failed"}


async def test_deployment_defaults_to_cold(client: httpx.AsyncClient, services: Services) -> None:
    account = await new_account(client)
    assert (await new_deployment(client, services, account, "m"))["readiness"] == "cold"


async def test_deployment_needs_a_ready_artifact_of_the_account(
    client: httpx.AsyncClient, services: Services
) -> None:
    a = await new_account(client, "a")
    b = await new_account(client, "b")
    owner = bearer(a["api_key"])
    foreign = ready_artifact(services, b["id"])
    response = await client.post(
        "/v1/deployments", json={"model": "m", "artifact_id": foreign}, headers=owner
    )
    assert_error(response, 404, "artifact_not_found")
    with services.database.transaction() as session:
        art = ModelArtifact(
            id="art_failed", account_id=a["id"], display_name="x", pipeline="fill-mask", status="failed"
        )
        session.add(art)
    response = await client.post(
        "/v1/deployments", json={"model": "m", "artifact_id": "art_failed"}, headers=owner
    )
    assert_error(response, 409, "artifact_not_ready")


async def test_model_id_is_unique_within_an_account_only(
    client: httpx.AsyncClient, services: Services
) -> None:
    a = await new_account(client, "a")
    b = await new_account(client, "b")
    await new_deployment(client, services, a, "same")
    await new_deployment(client, services, b, "same")
    again = await client.post(
        "/v1/deployments",
        json={"model": "same", "artifact_id": ready_artifact(services, a["id"])},
        headers=bearer(a["api_key"]),
    )
    assert_error(again, 409, "model_exists")


async def test_deployment_body_is_validated(client: httpx.AsyncClient, services: Services) -> None:
    account = await new_account(client)
    owner = bearer(account["api_key"])
    art = ready_artifact(services, account["id"])
    cases = [
        ({"model": "m", "artifact_id": art, "readiness": "lukewarm"}, "readiness"),
        ({"model": "bad id!", "artifact_id": art}, "model"),
        ({"model": "m", "artifact_id": art, "min_replicas": 3, "max_replicas": 1}, None),
        ({"model": "m", "artifact_id": art, "surprise": 1}, "surprise"),
        ({"artifact_id": art}, "model"),
    ]
    for body, param in cases:
        error = assert_error(
            await client.post("/v1/deployments", json=body, headers=owner), 400, "invalid_request"
        )
        if param:
            assert error["param"] == param


async def test_patch_changes_readiness_and_replicas(client: httpx.AsyncClient, services: Services) -> None:
    account = await new_account(client)
    owner = bearer(account["api_key"])
    dep = await new_deployment(client, services, account, "m")
    path = f"/v1/deployments/{dep['id']}"
    patched = (await client.patch(path, json={"readiness": "hot", "max_replicas": 3}, headers=owner)).json()
    assert (patched["readiness"], patched["max_replicas"]) == ("hot", 3)
    assert (await client.get(path, headers=owner)).json()["readiness"] == "hot"
    bad = await client.patch(path, json={"min_replicas": 5}, headers=owner)
    assert assert_error(bad, 400, "invalid_request")["param"] == "min_replicas"


async def test_generation_settings_are_checked_shown_and_patched_field_by_field(
    client: httpx.AsyncClient, services: Services
) -> None:
    account = await new_account(client)
    owner = bearer(account["api_key"])
    template = "{% for m in messages %}{{ m.content }}{% generation %}x{% endgeneration %}{% endfor %}"
    settings = {"max_model_len": 512, "chat_template": template, "chat_template_kwargs": {"a": 1}}
    dep = await new_deployment(client, services, account, "gen", "text-generation", **settings)
    assert {name: dep[name] for name in settings} == settings
    assert (dep["tool_parser"], dep["reasoning_parser"]) == (None, None)  # detected by the replica
    path = f"/v1/deployments/{dep['id']}"
    patched = await client.patch(
        path, json={"tool_parser": "mistral", "reasoning_parser": "none"}, headers=owner
    )
    assert (patched.json()["tool_parser"], patched.json()["reasoning_parser"]) == ("mistral", "none")
    assert patched.json()["chat_template"] == template  # the fields not given stay
    cleared = (
        await client.patch(path, json={"chat_template": None, "max_model_len": None}, headers=owner)
    ).json()
    assert (cleared["chat_template"], cleared["max_model_len"], cleared["tool_parser"]) == (
        None,
        None,
        "mistral",
    )
    weighed = await client.patch(path, json={"fair_token_weights": {"output": 4}}, headers=owner)
    assert weighed.json()["fair_token_weights"] == {"prompt": 1.0, "output": 4.0}, weighed.text
    stored = GenerationSettings.of(services.deployments.get(account["id"], dep["id"]).generation_settings)
    assert stored.token_weights() == TokenWeights(prompt=1.0, output=4.0)  # what its replicas count with
    refused = [
        ({"chat_template": "{% for m in messages %}"}, "chat_template", "line 1"),
        ({"chat_template": "x" * 32_769}, "chat_template", "32768"),
        (
            {"chat_template": "{{" + "(" * 5000 + "1" + ")" * 5000 + "}}"},
            "chat_template",
            "nested too deeply",
        ),
        ({"chat_template": "{{ messages | nofilter }}"}, "chat_template", "No filter named 'nofilter'"),
        ({"tool_parser": "hermes2"}, "tool_parser", "llama3_json"),
        ({"reasoning_parser": "think"}, "reasoning_parser", "none"),
        ({"max_model_len": 8}, "max_model_len", "16"),
        ({"chat_template_kwargs": {"messages": []}}, "chat_template_kwargs", "messages"),
        ({"fair_token_weights": {"output": -1}}, "fair_token_weights.output", "greater than or equal"),
        ({"fair_token_weights": {"input": 1}}, "fair_token_weights.input", "Extra inputs"),
    ]
    for body, param, says in refused:
        error = assert_error(await client.patch(path, json=body, headers=owner), 400, param=param)
        assert says in error["message"], error
        created = await client.post(
            "/v1/deployments",
            json={
                "model": "other",
                "artifact_id": ready_artifact(services, account["id"], "text-generation"),
                **body,
            },
            headers=owner,
        )
        assert_error(created, 400, param=param)
    embeddings = await new_deployment(client, services, account, "emb")
    not_generation = await client.patch(
        f"/v1/deployments/{embeddings['id']}", json={"max_model_len": 64}, headers=owner
    )
    assert "text-generation" in assert_error(not_generation, 400, param="max_model_len")["message"]
    assert (await client.get(path, headers=owner)).json()[
        "tool_parser"
    ] == "mistral"  # refusals changed nothing


async def test_delete_deployment_then_it_is_gone(client: httpx.AsyncClient, services: Services) -> None:
    account = await new_account(client)
    owner = bearer(account["api_key"])
    dep = await new_deployment(client, services, account, "m")
    deleted = (await client.delete(f"/v1/deployments/{dep['id']}", headers=owner)).json()
    assert deleted == {"id": dep["id"], "object": "deployment.deleted", "deleted": True}
    assert_error(await client.get(f"/v1/deployments/{dep['id']}", headers=owner), 404, "deployment_not_found")
    assert_error(
        await client.delete(f"/v1/deployments/{dep['id']}", headers=owner), 404, "deployment_not_found"
    )
    models = (await client.get("/v1/models", headers=owner)).json()["data"]
    assert models == []


async def test_another_accounts_deployment_is_not_found(
    client: httpx.AsyncClient, services: Services
) -> None:
    a = await new_account(client, "a")
    b = await new_account(client, "b")
    dep = await new_deployment(client, services, a, "m")
    other = bearer(b["api_key"])
    path = f"/v1/deployments/{dep['id']}"
    assert_error(await client.get(path, headers=other), 404, "deployment_not_found")
    assert_error(
        await client.patch(path, json={"readiness": "hot"}, headers=other), 404, "deployment_not_found"
    )
    assert_error(await client.delete(path, headers=other), 404, "deployment_not_found")
    assert (await client.get("/v1/deployments", headers=other)).json()["data"] == []


async def test_models_routes_follow_openais_shape(client: httpx.AsyncClient, services: Services) -> None:
    account = await new_account(client)
    owner = bearer(account["api_key"])
    dep = await new_deployment(client, services, account, "org/emb")
    listed = (await client.get("/v1/models", headers=owner)).json()
    assert listed["object"] == "list"
    (model,) = listed["data"]
    # OpenAI's, vLLM's `parent` / `root` (an adapter's base; a full model is its own root), and ours under
    # `modelhost`: never `pipeline`, which Open WebUI reads as its Pipelines setting (issue 59)
    assert set(model) == {"id", "object", "created", "owned_by", "modelhost", "parent", "root"}
    assert (model["parent"], model["root"]) == (None, "org/emb")
    assert (model["id"], model["object"]) == ("org/emb", "model")
    assert model["modelhost"] == {"task": "feature-extraction"}
    assert isinstance(model["created"], int)
    assert (await client.get("/v1/models/org/emb", headers=owner)).json() == model
    error = assert_error(await client.get("/v1/models/gpt-4o", headers=owner), 404, "model_not_found")
    assert error["message"] == "Model not found"
    assert dep["model"] == model["id"]


# ------------------------------------------------------------------------------------------ audit log


async def audit_rows(client: httpx.AsyncClient, key: str, **params: str) -> list[dict[str, Any]]:
    """Every audit row the key may read (oldest first), through the cursor pages."""
    rows: list[dict[str, Any]] = []
    after: str | None = None
    while True:
        query = {**params, "order": "asc", "limit": "100", **({"after": after} if after else {})}
        page = await client.get("/v1/audit", params=query, headers=bearer(key))
        assert page.status_code == 200, page.text
        rows += page.json()["data"]
        if not page.json()["has_more"]:
            return rows
        after = page.json()["last_id"]


async def verify(client: httpx.AsyncClient) -> dict[str, Any]:
    answer = await client.get("/v1/admin/audit/verify", headers=ADMIN)
    assert answer.status_code == 200, answer.text
    body: dict[str, Any] = answer.json()
    return body


async def test_every_management_change_writes_an_audit_row_without_a_secret(
    client: httpx.AsyncClient, services: Services
) -> None:
    account = await new_account(client, "audited")
    owner = bearer(account["api_key"])
    await client.patch(
        f"/v1/admin/accounts/{account['id']}", json={"limits": {"requests_per_minute": 60}}, headers=ADMIN
    )
    await client.post(f"/v1/admin/accounts/{account['id']}/credits", json={"credits": 5}, headers=ADMIN)
    key = (await client.post("/v1/keys", json={"name": "ci"}, headers=owner)).json()
    await client.patch(f"/v1/keys/{key['id']}", json={"limits": {"requests_per_minute": 10}}, headers=owner)
    rotated = (
        await client.post(f"/v1/keys/{key['id']}/rotate", json={"grace_seconds": 60}, headers=owner)
    ).json()
    assert (await client.delete(f"/v1/keys/{rotated['id']}", headers=owner)).status_code == 200
    dep = await new_deployment(client, services, account, "audited-model")
    await client.patch(f"/v1/deployments/{dep['id']}", json={"readiness": "warm"}, headers=owner)
    await client.patch(f"/v1/admin/deployments/{dep['id']}", json={"shared": False}, headers=ADMIN)
    assert (await client.delete(f"/v1/deployments/{dep['id']}", headers=owner)).status_code == 200
    artifact = (
        await client.post(
            "/v1/model-artifacts", json={"display_name": "a", "pipeline": "fill-mask"}, headers=owner
        )
    ).json()
    uploads = f"/v1/model-artifacts/{artifact['id']}/uploads"
    upload = (await client.post(uploads, headers=owner)).json()["upload_id"]
    await client.post(f"{uploads}/{upload}/complete", headers=owner)  # nothing uploaded: inspection fails
    upload = (await client.post(uploads, headers=owner)).json()["upload_id"]
    assert (await client.delete(f"{uploads}/{upload}", headers=owner)).status_code == 200
    assert (await client.delete(f"/v1/model-artifacts/{artifact['id']}", headers=owner)).status_code == 200
    file = {"file": ("notes.txt", b"hello", "text/plain")}
    uploaded = (
        await client.post("/v1/files", files=file, data={"purpose": "user_data"}, headers=owner)
    ).json()
    assert (await client.delete(f"/v1/files/{uploaded['id']}", headers=owner)).status_code == 200

    rows = await audit_rows(client, account["api_key"])
    actions = [row["action"] for row in rows]
    assert actions == [
        "account.created",
        "key.created",  # the account's first key
        "account.updated",
        "account.credits_added",
        "key.created",
        "key.updated",
        "key.created",  # the rotation's new key
        "key.rotated",
        "key.revoked",
        "deployment.created",
        "deployment.updated",
        "deployment.unshared",
        "deployment.deleted",
        "artifact.created",
        "artifact.upload_started",
        "artifact.upload_failed",
        "artifact.upload_started",
        "artifact.upload_aborted",
        "artifact.deleted",
        "file.created",
        "file.deleted",
    ]
    by_action = {row["action"]: row for row in rows}
    assert by_action["account.updated"]["changes"] == {
        "limits": {"before": None, "after": {"requests_per_minute": 60}}
    }
    assert by_action["account.updated"]["actor"]["kind"] == "admin"
    assert by_action["account.credits_added"]["changes"]["credits_granted_micro"] == {
        "before": 100_000_000,
        "after": 105_000_000,
    }
    updated = by_action["key.updated"]
    assert (updated["target"], updated["account_id"]) == ({"type": "key", "id": key["id"]}, account["id"])
    assert updated["changes"] == {"limits": {"before": None, "after": {"requests_per_minute": 10}}}
    assert by_action["key.rotated"]["changes"]["replaced_by"]["after"] == rotated["id"]
    assert by_action["deployment.updated"]["changes"] == {"readiness": {"before": "cold", "after": "warm"}}
    account_key_id = rows[1]["target"]["id"]
    for row in rows[4:]:  # made with the account key, from the test client, each by its own request
        if row["action"] != "deployment.unshared":
            assert row["actor"] == {
                "kind": "account",
                "key_id": account_key_id,
                "address": "127.0.0.1",
                "user_id": None,  # the account's first key: a service key, no person
                "email": None,
                "subject": None,
            }, row
        assert row["request_id"].startswith("req_")
    assert len({row["request_id"] for row in rows}) == len(rows) - 2  # a rotation is one request, two rows
    # never a secret: no key's secret, its hash or its prefix, in any row the admin reads
    everything = json.dumps(await audit_rows(client, ADMIN_KEY))
    for secret in (account["api_key"], key["api_key"], rotated["api_key"]):
        assert secret not in everything and hash_secret(secret) not in everything
        assert secret[:10] not in everything
    assert (await verify(client))["ok"]


@SQLITE_ONLY
async def test_a_refused_change_leaves_no_audit_row(client: httpx.AsyncClient, services: Services) -> None:
    account = await new_account(client)
    owner = bearer(account["api_key"])
    await new_deployment(client, services, account, "taken")
    before = await audit_rows(client, account["api_key"])
    [default] = (await client.get("/v1/keys", headers=owner)).json()["data"]
    assert_error(await client.delete(f"/v1/keys/{default['id']}", headers=owner), 409, "last_account_key")
    artifact_id = ready_artifact(services, account["id"])
    taken = await client.post(
        "/v1/deployments", json={"model": "taken", "artifact_id": artifact_id}, headers=owner
    )
    assert_error(
        taken, 409, "model_exists"
    )  # refused by the database's unique index, after the row was added
    assert await audit_rows(client, account["api_key"]) == before
    assert (await verify(client))["ok"]


@SQLITE_ONLY
async def test_an_account_reads_only_its_own_audit_rows(
    client: httpx.AsyncClient, services: Services
) -> None:
    a = await new_account(client, "a")
    b = await new_account(client, "b")
    dep = await new_deployment(client, services, a, "a-model")
    a_key_rows = await audit_rows(client, a["api_key"])
    assert {row["account_id"] for row in a_key_rows} == {a["id"]}
    b_rows = await audit_rows(client, b["api_key"], account_id=a["id"])  # asking for another's is ignored
    assert {row["account_id"] for row in b_rows} == {b["id"]}
    assert await audit_rows(client, b["api_key"], target_id=dep["id"]) == []
    assert_error(
        await client.get("/v1/audit", params={"after": a_key_rows[0]["id"]}, headers=bearer(b["api_key"])),
        404,
    )
    # the admin key reads both, and filters
    every = await audit_rows(client, ADMIN_KEY)
    assert {a["id"], b["id"]} <= {row["account_id"] for row in every}
    created = await audit_rows(client, ADMIN_KEY, action="deployment.created", target_type="deployment")
    assert [row["target"]["id"] for row in created] == [dep["id"]]
    since = await audit_rows(client, ADMIN_KEY, since=created[0]["created_at"])
    assert since[0]["id"] == created[0]["id"]
    # a deployment key reads none
    scoped = (
        await client.post("/v1/keys", json={"deployments": [dep["id"]]}, headers=bearer(a["api_key"]))
    ).json()
    assert_error(await client.get("/v1/audit", headers=bearer(scoped["api_key"])), 401, "invalid_api_key")


@SQLITE_ONLY
async def test_an_edited_or_deleted_audit_row_is_named_by_verify(
    client: httpx.AsyncClient, services: Services
) -> None:
    account = await new_account(client)
    for name in ("one", "two", "three"):
        await client.post("/v1/keys", json={"name": name}, headers=bearer(account["api_key"]))
    rows = await audit_rows(client, ADMIN_KEY)
    assert (await verify(client))["ok"]
    edited, deleted = rows[1], rows[3]
    with services.database.transaction() as session:
        session.execute(
            update(AuditRow)
            .where(AuditRow.id == edited["id"])
            .values(changes={"name": {"before": None, "after": "x"}})
        )
    found = await verify(client)
    assert not found["ok"]
    assert found["problems"] == [
        {"seq": edited["seq"], "id": edited["id"], "reason": "its contents do not match its hash (edited)"}
    ]
    with services.database.transaction() as session:
        session.execute(delete(AuditRow).where(AuditRow.id == deleted["id"]))
    found = await verify(client)
    assert [(p["seq"], p["id"]) for p in found["problems"]] == [
        (edited["seq"], edited["id"]),
        (deleted["seq"] + 1, rows[4]["id"]),  # the row after the gap names it
    ]
    assert f"rows {deleted['seq']}..{deleted['seq']} are missing" in found["problems"][1]["reason"]


def test_appends_from_many_threads_keep_one_linear_chain(services: Services) -> None:
    """Every append takes the chain head's lock (PostgreSQL's row lock, SQLite's write lock): rows made at
    once by many threads (as by several gateway processes or servers) still form one chain."""
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda n: services.accounts.create(f"acct-{n}", 1.0), range(24)))
    found = services.audit.verify()
    assert found.ok, found.problems
    assert (found.rows, found.first_seq, found.last_seq) == (48, 1, 48)  # each account and its key


@SQLITE_ONLY
def test_pruning_old_rows_keeps_the_chain_verifiable(services: Services) -> None:
    services.accounts.create("old", 1.0)
    time.sleep(0.3)
    services.accounts.create("new", 1.0)
    pruning = AuditLog(services.database, retention_days=0.15 / 86400)  # 0.15 s
    assert pruning.prune() == 2
    assert pruning.prune() == 0
    found = services.audit.verify()
    assert found.ok, found.problems
    assert (found.rows, found.first_seq, found.last_seq, found.pruned_through) == (2, 3, 4, 2)
    services.accounts.create("newer", 1.0)
    assert services.audit.verify().ok
    with services.database.transaction() as session:  # deleting the oldest row left is still seen
        session.execute(delete(AuditRow).where(AuditRow.seq == 3))
    assert [p.seq for p in services.audit.verify().problems] == [4]


@SQLITE_ONLY
async def test_a_cold_deployment_switches_its_artifact_and_keeps_its_history(
    client: httpx.AsyncClient, services: Services
) -> None:
    account, other = await new_account(client, "a"), await new_account(client, "b")
    owner = bearer(account["api_key"])
    dep = await new_deployment(client, services, account, "emb")
    old, new = dep["artifact_id"], ready_artifact(services, account["id"])
    assert dep["versions"] == [
        {
            "artifact_id": old,
            "state": "active",
            "traffic": 100,
            "since": dep["versions"][0]["since"],
            "reason": None,
        }
    ]
    foreign = ready_artifact(services, other["id"])
    answer = await client.patch(f"/v1/deployments/{dep['id']}", json={"artifact_id": foreign}, headers=owner)
    assert_error(answer, 404, "artifact_not_found")
    fill = ready_artifact(services, account["id"], "fill-mask")
    answer = await client.patch(f"/v1/deployments/{dep['id']}", json={"artifact_id": fill}, headers=owner)
    assert_error(answer, 400, "pipeline_mismatch")
    answer = await client.patch(f"/v1/deployments/{dep['id']}", json={"artifact_id": new}, headers=owner)
    assert answer.status_code == 200, answer.text
    switched = answer.json()
    assert switched["artifact_id"] == new and switched["model"] == "emb"
    assert [(v["artifact_id"], v["state"], v["traffic"]) for v in switched["versions"]] == [
        (new, "active", 100)
    ]
    assert [(h["from"], h["to"]) for h in switched["history"]] == [({old: 100}, {new: 100})]
    with services.database.transaction() as session:  # the old artifact is free again, the new one held
        counts = {a: session.get(ModelArtifact, a).deployment_count for a in (old, new)}  # type: ignore[union-attr]
    assert counts == {old: 0, new: 1}
    canary = {new: 90, old: 10}
    answer = await client.patch(
        f"/v1/deployments/{dep['id']}", json={"traffic": canary, "sticky": "key"}, headers=owner
    )
    shown = answer.json()
    assert {v["artifact_id"]: v["traffic"] for v in shown["versions"]} == canary and shown["sticky"] == "key"
    bad = await client.patch(f"/v1/deployments/{dep['id']}", json={"traffic": {new: 50}}, headers=owner)
    assert bad.status_code == 400
    rows = await audit_rows(client, account["api_key"])
    assert "deployment.rollout_started" in {r["action"] for r in rows}


@SQLITE_ONLY
async def test_a_restart_serves_the_stored_versions_and_carries_on_with_a_rollout(
    client: httpx.AsyncClient, services: Services
) -> None:
    account = await new_account(client)
    owner = bearer(account["api_key"])
    dep = await new_deployment(client, services, account, "emb", readiness="hot")
    old, new = dep["artifact_id"], ready_artifact(services, account["id"])
    deadline = time.monotonic() + 30  # its first load fails (the rows have no files): nothing runs, so the
    # PATCH stores the table as asked, both versions active (while it was still loading, the new one
    # would load beside it instead, and fail)
    while (await client.get(f"/v1/deployments/{dep['id']}", headers=owner)).json()["state"] != "failed":
        assert time.monotonic() < deadline
        await asyncio.sleep(0.02)
    canary = {"traffic": {old: 90, new: 10}}
    assert (await client.patch(f"/v1/deployments/{dep['id']}", json=canary, headers=owner)).status_code == 200
    # what a starting server reads: every active version of a hot deployment loads
    assert sorted(s.artifact_id for s in services.deployments.hot_specs()) == sorted([old, new])
    assert services.deployments.runtime_spec(f"{dep['id']}@{new}").artifact_id == new  # type: ignore[union-attr]
    gone = services.deployments.runtime_spec(f"{dep['id']}@art_gone")  # a version no longer listed
    assert gone is not None and gone.artifact_id == old
    with services.database.transaction() as session:  # a rollout under way when the server stopped
        row = session.get(Deployment, dep["id"])
        assert row is not None
        row.versions = [
            {**v, "state": "loading"} if v["artifact_id"] == new else v for v in row.versions or []
        ]
    assert services.deployments.rolling() == [dep["id"]]
