"""The Conversations API through the official `openai` SDK, in process, on SQLite and PostgreSQL: the
routes, their shapes, paging and refusals. (Turns generated with `conversation`, across a restart and
through two gateway processes: tests/test_responses.py, tests/test_gateway_processes.py.)"""

from __future__ import annotations

import httpx
import openai
import pytest

from tests.helpers import bearer, new_account


def sdk(http: httpx.AsyncClient, key: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(
        base_url=str(http.base_url.join("/v1")), api_key=key, http_client=http, max_retries=0
    )


async def test_a_conversation_and_its_items_go_through_every_route(client: httpx.AsyncClient) -> None:
    account = await new_account(client)
    api = sdk(client, account["api_key"])
    made = await api.conversations.create(
        items=[{"role": "user", "content": f"turn {n}"} for n in range(5)], metadata={"a": "1"}
    )
    assert made.object == "conversation" and made.metadata == {"a": "1"} and made.created_at > 0
    pages = []
    page = await api.conversations.items.list(made.id, order="asc", limit=2)
    while True:
        pages.append([item.content[0].text for item in page.data])  # type: ignore[union-attr]
        if not page.has_next_page():
            break
        page = await page.get_next_page()
    assert pages == [["turn 0", "turn 1"], ["turn 2", "turn 3"], ["turn 4"]]
    newest = await api.conversations.items.list(made.id, limit=1)
    assert newest.data[0].content[0].text == "turn 4" and newest.has_more  # type: ignore[union-attr]
    added = await api.conversations.items.create(
        made.id, items=[{"type": "function_call_output", "call_id": "c1", "output": "42"}]
    )
    assert added.object == "list" and added.first_id == added.last_id == added.data[0].id
    item = await api.conversations.items.retrieve(added.data[0].id, conversation_id=made.id)
    assert item.type == "function_call_output" and item.output == "42"  # type: ignore[union-attr]
    assert (await api.conversations.items.delete(item.id, conversation_id=made.id)).id == made.id  # type: ignore[union-attr]
    assert len((await api.conversations.items.list(made.id, limit=100)).data) == 5
    updated = await api.conversations.update(made.id, metadata={"b": "2"})
    assert updated.metadata == {"b": "2"} and updated.created_at == made.created_at
    deleted = await api.conversations.delete(made.id)
    assert (deleted.id, deleted.object, deleted.deleted) == (made.id, "conversation.deleted", True)
    with pytest.raises(openai.NotFoundError):
        await api.conversations.items.list(made.id)


async def test_another_accounts_conversation_is_a_404_on_every_route(client: httpx.AsyncClient) -> None:
    owner, stranger = await new_account(client, "owner"), await new_account(client, "stranger")
    mine = await sdk(client, owner["api_key"]).conversations.create(items=[{"role": "user", "content": "x"}])
    item = (await sdk(client, owner["api_key"]).conversations.items.list(mine.id)).data[0]
    base, key = f"/v1/conversations/{mine.id}", bearer(stranger["api_key"])
    for method, path, body in (
        ("GET", base, None),
        ("POST", base, {"metadata": {}}),
        ("DELETE", base, None),
        ("GET", f"{base}/items", None),
        ("POST", f"{base}/items", {"items": [{"role": "user", "content": "y"}]}),
        ("GET", f"{base}/items/{item.id}", None),
        ("DELETE", f"{base}/items/{item.id}", None),
    ):
        answer = await client.request(method, path, json=body, headers=key)
        assert answer.status_code == 404, (method, path, answer.text)
        assert answer.json()["error"]["type"] == "not_found_error"
    assert len((await sdk(client, owner["api_key"]).conversations.items.list(mine.id)).data) == 1
