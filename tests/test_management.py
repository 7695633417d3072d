"""Accounts, keys and deployments exactly as shared/spec/management.md describes them."""

from __future__ import annotations

from datetime import datetime

import httpx

from modelhost.container import Services
from modelhost.store.models import ModelArtifact
from tests.helpers import ADMIN_KEY, assert_error, bearer, new_account, new_deployment, ready_artifact

ADMIN = bearer(ADMIN_KEY)


async def test_create_account_returns_its_key_once(client: httpx.AsyncClient) -> None:
    account = await new_account(client, "acme", credits=12.5)
    fields = {"id", "name", "credits", "credits_granted", "credits_used", "limits", "created_at", "api_key"}
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
    # OpenAI's, the task, and vLLM's `parent` / `root` (an adapter's base; a full model is its own root)
    assert set(model) == {"id", "object", "created", "owned_by", "pipeline", "parent", "root"}
    assert (model["parent"], model["root"]) == (None, "org/emb")
    assert (model["id"], model["object"], model["pipeline"]) == ("org/emb", "model", "feature-extraction")
    assert isinstance(model["created"], int)
    assert (await client.get("/v1/models/org/emb", headers=owner)).json() == model
    error = assert_error(await client.get("/v1/models/gpt-4o", headers=owner), 404, "model_not_found")
    assert error["message"] == "Model not found"
    assert dep["model"] == model["id"]
