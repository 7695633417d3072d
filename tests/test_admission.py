"""Admission, one rule for every route (issue 70; docs/security.md, "Admission"; `api.admission`): every
keyed route that stores data or starts work answers 402 for an account without credits and 429 for a
key past its limits, before it reads its body. Generated over the OpenAPI document, so that a route
added later is admitted without anyone remembering, and its exemptions are pinned here."""

from __future__ import annotations

import re
from typing import Any

import httpx
import pytest

from modelhost.api.admission import EXEMPT, STATE_CHANGING, STOPS
from tests.helpers import assert_error, bearer, new_account

SQLITE = pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)

# Reads that start work (they ask a replica, which may load a cold deployment for them)
READS_THAT_START_WORK = {("GET", "/tokenizer_info")}
# Reads and removals of the Files API, counted against the rate limits (docs/batch.md)
LIMITED = {
    ("GET", "/v1/files"),
    ("GET", "/v1/files/{file_id}"),
    ("GET", "/v1/files/{file_id}/content"),
    ("DELETE", "/v1/files/{file_id}"),
}


def _keyed(document: dict[str, Any]) -> list[tuple[str, str]]:
    """Every keyed route of the document but the operator's (an account's routes)."""
    return [
        (method.upper(), path)
        for path, item in document["paths"].items()
        for method, operation in item.items()
        if operation.get("security") and not path.startswith("/v1/admin")
    ]


def _stores_or_starts(method: str, path: str) -> bool:
    """This test's own reading of the rule: a state-changing route that does not only stop work, and is
    not one of the exemptions (who may act), or a read that starts work."""
    if (method, path) in READS_THAT_START_WORK:
        return True
    stops = path.endswith(("/cancel", "/pause")) or (method, path) in STOPS  # OpenAI's cancel of an eval run
    return method in STATE_CHANGING and not stops and (method, path) not in EXEMPT


def test_the_only_routes_exempt_from_admission_are_those_that_change_who_may_act() -> None:
    """Each exemption is a key, a person (their role's quota and weight too: an account out of credits lowers
    its people's quotas and reorders its keys' shares) or the MCP allow-list: what an account out of credits
    must still manage (a leaked key is rotated or revoked at 0 credits). Anything else that stores data or
    starts work is admitted: adding an exemption means changing this test, with its reason."""
    exempt = ("/v1/keys", "/v1/users", "/v1/role-quotas", "/v1/role-weights", "/v1/mcp-servers")
    assert all(path.startswith(exempt) for _, path in EXEMPT)
    assert all(reason.startswith("who may act") for reason in EXEMPT.values())


@SQLITE
async def test_every_route_that_stores_data_or_starts_work_is_402_without_credits_and_429_past_the_limits(
    client: httpx.AsyncClient,
) -> None:
    broke = bearer((await new_account(client, "broke", credits=0))["api_key"])
    rich = await new_account(client, "rich")
    made = await client.post(
        "/v1/keys", json={"limits": {"requests_per_minute": 1}}, headers=bearer(rich["api_key"])
    )
    assert made.status_code == 201, made.text
    limited = bearer(made.json()["api_key"])
    spent = await client.post("/v1/conversations", json={}, headers=limited)  # its one request this minute
    assert spent.status_code == 200, spent.text
    document = (await client.get("/openapi.json")).json()
    routes = _keyed(document)
    admitted = [(m, p) for m, p in routes if _stores_or_starts(m, p)]
    # Files, batches, imports, uploads, Conversations, deployments, agents, inference... and what comes next
    assert {("POST", "/v1/files"), ("POST", "/v1/batches"), ("POST", "/v1/conversations")} <= set(admitted)
    assert ("POST", "/v1/model-artifacts/{artifact_id}/imports") in admitted
    assert len(admitted) > 45
    wrong: list[tuple[str, str, str, int]] = []
    for method, path in routes:
        concrete = re.sub(r"\{[^}]+\}", "x", path)
        without_credits = await client.request(method, concrete, json={}, headers=broke)
        past_limits = await client.request(method, concrete, json={}, headers=limited)
        if (method, path) in admitted:
            if without_credits.status_code != 402:
                wrong.append((method, path, "without credits", without_credits.status_code))
            elif path.startswith("/v1/messages"):  # Anthropic's error shape
                assert without_credits.json()["error"]["type"] == "billing_error"
            else:
                assert_error(without_credits, 402, "insufficient_credits")
            if past_limits.status_code != 429:
                wrong.append((method, path, "past its limits", past_limits.status_code))
        else:
            if without_credits.status_code == 402:  # removals, reads, who may act: at 0 credits too
                wrong.append((method, path, "refused without credits", 402))
            if ((method, path) in LIMITED) != (past_limits.status_code == 429):
                wrong.append((method, path, "rate limits", past_limits.status_code))
    assert wrong == []


@SQLITE
async def test_conversations_are_admitted_a_broke_account_stores_nothing_and_a_limited_key_makes_one_a_minute(
    client: httpx.AsyncClient,
) -> None:
    """S9 as the review did it: a 0-credit account stored 24 MiB of conversation items in 2 s, and a key
    of 1 request a minute made 6 conversations in a row."""
    broke = await new_account(client, "broke-talker", credits=0)
    items = [{"type": "message", "role": "user", "content": "x" * 100_000}]
    refused = await client.post("/v1/conversations", json={"items": items}, headers=bearer(broke["api_key"]))
    assert_error(refused, 402, "insufficient_credits")
    rich = await new_account(client, "talker")
    made = await client.post(
        "/v1/keys", json={"limits": {"requests_per_minute": 1}}, headers=bearer(rich["api_key"])
    )
    limited = bearer(made.json()["api_key"])
    statuses = [
        (await client.post("/v1/conversations", json={}, headers=limited)).status_code for _ in range(6)
    ]
    assert statuses == [200] + [429] * 5
