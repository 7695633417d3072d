"""`x-request-id` on every answer: the caller's own when well-formed, else a new one; named by the log
lines about the request and by the message of a 5xx error body."""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import openai
import pytest

from modelhost.api.app import create_app
from modelhost.container import Services
from tests.conftest import make_settings
from tests.helpers import ADMIN_KEY, assert_error, bearer, new_account
from tests.server_process import ServerProcess

OURS = re.compile(r"req_[0-9a-f]{32}")


@pytest.fixture
def database_url(sqlite_url: str) -> str:
    """The middleware is the same on either database: SQLite alone."""
    return sqlite_url


@pytest.mark.parametrize(
    ("method", "path", "status"),
    [
        ("GET", "/health", 200),
        ("GET", "/v1/models", 401),  # no key
        ("GET", "/v1/no-such-route", 404),
        ("POST", "/v1/admin/accounts", 400),  # a body that is no JSON
    ],
)
async def test_every_answer_carries_a_new_request_id(
    client: httpx.AsyncClient, method: str, path: str, status: int
) -> None:
    headers = bearer(ADMIN_KEY) if "admin" in path else {}
    first = await client.request(method, path, content=b"{", headers=headers)
    second = await client.request(method, path, content=b"{", headers=headers)
    assert first.status_code == second.status_code == status
    assert OURS.fullmatch(first.headers["x-request-id"]), first.headers
    assert OURS.fullmatch(second.headers["x-request-id"])
    assert first.headers["x-request-id"] != second.headers["x-request-id"]


@pytest.mark.parametrize("incoming", ["trace-0af76519", "b5b7c1e2-3d4f-4a5b-8c9d-0e1f2a3b4c5d"])
async def test_a_well_formed_incoming_request_id_is_kept(client: httpx.AsyncClient, incoming: str) -> None:
    response = await client.get("/health", headers={"X-Request-Id": incoming})
    assert response.headers["x-request-id"] == incoming


@pytest.mark.parametrize("incoming", ["", "has spaces", "x" * 129, "a\\b", "-leading", "<script>"])
async def test_a_malformed_incoming_request_id_is_replaced(client: httpx.AsyncClient, incoming: str) -> None:
    response = await client.get("/health", headers={"X-Request-Id": incoming})
    assert OURS.fullmatch(response.headers["x-request-id"])


async def test_the_openai_sdk_sees_the_request_id_of_answers_and_errors(client: httpx.AsyncClient) -> None:
    account = await new_account(client)
    sdk = openai.AsyncOpenAI(
        api_key=account["api_key"], base_url="http://modelhost.test/v1", http_client=client, max_retries=0
    )
    listed = await sdk.models.with_raw_response.list()
    assert OURS.fullmatch(listed.request_id or "")
    with pytest.raises(openai.NotFoundError) as caught:
        await sdk.models.retrieve("no-such-model")
    assert OURS.fullmatch(caught.value.request_id or "")


async def test_a_5xx_error_body_names_the_request_id(tmp_path: Path, sqlite_url: str) -> None:
    services = Services.build(make_settings(tmp_path, sqlite_url, apply_migrations_on_start=False))
    try:  # migrations behind: /ready answers 503
        transport = httpx.ASGITransport(app=create_app(services=services))
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
            response = await http.get("/ready")
        error = assert_error(response, 503, code="service_unavailable")
        assert error["message"].endswith(f"(request ID {response.headers['x-request-id']})"), error
    finally:
        services.close()


def test_the_servers_log_lines_about_a_request_name_its_id(tmp_path: Path, sqlite_url: str) -> None:
    server = ServerProcess(tmp_path / "data", sqlite_url, log_level="info")
    server.start()
    try:
        answer = httpx.get(f"{server.url}/v1/no-such-route", headers={"X-Request-Id": "trace-1234"})
        assert answer.headers["x-request-id"] == "trace-1234"
    finally:
        server.terminate()
    access = [line for line in server.log.read_text().splitlines() if "/v1/no-such-route" in line]
    assert access and all("[trace-1234]" in line for line in access), access
