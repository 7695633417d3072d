"""The Responses API through the official `openai` SDK against a live server, on the tiny recipe chat
model: the same generation as chat completions, OpenAI's event stream, stored responses chained by
`previous_response_id` (across a restart too), background responses and their cancel."""

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
from tests.helpers import assert_error, bearer
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


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"tools": [{"type": "web_search"}]}, "tools[0]"),
        ({"previous_response_id": "resp_missing"}, "previous_response_id"),
        ({"background": True, "store": False}, "background"),
        ({"conversation": "conv_1"}, "conversation"),
        ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0]"),
        ({"input": [{"role": "user", "content": [IMAGE_PART]}]}, "input[0].content"),  # a text-only model
        ({"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]}, "input[0]"),
        ({"tool_choice": {"type": "web_search"}, "tools": [TOOL]}, "tool_choice"),
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


def test_previous_response_id_chains_across_a_server_restart(tmp_path: Path, recipes: Path) -> None:
    with served_chat_model(tmp_path, recipes) as served:
        first = client(served).responses.create(model="chat", input="remember me", max_output_tokens=3)
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
