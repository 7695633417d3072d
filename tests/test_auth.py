"""The auth matrix: each key kind × each route family × missing/malformed/wrong/revoked/out-of-scope."""

from __future__ import annotations

import secrets
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI, Request
from sqlalchemy import event

from modelhost.api.app import create_app
from modelhost.api.deps import CallerPrincipal, deployment_for
from modelhost.auth.failures import FailedKeys
from modelhost.container import Services
from tests.conftest import make_settings
from tests.helpers import ADMIN_KEY, ManualClock, assert_error, bearer, new_account, new_deployment
from tests.postgres import create_database

# One representative route per family: (method, path, body).
ADMIN_ROUTE = ("GET", "/v1/admin/accounts", None)
MANAGEMENT_ROUTES = [("GET", "/v1/keys", None), ("GET", "/v1/deployments", None)]
CALLER_ROUTE = ("GET", "/v1/models", None)


def with_inference_probe(app: FastAPI) -> FastAPI:
    """Adds `/probe/embeddings`: the real auth and routing dependencies of `/v1/embeddings`, answering
    which deployment was chosen instead of running a model (so routing is checked without workers)."""

    @app.post("/probe/embeddings")
    async def probe(request: Request, principal: CallerPrincipal) -> dict[str, Any]:
        body = await request.json()
        chosen = await deployment_for(request, principal, body.get("model"), endpoint="/v1/embeddings")
        return {"deployment": chosen.id}

    return app


async def build_world(services: Services) -> dict[str, Any]:
    """Two accounts; account A has two embedding deployments and a chat one, and keys of each kind."""
    app = with_inference_probe(create_app(services=services))
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    http = httpx.AsyncClient(transport=transport, base_url="http://t")
    a = await new_account(http, "a")
    b = await new_account(http, "b")
    emb1 = await new_deployment(http, services, a, "emb-one")
    emb2 = await new_deployment(http, services, a, "emb-two")
    chat = await new_deployment(http, services, a, "chatty", pipeline="text-generation")
    b_dep = await new_deployment(http, services, b, "emb-b")
    scoped = (
        await http.post("/v1/keys", json={"deployments": [emb1["id"]]}, headers=bearer(a["api_key"]))
    ).json()
    revoked = (await http.post("/v1/keys", json={"name": "old"}, headers=bearer(a["api_key"]))).json()
    assert (await http.delete(f"/v1/keys/{revoked['id']}", headers=bearer(a["api_key"]))).status_code == 200
    return {
        "http": http,
        "a": a,
        "b": b,
        "emb1": emb1,
        "emb2": emb2,
        "chat": chat,
        "b_dep": b_dep,
        "scoped": scoped["api_key"],
        "revoked": revoked["api_key"],
    }


@pytest.fixture
async def world(services: Services) -> dict[str, Any]:
    """A world of its own, for a test that changes it (revokes keys, counts queries)."""
    return await build_world(services)


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
async def seen(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[dict[str, Any]]:
    """One world per database kind, shared by the tests that only read it (the route matrix)."""
    root = tmp_path_factory.mktemp("auth")
    url = f"sqlite:///{root / 'test.db'}"
    if request.param == "postgres":
        url = create_database(request.getfixturevalue("postgres_base_url"), f"t_{secrets.token_hex(6)}")
    services = Services.build(make_settings(root, url))
    built = await build_world(services)
    yield built
    await built["http"].aclose()
    services.close()


async def call(
    http: httpx.AsyncClient, route: tuple[str, str, Any], headers: dict[str, str]
) -> httpx.Response:
    method, path, body = route
    return await http.request(method, path, json=body, headers=headers)


BAD_HEADERS = {
    "missing": {},
    "not bearer": {"Authorization": "Basic dXNlcjpwYXNz"},
    "empty bearer": {"Authorization": "Bearer "},
    "malformed key": {"Authorization": "Bearer not-a-modelhost-key"},
    "wrong key": {"Authorization": "Bearer mh-" + "x" * 43},
}
ALL_ROUTES = [
    ADMIN_ROUTE,
    *MANAGEMENT_ROUTES,
    CALLER_ROUTE,
    ("POST", "/v1/embeddings", {"model": "emb-one", "input": "x"}),
    ("POST", "/v1/feature-extraction", {"inputs": "x"}),
    ("POST", "/probe/embeddings", {"model": "emb-one"}),
]


@pytest.mark.parametrize("route", ALL_ROUTES, ids=lambda r: f"{r[0]} {r[1]}")
@pytest.mark.parametrize("case", list(BAD_HEADERS), ids=str)
async def test_every_route_refuses_missing_malformed_or_wrong_keys(seen: dict[str, Any], route, case) -> None:
    response = await call(seen["http"], route, BAD_HEADERS[case])
    assert_error(response, 401, "invalid_api_key", "InvalidAPIKeyError")


@pytest.mark.parametrize("route", ALL_ROUTES, ids=lambda r: f"{r[0]} {r[1]}")
async def test_every_route_refuses_a_revoked_key(seen: dict[str, Any], route) -> None:
    assert_error(await call(seen["http"], route, bearer(seen["revoked"])), 401, type_="InvalidAPIKeyError")


async def test_admin_routes_take_only_the_admin_key(seen: dict[str, Any]) -> None:
    http = seen["http"]
    assert (await call(http, ADMIN_ROUTE, bearer(ADMIN_KEY))).status_code == 200
    for key in (seen["a"]["api_key"], seen["scoped"]):
        assert_error(await call(http, ADMIN_ROUTE, bearer(key)), 401, type_="InvalidAPIKeyError")


@pytest.mark.parametrize("route", MANAGEMENT_ROUTES, ids=lambda r: r[1])
async def test_management_routes_take_only_account_keys(seen: dict[str, Any], route) -> None:
    http = seen["http"]
    assert (await call(http, route, bearer(seen["a"]["api_key"]))).status_code == 200
    for key in (ADMIN_KEY, seen["scoped"]):
        assert_error(await call(http, route, bearer(key)), 401, type_="InvalidAPIKeyError")


async def test_models_lists_everything_for_an_account_key_and_only_the_scope_for_a_deployment_key(
    seen: dict[str, Any],
) -> None:
    http = seen["http"]
    listed = (await call(http, CALLER_ROUTE, bearer(seen["a"]["api_key"]))).json()
    assert sorted(m["id"] for m in listed["data"]) == ["chatty", "emb-one", "emb-two"]
    scoped = (await call(http, CALLER_ROUTE, bearer(seen["scoped"]))).json()
    assert [m["id"] for m in scoped["data"]] == ["emb-one"]
    assert_error(await call(http, CALLER_ROUTE, bearer(ADMIN_KEY)), 401, type_="InvalidAPIKeyError")


async def test_inference_with_an_account_key_runs_on_the_named_deployment(seen: dict[str, Any]) -> None:
    response = await seen["http"].post(
        "/probe/embeddings", json={"model": "emb-two"}, headers=bearer(seen["a"]["api_key"])
    )
    assert response.json() == {"deployment": seen["emb2"]["id"]}


async def test_inference_with_a_deployment_key_and_no_model_uses_its_single_deployment(
    seen: dict[str, Any],
) -> None:
    response = await seen["http"].post("/probe/embeddings", json={}, headers=bearer(seen["scoped"]))
    assert response.json() == {"deployment": seen["emb1"]["id"]}


async def test_inference_with_an_account_key_and_no_model_asks_for_the_model(seen: dict[str, Any]) -> None:
    response = await seen["http"].post("/probe/embeddings", json={}, headers=bearer(seen["a"]["api_key"]))
    assert assert_error(response, 400, "invalid_request")["param"] == "model"


async def test_inference_on_a_deployment_outside_the_keys_scope_is_401(seen: dict[str, Any]) -> None:
    response = await seen["http"].post(
        "/v1/embeddings", json={"model": "emb-two", "input": "x"}, headers=bearer(seen["scoped"])
    )
    assert_error(response, 401, "invalid_api_key", "InvalidAPIKeyError")


@pytest.mark.parametrize("model", ["gpt-4o", "text-embedding-3-small", "emb-b", "nope"])
async def test_vendor_names_and_other_accounts_models_are_model_not_found(
    seen: dict[str, Any], model: str
) -> None:
    for key, path in ((seen["a"]["api_key"], "/probe/embeddings"), (seen["scoped"], "/v1/embeddings")):
        response = await seen["http"].post(path, json={"model": model, "input": "x"}, headers=bearer(key))
        error = assert_error(response, 404, "model_not_found")
        assert error["message"] == "Model not found"
        assert error["param"] == "model"


async def test_endpoint_of_another_pipeline_is_endpoint_not_supported(seen: dict[str, Any]) -> None:
    response = await seen["http"].post(
        "/v1/embeddings", json={"model": "chatty", "input": "x"}, headers=bearer(seen["a"]["api_key"])
    )
    error = assert_error(response, 400, "endpoint_not_supported")
    assert error["message"].startswith("Endpoint not supported")


async def test_admin_key_cannot_call_inference(seen: dict[str, Any]) -> None:
    response = await seen["http"].post(
        "/v1/embeddings", json={"model": "emb-one", "input": "x"}, headers=bearer(ADMIN_KEY)
    )
    assert_error(response, 401, type_="InvalidAPIKeyError")


async def test_revocation_takes_effect_at_once_even_with_a_warm_cache(world: dict[str, Any]) -> None:
    http, owner = world["http"], bearer(world["a"]["api_key"])
    created = (await http.post("/v1/keys", json={"name": "temp"}, headers=owner)).json()
    assert (await http.get("/v1/models", headers=bearer(created["api_key"]))).status_code == 200  # now cached
    assert (await http.delete(f"/v1/keys/{created['id']}", headers=owner)).status_code == 200
    assert_error(
        await http.get("/v1/models", headers=bearer(created["api_key"])), 401, type_="InvalidAPIKeyError"
    )


async def test_the_last_account_key_cannot_be_revoked(world: dict[str, Any]) -> None:
    http = world["http"]
    b_keys = (await http.get("/v1/keys", headers=bearer(world["b"]["api_key"]))).json()["data"]
    response = await http.delete(f"/v1/keys/{b_keys[0]['id']}", headers=bearer(world["b"]["api_key"]))
    assert_error(response, 409, "last_account_key")


async def test_keys_of_another_account_are_not_found(world: dict[str, Any]) -> None:
    http = world["http"]
    a_keys = (await http.get("/v1/keys", headers=bearer(world["a"]["api_key"]))).json()["data"]
    response = await http.delete(f"/v1/keys/{a_keys[0]['id']}", headers=bearer(world["b"]["api_key"]))
    assert_error(response, 404, "key_not_found")


async def test_secrets_are_stored_hashed_and_never_listed(world: dict[str, Any], services: Services) -> None:
    from sqlalchemy import select

    from modelhost.store.models import ApiKey

    secret = world["a"]["api_key"]
    assert secret.startswith("mh-")
    listed = (await world["http"].get("/v1/keys", headers=bearer(secret))).text
    assert secret not in listed
    with services.database.transaction() as session:
        stored = [(k.secret_hash, k.secret_prefix) for k in session.scalars(select(ApiKey))]
    assert all(secret != h and len(h) == 64 for h, _ in stored)


async def test_cached_keys_do_not_query_the_database(world: dict[str, Any], services: Services) -> None:
    http, key = world["http"], bearer(world["scoped"])
    await http.post("/probe/embeddings", json={}, headers=key)
    statements: list[str] = []

    def record(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        statements.append(statement)

    event.listen(services.database.engine, "before_cursor_execute", record)
    try:
        for _ in range(20):
            assert (await http.get("/v1/models", headers=key)).status_code == 200
    finally:
        event.remove(services.database.engine, "before_cursor_execute", record)
    assert statements, "the route itself reads deployments"
    assert not any("api_keys" in s for s in statements)


async def test_wrong_keys_are_cached_as_misses_so_floods_cost_no_queries(
    world: dict[str, Any], services: Services
) -> None:
    wrong = "mh-" + "w" * 43
    assert_error(await world["http"].get("/v1/models", headers=bearer(wrong)), 401)
    assert services.authenticator.cached(wrong) == (True, None)


async def test_another_gateway_refuses_a_revoked_key_within_the_cache_lifetime(
    world: dict[str, Any], settings, tmp_path
) -> None:
    """Two gateways on one database: revocation on one reaches the other once its cache entry expires."""
    other_services = Services.build(
        make_settings(tmp_path / "g2", settings.database_url, key_cache_seconds=0.2)
    )
    other = httpx.AsyncClient(
        transport=httpx.ASGITransport(app=create_app(services=other_services)), base_url="http://g2"
    )
    http, owner = world["http"], bearer(world["a"]["api_key"])
    created = (await http.post("/v1/keys", json={}, headers=owner)).json()
    assert (await other.get("/v1/models", headers=bearer(created["api_key"]))).status_code == 200
    await http.delete(f"/v1/keys/{created['id']}", headers=owner)
    import asyncio

    await asyncio.sleep(0.3)
    assert_error(await other.get("/v1/models", headers=bearer(created["api_key"])), 401)
    other_services.close()


# ---------------------------------------------------------------- the key before anything else

PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 32
INVALID = [
    ("POST", "/v1/embeddings", {"content": b'{"model": ', "headers": {"Content-Type": "application/json"}}),
    ("POST", "/v1/embeddings", {"json": {"input": 3, "colour": "red"}}),
    ("POST", "/v1/chat/completions", {"content": b"not json", "headers": {"Content-Type": "text/plain"}}),
    ("GET", "/v1/deployments", {"params": {"limit": "lots", "order": "sideways"}}),
    ("GET", "/v1/keys", {"params": {"limit": -1}}),
    ("POST", "/v1/images/to-text", {"content": PNG, "params": {"colour": "red"}}),
    ("POST", "/v1/images/edits", {"content": b"--x\r\n", "headers": {"Content-Type": "multipart/form-data"}}),
    ("POST", "/v1/admin/accounts", {"content": b"{", "headers": {"Content-Type": "application/json"}}),
]


async def test_a_request_without_a_valid_key_is_401_whatever_its_body_or_query(
    client: httpx.AsyncClient,
) -> None:
    for method, path, request_options in INVALID:
        for key in ("missing", "wrong key"):
            headers = {**request_options.get("headers", {}), **BAD_HEADERS[key]}
            response = await client.request(method, path, **{**request_options, "headers": headers})
            assert response.status_code == 401, (method, path, key, response.text)
            assert_error(response, 401, "invalid_api_key", "InvalidAPIKeyError")


async def test_the_key_is_looked_up_once_per_request(world: dict[str, Any], services: Services) -> None:
    calls: list[str] = []
    authenticator = services.authenticator
    original = authenticator.cached

    def counting(token: str) -> Any:
        calls.append(token)
        return original(token)

    authenticator.cached = counting  # type: ignore[method-assign]
    try:
        response = await world["http"].get("/v1/models", headers=bearer(world["a"]["api_key"]))
    finally:
        authenticator.cached = original  # type: ignore[method-assign]
    assert response.status_code == 200 and len(calls) == 1


@pytest.mark.parametrize("path", ["/health", "/openapi.json", "/docs", "/metrics"])
async def test_public_routes_need_no_key(client: httpx.AsyncClient, path: str) -> None:
    assert (await client.get(path)).status_code == 200


# ---------------------------------------------------------------- guessing keys


async def test_a_client_sending_wrong_keys_is_refused_for_a_while_but_known_keys_still_pass(
    tmp_path: Path, sqlite_url: str
) -> None:
    """After `auth_failures_per_minute` wrong keys from one address, its unknown keys get 429 with
    `Retry-After`, without a lookup; a key the gateway already knows to be valid still passes."""
    services = Services.build(make_settings(tmp_path, sqlite_url, auth_failures_per_minute=3))
    transport = httpx.ASGITransport(app=create_app(services=services), raise_app_exceptions=False)
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
            known = bearer((await new_account(http, "a"))["api_key"])
            assert (await http.get("/v1/models", headers=known)).status_code == 200
            guesses = [bearer("mh-" + secrets.token_urlsafe(32)) for _ in range(3)]
            for guess in guesses[:2]:
                assert_error(await http.get("/v1/models", headers=guess), 401, "invalid_api_key")
            assert_error(await http.get("/v1/models", headers=bearer("not-a-key")), 401, "invalid_api_key")
            for refused in (guesses[2], bearer("not-a-key"), guesses[0]):
                response = await http.get("/v1/models", headers=refused)
                assert_error(response, 429, "too_many_failed_keys")
                assert 1 <= int(response.headers["retry-after"]) <= 60
            assert (await http.get("/v1/models", headers=known)).status_code == 200
            assert services.authenticator.cached(guesses[2]["Authorization"].split()[1]) == (False, None)
    finally:
        services.close()


def test_failed_keys_are_forgotten_a_minute_after_they_were_sent() -> None:
    now = [1000.0]
    failures = FailedKeys(2, max_addresses=2, now=lambda: now[0])
    failures.failed("10.0.0.1")
    now[0] += 30
    failures.failed("10.0.0.1")
    assert failures.retry_after("10.0.0.1") == 30
    assert failures.retry_after("10.0.0.2") is None
    now[0] += 30.5  # the first failure has left the window
    assert failures.retry_after("10.0.0.1") is None
    for address in ("10.0.0.2", "10.0.0.3", "10.0.0.4"):  # the oldest addresses are forgotten
        failures.failed(address)
        failures.failed(address)
    assert failures.retry_after("10.0.0.2") is None and failures.retry_after("10.0.0.4") == 60


FORWARDED = {"X-Forwarded-For": "203.0.113.9"}


async def _audited_address_and_throttle(tmp_path: Path, sqlite_url: str, proxies: str) -> tuple[str, int]:
    """Through the gateway's own uvicorn configuration (`server.http.uvicorn_config`), from 127.0.0.1
    with `X-Forwarded-For: 203.0.113.9` on every request but the last: the address of the audit row a
    key creation writes, and the status of a wrong key sent without the header after two forwarded
    wrong keys (throttle: 2 a minute)."""
    from modelhost.server.http import uvicorn_config

    settings = make_settings(tmp_path, sqlite_url, auth_failures_per_minute=2, trusted_proxies=proxies)
    services = Services.build(settings)
    config = uvicorn_config(create_app(services=services), settings, "warning")
    config.load()
    transport = httpx.ASGITransport(app=config.loaded_app, client=("127.0.0.1", 40000))
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://t", headers=FORWARDED) as http:
            owner = bearer((await new_account(http, "a"))["api_key"])
            created = (await http.post("/v1/keys", json={"name": "seen"}, headers=owner)).json()
            rows = (await http.get("/v1/audit", params={"action": "key.created"}, headers=owner)).json()
            [row] = [row for row in rows["data"] if row["target"]["id"] == created["id"]]
            for _ in range(2):
                wrong = bearer("mh-" + secrets.token_urlsafe(32))
                assert_error(await http.get("/v1/models", headers=wrong), 401, "invalid_api_key")
            unforwarded = {"Authorization": f"Bearer mh-{secrets.token_urlsafe(32)}", "X-Forwarded-For": ""}
            last = await http.get("/v1/models", headers=unforwarded)
            return str(row["actor"]["address"]), last.status_code
    finally:
        services.close()


async def test_a_forwarded_address_from_a_proxy_not_named_in_trusted_proxies_is_ignored(
    tmp_path: Path, sqlite_url: str
) -> None:
    """uvicorn trusts 127.0.0.1's `X-Forwarded-For` by default: any local client could then forge the
    audit row's address and dodge the wrong-key throttle by naming a new address each time."""
    address, throttled = await _audited_address_and_throttle(tmp_path, sqlite_url, proxies="")
    assert (address, throttled) == ("127.0.0.1", 429)  # the real address, whose wrong keys counted


async def test_a_proxy_named_in_trusted_proxies_forwards_the_clients_address(
    tmp_path: Path, sqlite_url: str
) -> None:
    address, throttled = await _audited_address_and_throttle(tmp_path, sqlite_url, proxies="127.0.0.0/8")
    assert (address, throttled) == ("203.0.113.9", 401)  # the forwarded client's: 127.0.0.1 has none


def test_trusted_proxies_take_addresses_and_cidrs_only(tmp_path: Path, sqlite_url: str) -> None:
    settings = make_settings(tmp_path, sqlite_url, trusted_proxies=" 10.0.0.1, 192.168.0.0/16,::1 ")
    assert settings.trusted_proxy_list == ["10.0.0.1", "192.168.0.0/16", "::1"]
    with pytest.raises(ValueError, match=r"'proxy\.local' is not an address or a CIDR"):
        make_settings(tmp_path, sqlite_url, trusted_proxies="10.0.0.1,proxy.local")


# ------------------------------------------------------------------------------------ the admin key


@pytest.mark.parametrize(
    "make",
    [
        lambda: secrets.token_hex(16),  # `openssl rand -hex 16`: 128 random bits
        lambda: secrets.token_hex(32),
        lambda: secrets.token_hex(16).upper(),
        lambda: secrets.token_urlsafe(24),
        lambda: "mh-admin-" + secrets.token_urlsafe(24),  # what `make run` and `quickstart` write
    ],
    ids=["hex-16", "hex-32", "HEX-16", "token_urlsafe-24", "make-run"],
)
def test_random_admin_keys_of_128_bits_pass_the_strength_check(make: Any) -> None:
    from modelhost.auth.secrets import admin_key_weakness

    refused = [key for key in (make() for _ in range(1000)) if admin_key_weakness(key) is not None]
    assert refused == []
    assert admin_key_weakness(ADMIN_KEY) is None  # the test suite's own


@pytest.mark.parametrize(
    "key",
    [
        "mh-admin-short",
        "9f86d081884c7d659a2feaa0c55ad0",  # 30 hex characters: 120 bits
        "mh-" + "ab" * 20,
        "abcdefghijklmnop" * 2,  # 16 distinct letters: passed the old check
        "Tr0ub4dor&3" + "x" * 30,
        "c3ab8ff13720e8ad" * 4,  # a random 16-character stretch, repeated
        "0123456789" * 4,
        "mh-admin-abcdefghijklmnopqrstuvwxyz",
        "mh-admin-zyxwvutsrqponmlkjihgfedcba",
    ],
)
def test_short_repeated_or_sequential_admin_keys_fail_with_how_to_make_one(key: str) -> None:
    from modelhost.auth.secrets import admin_key_weakness

    weakness = admin_key_weakness(key)
    assert weakness is not None and "at least 128" in weakness, key
    assert "openssl rand -hex 32" in weakness and "secrets.token_urlsafe(32)" in weakness


# ------------------------------------------------------------------------------------ expiring keys


@pytest.fixture
async def clocked(tmp_path: Path) -> AsyncIterator[tuple[httpx.AsyncClient, ManualClock]]:
    """A gateway whose clock moves only when told: keys expire without waiting."""
    clock = ManualClock(int(time.time() * 1000))
    services = Services.build(make_settings(tmp_path, f"sqlite:///{tmp_path / 'clocked.db'}"), clock=clock)
    transport = httpx.ASGITransport(app=create_app(services=services), raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
        yield http, clock
    services.close()


async def test_an_expired_key_is_refused_with_expired_api_key(
    clocked: tuple[httpx.AsyncClient, ManualClock],
) -> None:
    http, clock = clocked
    account = await new_account(http)
    owner = bearer(account["api_key"])
    soon = (await http.post("/v1/keys", json={"name": "ci", "expires_in": 60}, headers=owner)).json()
    moment = datetime.fromtimestamp(clock.now_ms() / 1000 + 120, UTC)
    later = (await http.post("/v1/keys", json={"expires_at": moment.isoformat()}, headers=owner)).json()
    assert datetime.fromisoformat(soon["expires_at"]).timestamp() == pytest.approx(clock.now_ms() / 1000 + 60)
    assert datetime.fromisoformat(later["expires_at"]) == moment
    assert (await http.get("/v1/keys", headers=bearer(soon["api_key"]))).status_code == 200  # now cached
    clock.advance(61)
    error = assert_error(
        await http.get("/v1/keys", headers=bearer(soon["api_key"])),
        401,
        "expired_api_key",
        "InvalidAPIKeyError",
    )
    assert "expired" in error["message"]
    assert (await http.get("/v1/keys", headers=bearer(later["api_key"]))).status_code == 200
    clock.advance(60)
    assert_error(await http.get("/v1/models", headers=bearer(later["api_key"])), 401, "expired_api_key")
    listed = {
        key["id"]: key["expires_at"] for key in (await http.get("/v1/keys", headers=owner)).json()["data"]
    }
    assert listed[soon["id"]] == soon["expires_at"]


async def test_a_key_expiry_is_in_the_future_and_given_once(
    clocked: tuple[httpx.AsyncClient, ManualClock],
) -> None:
    http, clock = clocked
    owner = bearer((await new_account(http))["api_key"])
    past = datetime.fromtimestamp(clock.now_ms() / 1000 - 1, UTC).isoformat()
    assert_error(
        await http.post("/v1/keys", json={"expires_at": past}, headers=owner), 400, param="expires_at"
    )
    both = {"expires_at": datetime.now(UTC).isoformat(), "expires_in": 60}
    assert_error(await http.post("/v1/keys", json=both, headers=owner), 400, param="expires_in")
    naive = {"expires_at": "2099-01-01T00:00:00"}  # a time without its zone is ambiguous
    assert_error(await http.post("/v1/keys", json=naive, headers=owner), 400)
    assert_error(await http.post("/v1/keys", json={"expires_in": 0}, headers=owner), 400)


async def test_rotation_gives_a_new_key_and_the_old_one_works_until_its_grace_ends(
    clocked: tuple[httpx.AsyncClient, ManualClock],
) -> None:
    http, clock = clocked
    account = await new_account(http)
    owner = bearer(account["api_key"])
    old = (
        await http.post("/v1/keys", json={"name": "ci", "limits": {"requests_per_minute": 9}}, headers=owner)
    ).json()
    rotated = await http.post(f"/v1/keys/{old['id']}/rotate", json={"grace_seconds": 300}, headers=owner)
    assert rotated.status_code == 201, rotated.text
    new = rotated.json()
    assert new["id"] != old["id"] and new["api_key"] != old["api_key"]
    assert (new["name"], new["kind"], new["limits"], new["expires_at"]) == (
        "ci",
        "account",
        old["limits"],
        None,
    )
    for key in (old, new):
        assert (await http.get("/v1/keys", headers=bearer(key["api_key"]))).status_code == 200
    clock.advance(299)
    assert (await http.get("/v1/keys", headers=bearer(old["api_key"]))).status_code == 200
    clock.advance(2)
    assert_error(await http.get("/v1/keys", headers=bearer(old["api_key"])), 401, "expired_api_key")
    assert (await http.get("/v1/keys", headers=bearer(new["api_key"]))).status_code == 200
    # an expired key is not rotated again
    assert_error(await http.post(f"/v1/keys/{old['id']}/rotate", headers=owner), 404, "key_not_found")


async def test_rotating_an_expiring_key_gives_a_key_that_expires_when_the_old_one_was_to(
    clocked: tuple[httpx.AsyncClient, ManualClock],
) -> None:
    http, clock = clocked
    owner = bearer((await new_account(http))["api_key"])
    old = (await http.post("/v1/keys", json={"name": "ci", "expires_in": 3600}, headers=owner)).json()
    rotated = await http.post(f"/v1/keys/{old['id']}/rotate", json={"grace_seconds": 60}, headers=owner)
    new = rotated.json()
    assert new["expires_at"] == old["expires_at"] is not None  # not the grace's end, and not never
    clock.advance(3599)
    assert (await http.get("/v1/keys", headers=bearer(new["api_key"]))).status_code == 200
    clock.advance(2)
    assert_error(await http.get("/v1/keys", headers=bearer(new["api_key"])), 401, "expired_api_key")


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
async def test_rotating_a_deployment_key_without_grace_ends_it_at_once(world: dict[str, Any]) -> None:
    http, a = world["http"], world["a"]
    listed = (await http.get("/v1/keys", headers=bearer(a["api_key"]))).json()["data"]
    [scoped] = [key for key in listed if key["kind"] == "deployment"]
    new = (await http.post(f"/v1/keys/{scoped['id']}/rotate", headers=bearer(a["api_key"]))).json()
    assert (new["kind"], new["deployments"]) == ("deployment", [world["emb1"]["id"]])
    assert_error(await call(http, CALLER_ROUTE, bearer(world["scoped"])), 401, "expired_api_key")
    assert (await call(http, CALLER_ROUTE, bearer(new["api_key"]))).status_code == 200
