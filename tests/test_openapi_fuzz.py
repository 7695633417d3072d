"""Property-based fuzz of the whole OpenAPI document with schemathesis, in-process over ASGI (SQLite).

Every operation the app documents is called with generated data (valid and invalid), with the right
bearer key for its route group, against an app seeded with real rows. Every response must be below
500, and every error must be the one error body `{"error": {message, type, code, param}}`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import schemathesis
from fastapi import FastAPI
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from schemathesis.python import asgi as schemathesis_asgi
from schemathesis.specs.openapi.checks import positive_data_acceptance
from starlette.types import Receive, Scope, Send

from modelhost.api.app import create_app
from modelhost.services.container import Services
from tests.conftest import make_settings
from tests.helpers import ADMIN_KEY, bearer, new_account, ready_artifact

MODEL = "fuzz-model"

# Path parameter name -> IDs of real rows, mixed into generated path parameters (filled by `account_key`).
KNOWN: dict[str, list[str]] = {}
# Operation label -> path parameter name -> real IDs that operation is never given.
SPARED: dict[str, dict[str, list[str]]] = {}


class SeededApp:
    """The ASGI app schemathesis calls: a stand-in, at import, for the app `account_key` seeds later."""

    app: FastAPI | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        assert self.app is not None, "the app is set by the `account_key` fixture"
        await self.app(scope, receive, send)


APP = SeededApp()


@pytest.fixture(scope="module")
async def account_key(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[str]:
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
    APP.app = app
    yield account["api_key"]
    # The ASGI client of schemathesis started the app's lifespan (and its sweeper task): stop it.
    schemathesis_asgi.shutdown_lifespans()
    APP.app = None
    KNOWN.clear()
    SPARED.clear()
    services.close()


def _document() -> dict[str, Any]:
    """The OpenAPI document, read at import so that pytest collects one test per operation.

    Building the document starts nothing (no services, no database); the requests go to the
    seeded app of the `account_key` fixture, which serves this very document.
    """
    return create_app(make_settings(Path("unused"), "sqlite://")).openapi()


schema = schemathesis.openapi.from_dict(_document())
schema.app = APP


@schema.hook
def flatmap_path_parameters(
    context: schemathesis.HookContext, path_parameters: dict[str, Any] | None
) -> st.SearchStrategy[dict[str, Any] | None]:
    """Each path parameter: the generated value, or the ID of a real row (see `account_key`)."""
    if not path_parameters:
        return st.just(path_parameters)
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
def test_every_operation(case: schemathesis.Case, account_key: str) -> None:
    key = ADMIN_KEY if case.operation.path.startswith("/v1/admin/") else account_key
    # Set on the case itself (not as call-time headers), so that schemathesis's checks judge the
    # request that was actually sent, valid key included.
    case.headers = {**(case.headers or {}), "Authorization": f"Bearer {key}"}
    response = case.call()
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
    # All of schemathesis's default checks (status codes, content types, response headers, response
    # schemas — ErrorBody for every error — negative data rejected, auth not ignored, ...) but one:
    # `positive_data_acceptance` expects every schema-valid request to succeed, while the API
    # deliberately answers 400 to valid-looking data that fails a rule JSON Schema cannot carry
    # (docs/api-decisions.md, each enforced by its own tests): `min_replicas <= max_replicas`,
    # `deployments` naming the account's own deployments, `X-Content-SHA256` being 64 hex digits,
    # upload paths being clean relative paths.
    case.validate_response(response, excluded_checks=[positive_data_acceptance])
