"""The Responses API through the official `openai` SDK against a live server, on the tiny recipe chat
model: the same generation as chat completions, OpenAI's event stream, stored responses chained by
`previous_response_id` (across a restart too), background responses and their cancel; conversations
(OpenAI's Conversations API) carrying each turn into the next, their items, limits and visibility."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import openai
import pytest

from tests.chat_model import WEATHER, ChatServer, served_chat_model
from tests.conftest import make_settings
from tests.helpers import ADMIN_KEY, assert_error, bearer
from tests.live import live_server

TOOL = {"type": "function", **WEATHER["function"]}  # the Responses API's flat function tool


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, recipes: Path) -> Iterator[ChatServer]:
    with served_chat_model(
        tmp_path_factory.mktemp("responses"), recipes, constrained_max_string_length=16
    ) as served:
        yield served


def client(server: ChatServer, key: str | None = None) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=key or server.key, max_retries=0)


def test_a_response_is_the_chat_completion_of_the_same_conversation(server: ChatServer) -> None:
    sdk = client(server)
    response = sdk.responses.create(
        model="chat", instructions="Be brief.", input="hello there", max_output_tokens=12, temperature=0
    )
    chat = sdk.chat.completions.create(
        model="chat",
        messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hello there"}],
        max_tokens=12,
        temperature=0,
    )
    assert response.object == "response" and response.id.startswith("resp_")
    assert response.output_text == chat.choices[0].message.content
    assert response.usage is not None and chat.usage is not None
    assert response.usage.input_tokens == chat.usage.prompt_tokens
    assert response.usage.output_tokens == chat.usage.completion_tokens
    assert response.usage.total_tokens == chat.usage.total_tokens
    if chat.choices[0].finish_reason == "length":
        assert response.status == "incomplete"
        assert response.incomplete_details is not None
        assert response.incomplete_details.reason == "max_output_tokens"
    else:
        assert response.status == "completed"
    assert response.instructions == "Be brief." and response.max_output_tokens == 12


def test_streaming_sends_openais_event_sequence_numbered_from_zero(server: ChatServer) -> None:
    sdk = client(server)
    with sdk.responses.stream(model="chat", input="tell a story", max_output_tokens=10, temperature=0) as s:
        events = list(s)
    final = events[-1].response  # type: ignore[union-attr]  # completed, or incomplete at the token limit
    kinds = [e.type for e in events]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        f"response.{final.status}",
    ]
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == final.output_text != ""
    stored = sdk.responses.retrieve(final.id)
    assert stored.output_text == final.output_text and stored.status == final.status
    assert stored.created_at == events[0].response.created_at  # type: ignore[union-attr]


def test_a_forced_function_call_then_its_output_continue_through_previous_response_id(
    server: ChatServer,
) -> None:
    sdk = client(server)
    first = sdk.responses.create(
        model="chat",
        input="what is the weather in berlin?",
        tools=[TOOL],  # type: ignore[list-item]
        tool_choice="required",
        max_output_tokens=60,
        temperature=0,
    )
    calls = [item for item in first.output if item.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "get_weather"
    jsonschema.validate(json.loads(calls[0].arguments), WEATHER["function"]["parameters"])  # type: ignore[arg-type]
    second = sdk.responses.create(
        model="chat",
        previous_response_id=first.id,
        input=[{"type": "function_call_output", "call_id": calls[0].call_id, "output": "sunny, 21 C"}],
        max_output_tokens=5,
        temperature=0,
    )
    assert second.previous_response_id == first.id
    items = sdk.responses.input_items.list(second.id, order="asc").data
    assert [item.type for item in items] == ["message", "function_call", "function_call_output"]
    assert items[1].call_id == calls[0].call_id  # type: ignore[union-attr]
    newest_first = sdk.responses.input_items.list(second.id, limit=1)
    assert newest_first.data[0].type == "function_call_output" and newest_first.has_more


def test_streamed_function_call_arguments_reassemble_to_the_call(server: ChatServer) -> None:
    sdk = client(server)
    stream = sdk.responses.create(
        model="chat",
        input="weather?",
        tools=[TOOL],  # type: ignore[list-item]
        tool_choice={"type": "function", "name": "get_weather"},
        max_output_tokens=60,
        temperature=0,
        stream=True,
    )
    events = list(stream)
    deltas = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    done = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert len(done) == 1 and done[0].arguments == deltas
    final = events[-1].response  # type: ignore[union-attr]
    assert final.output[0].arguments == deltas


def test_a_json_schema_text_format_gives_valid_json(server: ChatServer) -> None:
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    response = client(server).responses.create(
        model="chat",
        input="name a city",
        text={"format": {"type": "json_schema", "name": "city", "schema": schema, "strict": True}},
        max_output_tokens=40,
        temperature=0,
    )
    jsonschema.validate(json.loads(response.output_text), schema)


def test_fields_clients_send_are_accepted_and_misspelt_ones_refused(server: ChatServer) -> None:
    sdk = client(server)
    response = sdk.responses.create(
        model="chat",
        input=[{"role": "user", "content": [{"type": "input_text", "text": "hi"}]}],
        max_output_tokens=3,
        store=False,
        metadata={"team": "search"},
        user="u-1",
        safety_identifier="s-1",
        prompt_cache_key="k",
        service_tier="auto",
        reasoning={"summary": "auto"},
        truncation="disabled",
        parallel_tool_calls=False,
        text={"verbosity": "low"},
    )
    assert response.metadata == {"team": "search"} and response.parallel_tool_calls is False
    assert response.service_tier == "default"  # `auto`, as applied
    flex = sdk.responses.create(
        model="chat", input="hi", max_output_tokens=2, service_tier="flex", store=False
    )
    assert flex.service_tier == "flex"
    with pytest.raises(openai.NotFoundError):
        sdk.responses.retrieve(response.id)  # store: false keeps nothing
    misspelt = server.http.post(
        "/v1/responses", json={"model": "chat", "input": "hi", "max_tokens": 3}, headers=bearer(server.key)
    )
    assert_error(misspelt, 400, type_="invalid_request_error", param="max_tokens")


IMAGE_PART = {"type": "input_image", "image_url": "x"}
MCP = {"type": "mcp", "server_label": "m", "server_url": "https://mcp.example.com/mcp"}


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"tools": [{"type": "web_search"}]}, "tools[0]"),
        ({"previous_response_id": "resp_missing"}, "previous_response_id"),
        ({"background": True, "store": False}, "background"),
        ({"conversation": "conv_1", "previous_response_id": "resp_1"}, "conversation"),
        ({"conversation": {"name": "x"}}, "conversation"),
        ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0]"),
        ({"input": [{"role": "user", "content": [IMAGE_PART]}]}, "input[0].content"),  # a text-only model
        ({"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]}, "input[0]"),
        ({"tool_choice": {"type": "web_search"}, "tools": [TOOL]}, "tool_choice"),
        ({"tools": [{"type": "mcp", "server_label": "m"}]}, "tools[0].server_url"),
        ({"tools": [MCP | {"connector_id": "connector_gmail"}]}, "tools[0].connector_id"),
        ({"tools": [MCP | {"allowed_tools": {"read_only": True}}]}, "tools[0].allowed_tools.read_only"),
        ({"tools": [MCP]}, "tools[0].server_url"),  # not on the account's (empty) allow-list
        ({"tools": [MCP | {"headers": {"Host": "internal"}}]}, "tools[0].headers"),
        (
            {"input": [{"type": "mcp_approval_response", "approval_request_id": "x", "approve": True}]},
            "input[0].approval_request_id",
        ),
    ],
)
def test_what_cannot_be_served_is_a_400_naming_the_field(
    server: ChatServer, body: dict[str, Any], param: str
) -> None:
    answer = server.http.post(
        "/v1/responses", json={"model": "chat", "input": "hi", **body}, headers=bearer(server.key)
    )
    assert_error(answer, 400, type_="invalid_request_error", param=param)


def test_background_responses_complete_or_are_cancelled(server: ChatServer) -> None:
    sdk = client(server)
    queued = sdk.responses.create(model="chat", input="hi", max_output_tokens=4, background=True)
    assert queued.status in ("queued", "in_progress") and queued.background
    deadline = time.monotonic() + 60
    while (done := sdk.responses.retrieve(queued.id)).status in ("queued", "in_progress"):
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert done.status in ("completed", "incomplete") and done.output_text
    long = sdk.responses.create(model="chat", input="go on", max_output_tokens=1500, background=True)
    cancelled = sdk.responses.cancel(long.id)
    assert cancelled.status == "cancelled"
    time.sleep(0.5)
    assert sdk.responses.retrieve(long.id).status == "cancelled"
    not_background = sdk.responses.create(model="chat", input="hi", max_output_tokens=1)
    with pytest.raises(openai.BadRequestError):
        sdk.responses.cancel(not_background.id)


def dumped(events: Any) -> list[dict[str, Any]]:
    return [event.model_dump() for event in events]


def test_a_background_responses_stream_resumes_after_a_sequence_number_with_no_event_lost_or_repeated(
    server: ChatServer,
) -> None:
    """Issue 73: the client of a background stream leaves after a few events; the generation goes on,
    and `retrieve(stream=True, starting_after=N)` gives every event after N, live ones included."""
    sdk = client(server)
    first: list[Any] = []
    with sdk.responses.create(
        model="chat",
        input="tell a long story",
        max_output_tokens=200,
        temperature=0,
        background=True,
        stream=True,
        extra_body={"min_tokens": 200},  # long enough to be generating still when it is resumed
    ) as stream:
        for event in stream:
            first.append(event)
            if len(first) == 5:
                break  # the client leaves
    response_id = first[0].response.id
    assert first[0].type == "response.created" and first[0].response.background
    with sdk.responses.retrieve(response_id, stream=True, starting_after=4) as resumed:
        rest = list(resumed)
    with sdk.responses.retrieve(response_id, stream=True) as replayed:  # all of it, from 0
        whole = list(replayed)
    assert [e.sequence_number for e in whole] == list(range(len(whole)))
    assert dumped(whole) == dumped(first) + dumped(rest)
    final = whole[-1].response
    assert whole[-1].type == f"response.{final.status}" and final.status in ("completed", "incomplete")
    deltas = "".join(e.delta for e in whole if e.type == "response.output_text.delta")
    stored = sdk.responses.retrieve(response_id)
    assert deltas == stored.output_text == final.output_text != "" and stored.status == final.status
    with sdk.responses.retrieve(response_id, stream=True, starting_after=len(whole) - 3) as tail:
        assert dumped(tail) == dumped(whole[-2:])  # a finished one replays and closes
    with sdk.responses.retrieve(response_id, stream=True, starting_after=len(whole) + 5) as after_end:
        assert list(after_end) == []


def test_a_background_response_made_without_stream_streams_from_its_first_event(server: ChatServer) -> None:
    sdk = client(server)
    queued = sdk.responses.create(model="chat", input="hi", max_output_tokens=8, background=True)
    with sdk.responses.retrieve(queued.id, stream=True) as stream:  # follows it live
        events = list(stream)
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[0].type == "response.created" and events[-1].type in (
        "response.completed",
        "response.incomplete",
    )
    assert events[-1].response.output_text == sdk.responses.retrieve(queued.id).output_text


def test_only_a_background_response_streams_again_and_only_to_its_own_account(server: ChatServer) -> None:
    sdk = client(server)
    foreground = sdk.responses.create(model="chat", input="hi", max_output_tokens=1)
    with pytest.raises(openai.BadRequestError) as refused:
        sdk.responses.retrieve(foreground.id, stream=True)
    assert refused.value.body["param"] == "stream"  # type: ignore[index]
    assert sdk.responses.retrieve(foreground.id).id == foreground.id  # without stream: as before
    background = sdk.responses.create(model="chat", input="hi", max_output_tokens=2, background=True)
    other = server.http.post("/v1/admin/accounts", json={"name": "resumer"}, headers=bearer(ADMIN_KEY))
    stranger = client(server, other.json()["api_key"])
    for response_id in (background.id, foreground.id, "resp_missing"):
        with pytest.raises(openai.NotFoundError):
            stranger.responses.retrieve(response_id, stream=True, starting_after=0)


def test_a_background_response_handed_back_by_its_stopping_task_is_taken_over_and_loses_nothing(
    server: ChatServer,
) -> None:
    """Issue 73: the task generating a background response is stopped as a stopping process stops it
    (cancelled: it hands the response back); the server's takeover loop claims it, replays its written
    events and goes on. The client resuming after its last event gets the rest, numbered without a gap
    or a repeat, and the undisturbed greedy answer."""
    from modelhost import metrics

    sdk, tokens = client(server), 400  # a few ms in when it is stopped: long enough
    body: dict[str, Any] = {"model": "chat", "input": "go on", "max_output_tokens": tokens, "temperature": 0}
    body["extra_body"] = {"min_tokens": tokens}
    labels = {"deployment": server.deployment_id, "reason": "taken_over"}
    before = metrics.sample("modelhost_generations_migrated_total", labels) or 0.0
    first: list[Any] = []
    with sdk.responses.create(**body, background=True, stream=True) as stream:
        for event in stream:
            first.append(event)
            if len(first) == 6:
                break
    response_id = first[0].response.id
    task = server.app.state.services.responses._tasks[response_id]
    task.get_loop().call_soon_threadsafe(task.cancel)  # as `Responses.stop` does
    with sdk.responses.retrieve(response_id, stream=True, starting_after=5) as resumed:
        rest = list(resumed)
    assert metrics.sample("modelhost_generations_migrated_total", labels) == before + 1
    with sdk.responses.retrieve(response_id, stream=True) as replayed:
        whole = list(replayed)
    assert [e.sequence_number for e in whole] == list(range(len(whole)))
    assert dumped(whole) == dumped(first) + dumped(rest)
    final = whole[-1].response
    undisturbed = sdk.responses.create(**body)
    assert final.status == "incomplete" and final.output_text == undisturbed.output_text
    assert final.usage is not None and undisturbed.usage is not None
    assert (final.usage.input_tokens, final.usage.output_tokens) == (
        undisturbed.usage.input_tokens,
        undisturbed.usage.output_tokens,
    )


def test_a_cancelled_background_streams_last_event_is_its_last_and_a_failed_one_ends_failed(
    server: ChatServer,
) -> None:
    sdk = client(server)
    long = sdk.responses.create(model="chat", input="go on", max_output_tokens=1500, background=True)
    sdk.responses.cancel(long.id)
    with sdk.responses.retrieve(long.id, stream=True) as stream:
        events = list(stream)  # closes: no final event (OpenAI's stream has none for cancelled)
    assert all(e.type not in ("response.completed", "response.incomplete") for e in events)
    assert [e.sequence_number for e in events] == list(range(len(events)))
    big = "word " * 5000  # does not fit the 2048-token model: fails before generating
    failed = sdk.responses.create(model="chat", input=big, max_output_tokens=4, background=True)
    with sdk.responses.retrieve(failed.id, stream=True) as stream:
        [only] = list(stream)
    assert only.type == "response.failed" and only.sequence_number == 0
    assert only.response.status == "failed" and only.response.error is not None


def test_stored_responses_are_seen_by_their_account_and_deployment_keys_only(server: ChatServer) -> None:
    http, key = server.http, server.key
    response = client(server).responses.create(model="chat", input="hi", max_output_tokens=1)
    artifact = http.get(f"/v1/deployments/{server.deployment_id}", headers=bearer(key)).json()["artifact_id"]
    other = http.post(
        "/v1/deployments",
        json={"model": "chat-other", "artifact_id": artifact, "readiness": "cold"},
        headers=bearer(key),
    ).json()["id"]
    own = http.post("/v1/keys", json={"deployments": [server.deployment_id]}, headers=bearer(key)).json()
    foreign = http.post("/v1/keys", json={"deployments": [other]}, headers=bearer(key)).json()
    assert client(server, own["api_key"]).responses.retrieve(response.id).id == response.id
    with pytest.raises(openai.NotFoundError):
        client(server, foreign["api_key"]).responses.retrieve(response.id)
    deleted = client(server).responses.delete(response.id)
    assert deleted is None or getattr(deleted, "deleted", True)
    with pytest.raises(openai.NotFoundError):
        client(server).responses.retrieve(response.id)


def test_a_conversation_carries_each_turn_into_the_next(server: ChatServer) -> None:
    sdk = client(server)
    conversation = sdk.conversations.create(
        items=[{"type": "message", "role": "user", "content": "my name is ada"}], metadata={"team": "a"}
    )
    assert conversation.id.startswith("conv_") and conversation.object == "conversation"
    assert conversation.metadata == {"team": "a"}
    first = sdk.responses.create(
        model="chat", conversation=conversation.id, input="hello", max_output_tokens=4, temperature=0
    )
    second = sdk.responses.create(
        model="chat",
        conversation={"id": conversation.id},
        input="and again",
        max_output_tokens=4,
        temperature=0,
    )
    assert first.conversation is not None and first.conversation.id == conversation.id
    # the second turn was generated from the whole conversation: as the same chat completion
    chat = sdk.chat.completions.create(
        model="chat",
        messages=[
            {"role": "user", "content": "my name is ada"},
            {"role": "user", "content": "hello"},
            {"role": "assistant", "content": first.output_text},
            {"role": "user", "content": "and again"},
        ],
        max_tokens=4,
        temperature=0,
    )
    assert second.usage is not None and chat.usage is not None and first.usage is not None
    assert second.usage.input_tokens == chat.usage.prompt_tokens > first.usage.input_tokens
    assert second.output_text == chat.choices[0].message.content
    items = list(sdk.conversations.items.list(conversation.id, order="asc", limit=2))  # paged by 2
    assert len(items) == 5 and (items[2].id, items[4].id) == (first.output[0].id, second.output[0].id)
    texts = [item.content[0].text for item in items]  # type: ignore[union-attr]
    assert texts == ["my name is ada", "hello", first.output_text, "and again", second.output_text]
    context = sdk.responses.input_items.list(second.id, order="asc").data
    assert [item.id for item in context] == [item.id for item in items[:4]]


def test_conversation_items_are_added_retrieved_and_deleted(server: ChatServer) -> None:
    sdk = client(server)
    conversation = sdk.conversations.create()
    added = sdk.conversations.items.create(
        conversation.id,
        items=[
            {"type": "message", "role": "user", "content": "one"},
            {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
        ],
    )
    assert [item.type for item in added.data] == ["message", "function_call", "function_call_output"]
    call = sdk.conversations.items.retrieve(added.data[1].id, conversation_id=conversation.id)
    assert call.type == "function_call" and call.call_id == "call_1"  # type: ignore[union-attr]
    newest = sdk.conversations.items.list(conversation.id, limit=1)
    assert newest.data[0].id == added.data[2].id and newest.has_more
    answer = sdk.conversations.items.delete(added.data[0].id, conversation_id=conversation.id)
    assert answer.id == conversation.id and answer.object == "conversation"
    remaining = sdk.conversations.items.list(conversation.id, order="asc").data
    assert [item.id for item in remaining] == [added.data[1].id, added.data[2].id]
    with pytest.raises(openai.NotFoundError):
        sdk.conversations.items.retrieve(added.data[0].id, conversation_id=conversation.id)
    updated = sdk.conversations.update(conversation.id, metadata={"stage": "two"})
    assert sdk.conversations.retrieve(conversation.id).metadata == updated.metadata == {"stage": "two"}
    deleted = sdk.conversations.delete(conversation.id)
    assert deleted.deleted and deleted.object == "conversation.deleted"
    for gone in (
        lambda: sdk.conversations.retrieve(conversation.id),
        lambda: sdk.conversations.items.list(conversation.id),
        lambda: sdk.responses.create(model="chat", conversation=conversation.id, input="hi"),
    ):
        with pytest.raises(openai.NotFoundError):
            gone()


def test_another_accounts_conversation_is_a_404(server: ChatServer) -> None:
    http, key = server.http, server.key
    mine = client(server).conversations.create(items=[{"role": "user", "content": "secret"}])
    item = client(server).conversations.items.list(mine.id).data[0]
    other = http.post("/v1/admin/accounts", json={"name": "another"}, headers=bearer(ADMIN_KEY))
    stranger = client(server, other.json()["api_key"])
    for call in (
        lambda: stranger.conversations.retrieve(mine.id),
        lambda: stranger.conversations.update(mine.id, metadata={"x": "y"}),
        lambda: stranger.conversations.delete(mine.id),
        lambda: stranger.conversations.items.list(mine.id),
        lambda: stranger.conversations.items.create(mine.id, items=[{"role": "user", "content": "x"}]),
        lambda: stranger.conversations.items.retrieve(item.id, conversation_id=mine.id),
        lambda: stranger.conversations.items.delete(item.id, conversation_id=mine.id),
    ):
        with pytest.raises(openai.NotFoundError):
            call()
    # a deployment key sees the conversations created through keys of its deployments only
    scoped = http.post("/v1/keys", json={"deployments": [server.deployment_id]}, headers=bearer(key)).json()
    deployment = client(server, scoped["api_key"])
    with pytest.raises(openai.NotFoundError):
        deployment.conversations.retrieve(mine.id)  # the account key's: any deployment's turns
    own = deployment.conversations.create()
    turn = deployment.responses.create(model="chat", conversation=own.id, input="hi", max_output_tokens=1)
    assert client(server).conversations.retrieve(own.id).id == own.id
    assert len(client(server).conversations.items.list(own.id).data) == 1 + len(turn.output)
    assert [item.type for item in client(server).conversations.items.list(mine.id).data] == ["message"]


def test_conversation_limits_and_misuse_are_400s(server: ChatServer) -> None:
    http, headers = server.http, bearer(server.key)
    conversation = client(server).conversations.create(items=[{"role": "user", "content": "hi"}])
    path = f"/v1/conversations/{conversation.id}/items"
    message = {"type": "message", "role": "user", "content": "x"}
    many = http.post(path, json={"items": [message] * 21}, headers=headers)
    assert_error(many, 400, type_="invalid_request_error", param="items")
    pairs = {f"k{n}": "v" for n in range(17)}
    assert_error(
        http.post("/v1/conversations", json={"metadata": pairs}, headers=headers), 400, param="metadata"
    )
    big = {**message, "content": "x" * (1 << 20)}
    assert_error(
        http.post(path, json={"items": [big]}, headers=headers), 400, "item_too_large", param="items[0]"
    )
    turn = {"model": "chat", "conversation": conversation.id, "input": [big], "max_output_tokens": 1}
    assert_error(
        http.post("/v1/responses", json=turn, headers=headers), 400, "item_too_large", param="input[0]"
    )
    call = {"type": "function_call", "id": "fc_1", "call_id": "c", "name": "f", "arguments": "{}"}
    assert http.post(path, json={"items": [call]}, headers=headers).status_code == 200
    again = http.post(path, json={"items": [call]}, headers=headers)
    assert_error(again, 400, "duplicate_item", param="items[0]")
    assert_error(http.post(path, json={"items": []}, headers=headers), 400, param="items")
    missing = {"model": "chat", "conversation": "conv_missing", "input": "hi"}
    assert_error(http.post("/v1/responses", json=missing, headers=headers), 404, param="conversation")
    page = http.get(path, params={"after": "msg_missing"}, headers=headers)
    assert_error(page, 400, param="after")
    items = client(server).conversations.items.list(conversation.id, order="asc").data
    assert [item.type for item in items] == ["message", "function_call"]  # nothing refused was kept


def test_previous_response_id_and_conversations_last_across_a_server_restart(
    tmp_path: Path, recipes: Path
) -> None:
    with served_chat_model(tmp_path, recipes) as served:
        first = client(served).responses.create(model="chat", input="remember me", max_output_tokens=3)
        conversation = client(served).conversations.create(metadata={"k": "v"})
        turn = client(served).responses.create(
            model="chat", conversation=conversation.id, input="before", max_output_tokens=3
        )
    settings = make_settings(tmp_path, served.database_url, worker_threads=1)
    with live_server(settings) as url:
        restarted = openai.OpenAI(base_url=f"{url}/v1", api_key=served.key, max_retries=0)
        assert restarted.responses.retrieve(first.id).output_text == first.output_text
        second = restarted.responses.create(
            model="chat", previous_response_id=first.id, input="and now?", max_output_tokens=3
        )
        items = restarted.responses.input_items.list(second.id, order="asc").data
        texts = [item.content[0].text for item in items if item.type == "message"]  # type: ignore[union-attr]
        assert texts == ["remember me", first.output_text, "and now?"]
        assert restarted.conversations.retrieve(conversation.id).metadata == {"k": "v"}
        after = restarted.responses.create(
            model="chat", conversation=conversation.id, input="after", max_output_tokens=3
        )
        listed = restarted.conversations.items.list(conversation.id, order="asc").data
        texts = [item.content[0].text for item in listed]  # type: ignore[union-attr]
        assert texts == ["before", turn.output_text, "after", after.output_text]
