"""Requests without a key, one throttle for every route (issue 70, S3 and S13; docs/security.md,
"Anonymous routes"; `auth.anonymous`): every route reachable without a key is counted per client
address, 429 past its share, whatever the route. Generated over the OpenAPI document (and the pages
FastAPI serves beside it, and paths that match nothing), so that a public route added later is
throttled without anyone remembering."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from modelhost.api.app import create_app
from modelhost.auth.anonymous import COST, AnonymousThrottle
from modelhost.container import Services
from tests.conftest import make_settings
from tests.helpers import ADMIN_KEY, assert_error, bearer

BURST = 8
# what an anonymous request may be answered before the throttle refuses one
ANSWERED = {200, 204, 302, 307, 400, 401, 403, 404, 405, 422}


@pytest.fixture
async def throttled(tmp_path: Path, sqlite_url: str) -> AsyncIterator[Services]:
    settings = make_settings(tmp_path, sqlite_url, anonymous_requests_per_minute=6, anonymous_burst=BURST)
    services = Services.build(settings)
    # a clock that stands still: no unit comes back while the test runs, however long a route takes on a
    # loaded machine (/metrics reads one file per process: CI refilled a 10 s unit between two of them)
    services.anonymous = AnonymousThrottle(6, BURST, now=lambda: 0.0)
    yield services
    services.close()


def _from(services: Services, address: str) -> httpx.AsyncClient:
    app = create_app(services=services)
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False, client=(address, 40000))
    return httpx.AsyncClient(transport=transport, base_url="http://modelhost.test")


def _anonymous(document: dict[str, Any]) -> list[tuple[str, str, int]]:
    """(method, path, cost) of every operation reachable without a key: no security, or a security
    that lists the empty requirement (a key, or none: a signed link)."""
    found = []
    for path, item in document["paths"].items():
        for method, operation in item.items():
            security = operation.get("security")
            if not security or {} in security:
                found.append((method.upper(), path, int(operation.get(COST, 1))))
    return found


async def test_every_route_reachable_without_a_key_is_throttled_per_client_address(
    throttled: Services,
) -> None:
    async with _from(throttled, "198.51.100.1") as http:
        document = (await http.get("/openapi.json")).json()
    routes = _anonymous(document)
    assert {("GET", "/health"), ("GET", "/v1/auth/login"), ("GET", "/v1/files/{file_id}/content")} <= {
        (m, p) for m, p, _ in routes
    }
    extra = [("GET", "/docs", 1), ("GET", "/openapi.json", 1), ("GET", "/no/such/route", 1)]
    unthrottled: list[tuple[str, str, list[int]]] = []
    for number, (method, path, cost) in enumerate(routes + extra):
        concrete = re.sub(r"\{[^}]+\}", "x", path)
        if path == "/v1/files/{file_id}/content":
            concrete += "?expires=1&signature=00"  # a signed link: no key
        statuses: list[int] = []
        async with _from(throttled, f"198.51.100.{number + 10}") as http:  # a fresh address each
            for _ in range(BURST // min(cost, BURST) + 1):
                answer = await http.request(method, concrete, follow_redirects=False)
                statuses.append(answer.status_code)
                if answer.status_code == 429:
                    assert_error(answer, 429, "too_many_anonymous_requests", "requests")
                    assert int(answer.headers["retry-after"]) >= 1
                    break
        if statuses[-1] != 429 or not set(statuses[:-1]) <= ANSWERED:
            unthrottled.append((method, path, statuses))
    assert unthrottled == []


async def test_a_key_is_not_counted_as_anonymous_and_other_addresses_keep_their_share(
    throttled: Services,
) -> None:
    """The throttle counts requests no key checks: a keyed request from a throttled address still goes
    through, and another address is not refused because of the first."""
    async with _from(throttled, "198.51.100.200") as http:
        for _ in range(BURST + 1):
            last = await http.get("/health")
        assert last.status_code == 429
        made = await http.post("/v1/admin/accounts", json={"name": "a"}, headers=bearer(ADMIN_KEY))
        assert made.status_code == 201, made.text
    async with _from(throttled, "198.51.100.201") as http:
        assert (await http.get("/health")).status_code == 200


async def test_behind_a_trusted_proxy_each_forwarded_client_has_its_own_share(
    tmp_path: Path, sqlite_url: str
) -> None:
    """Through the gateway's own uvicorn configuration: with the proxy named in
    `MODELHOST_TRUSTED_PROXIES`, the forwarded client's address is counted (one client's sign-ins do not
    refuse everyone behind the proxy); without it, the proxy's own address is, whatever it forwards."""
    from modelhost.server.http import uvicorn_config

    async def statuses(proxies: str) -> list[int]:
        settings = make_settings(
            tmp_path, sqlite_url, anonymous_requests_per_minute=6, anonymous_burst=2, trusted_proxies=proxies
        )
        services = Services.build(settings)
        config = uvicorn_config(create_app(services=services), settings, "warning")
        config.load()
        transport = httpx.ASGITransport(app=config.loaded_app, client=("127.0.0.1", 40000))
        try:
            async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
                found = []
                for client in ("203.0.113.1", "203.0.113.1", "203.0.113.1", "203.0.113.2"):
                    answer = await http.get("/health", headers={"X-Forwarded-For": client})
                    found.append(answer.status_code)
                return found
        finally:
            services.close()

    assert await statuses("127.0.0.0/8") == [200, 200, 429, 200]
    assert await statuses("") == [200, 200, 429, 429]


def test_the_bucket_refills_at_its_rate_and_forgets_the_oldest_addresses() -> None:
    now = [100.0]
    throttle = AnonymousThrottle(per_minute=60, burst=3, max_addresses=2, now=lambda: now[0])
    assert [throttle.charge("a") for _ in range(4)] == [None, None, None, 1]
    now[0] += 1.0  # one unit back a second
    assert throttle.charge("a") is None and throttle.charge("a") == 1
    assert throttle.charge("a", cost=20) == 3  # a dearer request waits for a whole burst
    throttle.charge("b")
    throttle.charge("c")  # "a" is forgotten: its bucket is full again
    assert [throttle.charge("a") for _ in range(3)] == [None, None, None]
    assert AnonymousThrottle(per_minute=0, burst=1).charge("a", cost=100) is None  # off
