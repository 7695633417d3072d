"""Anthropic Messages requests → chat requests, and engine events → Anthropic messages and stream events
(`serving.messages`, pure logic; the SDKs against live servers are in tests/test_chat.py)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import ValidationError

from modelhost.errors import (
    InvalidAPIKey,
    InvalidRequest,
    ModelNotFound,
    Overloaded,
    PayloadTooLarge,
    TokensLimitReached,
    anthropic_body,
)
from modelhost.generation.choices import ChatChoice, chat_requests
from modelhost.generation.contract import GenerationStarted, Text
from modelhost.protocol.messages import MessagesRequest
from modelhost.serving.messages import (
    MessageAssembler,
    StopSequences,
    chat_request,
    reasoning_effort,
)

WEATHER = {
    "name": "get_weather",
    "description": "The weather.",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
PNG = "iVBORw0KGgo="
QWEN3_OPEN = {"reasoning_format": "qwen3", "reasoning_open": True}  # a prompt that opened the thought


def request(**fields: Any) -> MessagesRequest:
    return MessagesRequest.model_validate(
        {"model": "m", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}], **fields}
    )


def chat_messages(**fields: Any) -> list[dict[str, Any]]:
    return [m.model_dump(exclude_none=True) for m in chat_request(request(**fields)).chat.messages]


# ---------------------------------------------------------------- requests


def test_system_blocks_become_one_system_message_and_their_cache_control_is_ignored() -> None:
    system = [
        {"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}},
        {"type": "text", "text": "Be brief."},
    ]
    assert chat_messages(system=system)[0] == {"role": "system", "content": "You are Claude Code.\nBe brief."}
    assert chat_messages(system="Be brief.")[0] == {"role": "system", "content": "Be brief."}


def test_a_tool_use_turn_and_its_results_become_a_call_and_tool_messages_before_the_users_text() -> None:
    messages = [
        {"role": "user", "content": "weather in paris and rome?"},
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "two calls", "signature": "sig"},
                {"type": "redacted_thinking", "data": "opaque"},
                {"type": "text", "text": "Checking."},
                {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "paris"}},
                {"type": "tool_use", "id": "toolu_2", "name": "get_weather", "input": {"city": "rome"}},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"},
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_2",
                    "content": [{"type": "text", "text": "no such city"}],
                    "is_error": True,
                },
                {"type": "text", "text": "and?", "cache_control": {"type": "ephemeral"}},
            ],
        },
    ]
    _, assistant, paris, rome, user = chat_messages(messages=messages, tools=[WEATHER])
    assert assistant["content"] == "Checking." and assistant["reasoning_content"] == "two calls"
    assert [(c["id"], json.loads(c["function"]["arguments"])) for c in assistant["tool_calls"]] == [
        ("toolu_1", {"city": "paris"}),
        ("toolu_2", {"city": "rome"}),
    ]
    assert paris == {"role": "tool", "tool_call_id": "toolu_1", "content": "sunny"}
    assert rome == {"role": "tool", "tool_call_id": "toolu_2", "content": "Error: no such city"}
    assert user == {"role": "user", "content": "and?"}


def test_an_mcp_connector_turn_sent_back_is_its_calls_their_results_then_its_answer() -> None:
    use = {"type": "mcp_tool_use", "id": "mcptoolu_1", "name": "get_weather", "server_name": "w"}
    result = {"type": "mcp_tool_result", "tool_use_id": "mcptoolu_1", "is_error": False}
    messages = [
        {"role": "user", "content": "weather in paris?"},
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "a call", "signature": ""},
                use | {"input": {"city": "paris"}},
                result | {"content": [{"type": "text", "text": "sunny"}]},
                {"type": "text", "text": "Sunny."},
            ],
        },
        {"role": "user", "content": "thanks"},
    ]
    _, call, answer, said, thanks = chat_messages(messages=messages, tools=[WEATHER])
    assert call["reasoning_content"] == "a call" and call["tool_calls"][0]["id"] == "mcptoolu_1"
    assert json.loads(call["tool_calls"][0]["function"]["arguments"]) == {"city": "paris"}
    assert answer == {"role": "tool", "tool_call_id": "mcptoolu_1", "content": "sunny"}
    assert (said["role"], said["content"], thanks["content"]) == ("assistant", "Sunny.", "thanks")
    with pytest.raises(InvalidRequest):
        chat_request(request(messages=[{"role": "user", "content": [use | {"input": {}}]}]))


def test_images_become_image_url_parts_named_by_their_anthropic_fields() -> None:
    messages = [
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "t", "content": [{"type": "image", "source": {
                    "type": "url", "url": "https://example.com/a.png"}}]},
                {"type": "text", "text": "what is it?"},
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}},
            ],
        }
    ]  # fmt: skip
    translated = chat_request(request(messages=messages))
    tool, user = (m.model_dump(exclude_none=True) for m in translated.chat.messages)
    assert tool["content"] == ""
    assert [p.get("image_url", {}).get("url") for p in user["content"]] == [
        "https://example.com/a.png",
        None,
        f"data:image/png;base64,{PNG}",
    ]
    assert translated.image_params == [
        "messages[0].content[0].content[0].source",
        "messages[0].content[2].source",
    ]


def test_sampling_stop_sequences_and_tool_choice_map_onto_the_chat_request() -> None:
    chat = chat_request(
        request(
            stop_sequences=["END"],
            temperature=0.5,
            top_p=0.9,
            top_k=5,
            tools=[WEATHER],
            tool_choice={"type": "any", "disable_parallel_tool_use": True},
            metadata={"user_id": "u-1"},
        )
    ).chat
    assert (chat.stop, chat.include_stop_str_in_output, chat.max_tokens) == (["END"], True, 16)
    assert (chat.temperature, chat.top_p, chat.top_k, chat.user) == (0.5, 0.9, 5, "u-1")
    assert chat.tool_choice == "required" and chat.parallel_tool_calls is False
    named = chat_request(request(tools=[WEATHER], tool_choice={"type": "tool", "name": "get_weather"})).chat
    assert named.tool_choice is not None and named.tool_choice.function.name == "get_weather"  # type: ignore[union-attr]
    assert chat_request(request(tools=[WEATHER], tool_choice={"type": "none"})).chat.tool_choice == "none"
    requests, mode = chat_requests(
        chat_request(request(tools=[WEATHER])).chat, 16, "thinking", effort_optional=True
    )
    assert (
        mode == "auto" and (requests[0].tools or [{}])[0]["function"]["parameters"] == WEATHER["input_schema"]
    )


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "tools[0]"),
        ({"tools": [{"name": "f"}]}, "tools[0].input_schema"),
        ({"tool_choice": {"type": "any"}}, "tool_choice"),
        ({"tools": [WEATHER], "tool_choice": {"type": "tool", "name": "other"}}, "tool_choice.name"),
        (
            {"messages": [{"role": "user", "content": [{"type": "thinking", "thinking": "x"}]}]},
            "messages[0].content[0]",
        ),
    ],
)
def test_what_cannot_be_served_is_a_400_naming_its_field(fields: dict[str, Any], param: str) -> None:
    with pytest.raises(InvalidRequest) as refused:
        chat_request(request(**fields))
    assert refused.value.param == param


def test_unknown_fields_and_block_types_are_refused_and_max_tokens_is_required() -> None:
    with pytest.raises(ValidationError, match="max_tokens"):
        MessagesRequest.model_validate({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    with pytest.raises(ValidationError, match="maxtokens"):
        request(maxtokens=3)
    document = {"type": "document", "source": {"type": "text", "data": "x", "media_type": "text/plain"}}
    with pytest.raises(ValidationError, match="'document' are not supported"):
        request(messages=[{"role": "user", "content": [document]}])


@pytest.mark.parametrize(
    ("thinking", "output_config", "effort"),
    [
        (None, None, None),
        ({"type": "disabled"}, None, "none"),
        ({"type": "enabled", "budget_tokens": 1024}, None, "low"),
        ({"type": "enabled", "budget_tokens": 8000}, None, "medium"),
        ({"type": "enabled", "budget_tokens": 32000}, None, "high"),
        ({"type": "adaptive"}, None, "medium"),
        ({"type": "adaptive"}, {"effort": "max"}, "max"),
        (None, {"effort": "low"}, "low"),
    ],
)
def test_thinking_is_a_reasoning_effort_the_family_may_ignore(
    thinking: Any, output_config: Any, effort: str | None
) -> None:
    fields = {k: v for k, v in (("thinking", thinking), ("output_config", output_config)) if v is not None}
    assert reasoning_effort(request(**fields)) == effort
    requests, _ = chat_requests(chat_request(request(**fields)).chat, 16, "thinking", effort_optional=True)
    assert requests[0].reasoning_effort == effort
    assert requests[0].reasoning_effort_optional is bool(effort)


# ---------------------------------------------------------------- answers


def assembled(events: list[Any], mode: str = "none", stops: list[str] | None = None) -> Any:
    assembler = MessageAssembler(ChatChoice(0, mode, ["get_weather"]), StopSequences(stops or []))
    produced = [e for event in events for e in assembler.feed(event)]
    return assembler.message({"id": "msg_1"}), produced


def test_a_reasoning_answer_is_a_thinking_block_then_a_text_block_streamed_as_their_deltas() -> None:
    message, events = assembled(
        [
            GenerationStarted(prompt_tokens=12, cached_tokens=4, **QWEN3_OPEN),
            Text(text="hmm", completion_tokens=1),
            Text(text="</think>", completion_tokens=2),
            Text(text="Sunny", completion_tokens=3),
            Text(text=".", completion_tokens=4, finish="stop"),
        ]
    )  # fmt: skip
    assert message["content"] == [
        {"type": "thinking", "thinking": "hmm", "signature": ""},
        {"type": "text", "text": "Sunny."},
    ]
    assert message["stop_reason"] == "end_turn" and message["stop_sequence"] is None
    assert message["usage"] == {
        "input_tokens": 8,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 4,
        "output_tokens": 4,
        "service_tier": "standard",
    }
    assert [(e["type"], e["index"], e.get("delta", {}).get("type")) for e in events] == [
        ("content_block_start", 0, None),
        ("content_block_delta", 0, "thinking_delta"),
        ("content_block_stop", 0, None),
        ("content_block_start", 1, None),
        ("content_block_delta", 1, "text_delta"),
        ("content_block_delta", 1, "text_delta"),
        ("content_block_stop", 1, None),
    ]


def test_a_forced_call_is_a_tool_use_block_streamed_as_input_json_deltas() -> None:
    pieces = ['{"name": "get_weather", "arguments": {"ci', 'ty": "pa', 'ris"}', "}"]
    events = [GenerationStarted(prompt_tokens=5)]
    events += [Text(text=p, completion_tokens=i + 1) for i, p in enumerate(pieces)]
    events[-1].finish = "stop"  # type: ignore[union-attr]
    message, produced = assembled(events, mode="forced")
    (block,) = message["content"]
    assert (
        block["type"] == "tool_use" and block["name"] == "get_weather" and block["input"] == {"city": "paris"}
    )
    assert message["stop_reason"] == "tool_use"
    partial = [e["delta"]["partial_json"] for e in produced if e["type"] == "content_block_delta"]
    assert json.loads("".join(partial)) == {"city": "paris"} and len(partial) > 1
    assert produced[0]["content_block"] == {
        "type": "tool_use",
        "id": block["id"],
        "name": "get_weather",
        "input": {},
    }


def test_a_parsed_call_after_text_closes_the_text_block_first() -> None:
    text = 'Let me check.<tool_call>\n{"name": "get_weather", "arguments": {"city": "rome"}}\n</tool_call>'
    message, _ = assembled(
        [GenerationStarted(), Text(text=text, completion_tokens=9, finish="stop")], mode="auto"
    )
    assert [b["type"] for b in message["content"]] == ["text", "tool_use"]
    assert message["content"][1]["input"] == {"city": "rome"} and message["stop_reason"] == "tool_use"


def test_a_length_finish_is_max_tokens() -> None:
    message, _ = assembled([GenerationStarted(), Text(text="abc", completion_tokens=3, finish="length")])
    assert message["stop_reason"] == "max_tokens" and message["content"] == [{"type": "text", "text": "abc"}]


def test_a_stop_sequence_is_held_back_cut_off_and_named_even_split_across_events() -> None:
    events: list[Any] = [
        GenerationStarted(),
        Text(text="one E", completion_tokens=1),
        Text(text="N", completion_tokens=2),
    ]
    events.append(Text(text="D", completion_tokens=3, finish="stop"))
    message, produced = assembled(events, stops=["END", "EX"])
    assert message["content"] == [{"type": "text", "text": "one "}]
    assert (message["stop_reason"], message["stop_sequence"]) == ("stop_sequence", "END")
    assert "".join(e["delta"]["text"] for e in produced if e["type"] == "content_block_delta") == "one "
    stops = StopSequences(["END"])
    assert stops.feed("an E") == "an " and stops.feed("ggs") == "Eggs" and stops.finish() == ""
    assert stops.matched is None


@pytest.mark.parametrize(
    ("error", "status", "kind"),
    [
        (InvalidRequest("bad", param="max_tokens"), 400, "invalid_request_error"),
        (InvalidAPIKey("no"), 401, "authentication_error"),
        (ModelNotFound("x"), 404, "not_found_error"),
        (PayloadTooLarge("big"), 413, "request_too_large"),
        (TokensLimitReached("slow down"), 429, "rate_limit_error"),
        (Overloaded("queue full"), 429, "overloaded_error"),
    ],
)
def test_errors_take_anthropics_shape_with_the_same_status(error: Any, status: int, kind: str) -> None:
    body = anthropic_body(error)
    assert error.status_code == status and body["type"] == "error"
    assert body["error"]["type"] == kind  # type: ignore[index]
    if isinstance(error, InvalidRequest):  # the field at fault, which Anthropic's body has no place for
        assert body["error"]["message"] == "max_tokens: bad"  # type: ignore[index]
