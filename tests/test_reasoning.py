"""The reasoning parsers (`generation.reasoning`) on each family's output, whole and streamed, and a chat
choice assembled from real engine-event sequences of a reasoning model (`generation.choices.ChatChoice`)."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from modelhost.agents.runner import RunMessage
from modelhost.errors import InvalidRequest
from modelhost.generation.choices import ChatChoice
from modelhost.generation.contract import GenerationEvent, GenerationRequest, GenerationStarted, Text
from modelhost.generation.families import REASONING_PARSER_NAMES, family_named
from modelhost.generation.reasoning import (
    REASONING_PARSERS,
    effort_kwargs,
    prompt_opens,
    split,
)
from modelhost.generation.requests import special_tokens

QWEN3 = "<think>\nThe user greets me.\nI greet back.\n</think>\n\nHello! How can I help?"
HARMONY = (
    "<|channel|>analysis<|message|>User asks weather. Call the tool.<|end|>"
    "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
    '{"city": "Berlin"}<|call|>'
)
HARMONY_FINAL = (
    "<|channel|>analysis<|message|>Simple greeting.<|end|>"
    "<|start|>assistant<|channel|>final<|message|>Hi there!<|return|>"
)
GRANITE = "Here is my thought process:\nThe user wants a number.\nHere is my response:\n42"

# (parser, the prompt opened the reasoning, output, reasoning, rest)
CASES = [
    ("qwen3", False, QWEN3, "The user greets me.\nI greet back.", "Hello! How can I help?"),
    ("qwen3", False, "Hello without thinking", "", "Hello without thinking"),
    ("qwen3", False, "No start, yet </think> here", "", "No start, yet </think> here"),
    ("qwen3", True, "Opened by the prompt\n</think>\n\nAnswer", "Opened by the prompt", "Answer"),
    ("qwen3", True, "Cut off while thinking", "Cut off while thinking", ""),
    (
        "qwen3",
        False,
        "<think>\nstill thinking when max_tokens ran out",
        "still thinking when max_tokens ran out",
        "",
    ),
    ("qwen3", False, "<think>\n\n</think>\n\n", "", ""),
    ("deepseek_r1", False, "No start marker\n</think>\n\nThe answer.", "No start marker", "The answer."),
    ("deepseek_r1", False, "<think>\nWith its own marker</think>Done", "With its own marker", "Done"),
    ("deepseek_r1", False, "All reasoning", "All reasoning", ""),
    ("deepseek_v3", True, "V3.1 thinks</think>Reply", "V3.1 thinks", "Reply"),
    ("deepseek_v3", False, "V3.1 without thinking", "", "V3.1 without thinking"),
    ("glm45", False, "<think>GLM thinks</think>\nAnswer <tool_call>x", "GLM thinks", "Answer <tool_call>x"),
    ("granite", False, GRANITE, "The user wants a number.", "42"),
    ("granite", False, "Here's my thought process: hm Here's my response: ok", "hm", "ok"),
    ("granite", False, "Just an answer.", "", "Just an answer."),
    ("harmony", False, HARMONY_FINAL, "Simple greeting.", "Hi there!"),
    ("harmony", False, HARMONY, "User asks weather. Call the tool.", HARMONY.split("<|end|>", 1)[1]),
    (
        "harmony",
        False,
        "<|channel|>analysis<|message|>a<|end|><|start|>assistant<|channel|>analysis"
        "<|message|>b<|end|><|start|>assistant<|channel|>final<|message|>c",
        "a\nb",
        "c",
    ),
    ("harmony", False, "<|channel|>analysis<|message|>cut off", "cut off", ""),
    (
        "harmony",
        False,
        "analysisThe special tokens were skipped",
        "",
        "analysisThe special tokens were skipped",
    ),
]


@pytest.mark.parametrize(("name", "opened", "text", "reasoning", "rest"), CASES)
def test_each_reasoning_parser_splits_its_familys_output(
    name: str, opened: bool, text: str, reasoning: str, rest: str
) -> None:
    assert split(name, text, opened) == (reasoning, rest)


def test_every_family_reasoning_parser_is_registered() -> None:
    assert set(REASONING_PARSERS) == REASONING_PARSER_NAMES


def _streamed(name: str, opened: bool, text: str, cuts: list[int]) -> tuple[str, str]:
    parser = REASONING_PARSERS[name](opened)
    reasoning, rest = "", ""
    bounds = [0, *sorted(c % (len(text) + 1) for c in cuts), len(text)]
    for start, end in itertools.pairwise(bounds):
        r, c = parser.feed(text[start:end])
        reasoning, rest = reasoning + r, rest + c
    r, c = parser.finish()
    return reasoning + r, rest + c


@settings(max_examples=300, deadline=None)
@given(case=st.sampled_from(CASES), cuts=st.lists(st.integers(min_value=0, max_value=400), max_size=12))
def test_any_chunking_of_an_answer_gives_the_same_split_as_the_whole(
    case: tuple[str, bool, str, str, str], cuts: list[int]
) -> None:
    name, opened, text, reasoning, rest = case
    assert _streamed(name, opened, text, cuts) == (reasoning, rest)


@settings(max_examples=200, deadline=None)
@given(
    name=st.sampled_from(sorted(REASONING_PARSER_NAMES)),
    opened=st.booleans(),
    pieces=st.lists(
        st.sampled_from(
            [
                "<think>",
                "</think>",
                "<|channel|>",
                "analysis",
                "final",
                "<|message|>",
                "<|end|>",
                "<|start|>",
                "Here is my thought process:",
                "Here is my response:",
                "\n",
                " ",
                "a",
                "<",
                "<|",
                "Here",
                "x y",
            ]
        ),
        max_size=14,
    ),
    cuts=st.lists(st.integers(min_value=0, max_value=200), max_size=8),
)
def test_any_text_splits_the_same_whole_and_streamed(
    name: str, opened: bool, pieces: list[str], cuts: list[int]
) -> None:
    text = "".join(pieces)
    assert _streamed(name, opened, text, cuts) == split(name, text, opened)


def test_a_stream_holds_back_only_a_possible_marker() -> None:
    parser = REASONING_PARSERS["qwen3"](False)
    assert parser.feed("<th") == ("", "")
    assert parser.feed("ink>\nstep one") == ("step one", "")
    assert parser.feed(" then</th") == (" then", "")
    assert parser.feed("ink>\n\nDone") == ("", "Done")
    assert parser.finish() == ("", "")


@pytest.mark.parametrize(
    ("name", "tail", "opens"),
    [
        ("qwen3", "<|im_start|>assistant\n<think>\n", True),
        ("qwen3", "<|im_start|>assistant\n<think>\n\n</think>\n\n", False),
        ("qwen3", "<|im_start|>assistant\n", False),
        ("deepseek_v3", "<｜Assistant｜></think>", False),
        ("deepseek_v3", "<｜Assistant｜><think>", True),
        ("harmony", "<|start|>assistant", False),
        (None, "<think>\n", False),
    ],
)
def test_whether_a_prompt_opens_the_reasoning_is_read_from_its_tail(
    name: Any, tail: str, opens: bool
) -> None:
    assert prompt_opens(name, tail) is opens


def test_reasoning_effort_maps_to_each_familys_switch_or_is_refused() -> None:
    qwen3, gpt_oss, granite = family_named("qwen3"), family_named("gpt_oss"), family_named("granite")
    assert qwen3 and gpt_oss and granite
    assert effort_kwargs(qwen3, "none", "reasoning_effort") == {"enable_thinking": False}
    assert effort_kwargs(qwen3, "minimal", "reasoning_effort") == {"enable_thinking": False}
    assert effort_kwargs(qwen3, "high", "reasoning_effort") == {"enable_thinking": True}
    assert effort_kwargs(granite, "low", "reasoning_effort") == {"thinking": True}
    assert effort_kwargs(gpt_oss, "medium", "reasoning.effort") == {"reasoning_effort": "medium"}
    with pytest.raises(InvalidRequest) as refused:
        effort_kwargs(gpt_oss, "none", "reasoning.effort")
    assert refused.value.param == "reasoning.effort"
    for name in ("hermes", "qwen_think"):
        family = family_named(name)
        assert family
        with pytest.raises(InvalidRequest) as refused:
            effort_kwargs(family, "low", "reasoning_effort")
        assert refused.value.param == "reasoning_effort" and family.name in refused.value.message


# ---------------------------------------------------------------- a chat choice of a reasoning model


def _events(pieces: list[str], finish: str = "stop", **started: Any) -> list[GenerationEvent]:
    """The engine's events of an answer, one token each, as both engines send them."""
    head = {"prompt_tokens": 9, "tool_format": "hermes", "reasoning_format": "qwen3", **started}
    texts = [Text(text=piece, completion_tokens=i + 1) for i, piece in enumerate(pieces)]
    texts[-1].finish = finish
    return [GenerationStarted(**head), *texts]


THOUGHT = ["<think>", "\n", "Call", " the", " tool", "<tool_call>", "\n", "</think>", "\n\n"]
CALL = ["<tool_call>", '\n{"name": "get_weather", ', '"arguments": {"city": "Paris"}}', "\n</tool_call>"]


def test_a_chat_choice_streams_reasoning_apart_and_counts_its_tokens() -> None:
    choice = ChatChoice(0, "none", [])
    deltas = [choice.feed(event) for event in _events([*THOUGHT, "Hi", "!"])]
    streamed = "".join(d.get("reasoning_content", "") for d in deltas)
    assert streamed == "".join(d.get("reasoning", "") for d in deltas) == "Call the tool<tool_call>"
    assert "".join(d.get("content", "") for d in deltas) == "Hi!"
    assert choice.message() == {
        "role": "assistant",
        "content": "Hi!",
        "refusal": None,
        "reasoning_content": "Call the tool<tool_call>",
        "reasoning": "Call the tool<tool_call>",
    }
    assert (choice.reasoning_tokens, choice.completion_tokens) == (len(THOUGHT) - 1, len(THOUGHT) + 2)


def test_an_agent_run_keeps_its_reasoning_apart_in_events_of_its_own() -> None:
    message = RunMessage(ChatChoice(0, "none", []))
    written = [e for event in _events([*THOUGHT, "Hi", "!"], cached_tokens=7) for e in message.feed(event)]
    reasoning = "".join(d["reasoning"] for t, d in written if t == "reasoning.delta")
    assert reasoning == "Call the tool<tool_call>"
    assert "".join(d["content"] for t, d in written if t == "message.delta") == "Hi!"
    completed = message.completed()
    assert (completed["content"], completed["reasoning"]) == ("Hi!", "Call the tool<tool_call>")
    assert completed["usage"] == {
        "prompt_tokens": 9,
        "completion_tokens": len(THOUGHT) + 2,
        "prompt_tokens_details": {"cached_tokens": 7},
        "completion_tokens_details": {"reasoning_tokens": len(THOUGHT) - 1},
    }


def test_tool_calls_after_reasoning_are_parsed_from_the_rest_only() -> None:
    choice = ChatChoice(0, "auto", ["get_weather"])
    deltas = [choice.feed(event) for event in _events([*THOUGHT, *CALL])]
    message = choice.message()
    assert message["reasoning_content"] == "Call the tool<tool_call>" and message["content"] is None
    assert [c["function"] for c in message["tool_calls"]] == [
        {"name": "get_weather", "arguments": '{"city": "Paris"}'}
    ]
    assert choice.finish_reason == "tool_calls"
    assert not any("<tool_call>" in d.get("content", "") for d in deltas)


def test_an_answer_cut_off_in_an_opened_reasoning_is_all_reasoning() -> None:
    choice = ChatChoice(0, "none", [])
    for event in _events(["I", " wonder", " whether"], finish="length", reasoning_open=True):
        choice.feed(event)
    assert choice.message()["reasoning_content"] == "I wonder whether" and choice.message()["content"] is None
    assert choice.reasoning_tokens == choice.completion_tokens == 3


def test_a_model_without_a_reasoning_parser_answers_as_before() -> None:
    choice = ChatChoice(0, "none", [])
    for event in _events(["<think>", "x", "</think>", "y"], reasoning_format=None):
        choice.feed(event)
    assert choice.message() == {"role": "assistant", "content": "<think>x</think>y", "refusal": None}
    assert choice.reasoning_tokens == 0


def test_harmony_channels_become_reasoning_and_content_without_control_tokens() -> None:
    pieces = [
        "<|channel|>",
        "analysis",
        "<|message|>",
        "Greet",
        " back",
        "<|end|>",
        "<|start|>",
        "assistant",
        "<|channel|>",
        "final",
        "<|message|>",
        "Hello",
        "!",
    ]
    choice = ChatChoice(0, "none", [])
    for event in _events(pieces, reasoning_format="harmony", tool_format="harmony"):
        choice.feed(event)
    assert (choice.reasoning, choice.text) == ("Greet back", "Hello!")
    assert choice.reasoning_tokens == 4  # from <|message|> through <|end|>


def test_a_response_puts_its_reasoning_item_before_its_message_with_its_stream_events() -> None:
    from modelhost.serving.responses.items import OutputAssembler

    assembler = OutputAssembler(ChatChoice(0, "none", []))
    events = [e for event in _events([*THOUGHT, "Hi"]) for e in assembler.feed(event)] + assembler.finish()
    kinds = [e["type"] for e in events]
    assert kinds[:3] == [
        "response.output_item.added",
        "response.content_part.added",
        "response.reasoning_text.delta",
    ]
    done = kinds.index("response.reasoning_text.done")
    assert kinds[done : done + 3] == [
        "response.reasoning_text.done",
        "response.content_part.done",
        "response.output_item.done",
    ]
    assert done < kinds.index("response.output_text.delta")
    reasoning, message = assembler.output
    assert reasoning == {
        "id": reasoning["id"],
        "type": "reasoning",
        "summary": [],
        "content": [{"type": "reasoning_text", "text": "Call the tool<tool_call>"}],
        "status": "completed",
    }
    assert message["content"][0]["text"] == "Hi"
    assert assembler.usage()["output_tokens_details"] == {"reasoning_tokens": len(THOUGHT) - 1}


def test_a_response_whose_model_ends_at_once_has_one_empty_completed_message() -> None:
    """A model that samples its end first still answers a message, as OpenAI does: clients read
    `output[0]` (the last CI's flake: a random model's first token was its end)."""
    from modelhost.serving.responses.items import OutputAssembler

    assembler = OutputAssembler(ChatChoice(0, "none", []))
    events = [e for event in _events([""]) for e in assembler.feed(event)] + assembler.finish()
    assert [e["type"] for e in events] == [
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
    ]
    (message,) = assembler.output
    assert (message["type"], message["status"], message["content"][0]["text"]) == ("message", "completed", "")


def test_a_chat_keeps_the_special_tokens_of_its_familys_markup_and_hides_the_others(recipes: Path) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(recipes / "t11_text_generation_chat")
    template, qwen3 = tokenizer.chat_template, family_named("qwen3")
    assert qwen3 is not None
    marked = special_tokens(tokenizer, qwen3, template)  # its <tool_call> and </tool_call> are special
    skip, strip = marked.decoding(GenerationRequest(messages=[]), True)
    assert skip is False and strip is not None
    eos, pad = tokenizer.eos_token, "<|endoftext|>"
    written = f"<tool_call>{{}}</tool_call>{pad}{eos}"
    assert pad not in template and strip(written) == "<tool_call>{}</tool_call>"
    assert marked.decoding(GenerationRequest(messages=[]), False) == (
        False,
        None,
    )  # the client wants every token
    assert marked.decoding(GenerationRequest(prompt="x"), True) == (True, None)  # completions are not parsed
    llama3 = family_named("llama3")  # none of its markers is special here: the request decides
    assert llama3 is not None
    assert special_tokens(tokenizer, llama3, template).decoding(GenerationRequest(messages=[]), True) == (
        True,
        None,
    )


# --- the trained family models' own outputs (tests/data/family_outputs.json) ---------------------------

FAMILY_OUTPUTS: dict[str, Any] = json.loads(
    (Path(__file__).parent / "data" / "family_outputs.json").read_text()
)


def _family_conversations() -> list[Any]:
    return [
        pytest.param(family, name, id=f"{family}-{name}")
        for family, output in FAMILY_OUTPUTS.items()
        for name in output["conversations"]
    ]


@pytest.mark.parametrize(("family", "name"), _family_conversations())
def test_each_family_models_output_is_split_by_its_parsers_fed_a_character_at_a_time(
    family: str, name: str
) -> None:
    """What a trained family model really wrote (its end token off, as the engines stop before it),
    fed to a chat choice one character per event as a stream would bring it: its reasoning, content and
    call are what the model meant, with the family's parsers as the replica names them."""
    output = FAMILY_OUTPUTS[family]
    conversation = output["conversations"][name]
    text = conversation["text"]
    for end in output["end_tokens"]:
        text = text.removesuffix(end)
    tools = conversation["tools"] or []
    choice = ChatChoice(0, "auto" if tools else "none", [t["function"]["name"] for t in tools])
    choice.tool_schemas = {t["function"]["name"]: t["function"].get("parameters", {}) for t in tools}
    opened = prompt_opens(output["reasoning_parser"], conversation["prompt"][-64:])
    reasoning = output["reasoning_parser"]
    choice.feed(
        GenerationStarted(
            tool_format=output["tool_parser"], reasoning_open=opened, reasoning_format=reasoning
        )
    )
    for count, character in enumerate(text, 1):
        choice.feed(Text(text=character, completion_tokens=count))
    choice.feed(Text(text="", finish="stop", completion_tokens=len(text)))
    message = choice.message()
    assert (message.get("reasoning_content") or "").strip() == (conversation["reasoning"] or "")
    assert (message["content"] or "").strip() == (conversation["content"] or "")
    calls = [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in choice.calls]
    expected = conversation["tool_call"]
    assert calls == ([(expected["name"], expected["arguments"])] if expected else [])
