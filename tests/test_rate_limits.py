"""Rate limits of keys and accounts (issue 31), through HTTP against `modelhost serve --workers 3`.

Every gateway process counts limited requests in the server's one shared table (auth/limit_table.py),
so the counts hold whichever of the three serves it: requests are sent through each in turn
(`Server.via`). Limits are
set through the API (the operator's on the account, the account's on its keys) and the answers are
OpenAI's: 429 `rate_limit_exceeded` with `Retry-After`, and `x-ratelimit-*` on every answer.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.helpers import ADMIN_KEY, assert_error, bearer
from tests.server_process import ST_RECIPE, Server, server_with, stopped, until

WORKERS = 3


@dataclass
class Limited:
    server: Server
    account_id: str
    account_key: str  # of an account whose limits the tests set
    deployment_id: str

    def admin(self, method: str, path: str, **body: Any) -> httpx.Response:
        return httpx.request(method, f"{self.server.url}{path}", json=body or None, headers=bearer(ADMIN_KEY))

    def account(self, method: str, path: str, **body: Any) -> httpx.Response:
        return httpx.request(
            method, f"{self.server.url}{path}", json=body or None, headers=bearer(self.account_key)
        )

    def new_key(self, **limits: int) -> str:
        created = self.account("POST", "/v1/keys", name="limited", limits=limits)
        assert created.status_code == 201, created.text
        secret: str = created.json()["api_key"]
        return secret

    async def post(self, key: str, path: str, body: dict[str, Any], pid: int | None = None) -> httpx.Response:
        """`body` posted to `path` with `key`, through gateway process `pid` (else whichever accepts)."""

        async def send() -> httpx.Response:
            async with httpx.AsyncClient(base_url=self.server.url, timeout=60) as client:
                return await client.post(path, json=body, headers=bearer(key))

        if pid is None:
            return await send()
        answer: httpx.Response = await (await self.server.via(pid, send))
        return answer

    async def embed(self, key: str, text: str = "hello there", pid: int | None = None) -> httpx.Response:
        """`text` embedded with `key`, through gateway process `pid` (else whichever accepts)."""
        return await self.post(key, "/v1/embeddings", {"model": "m", "input": text}, pid)


@pytest.fixture(scope="module")
async def limited(tmp_path_factory: pytest.TempPathFactory, recipes: Path) -> AsyncIterator[Limited]:
    quick_billing = {"MODELHOST_BILLING_TICK_SECONDS": "1", "MODELHOST_BILLING_BALANCE_CACHE_SECONDS": "0.2"}
    async with server_with(tmp_path_factory.mktemp("limits"), WORKERS, **quick_billing) as server:
        created = httpx.post(
            f"{server.url}/v1/admin/accounts",
            json={"name": "limited", "limits": {"requests_per_minute": 1000, "concurrent_requests": 50}},
            headers=bearer(ADMIN_KEY),
        )
        assert created.status_code == 201, created.text
        account = created.json()
        server.key = account["api_key"]  # `Server.deploy` deploys for this account
        deployment_id = await server.deploy(
            recipes.joinpath(*ST_RECIPE), "feature-extraction", "m", readiness="warm"
        )
        await server.ready(deployment_id)
        yield Limited(server, account["id"], account["api_key"], deployment_id)


def test_limits_are_set_on_accounts_and_keys_and_a_key_cannot_exceed_its_account(limited: Limited) -> None:
    account = limited.admin("GET", f"/v1/admin/accounts/{limited.account_id}").json()
    assert account["limits"] == {
        "requests_per_minute": 1000,
        "tokens_per_minute": None,
        "concurrent_requests": 50,
        "credits_per_day": None,
        "credits_per_month": None,
    }
    above = limited.account("POST", "/v1/keys", limits={"requests_per_minute": 1001})
    assert_error(above, 400, code="limit_above_account", param="limits.requests_per_minute")
    created = limited.account("POST", "/v1/keys", name="k", limits={"tokens_per_minute": 5000})
    assert created.status_code == 201, created.text  # a limit the account does not have: any value
    key = created.json()
    assert key["limits"]["tokens_per_minute"] == 5000 and key["limits"]["requests_per_minute"] is None
    changed = limited.account("PATCH", f"/v1/keys/{key['id']}", limits={"concurrent_requests": 51})
    assert_error(changed, 400, code="limit_above_account", param="limits.concurrent_requests")
    changed = limited.account("PATCH", f"/v1/keys/{key['id']}", limits={"concurrent_requests": 5})
    assert changed.status_code == 200 and changed.json()["limits"]["concurrent_requests"] == 5
    assert changed.json()["limits"]["tokens_per_minute"] is None  # replaced whole
    listed = {k["id"]: k for k in limited.account("GET", "/v1/keys").json()["data"]}
    assert listed[key["id"]]["limits"]["concurrent_requests"] == 5
    removed = limited.account("PATCH", f"/v1/keys/{key['id']}", limits=None)
    assert removed.status_code == 200 and removed.json()["limits"] is None
    bad = limited.account("POST", "/v1/keys", limits={"requests_per_minute": 0})
    assert_error(bad, 400, param="limits.requests_per_minute")
    unknown = limited.admin("PATCH", "/v1/admin/accounts/acct_nope", limits={"requests_per_minute": 1})
    assert_error(unknown, 404, code="account_not_found")


async def test_requests_per_minute_hold_exactly_across_the_gateway_processes(limited: Limited) -> None:
    key = limited.new_key(requests_per_minute=4)
    gateways = limited.server.gateways()
    answers = [await limited.embed(key, pid=gateways[i % WORKERS]) for i in range(6)]
    assert [a.status_code for a in answers] == [200, 200, 200, 200, 429, 429]
    assert [a.headers["x-ratelimit-remaining-requests"] for a in answers] == ["3", "2", "1", "0", "0", "0"]
    assert all(a.headers["x-ratelimit-limit-requests"] == "4" for a in answers)
    refused = answers[4]
    assert_error(refused, 429, code="rate_limit_exceeded")
    assert refused.json()["error"]["type"] == "requests"
    assert 1 <= int(refused.headers["retry-after"]) <= 15  # one request refills in 60 / 4 s
    assert "requests per minute: limit 4" in refused.json()["error"]["message"]
    assert "x-ratelimit-limit-tokens" not in refused.headers  # no token limit: no token headers
    [listed] = [k for k in limited.account("GET", "/v1/keys").json()["data"] if key.startswith(k["prefix"])]
    assert listed["use"] == {"in_flight": 0, "requests_remaining": 0, "tokens_remaining": None}


async def test_concurrent_requests_are_refused_while_the_limit_is_in_flight_and_freed_when_done(
    limited: Limited,
) -> None:
    key = limited.new_key(concurrent_requests=1)
    first, second, _ = limited.server.gateways()
    [replica] = limited.server.replicas(limited.deployment_id)
    with stopped(replica):  # the first request waits in the replica's socket: in flight
        held = await limited.server.via(second, lambda: limited.embed(key))
        await until(lambda: sum(limited.server.in_flight(limited.deployment_id).values()) == 1)
        refused = await limited.embed(key, pid=first)
        assert_error(refused, 429, code="rate_limit_exceeded")
        assert (
            refused.json()["error"]["type"] == "concurrent_requests" and refused.headers["retry-after"] == "1"
        )
    assert (await held).status_code == 200
    assert (await limited.embed(key, pid=first)).status_code == 200  # its place is back


async def test_tokens_per_minute_count_the_input_tokens_of_each_request(limited: Limited) -> None:
    first_answer = await limited.embed(limited.new_key(), "count my tokens please")
    tokens = first_answer.json()["usage"]["total_tokens"]
    key = limited.new_key(tokens_per_minute=2 * tokens - 1)  # room for one, then a remainder under one
    gateways = limited.server.gateways()
    first = await limited.embed(key, "count my tokens please", pid=gateways[1])
    assert first.status_code == 200 and first.headers["x-ratelimit-remaining-tokens"] == str(2 * tokens - 1)
    second = await limited.embed(key, "count my tokens please", pid=gateways[2])
    assert second.status_code == 200 and second.headers["x-ratelimit-remaining-tokens"] == str(tokens - 1)
    third = await limited.embed(key, "count my tokens please", pid=gateways[0])
    assert_error(third, 429, code="rate_limit_exceeded")
    assert third.json()["error"]["type"] == "tokens"
    assert third.headers["x-ratelimit-remaining-tokens"] == "0"


@pytest.fixture(scope="module")
async def chat_model(limited: Limited, recipes: Path) -> str:
    """A warm chat deployment beside the embeddings one: its model name."""
    deployment_id = await limited.server.deploy(
        recipes / "t11_text_generation_chat", "text-generation", "chat", readiness="warm"
    )
    await limited.server.ready(deployment_id)
    return "chat"


CHAT = {"messages": [{"role": "user", "content": "count these"}], "max_tokens": 5, "temperature": 0}


async def test_tokens_per_minute_count_prompt_and_completion_of_chat_answers_and_streams(
    limited: Limited, chat_model: str
) -> None:
    gateways = limited.server.gateways()
    body = {"model": chat_model, **CHAT}
    measured = await limited.post(limited.new_key(), "/v1/chat/completions", body, gateways[0])
    usage = measured.json()["usage"]
    tokens = usage["prompt_tokens"] + usage["completion_tokens"]
    assert usage["completion_tokens"] == 5 and usage["total_tokens"] == tokens
    limit = tokens + tokens // 2  # room for one answer, then half of one: taken below zero by the second
    key = limited.new_key(tokens_per_minute=limit)
    first = await limited.post(key, "/v1/chat/completions", body, gateways[1])
    assert first.status_code == 200 and first.headers["x-ratelimit-remaining-tokens"] == str(limit)
    streamed = await limited.post(key, "/v1/chat/completions", {**body, "stream": True}, gateways[2])
    assert streamed.status_code == 200 and "data: [DONE]" in streamed.text
    assert int(streamed.headers["x-ratelimit-remaining-tokens"]) < tokens  # the first answer's are gone
    third = await limited.post(key, "/v1/chat/completions", body, gateways[0])
    assert_error(third, 429, code="rate_limit_exceeded")  # the stream's went too: half a minute to refill
    assert third.json()["error"]["type"] == "tokens"


async def test_a_background_response_takes_its_tokens_when_it_ends(limited: Limited, chat_model: str) -> None:
    """Its request is answered `queued` at once, so its tokens come off the key's bucket when the
    generation ends, from whichever process ran it."""
    gateways = limited.server.gateways()
    body = {"model": chat_model, "input": "count these", "max_output_tokens": 5, "temperature": 0}
    background = {**body, "background": True, "store": True}
    measured = await limited.post(limited.new_key(), "/v1/responses", body, gateways[0])
    tokens = measured.json()["usage"]["total_tokens"]
    key = limited.new_key(tokens_per_minute=tokens // 2)  # half of one response: a minute to refill
    queued = await limited.post(key, "/v1/responses", background, gateways[1])
    assert queued.status_code == 200 and queued.json()["status"] == "queued", queued.text

    def tokens_left() -> int:
        listed = limited.account("GET", "/v1/keys").json()["data"]
        [found] = [k for k in listed if key.startswith(k["prefix"])]
        left: int = found["use"]["tokens_remaining"]
        return left

    await until(lambda: tokens_left() == 0, timeout=60)  # the queued answer used none: the generation did
    answer = await limited.post(key, "/v1/chat/completions", {"model": chat_model, **CHAT}, gateways[2])
    assert_error(answer, 429, code="rate_limit_exceeded")
    assert answer.json()["error"]["type"] == "tokens"
    view = httpx.get(f"{limited.server.url}/v1/responses/{queued.json()['id']}", headers=bearer(key)).json()
    assert view["status"] == "incomplete" and view["usage"]["total_tokens"] == tokens  # at max_output_tokens


async def test_the_accounts_limit_binds_every_key_and_a_change_applies_to_the_next_request(
    limited: Limited,
) -> None:
    keys = [limited.new_key(), limited.new_key()]
    changed = limited.admin(
        "PATCH", f"/v1/admin/accounts/{limited.account_id}", limits={"concurrent_requests": 1}
    )
    assert changed.status_code == 200 and changed.json()["limits"]["concurrent_requests"] == 1
    try:
        [replica] = limited.server.replicas(limited.deployment_id)
        with stopped(replica):
            first = await limited.server.via(limited.server.gateways()[1], lambda: limited.embed(keys[0]))
            await until(lambda: sum(limited.server.in_flight(limited.deployment_id).values()) == 1)
            other_key = await limited.embed(keys[1], pid=limited.server.gateways()[2])
            assert_error(other_key, 429, code="rate_limit_exceeded")
            assert "account " in other_key.json()["error"]["message"]
        assert (await first).status_code == 200
    finally:
        limited.admin("PATCH", f"/v1/admin/accounts/{limited.account_id}", limits=None)
    assert (await limited.embed(keys[1])).status_code == 200


async def test_the_openai_sdk_sees_the_headers_and_its_retry_succeeds_after_the_refill(
    limited: Limited,
) -> None:
    import openai

    key = limited.new_key(requests_per_minute=60)  # one request back every second
    client = openai.AsyncOpenAI(base_url=f"{limited.server.url}/v1", api_key=key, max_retries=0)
    admitted = 0
    with pytest.raises(openai.RateLimitError) as refused:  # 60, and those refilled while they ran
        while admitted < 120:
            await client.embeddings.create(model="m", input="hi")
            admitted += 1
    assert admitted >= 60
    assert refused.value.response.headers["x-ratelimit-remaining-requests"] == "0"
    retrying = openai.AsyncOpenAI(base_url=f"{limited.server.url}/v1", api_key=key, max_retries=3)
    raw = await retrying.embeddings.with_raw_response.create(model="m", input="hi")
    assert raw.http_response.status_code == 200
    assert raw.headers["x-ratelimit-limit-requests"] == "60"
    assert len(raw.parse().data[0].embedding) > 0


async def test_a_spend_cap_on_the_account_refuses_inference_with_insufficient_quota_until_raised(
    limited: Limited,
) -> None:
    """The account's warm deployment is billed every second: a cap of one micro-credit a day is soon
    spent, and inference is a 429 `insufficient_quota` (OpenAI's) on every gateway process."""
    on_key = limited.account("POST", "/v1/keys", limits={"credits_per_day": 5})
    assert_error(on_key, 400, code="spend_cap_on_key", param="limits.credits_per_day")
    capped = limited.admin(
        "PATCH", f"/v1/admin/accounts/{limited.account_id}", limits={"credits_per_day": 0.000001}
    )
    assert capped.status_code == 200 and capped.json()["limits"]["credits_per_day"] == 0.000001
    try:
        key = limited.new_key()
        deadline = time.monotonic() + 30
        while (answer := await limited.embed(key)).status_code != 429:  # billed at the next tick
            assert answer.status_code == 200 and time.monotonic() < deadline, answer.text
            await asyncio.sleep(0.2)
        assert_error(answer, 429, code="insufficient_quota")
        assert answer.json()["error"]["type"] == "insufficient_quota"
        assert "credits per day" in answer.json()["error"]["message"]
        assert 1 <= int(answer.headers["retry-after"]) <= 86400  # the next UTC day
        for pid in limited.server.gateways():  # the ledger's: every process sees it
            assert (await limited.embed(key, pid=pid)).status_code == 429
    finally:
        limited.admin("PATCH", f"/v1/admin/accounts/{limited.account_id}", limits=None)
    assert (await limited.embed(key)).status_code == 200


async def test_a_gateway_process_that_dies_gives_back_the_places_of_its_requests_in_flight(
    limited: Limited,
) -> None:
    """Each process counts its own requests in flight in its column of the shared table: when one dies,
    the supervisor clears its column, and the places it held are free on every other process."""
    key = limited.new_key(concurrent_requests=1)
    first, second, third = limited.server.gateways()
    [replica] = limited.server.replicas(limited.deployment_id)
    with stopped(replica):  # the request waits in the replica's socket: in flight on the second
        held = await limited.server.via(second, lambda: limited.embed(key))
        await until(lambda: sum(limited.server.in_flight(limited.deployment_id).values()) == 1)
        assert_error(await limited.embed(key, pid=first), 429, code="rate_limit_exceeded")
        os.kill(second, signal.SIGKILL)
        with pytest.raises(httpx.TransportError):
            await held

    def in_flight() -> int:
        [listed] = [
            k for k in limited.account("GET", "/v1/keys").json()["data"] if key.startswith(k["prefix"])
        ]
        count: int = listed["use"]["in_flight"]
        return count

    await until(lambda: in_flight() == 0)
    answer = await limited.embed(key, pid=first)
    assert answer.status_code == 200, answer.text
    replacement = await until(lambda: set(limited.server.gateways()) - {first, second, third})
    await limited.server.serving(replacement.pop())
