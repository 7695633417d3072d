"""Small helpers shared by tests: accounts, keys, artifacts created the way a client would."""

from __future__ import annotations

from typing import Any

import httpx

from modelhost.services.container import Services
from modelhost.store.models import ModelArtifact
from modelhost.store.types import new_id

ADMIN_KEY = "mh-admin-test-key-0123456789abcdef"


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def new_account(
    client: httpx.AsyncClient, name: str = "acme", credits: float = 100.0
) -> dict[str, Any]:
    response = await client.post(
        "/v1/admin/accounts", json={"name": name, "credits": credits}, headers=bearer(ADMIN_KEY)
    )
    assert response.status_code == 201, response.text
    body: dict[str, Any] = response.json()
    return body


def ready_artifact(services: Services, account_id: str, pipeline: str = "feature-extraction") -> str:
    """A `ready` artifact row made through the store (the artifact routes arrive with issue 3)."""
    with services.database.transaction() as session:
        artifact = ModelArtifact(
            id=new_id("art"), account_id=account_id, display_name="tiny", pipeline=pipeline, status="ready"
        )
        session.add(artifact)
        return artifact.id


async def new_deployment(
    client: httpx.AsyncClient,
    services: Services,
    account: dict[str, Any],
    model: str,
    pipeline: str = "feature-extraction",
    **extra: Any,
) -> dict[str, Any]:
    artifact_id = ready_artifact(services, account["id"], pipeline)
    response = await client.post(
        "/v1/deployments",
        json={"model": model, "artifact_id": artifact_id, **extra},
        headers=bearer(account["api_key"]),
    )
    assert response.status_code == 201, response.text
    body: dict[str, Any] = response.json()
    return body


def assert_error(
    response: httpx.Response, status: int, code: str | None = None, type_: str | None = None
) -> dict[str, Any]:
    """The one error body, with the expected status (and code / type when given)."""
    assert response.status_code == status, (response.status_code, response.text)
    body = response.json()
    assert set(body) == {"error"}, body
    error: dict[str, Any] = body["error"]
    assert set(error) == {"message", "type", "code", "param"}, error
    assert isinstance(error["message"], str) and error["message"]
    if code is not None:
        assert error["code"] == code, error
    if type_ is not None:
        assert error["type"] == type_, error
    return error
