"""Chat and completion requests → engine requests, and engine events → OpenAI choices (pure logic)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from modelhost.errors import InvalidRequest
from modelhost.generation.choices import ChatChoice, chat_requests, completion_requests
from modelhost.generation.contract import GenerationStarted, Logprob, Text, TokenLogprob
from modelhost.generation.grammar import regex_grammar
from modelhost.protocol.chat import ChatCompletionRequest, CompletionRequest
from modelhost.serving.chat import CompletionChoice, chat_choices

TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


def chat(**fields: Any) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate(
        {"model": "m", "messages": [{"role": "user", "content": "hi"}], **fields}
    )


def feed_all(choice: ChatChoice, texts: list[str], finish: str = "stop") -> list[dict[str, Any]]:
    deltas = [choice.feed(GenerationStarted(prompt_tokens=3, tool_format="hermes"))]
    for i, text in enumerate(texts):
        last = i == len(texts) - 1
        deltas.append(choice.feed(Text(text=text, completion_tokens=i + 1, finish=finish if last else None)))
    return [d for d in deltas if d]


def test_auto_mode_types_qwen3_coders_text_values_by_the_requests_tool_schema() -> None:
    parameters = {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": parameters}}
    (choice,) = chat_choices(chat(tools=[tool]), "auto", 1)
    choice.feed(GenerationStarted(prompt_tokens=3, tool_format="qwen3_xml"))
    call = (
        "<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n</parameter>\n"
    )
    delta = choice.feed(Text(text=f"<tool_call>\n{call}</function>\n</tool_call>", finish="stop"))
    assert delta["tool_calls"][0]["function"] == {
        "name": "get_weather",
        "arguments": '{"city": "Paris", "days": 3}',
    }


def test_auto_mode_answers_a_kimi_call_with_kimis_own_call_id() -> None:
    choice = ChatChoice(0, "auto", ["get_weather"])
    choice.feed(GenerationStarted(prompt_tokens=3, tool_format="kimi_k2"))
    text = (
        "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>"
        '{"city": "Paris"}<|tool_call_end|><|tool_calls_section_end|>'
    )
    choice.feed(Text(text=text, finish="stop"))
    assert choice.message()["tool_calls"][0]["id"] == "functions.get_weather:0"
    assert choice.finish_reason == "tool_calls"


def test_auto_mode_streams_text_before_the_markup_and_turns_the_markup_into_a_call() -> None:
    choice = ChatChoice(0, "auto", ["get_weather"])
    pieces = [
        "Let me check. ",
        "<tool",
        '_call>\n{"name": "get_weather", ',
        '"arguments": {"city": "berlin"}}\n</tool_call>',
    ]
    deltas = feed_all(choice, pieces)
    assert deltas[0] == {"content": "Let me check. "}
    assert all("content" not in d for d in deltas[1:-1])  # markup is held back, never streamed as text
    calls = deltas[-1]["tool_calls"]
    assert calls[0]["index"] == 0 and calls[0]["function"] == {
        "name": "get_weather",
        "arguments": '{"city": "berlin"}',
    }
    assert choice.finish_reason == "tool_calls"
    message = choice.message()
    assert message["content"] == "Let me check. "  # as streamed
    assert message["tool_calls"][0]["id"].startswith("call-")


def test_auto_mode_without_markup_is_plain_content() -> None:
    choice = ChatChoice(0, "auto", ["get_weather"])
    deltas = feed_all(choice, ["hello ", "a < b"])
    assert "".join(d.get("content", "") for d in deltas) == "hello a < b"
    assert choice.finish_reason == "stop" and "tool_calls" not in choice.message()


def test_auto_mode_markup_for_an_unknown_tool_stays_text() -> None:
    choice = ChatChoice(0, "auto", ["get_weather"])
    text = '<tool_call>\n{"name": "rm_rf", "arguments": {}}\n</tool_call>'
    feed_all(choice, [text])
    assert choice.message()["content"] == text and choice.finish_reason == "stop"


def test_a_forced_call_streams_its_name_once_then_argument_pieces_without_the_wrapping_brace() -> None:
    choice = ChatChoice(0, "forced", ["get_weather", "get_time"])
    pieces = ['{"name": "get_', 'weather", "arguments": ', '{"city":', '"par', 'is"}', "}"]
    deltas = feed_all(choice, pieces)
    calls = [d["tool_calls"][0] for d in deltas]
    assert calls[0]["function"]["name"] == "get_weather" and calls[0]["id"].startswith("call-")
    assert sum(1 for c in calls if "id" in c) == 1
    assert "".join(c.get("function", {}).get("arguments", "") for c in calls) == '{"city":"paris"}'
    assert choice.message()["tool_calls"][0]["function"]["arguments"] == '{"city":"paris"}'
    assert choice.message()["content"] is None and choice.finish_reason == "tool_calls"


def test_a_truncated_forced_call_finishes_with_length() -> None:
    choice = ChatChoice(0, "forced", ["get_weather"])
    feed_all(choice, ['{"name": "get_weather", "arguments": {"ci'], finish="length")
    assert choice.finish_reason == "length"


def test_chat_requests_make_one_request_per_choice_with_consecutive_seeds() -> None:
    requests, mode = chat_requests(chat(n=3, seed=10, temperature=0.5, stop="END"), 64)
    assert mode == "none" and [r.params.seed for r in requests] == [10, 11, 12]
    assert requests[0].params.stop == ["END"] and requests[0].params.temperature == 0.5
    unseeded, _ = chat_requests(chat(n=2), 64)
    assert [r.params.seed for r in unseeded] == [None, None]


def test_chat_requests_render_openai_messages_for_templates() -> None:
    messages = [
        {
            "role": "developer",
            "content": [{"type": "text", "text": "be brief"}, {"type": "text", "text": "really"}],
        },
        {"role": "user", "content": "weather?"},
        {
            "role": "assistant",
            "content": None,
            "refusal": None,
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "rome"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
    ]
    (request,), _ = chat_requests(chat(messages=messages, tools=[TOOL]), 64)
    rendered = request.messages
    assert rendered is not None
    assert rendered[0] == {"role": "system", "content": "be brief\nreally"}
    assert rendered[2]["tool_calls"][0]["function"]["arguments"] == {"city": "rome"}
    assert rendered[3] == {"role": "tool", "content": "sunny", "tool_call_id": "c1", "name": "get_weather"}
    assert request.tools == [TOOL] and request.grammar is None


def test_tool_choice_decides_the_mode_and_the_grammar() -> None:
    _, auto = chat_requests(chat(tools=[TOOL]), 64)
    (none_request,), none = chat_requests(chat(tools=[TOOL], tool_choice="none"), 64)
    (forced_request,), forced = chat_requests(chat(tools=[TOOL], tool_choice="required"), 64)
    assert (auto, none, forced) == ("auto", "none", "forced")
    assert none_request.tools is None and "get_weather" in (forced_request.grammar or "")
    (json_request,), json_mode = chat_requests(chat(response_format={"type": "json_object"}), 64)
    assert json_mode == "json" and "%json" in (json_request.grammar or "")


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"tool_choice": "auto"}, "tool_choice"),
        ({"tools": [TOOL], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
        ({"top_logprobs": 2}, "top_logprobs"),
    ],
)
def test_inconsistent_fields_are_refused_naming_the_field(fields: dict[str, Any], param: str) -> None:
    with pytest.raises(InvalidRequest) as refused:
        chat_requests(chat(**fields), 64)
    assert refused.value.param == param


def test_completion_requests_are_prompt_major_and_echo_asks_for_prompt_logprobs() -> None:
    body = CompletionRequest.model_validate(
        {"model": "m", "prompt": ["a", "b"], "n": 2, "echo": True, "logprobs": 1}
    )
    requests = completion_requests(body, 64)
    assert [r.prompt for r in requests] == ["a", "a", "b", "b"]
    assert requests[0].params.prompt_logprobs and requests[0].params.max_tokens == 16
    ids = completion_requests(CompletionRequest.model_validate({"model": "m", "prompt": [5, 6]}), 64)
    assert [r.prompt for r in ids] == [[5, 6]]


def test_completion_choice_builds_legacy_logprobs_with_offsets() -> None:
    choice = CompletionChoice(0, want_logprobs=True, echo=True)
    choice.feed(
        GenerationStarted(
            prompt_tokens=2,
            prompt_text="ab",
            prompt_logprobs=[TokenLogprob("a", 0), TokenLogprob("b", 1, -1.0, [("b", -1.0)])],
        )
    )
    choice.feed(Logprob(TokenLogprob("c", 2, -0.5, [("c", -0.5)])))
    choice.feed(Text(text="c", completion_tokens=1, finish="length"))
    assert choice.text == "abc"
    assert choice.logprobs() == {
        "tokens": ["a", "b", "c"],
        "token_logprobs": [None, -1.0, -0.5],
        "top_logprobs": [None, {"b": -1.0}, {"c": -0.5}],
        "text_offset": [0, 1, 2],
    }
    assert json.dumps(choice.logprobs())  # plain JSON


def test_a_schema_listing_its_properties_gets_no_others_strict_or_not_while_json_object_stays_open() -> None:
    from modelhost.generation.grammar import json_schema_grammar

    def constrained(schema: dict[str, Any], strict: bool) -> dict[str, Any]:
        grammar = json_schema_grammar(schema, 16, strict)
        parsed: dict[str, Any] = json.loads(grammar.split("%json ", 1)[1])
        return parsed

    person = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}
    assert constrained(person, strict=False)["additionalProperties"] is False  # Instructor's schemas
    assert constrained(person, strict=True)["additionalProperties"] is False
    assert "additionalProperties" not in constrained({"type": "object"}, strict=False)  # json_object
    assert constrained({**person, "additionalProperties": True}, strict=False)["additionalProperties"] is True


def test_a_regex_becomes_one_lark_regex_terminal_its_slashes_and_line_breaks_escaped_once() -> None:
    assert regex_grammar("[0-9]{3}/x") == "start: /[0-9]{3}\\/x/\n"
    assert regex_grammar("a\\/b") == "start: /a\\/b/\n"  # escaped by the client already: kept
    assert regex_grammar("a\\\\/b") == "start: /a\\\\\\/b/\n"  # an escaped backslash, then a slash
    assert regex_grammar("a\nb\\\r") == "start: /a\\nb\\r/\n"
    assert regex_grammar("\\d+") == "start: /\\d+/\n"
