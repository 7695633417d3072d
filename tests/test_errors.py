"""One error body for every failure: validation, bad JSON, unknown routes, methods, sizes, crashes."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from modelhost.api.app import create_app
from modelhost.container import Services
from tests.conftest import make_settings
from tests.helpers import ADMIN_KEY, assert_error, bearer, new_account

ADMIN = bearer(ADMIN_KEY)


async def test_malformed_json_is_400(client: httpx.AsyncClient) -> None:
    response = await client.post(
        "/v1/admin/accounts", content=b'{"name": ', headers={**ADMIN, "Content-Type": "application/json"}
    )
    assert_error(response, 400, "invalid_json", "invalid_request_error")


async def test_wrong_types_are_400_with_the_param(client: httpx.AsyncClient) -> None:
    response = await client.post("/v1/admin/accounts", json={"name": "x", "credits": "lots"}, headers=ADMIN)
    assert assert_error(response, 400, "invalid_request")["param"] == "credits"


async def test_nested_params_are_named_with_their_path(client: httpx.AsyncClient) -> None:
    account = await new_account(client)
    response = await client.post(
        "/v1/keys", json={"deployments": ["a", 3]}, headers=bearer(account["api_key"])
    )
    assert assert_error(response, 400)["param"] == "deployments[1]"


async def test_a_one_value_query_parameter_given_twice_is_400_naming_it(client: httpx.AsyncClient) -> None:
    """FastAPI would read the last of the two and answer as if the first were not there."""
    account = await new_account(client)
    key = bearer(account["api_key"])
    twice = await client.get("/v1/audit?target_type=key&target_type=deployment", headers=key)
    assert assert_error(twice, 400, "invalid_request")["param"] == "target_type"
    assert (await client.get("/v1/audit?target_type=key&limit=5", headers=key)).status_code == 200
    listed = await client.get("/v1/responses/resp_nope?include=a&include=b", headers=key)
    assert listed.status_code == 404  # a parameter that takes a list may repeat: the answer is the lookup's


async def test_a_non_object_body_is_400(client: httpx.AsyncClient) -> None:
    response = await client.post("/v1/admin/accounts", json=[1, 2], headers=ADMIN)
    assert_error(response, 400, "invalid_request")


async def test_unknown_route_is_404_in_the_error_shape(client: httpx.AsyncClient) -> None:
    assert_error(await client.get("/v1/nothing-here"), 404, "route_not_found")


async def test_wrong_method_is_405_in_the_error_shape(client: httpx.AsyncClient) -> None:
    response = await client.put("/v1/keys", headers=ADMIN)
    assert_error(response, 405, "method_not_allowed")
    assert "GET" in response.headers["allow"]


@pytest.fixture
async def small_limit_client(tmp_path: Path, sqlite_url: str) -> AsyncIterator[httpx.AsyncClient]:
    services = Services.build(make_settings(tmp_path, sqlite_url, max_body_bytes=1024))
    transport = httpx.ASGITransport(app=create_app(services=services))
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
        yield http
    services.close()


async def test_oversized_body_is_413_by_content_length(small_limit_client: httpx.AsyncClient) -> None:
    response = await small_limit_client.post("/v1/admin/accounts", json={"name": "x" * 2000}, headers=ADMIN)
    assert_error(response, 413, "payload_too_large")


async def test_oversized_streamed_body_is_413(small_limit_client: httpx.AsyncClient) -> None:
    async def chunks() -> AsyncIterator[bytes]:
        yield b'{"name": "'
        for _ in range(10):
            yield b"x" * 200
        yield b'"}'

    response = await small_limit_client.post(
        "/v1/admin/accounts", content=chunks(), headers={**ADMIN, "Content-Type": "application/json"}
    )
    assert_error(response, 413, "payload_too_large")


async def test_body_under_the_limit_passes(small_limit_client: httpx.AsyncClient) -> None:
    response = await small_limit_client.post("/v1/admin/accounts", json={"name": "ok"}, headers=ADMIN)
    assert response.status_code == 201


async def test_an_unexpected_exception_is_a_500_without_details(services: Services) -> None:
    app = create_app(services=services)

    @app.get("/v1/boom")
    async def boom() -> None:
        raise RuntimeError("secret internals /etc/passwd")

    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
        response = await http.get("/v1/boom")
    error = assert_error(response, 500, "internal_error", "server_error")
    assert "secret" not in response.text and "Traceback" not in response.text
    assert error["message"] == "Internal server error."
