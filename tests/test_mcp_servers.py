"""An account's allow-list of MCP servers (issue 63; docs/responses.md, "MCP tools"): managed by the
account's owners and admins and by the operator, none by default, URLs normalised, the matching rule,
each change audited. The hosted MCP tools themselves run end to end in tests/test_families.py."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from modelhost.container import Services
from modelhost.errors import InvalidRequest
from modelhost.mcp.allowlist import normalised, permits
from modelhost.mcp.tools import McpRequest, McpTools
from modelhost.outbound import parse_networks
from tests.helpers import ADMIN_KEY, assert_error, bearer, new_account
from tests.mcp_server import McpTestServer, mcp_server


async def test_an_account_has_no_mcp_servers_until_its_admin_lists_them(client: httpx.AsyncClient) -> None:
    key = (await new_account(client, "mcp"))["api_key"]
    assert (await client.get("/v1/mcp-servers", headers=bearer(key))).json() == {"urls": []}
    urls = ["HTTPS://MCP.example.com:443/mcp/", "http://10.0.0.5:8080/tools", "https://mcp.example.com/mcp"]
    put = await client.put("/v1/mcp-servers", json={"urls": urls}, headers=bearer(key))
    assert put.status_code == 200, put.text
    expected = {"urls": ["http://10.0.0.5:8080/tools", "https://mcp.example.com/mcp"]}
    assert put.json() == expected
    assert (await client.get("/v1/mcp-servers", headers=bearer(key))).json() == expected
    audit = (
        await client.get("/v1/audit", params={"action": "account.mcp_servers_updated"}, headers=bearer(key))
    ).json()
    (row,) = audit["data"]
    assert row["changes"]["urls"] == {"before": [], "after": expected["urls"]}


async def test_the_operator_sees_and_sets_any_accounts_list_and_a_missing_account_is_a_404(
    client: httpx.AsyncClient,
) -> None:
    account = await new_account(client, "mcp-operator")
    path = f"/v1/admin/accounts/{account['id']}/mcp-servers"
    put = await client.put(path, json={"urls": ["https://a.example/mcp"]}, headers=bearer(ADMIN_KEY))
    assert put.json() == {"urls": ["https://a.example/mcp"]}
    mine = await client.get("/v1/mcp-servers", headers=bearer(account["api_key"]))
    assert mine.json() == {"urls": ["https://a.example/mcp"]}
    missing = await client.get("/v1/admin/accounts/acct_nope/mcp-servers", headers=bearer(ADMIN_KEY))
    assert_error(missing, 404)
    assert_error(await client.get(path, headers=bearer(account["api_key"])), 401)


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("ftp://x.example/mcp", "http"),
        ("https://user:pw@x.example/mcp", "credentials"),
        ("not a url", "http"),
    ],
)
async def test_a_url_that_is_not_a_plain_http_url_is_a_400_naming_it(
    client: httpx.AsyncClient, url: str, why: str
) -> None:
    key = (await new_account(client, "mcp-bad"))["api_key"]
    put = await client.put("/v1/mcp-servers", json={"urls": ["https://ok.example", url]}, headers=bearer(key))
    assert why in assert_error(put, 400, param="urls[1]")["message"]


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
async def test_a_developer_may_not_change_the_list(client: httpx.AsyncClient) -> None:
    owner = (await new_account(client, "mcp-roles"))["api_key"]
    made = await client.post("/v1/keys", json={"role": "developer"}, headers=bearer(owner))
    developer = made.json()["api_key"]
    refused = await client.put("/v1/mcp-servers", json={"urls": []}, headers=bearer(developer))
    assert_error(refused, 403)


@pytest.mark.parametrize(
    ("url", "allowed"),
    [
        ("https://mcp.example.com/mcp", True),
        ("https://MCP.example.com:443/mcp/v2", True),
        ("https://mcp.example.com/mcp2", False),  # a path segment, not a string prefix
        ("http://mcp.example.com/mcp", False),  # another scheme
        ("https://mcp.example.com:8443/mcp", False),  # another port
        ("https://evil.example/mcp", False),
        ("https://whole.example/anything", True),  # an entry without a path allows the origin
    ],
)
def test_a_server_url_matches_an_entry_by_origin_and_path_below_it(url: str, allowed: bool) -> None:
    entries = [normalised("https://mcp.example.com/mcp/", "e"), normalised("https://whole.example", "e")]
    assert permits(entries, url, "tools[0].server_url") is allowed


def test_a_bad_server_url_is_an_invalid_request_naming_its_field() -> None:
    with pytest.raises(InvalidRequest) as bad:
        permits([], "file:///etc/passwd", "tools[0].server_url")
    assert bad.value.param == "tools[0].server_url"


# ---------------------------------------------------------------- the client against a real MCP server


@pytest.fixture(scope="module")
def weather_server() -> Iterator[McpTestServer]:
    with mcp_server() as server:
        yield server


def _weather(url: str) -> McpRequest:
    headers = {"Authorization": "Bearer t"}
    return McpRequest("weather", url, headers, None, lambda name: False, "tools[0].server_url")


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
async def test_without_the_operators_setting_a_loopback_mcp_url_is_refused_before_any_request(
    client: httpx.AsyncClient, services: Services, weather_server: McpTestServer
) -> None:
    """The server's own settings (no MODELHOST_MEDIA_ALLOW_NETWORKS): 127.0.0.1 is refused even on the
    account's list, and the MCP server sees nothing."""
    account = await new_account(client, "mcp-loopback")
    await client.put(
        "/v1/mcp-servers", json={"urls": [weather_server.url]}, headers=bearer(account["api_key"])
    )
    weather_server.requests.clear()
    with pytest.raises(InvalidRequest) as refused:
        await services.mcp.open(account["id"], [_weather(weather_server.url)])
    assert (refused.value.code, refused.value.param) == ("mcp_server_refused", "tools[0].server_url")
    assert weather_server.requests == []


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
async def test_a_tool_that_fails_is_an_error_outcome_and_every_call_is_audited(
    client: httpx.AsyncClient, services: Services, weather_server: McpTestServer
) -> None:
    account = await new_account(client, "mcp-calls")
    await client.put(
        "/v1/mcp-servers", json={"urls": [weather_server.url]}, headers=bearer(account["api_key"])
    )
    tools = McpTools(services.mcp.allowlist, parse_networks(["127.0.0.1/32"]), services.database, b"key")
    toolset = await tools.open(account["id"], [_weather(weather_server.url)])
    assert set(toolset.tools) == {"get_weather", "fail_always"}
    failed = await tools.call(account["id"], toolset, "fail_always", "{}")
    assert failed.output is None and failed.kind == "tool" and "fail_always" in (failed.error or "")
    bad = await tools.call(account["id"], toolset, "get_weather", "not json")
    assert bad.kind == "protocol"
    done = await tools.call(account["id"], toolset, "get_weather", '{"city": "Oslo"}')
    assert done.output == weather_server.weather and done.error is None
    rows = await client.get(
        "/v1/audit", params={"action": "mcp_server.called"}, headers=bearer(account["api_key"])
    )
    assert rows.status_code == 200, rows.text
    outcomes = sorted(row["changes"]["outcome"]["after"] for row in rows.json()["data"])
    assert outcomes == ["ok", "protocol", "tool"]
