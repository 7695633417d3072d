"""Quotas per person (issue 72; docs/limits.md, "Quotas per person"): tokens and requests per UTC day and
month, counted over every key a person owns and their sign-in sessions, set per person and per role,
refused as OpenAI refuses a quota, shown in `GET /v1/me`, and stored so that every gateway process and
a restart see the same use, on SQLite and PostgreSQL."""

from __future__ import annotations

import hashlib
import secrets
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from modelhost.auth.quotas import Person, PersonQuotas, Quota, periods
from modelhost.container import Services
from modelhost.errors import InsufficientQuota
from modelhost.store.models import SsoSession
from modelhost.store.types import new_id, utcnow
from tests.conftest import make_settings
from tests.helpers import ADMIN_KEY, assert_error, bearer, new_account
from tests.live import live_server

CSRF = "c" * 43


class Clock:
    """Wall-clock and monotonic time the test moves."""

    def __init__(self, now_ms: int) -> None:
        self.ms = now_ms
        self.seconds = 100.0

    def now_ms(self) -> int:
        return self.ms

    def monotonic(self) -> float:
        return self.seconds


async def _person(http: httpx.AsyncClient, owner_key: str, email: str, role: str) -> tuple[str, str]:
    """A person added with `role`, and a key the owner made for them: (user ID, key)."""
    added = await http.post("/v1/users", json={"email": email, "role": role}, headers=bearer(owner_key))
    assert added.status_code == 201, added.text
    return added.json()["id"], await _key_of(http, owner_key, added.json()["id"])


async def _key_of(http: httpx.AsyncClient, owner_key: str, user_id: str) -> str:
    made = await http.post("/v1/keys", json={"user_id": user_id}, headers=bearer(owner_key))
    assert made.status_code == 201, made.text
    key: str = made.json()["api_key"]
    return key


def _signed_in(services: Services, user_id: str, account_id: str) -> str:
    """A sign-in session of the person in the account, as the provider's callback opens one: its secret."""
    secret = "mhs-" + secrets.token_urlsafe(32)
    with services.database.transaction() as session:
        session.add(
            SsoSession(
                id=new_id("ses"),
                secret_hash=hashlib.sha256(secret.encode()).hexdigest(),
                user_id=user_id,
                account_id=account_id,
                operator=False,
                csrf_token=CSRF,
                id_token="-",
                created_at=utcnow(),
                last_seen_at=utcnow(),
            )
        )
    return secret


async def _call(http: httpx.AsyncClient, headers: dict[str, str]) -> httpx.Response:
    """One admitted request that needs no model: a new conversation."""
    return await http.post("/v1/conversations", json={}, headers=headers)


async def _me(http: httpx.AsyncClient, key: str) -> dict[str, Any]:
    answer = await http.get("/v1/me", headers=bearer(key))
    assert answer.status_code == 200, answer.text
    me: dict[str, Any] = answer.json()
    return me


async def test_a_persons_quota_counts_every_key_they_own_and_their_sessions(
    client: httpx.AsyncClient, services: Services
) -> None:
    account = await new_account(client, "quotas")
    owner = account["api_key"]
    user_id, first = await _person(client, owner, "ann@example.com", "developer")
    second = await _key_of(client, owner, user_id)
    session = _signed_in(services, user_id, account["id"])
    patched = await client.patch(
        f"/v1/users/{user_id}", json={"quota": {"requests_per_day": 3}}, headers=bearer(owner)
    )
    assert patched.status_code == 200, patched.text
    assert patched.json()["quota"] == {
        "requests_per_day": 3,
        "requests_per_month": None,
        "tokens_per_day": None,
        "tokens_per_month": None,
    }
    for headers in (bearer(first), bearer(second), bearer(session)):
        assert (await _call(client, headers)).status_code == 200
    for headers in (bearer(first), bearer(second), bearer(session)):
        refused = await _call(client, headers)
        body = assert_error(refused, 429, "insufficient_quota", "insufficient_quota")
        assert f"Quota reached for user {user_id} on requests per day: limit 3 (3 used)" in body["message"]
        assert refused.headers["x-ratelimit-limit-requests"] == "3"
        assert refused.headers["x-ratelimit-remaining-requests"] == "0"
        wait = int(refused.headers["Retry-After"])
        assert 1 <= wait <= 86400  # until the next UTC day
        assert refused.headers["x-ratelimit-reset-requests"].endswith("s")
    assert (await _call(client, bearer(owner))).status_code == 200  # a service key has no quota
    me = await _me(client, first)
    assert me["quota"]["source"] == "person"
    assert me["quota"]["limits"]["requests_per_day"] == 3
    day, month = me["quota"]["day"], me["quota"]["month"]
    assert (day["requests"], day["requests_remaining"]) == (3, 0)
    assert (day["tokens"], day["tokens_remaining"]) == (0, None)
    assert (month["requests"], month["requests_remaining"]) == (3, None)
    assert day["period"] == datetime.now(UTC).date().isoformat() and month["period"] == day["period"][:7]
    assert (await _me(client, owner))["quota"] is None
    # removed, the person may call again at once (their role has no default)
    cleared = await client.patch(f"/v1/users/{user_id}", json={"quota": None}, headers=bearer(owner))
    assert cleared.json()["quota"] is None
    assert (await _call(client, bearer(second))).status_code == 200
    assert (await _me(client, first))["quota"]["day"]["requests"] == 4  # every admitted request counts


async def test_a_roles_default_quota_applies_until_the_persons_own_replaces_it(
    client: httpx.AsyncClient, services: Services
) -> None:
    account = await new_account(client, "roles")
    owner = account["api_key"]
    dev_id, dev = await _person(client, owner, "dev@example.com", "developer")
    _, admin = await _person(client, owner, "admin@example.com", "admin")
    set_default = await client.patch(
        "/v1/role-quotas", json={"developer": {"requests_per_month": 1}}, headers=bearer(admin)
    )
    assert set_default.status_code == 200, set_default.text
    assert set_default.json()["developer"]["requests_per_month"] == 1 and set_default.json()["owner"] is None
    listed = (await client.get("/v1/role-quotas", headers=bearer(dev))).status_code
    assert listed == 403  # `users:read`: the account's admins
    assert (await _call(client, bearer(dev))).status_code == 200
    refused = await _call(client, bearer(dev))
    assert_error(refused, 429, "insufficient_quota")
    assert "requests per month: limit 1 (1 used)" in refused.json()["error"]["message"]
    me = (await _me(client, dev))["quota"]
    assert (me["source"], me["month"]["requests_remaining"]) == ("role", 0)
    own = {"quota": {"requests_per_month": 5}}
    assert (await client.patch(f"/v1/users/{dev_id}", json=own, headers=bearer(admin))).status_code == 200
    assert (await _call(client, bearer(dev))).status_code == 200  # their own replaces the role's
    assert (await _me(client, dev))["quota"]["source"] == "person"
    # an admin may not set the owners' default (an owner can do more); the owner may, and remove it
    too_high = await client.patch(
        "/v1/role-quotas", json={"owner": {"tokens_per_day": 10}}, headers=bearer(admin)
    )
    assert_error(too_high, 403, "permission_denied")
    removed = await client.patch("/v1/role-quotas", json={"developer": None}, headers=bearer(owner))
    assert removed.json()["developer"] is None
    assert (await client.get("/v1/role-quotas", headers=bearer(owner))).json()["developer"] is None


async def test_tokens_count_when_requests_end_and_refuse_the_next_request(
    client: httpx.AsyncClient, services: Services
) -> None:
    account = await new_account(client, "tokens")
    owner = account["api_key"]
    user_id, key = await _person(client, owner, "tok@example.com", "developer")
    quota = {"quota": {"tokens_per_day": 100}}
    assert (await client.patch(f"/v1/users/{user_id}", json=quota, headers=bearer(owner))).status_code == 200
    assert (await _call(client, bearer(key))).status_code == 200
    services.quotas.ended(Person(account["id"], user_id), 100)  # what a generation's end adds
    refused = await _call(client, bearer(key))
    assert_error(refused, 429, "insufficient_quota")
    assert refused.headers["x-ratelimit-limit-tokens"] == "100"
    assert refused.headers["x-ratelimit-remaining-tokens"] == "0"
    day = (await _me(client, key))["quota"]["day"]
    assert (day["tokens"], day["tokens_remaining"], day["requests"]) == (100, 0, 1)


async def test_use_is_stored_so_other_processes_and_a_restart_see_it(
    client: httpx.AsyncClient, services: Services
) -> None:
    """On SQLite and PostgreSQL: what one process counted reaches the table once it flushes, adds to what
    another flushed, and a process started afterwards reads it."""
    account = await new_account(client, "stored")
    user_id, _ = await _person(client, account["api_key"], "s@example.com", "developer")
    person = Person(account["id"], user_id)
    clock = Clock(services.billing.clock.now_ms())
    one, two = PersonQuotas(services.database, clock), PersonQuotas(services.database, clock)
    for _ in range(3):
        one.admitted(person)
    one.ended(person, 40)
    two.admitted(person)
    two.ended(person, 2)
    assert (await two.use(person)).day.requests == 1  # nothing flushed: its own only
    one.flush()
    two.flush()
    one.flush()  # nothing new: no change
    clock.seconds += 2  # past the refresh
    for quotas in (one, two, PersonQuotas(services.database, clock)):
        use = await quotas.use(person)
        assert (use.day.requests, use.day.tokens, use.month.requests, use.month.tokens) == (4, 42, 4, 42)
    with pytest.raises(InsufficientQuota):
        await two.require_within(person, Quota(tokens_per_month=42))
    await two.require_within(person, Quota(tokens_per_month=43, requests_per_day=5))


async def test_a_new_day_starts_at_zero_and_the_month_goes_on(
    client: httpx.AsyncClient, services: Services
) -> None:
    account = await new_account(client, "days")
    person = Person(account["id"], "user_x")
    end_of_day = int(datetime(2026, 11, 29, 23, 59, 30, tzinfo=UTC).timestamp() * 1000)
    clock = Clock(end_of_day)
    quotas = PersonQuotas(services.database, clock)
    quotas.admitted(person)
    quotas.flush()
    with pytest.raises(InsufficientQuota) as refused:
        await quotas.require_within(person, Quota(requests_per_day=1))
    assert refused.value.headers["Retry-After"] == "30"
    assert refused.value.headers["x-ratelimit-reset-requests"] == "30s"
    clock.ms += 60_000  # 30 s into the 30th
    await quotas.require_within(person, Quota(requests_per_day=1))
    use = await quotas.use(person)
    assert (use.day.period, use.day.requests, use.month.period, use.month.requests) == (
        "2026-11-30",
        0,
        "2026-11",
        1,
    )
    with pytest.raises(InsufficientQuota) as refused:
        await quotas.require_within(person, Quota(requests_per_month=1))
    assert refused.value.headers["x-ratelimit-reset-requests"] == "23h59m30s"  # to 1 December
    clock.ms += 86_400_000  # 1 December: a new month
    await quotas.require_within(person, Quota(requests_per_month=1))
    use = await quotas.use(person)
    assert (use.month.period, use.month.requests) == ("2026-12", 0)


def test_a_restarted_server_counts_on_from_what_it_stored_at_shutdown(tmp_path: Path) -> None:
    settings = make_settings(tmp_path, f"sqlite:///{tmp_path / 'q.db'}", worker_threads=1)
    with live_server(settings) as url, httpx.Client(base_url=url) as http:
        made = {"name": "restart", "credits": 10}
        owner = http.post("/v1/admin/accounts", json=made, headers=bearer(ADMIN_KEY)).json()["api_key"]
        added = http.post(
            "/v1/users", json={"email": "r@example.com", "role": "developer"}, headers=bearer(owner)
        )
        user_id = added.json()["id"]
        key = http.post("/v1/keys", json={"user_id": user_id}, headers=bearer(owner)).json()["api_key"]
        quota = {"quota": {"requests_per_month": 3}}
        assert http.patch(f"/v1/users/{user_id}", json=quota, headers=bearer(owner)).status_code == 200
        for _ in range(2):
            assert http.post("/v1/conversations", json={}, headers=bearer(key)).status_code == 200
    with live_server(settings) as url, httpx.Client(base_url=url) as http:
        assert http.get("/v1/me", headers=bearer(key)).json()["quota"]["month"]["requests"] == 2
        assert http.post("/v1/conversations", json={}, headers=bearer(key)).status_code == 200
        assert http.post("/v1/conversations", json={}, headers=bearer(key)).status_code == 429


def test_periods_are_the_utc_day_and_month_with_their_ends() -> None:
    (day, day_ends), (month, month_ends) = periods(
        int(datetime(2026, 12, 31, 12, tzinfo=UTC).timestamp() * 1000)
    )
    assert (day, month) == ("2026-12-31", "2026-12")
    assert day_ends == month_ends == int(datetime(2027, 1, 1, tzinfo=UTC).timestamp() * 1000)


def test_a_quota_of_nothing_is_no_quota() -> None:
    assert Quota.of(None) is None and Quota.of({}) is None and Quota.of({"tokens_per_day": None}) is None
    assert Quota.of({"tokens_per_day": 5}) == Quota(tokens_per_day=5)
