"""Property-based fuzz of the whole OpenAPI document with schemathesis, in-process over ASGI (SQLite).

Every operation the app documents is called with generated data (valid and invalid), with the right
bearer key for its route group, against an app seeded with real rows. Every response must be below
500, and every error must be the one error body `{"error": {message, type, code, param}}`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import schemathesis
from fastapi import FastAPI
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from schemathesis.python import asgi as schemathesis_asgi

from modelhost.api.app import create_app
from modelhost.services.container import Services
from tests.conftest import make_settings
from tests.helpers import ADMIN_KEY, bearer, new_account, ready_artifact

MODEL = "fuzz-model"

# Path parameter name -> IDs of real rows, mixed into generated path parameters (filled by `fuzz_env`).
KNOWN: dict[str, list[str]] = {}
# Operation label -> path parameter name -> real IDs that operation is never given.
SPARED: dict[str, dict[str, list[str]]] = {}


@dataclass
class FuzzEnv:
    app: FastAPI
    account_key: str


@pytest.fixture(scope="module")
async def fuzz_env(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[FuzzEnv]:
    """One app on a SQLite file, with an account, a ready artifact and a deployment (plus a spare
    deployment key and an artifact with an open upload session, for the key and upload routes)."""
    tmp_path = tmp_path_factory.mktemp("openapi-fuzz")
    services = Services.build(make_settings(tmp_path, f"sqlite:///{tmp_path / 'fuzz.db'}"))
    app = create_app(services=services)
    assert app.openapi() == schema.raw_schema
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://modelhost.test") as http:
        account = await new_account(http, name="fuzz")
        key = bearer(account["api_key"])
        artifact_id = ready_artifact(services, account["id"])
        response = await http.post(
            "/v1/deployments", json={"model": MODEL, "artifact_id": artifact_id}, headers=key
        )
        assert response.status_code == 201, response.text
        deployment_id = response.json()["id"]
        # A key the fuzzer may revoke (never the account key it calls with).
        response = await http.post(
            "/v1/keys", json={"name": "spare", "deployments": [deployment_id]}, headers=key
        )
        assert response.status_code == 201, response.text
        key_id = response.json()["id"]
        response = await http.post(
            "/v1/model-artifacts", json={"display_name": "up", "pipeline": "feature-extraction"}, headers=key
        )
        assert response.status_code == 201, response.text
        upload_artifact_id = response.json()["id"]
        response = await http.post(f"/v1/model-artifacts/{upload_artifact_id}/uploads", headers=key)
        assert response.status_code == 201, response.text
        upload_id = response.json()["upload_id"]
    KNOWN.update(
        account_id=[account["id"]],
        key_id=[key_id],
        artifact_id=[artifact_id, upload_artifact_id],
        upload_id=[upload_id],
        deployment_id=[deployment_id],
        model=[MODEL],
    )
    # Deleting the artifact under upload would leave the upload routes (fuzzed after it) nothing real.
    SPARED["DELETE /v1/model-artifacts/{artifact_id}"] = {"artifact_id": [upload_artifact_id]}
    yield FuzzEnv(app=app, account_key=account["api_key"])
    KNOWN.clear()
    SPARED.clear()
    # The ASGI client of schemathesis started the app's lifespan (and its sweeper task): stop it.
    schemathesis_asgi.shutdown_lifespans()
    services.close()


def _document() -> dict[str, Any]:
    """The OpenAPI document, read at import so that pytest collects one test per operation.

    Building the document starts nothing (no services, no database); the requests go to the
    seeded app of the `fuzz_env` fixture, which serves this very document.
    """
    return create_app(make_settings(Path("unused"), "sqlite://")).openapi()


schema = schemathesis.openapi.from_dict(_document())


@schema.hook
def flatmap_path_parameters(
    context: schemathesis.HookContext, path_parameters: dict[str, Any]
) -> st.SearchStrategy[dict[str, Any]]:
    """Each path parameter: the generated value, or the ID of a real row (see `fuzz_env`)."""
    label = context.operation.label if context.operation is not None else ""
    spared = SPARED.get(label, {})
    choices = {
        name: st.sampled_from(
            [value, *(known for known in KNOWN.get(name, []) if known not in spared.get(name, []))]
        )
        for name, value in path_parameters.items()
    }
    return st.fixed_dictionaries(choices)


@schema.parametrize()
@settings(
    max_examples=30,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
def test_every_operation(case: schemathesis.Case, fuzz_env: FuzzEnv) -> None:
    path = case.operation.path
    key = ADMIN_KEY if path.startswith("/v1/admin/") else fuzz_env.account_key
    headers = {"Authorization": f"Bearer {key}"}
    response = case.call(app=fuzz_env.app, headers=headers)
    assert response.status_code < 500, (response.status_code, response.text)
    if response.status_code >= 400:
        body = response.json()
        assert isinstance(body, dict) and set(body) == {"error"}, body
        error = body["error"]
        assert isinstance(error, dict) and set(error) == {"message", "type", "code", "param"}, body
        assert isinstance(error["message"], str), body
        assert isinstance(error["type"], str), body
        assert error["code"] is None or isinstance(error["code"], str), body
        assert error["param"] is None or isinstance(error["param"], str), body
    case.validate_response(
        response, headers=headers, transport_kwargs={"app": fuzz_env.app, "headers": headers}
    )
