"""Tool-call parsers: the model's own markup becomes OpenAI tool_calls, anything else stays content."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from modelhost.generation.families import FAMILIES, TOOL_PARSER_NAMES, artifact_family, detect_family
from modelhost.generation.tool_parsers import (
    PARSERS,
    ParsedOutput,
    ToolCall,
    streamable_length,
)

# The request's tools as the parsers get them: name → `parameters` schema.
TOOLS: dict[str, dict[str, Any]] = {
    "get_weather": {
        "type": "object",
        "properties": {
            "city": {"type": "string"},
            "days": {"type": "integer"},
            "metric": {"type": "boolean"},
            "where": {"type": "object"},
        },
    },
    "search": {"type": "object", "properties": {"q": {"type": "string"}}},
}
hermes = PARSERS["hermes"]
llama = PARSERS["llama3_json"]
mistral = PARSERS["mistral"]

WEATHER = ToolCall(name="get_weather", arguments='{"city": "Paris"}')
SEARCH = ToolCall(name="search", arguments='{"q": "x"}')


# --- hermes -------------------------------------------------------------------------------------------


def test_hermes_parses_one_call_and_leaves_no_content() -> None:
    text = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    assert hermes.parse(text, TOOLS) == ParsedOutput(content=None, tool_calls=[WEATHER])


def test_hermes_parses_two_calls_and_keeps_the_text_between_as_content() -> None:
    text = (
        "Let me look.\n"
        '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>\n'
        "and also\n"
        '<tool_call>  {"name": "search", "arguments": {"q": "x"}}  </tool_call>\nDone.'
    )
    assert hermes.parse(text, TOOLS) == ParsedOutput(
        content="Let me look.\n\nand also\n\nDone.", tool_calls=[WEATHER, SEARCH]
    )


def test_hermes_accepts_a_last_block_without_closing_tag_when_its_json_is_complete() -> None:
    text = 'Sure.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
    assert hermes.parse(text, TOOLS) == ParsedOutput(content="Sure.", tool_calls=[WEATHER])


def test_hermes_leaves_an_unclosed_block_followed_by_text_in_the_content() -> None:
    text = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}} and then some'
    assert hermes.parse(text, TOOLS) == ParsedOutput(content=text, tool_calls=[])


def test_hermes_leaves_an_unclosed_block_with_incomplete_json_in_the_content() -> None:
    text = '<tool_call>{"name": "get_weather", "arguments": {"city": "Par'
    assert hermes.parse(text, TOOLS) == ParsedOutput(content=text, tool_calls=[])


def test_hermes_decodes_arguments_given_as_a_json_string() -> None:
    text = '<tool_call>{"name": "search", "arguments": "{\\"q\\": \\"x\\"}"}</tool_call>'
    assert hermes.parse(text, TOOLS) == ParsedOutput(content=None, tool_calls=[SEARCH])


def test_hermes_rewrites_arguments_in_one_fixed_json_style_keeping_non_ascii() -> None:
    text = '<tool_call>{"name":"get_weather","arguments":{"city":"Zürich","days":[1,2]}}</tool_call>'
    call = hermes.parse(text, TOOLS).tool_calls[0]
    assert call.arguments == '{"city": "Zürich", "days": [1, 2]}'


def test_hermes_gives_missing_arguments_as_an_empty_object() -> None:
    text = '<tool_call>{"name": "search"}</tool_call>'
    assert hermes.parse(text, TOOLS).tool_calls == [ToolCall(name="search", arguments="{}")]


def test_hermes_keeps_a_block_with_invalid_json_as_content_and_still_parses_the_valid_one() -> None:
    bad = '<tool_call>{"name": "search", "arguments": {"q": }</tool_call>'
    good = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'
    assert hermes.parse(f"{bad}\n{good}", TOOLS) == ParsedOutput(content=bad, tool_calls=[WEATHER])


def test_hermes_keeps_a_call_to_an_unknown_tool_as_content() -> None:
    text = '<tool_call>{"name": "delete_everything", "arguments": {}}</tool_call>'
    assert hermes.parse(text, TOOLS) == ParsedOutput(content=text, tool_calls=[])


def test_hermes_keeps_a_call_whose_arguments_are_not_an_object_as_content() -> None:
    text = '<tool_call>{"name": "search", "arguments": [1, 2]}</tool_call>'
    assert hermes.parse(text, TOOLS) == ParsedOutput(content=text, tool_calls=[])


def test_hermes_keeps_a_call_whose_string_arguments_are_not_json_as_content() -> None:
    text = '<tool_call>{"name": "search", "arguments": "q=x"}</tool_call>'
    assert hermes.parse(text, TOOLS) == ParsedOutput(content=text, tool_calls=[])


def test_hermes_keeps_a_call_with_nan_in_its_arguments_as_content() -> None:
    text = '<tool_call>{"name": "search", "arguments": {"q": NaN}}</tool_call>'
    assert hermes.parse(text, TOOLS) == ParsedOutput(content=text, tool_calls=[])


def test_hermes_finds_no_calls_when_no_tools_were_offered() -> None:
    text = '<tool_call>{"name": "search", "arguments": {"q": "x"}}</tool_call>'
    assert hermes.parse(text, {}) == ParsedOutput(content=text, tool_calls=[])


def test_hermes_returns_plain_text_stripped_as_content() -> None:
    assert hermes.parse("  The weather is fine.\n", TOOLS) == ParsedOutput(
        content="The weather is fine.", tool_calls=[]
    )


def test_any_parser_gives_none_content_for_empty_or_blank_text() -> None:
    for parser in PARSERS.values():
        assert parser.parse("", TOOLS) == ParsedOutput(content=None, tool_calls=[])
        assert parser.parse(" \n ", TOOLS) == ParsedOutput(content=None, tool_calls=[])


# --- llama3_json --------------------------------------------------------------------------------------


def test_llama3_parses_a_whole_output_json_object_with_parameters() -> None:
    text = ' {"name": "get_weather", "parameters": {"city": "Paris"}}\n'
    assert llama.parse(text, TOOLS) == ParsedOutput(content=None, tool_calls=[WEATHER])


def test_llama3_parses_objects_separated_by_semicolons() -> None:
    weather = '{"name": "get_weather", "parameters": {"city": "Paris"}}'
    text = f'{weather}; {{"name": "search", "arguments": {{"q": "x"}}}}'
    assert llama.parse(text, TOOLS) == ParsedOutput(content=None, tool_calls=[WEATHER, SEARCH])


def test_llama3_parses_calls_after_the_python_tag_and_keeps_the_text_before_it() -> None:
    text = 'Checking.<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}'
    assert llama.parse(text, TOOLS) == ParsedOutput(content="Checking.", tool_calls=[WEATHER])


def test_llama3_decodes_parameters_given_as_a_json_string() -> None:
    text = '{"name": "search", "parameters": "{\\"q\\": \\"x\\"}"}'
    assert llama.parse(text, TOOLS) == ParsedOutput(content=None, tool_calls=[SEARCH])


def test_llama3_treats_json_followed_by_prose_as_content() -> None:
    text = '{"name": "get_weather", "parameters": {"city": "Paris"}} is what I would call.'
    assert llama.parse(text, TOOLS) == ParsedOutput(content=text, tool_calls=[])


def test_llama3_treats_prose_mentioning_json_as_content() -> None:
    text = 'I would call {"name": "get_weather", "parameters": {"city": "Paris"}}'
    assert llama.parse(text, TOOLS) == ParsedOutput(content=text, tool_calls=[])


def test_llama3_treats_a_json_answer_that_is_not_a_call_as_content() -> None:
    text = '{"name": "Bob", "age": 3}'
    assert llama.parse(text, TOOLS) == ParsedOutput(content=text, tool_calls=[])


def test_llama3_keeps_an_unknown_tools_object_as_content_beside_a_valid_call() -> None:
    text = '{"name": "get_weather", "parameters": {"city": "Paris"}}; {"name": "nope", "parameters": {}}'
    assert llama.parse(text, TOOLS) == ParsedOutput(
        content='{"name": "nope", "parameters": {}}', tool_calls=[WEATHER]
    )


def test_llama3_keeps_the_whole_text_when_the_json_after_the_python_tag_is_invalid() -> None:
    text = 'Hm. <|python_tag|>{"name": "get_weather", "parameters": {'
    assert llama.parse(text, TOOLS) == ParsedOutput(content=text, tool_calls=[])


def test_llama3_keeps_builtin_tool_code_after_the_python_tag_as_content() -> None:
    text = '<|python_tag|>brave_search.call(query="weather")'
    assert llama.parse(text, TOOLS) == ParsedOutput(content=text, tool_calls=[])


def test_llama3_returns_plain_text_as_content() -> None:
    assert llama.parse("It is sunny.", TOOLS) == ParsedOutput(content="It is sunny.", tool_calls=[])


# --- mistral ------------------------------------------------------------------------------------------


def test_mistral_parses_the_older_json_array_format_and_keeps_the_text_before_as_content() -> None:
    text = (
        'Let me check.[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}}, '
        '{"name": "search", "arguments": {"q": "x"}}]'
    )
    assert mistral.parse(text, TOOLS) == ParsedOutput(content="Let me check.", tool_calls=[WEATHER, SEARCH])


def test_mistral_parses_the_newer_name_args_format_with_one_marker_per_call() -> None:
    text = '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]search[ARGS]{"q": "x"}'
    assert mistral.parse(text, TOOLS) == ParsedOutput(content=None, tool_calls=[WEATHER, SEARCH])


def test_mistral_ignores_a_call_id_between_name_and_arguments() -> None:
    text = '[TOOL_CALLS]get_weather[CALL_ID]a1b2c3d4e[ARGS]{"city": "Paris"}'
    assert mistral.parse(text, TOOLS) == ParsedOutput(content=None, tool_calls=[WEATHER])


def test_mistral_decodes_arguments_given_as_a_json_string() -> None:
    text = '[TOOL_CALLS][{"name": "search", "arguments": "{\\"q\\": \\"x\\"}"}]'
    assert mistral.parse(text, TOOLS) == ParsedOutput(content=None, tool_calls=[SEARCH])


def test_mistral_keeps_an_array_with_one_unknown_tool_entirely_as_content() -> None:
    text = '[TOOL_CALLS][{"name": "get_weather", "arguments": {}}, {"name": "nope", "arguments": {}}]'
    assert mistral.parse(text, TOOLS) == ParsedOutput(content=text, tool_calls=[])


def test_mistral_keeps_an_invalid_newer_format_call_as_content_and_parses_the_valid_one() -> None:
    text = 'Ok [TOOL_CALLS]nope[ARGS]{}[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}'
    expected = ParsedOutput(content="Ok [TOOL_CALLS]nope[ARGS]{}", tool_calls=[WEATHER])
    assert mistral.parse(text, TOOLS) == expected


def test_mistral_keeps_a_marker_followed_by_broken_json_as_content() -> None:
    text = '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}'
    assert mistral.parse(text, TOOLS) == ParsedOutput(content=text, tool_calls=[])


def test_mistral_keeps_a_marker_without_args_as_content() -> None:
    text = "[TOOL_CALLS]get_weather"
    assert mistral.parse(text, TOOLS) == ParsedOutput(content=text, tool_calls=[])


def test_mistral_returns_plain_text_as_content() -> None:
    assert mistral.parse("No tools needed.", TOOLS) == ParsedOutput(content="No tools needed.", tool_calls=[])


# --- qwen3_xml (Qwen3-Coder) --------------------------------------------------------------------------

qwen_xml = PARSERS["qwen3_xml"]


def _qwen_call(name: str, **parameters: str) -> str:
    body = "".join(f"<parameter={key}>\n{value}\n</parameter>\n" for key, value in parameters.items())
    return f"<tool_call>\n<function={name}>\n{body}</function>\n</tool_call>"


def test_qwen3_xml_parses_a_call_after_content_and_types_values_by_the_schema() -> None:
    text = "I'll check the forecast.\n" + _qwen_call("get_weather", city="Paris", days="3", metric="true")
    assert qwen_xml.parse(text, TOOLS) == ParsedOutput(
        content="I'll check the forecast.",
        tool_calls=[ToolCall("get_weather", '{"city": "Paris", "days": 3, "metric": true}')],
    )


def test_qwen3_xml_keeps_a_string_parameter_that_looks_like_a_number_as_text() -> None:
    text = _qwen_call("search", q="42")
    assert qwen_xml.parse(text, TOOLS).tool_calls == [ToolCall("search", '{"q": "42"}')]


def test_qwen3_xml_keeps_values_as_text_when_the_tool_has_no_schema_for_them() -> None:
    text = _qwen_call("search", q="x", limit="10")
    assert qwen_xml.parse(text, {"search": {}}).tool_calls == [
        ToolCall("search", '{"q": "x", "limit": "10"}')
    ]


def test_qwen3_xml_parses_an_object_parameter_and_a_multiline_value() -> None:
    text = _qwen_call("get_weather", city="Paris\nFrance", where='{"lat": 48.85, "tags": ["a"]}')
    expected = {"city": "Paris\nFrance", "where": {"lat": 48.85, "tags": ["a"]}}
    assert json.loads(qwen_xml.parse(text, TOOLS).tool_calls[0].arguments) == expected


def test_qwen3_xml_leaves_a_value_that_does_not_read_as_its_type_as_text() -> None:
    text = _qwen_call("get_weather", days="three", where="{broken")
    assert json.loads(qwen_xml.parse(text, TOOLS).tool_calls[0].arguments) == {
        "days": "three",
        "where": "{broken",
    }


def test_qwen3_xml_parses_two_calls() -> None:
    text = _qwen_call("get_weather", city="Paris") + "\n" + _qwen_call("search", q="x")
    assert qwen_xml.parse(text, TOOLS) == ParsedOutput(content=None, tool_calls=[WEATHER, SEARCH])


def test_qwen3_xml_reads_a_parameter_whose_closing_tag_is_missing() -> None:
    text = "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</function>\n</tool_call>"
    assert qwen_xml.parse(text, TOOLS).tool_calls == [WEATHER]


def test_qwen3_xml_accepts_a_last_block_without_its_closing_tag() -> None:
    text = "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n"
    assert qwen_xml.parse(text, TOOLS) == ParsedOutput(content=None, tool_calls=[WEATHER])


def test_qwen3_xml_keeps_a_call_to_an_unknown_tool_as_content() -> None:
    text = _qwen_call("rm_rf", path="/")
    assert qwen_xml.parse(text, TOOLS) == ParsedOutput(content=text, tool_calls=[])


def test_qwen3_xml_keeps_a_truncated_call_as_content() -> None:
    text = "Sure.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nPar"
    assert qwen_xml.parse(text, TOOLS) == ParsedOutput(content=text, tool_calls=[])


def test_qwen3_xml_keeps_a_block_with_text_between_its_tags_as_content() -> None:
    text = "<tool_call>\n<function=search>\nI think q is x\n</function>\n</tool_call>"
    assert qwen_xml.parse(text, TOOLS) == ParsedOutput(content=text, tool_calls=[])


# --- glm45 ---------------------------------------------------------------------------------------------

glm = PARSERS["glm45"]


def test_glm45_parses_a_call_after_content_with_values_typed_by_the_schema() -> None:
    text = (
        "Let me look that up.\n<tool_call>get_weather\n"
        "<arg_key>city</arg_key>\n<arg_value>Beijing</arg_value>\n"
        "<arg_key>days</arg_key>\n<arg_value>2</arg_value>\n</tool_call>"
    )
    assert glm.parse(text, TOOLS) == ParsedOutput(
        content="Let me look that up.", tool_calls=[ToolCall("get_weather", '{"city": "Beijing", "days": 2}')]
    )


def test_glm45_parses_two_calls_one_with_a_nested_object_and_one_without_arguments() -> None:
    text = (
        '<tool_call>get_weather\n<arg_key>where</arg_key>\n<arg_value>{"lat": 1, "lon": [2, 3]}</arg_value>\n'
        "</tool_call>\n<tool_call>search</tool_call>"
    )
    assert glm.parse(text, TOOLS) == ParsedOutput(
        content=None,
        tool_calls=[
            ToolCall("get_weather", '{"where": {"lat": 1, "lon": [2, 3]}}'),
            ToolCall("search", "{}"),
        ],
    )


def test_glm45_keeps_a_call_to_an_unknown_tool_as_content() -> None:
    text = "<tool_call>shutdown\n<arg_key>now</arg_key>\n<arg_value>true</arg_value>\n</tool_call>"
    assert glm.parse(text, TOOLS) == ParsedOutput(content=text, tool_calls=[])


def test_glm45_keeps_a_truncated_call_as_content() -> None:
    text = "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Bei"
    assert glm.parse(text, TOOLS) == ParsedOutput(content=text, tool_calls=[])


# --- pythonic ------------------------------------------------------------------------------------------

pythonic = PARSERS["pythonic"]


def test_pythonic_parses_a_list_of_two_calls() -> None:
    text = "[get_weather(city=\"Paris\"), search(q='x')]"
    assert pythonic.parse(text, TOOLS) == ParsedOutput(content=None, tool_calls=[WEATHER, SEARCH])


def test_pythonic_parses_llama4s_python_tags_and_literal_arguments_of_every_kind() -> None:
    text = (
        "<|python_start|>[get_weather(city='Paris', days=-2, metric=True, "
        "where={'lat': 1.5, 'tags': ('a', None), 'ok': true})]<|python_end|>"
    )
    call = pythonic.parse(text, TOOLS).tool_calls[0]
    assert json.loads(call.arguments) == {
        "city": "Paris",
        "days": -2,
        "metric": True,
        "where": {"lat": 1.5, "tags": ["a", None], "ok": True},
    }


def test_pythonic_keeps_the_text_before_the_call_list_as_content() -> None:
    text = 'Let me check.\n[get_weather(city="Paris")]'
    assert pythonic.parse(text, TOOLS) == ParsedOutput(content="Let me check.", tool_calls=[WEATHER])


def test_pythonic_never_evaluates_expressions_and_keeps_them_as_content() -> None:
    for text in (
        '[get_weather(city=__import__("os").getcwd())]',
        "[get_weather(city=name)]",
        '[get_weather("Paris")]',
        "[get_weather(**kwargs)]",
        "[get_weather(city=1 + 2)]",
    ):
        assert pythonic.parse(text, TOOLS) == ParsedOutput(content=text, tool_calls=[]), text


def test_pythonic_keeps_a_list_with_a_call_to_an_unknown_tool_as_content() -> None:
    text = '[get_weather(city="Paris"), delete_all()]'
    assert pythonic.parse(text, TOOLS) == ParsedOutput(content=text, tool_calls=[])


def test_pythonic_keeps_a_truncated_call_and_prose_with_brackets_as_content() -> None:
    for text in ('[get_weather(city="Par', "See [1] for details.", "x[get_weather()]"):
        assert pythonic.parse(text, TOOLS) == ParsedOutput(content=text, tool_calls=[]), text


# --- deepseek_v3 / deepseek_v31 -----------------------------------------------------------------------

deepseek_v3 = PARSERS["deepseek_v3"]
deepseek_v31 = PARSERS["deepseek_v31"]


def _ds3(name: str, arguments: str) -> str:
    return f"<｜tool▁call▁begin｜>function<｜tool▁sep｜>{name}\n```json\n{arguments}\n```<｜tool▁call▁end｜>"


def test_deepseek_v3_parses_two_fenced_calls_after_content() -> None:
    text = (
        "I need the weather first.<｜tool▁calls▁begin｜>"
        + _ds3("get_weather", '{"city": "Paris"}')
        + "\n"
        + _ds3("search", '{"q": "x"}')
        + "<｜tool▁calls▁end｜>"
    )
    assert deepseek_v3.parse(text, TOOLS) == ParsedOutput(
        content="I need the weather first.", tool_calls=[WEATHER, SEARCH]
    )


def test_deepseek_v3_parses_nested_arguments_and_a_section_whose_end_token_is_missing() -> None:
    text = "<｜tool▁calls▁begin｜>" + _ds3("get_weather", '{"where": {"lat": 1, "lon": [2]}}')
    assert deepseek_v3.parse(text, TOOLS).tool_calls == [
        ToolCall("get_weather", '{"where": {"lat": 1, "lon": [2]}}')
    ]


def test_deepseek_v3_keeps_a_section_with_an_unknown_tool_entirely_as_content() -> None:
    text = (
        "<｜tool▁calls▁begin｜>"
        + _ds3("get_weather", '{"city": "Paris"}')
        + _ds3("format_disk", "{}")
        + "<｜tool▁calls▁end｜>"
    )
    assert deepseek_v3.parse(text, TOOLS) == ParsedOutput(content=text, tool_calls=[])


def test_deepseek_v3_keeps_a_truncated_call_as_content() -> None:
    text = '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{"ci'
    assert deepseek_v3.parse(text, TOOLS) == ParsedOutput(content=text, tool_calls=[])


def test_deepseek_v31_parses_two_calls_with_bare_json_arguments() -> None:
    text = (
        "<｜tool▁calls▁begin｜>"
        '<｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"city": "Paris"}<｜tool▁call▁end｜>'
        '<｜tool▁call▁begin｜>search<｜tool▁sep｜>{"q": "x"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>'
    )
    assert deepseek_v31.parse(text, TOOLS) == ParsedOutput(content=None, tool_calls=[WEATHER, SEARCH])


def test_deepseek_v31_keeps_content_before_and_v3s_fenced_form_stays_content() -> None:
    good = (
        "Checking.<｜tool▁calls▁begin｜>"
        '<｜tool▁call▁begin｜>search<｜tool▁sep｜>{"q": "x"}<｜tool▁call▁end｜>'
    )
    assert deepseek_v31.parse(good, TOOLS) == ParsedOutput(content="Checking.", tool_calls=[SEARCH])
    fenced = "<｜tool▁calls▁begin｜>" + _ds3("search", '{"q": "x"}')
    assert deepseek_v31.parse(fenced, TOOLS) == ParsedOutput(content=fenced, tool_calls=[])


def test_deepseek_v31_keeps_an_unknown_tool_and_a_truncated_call_as_content() -> None:
    for text in (
        "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>nope<｜tool▁sep｜>{}<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
        '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>search<｜tool▁sep｜>{"q": "x',
    ):
        assert deepseek_v31.parse(text, TOOLS) == ParsedOutput(content=text, tool_calls=[])


# --- kimi_k2 -------------------------------------------------------------------------------------------

kimi = PARSERS["kimi_k2"]


def _kimi(header: str, arguments: str) -> str:
    return f"<|tool_call_begin|>{header}<|tool_call_argument_begin|>{arguments}<|tool_call_end|>"


def test_kimi_parses_two_calls_after_content_and_keeps_kimis_own_call_ids() -> None:
    text = (
        "Let me look that up.<|tool_calls_section_begin|>\n"
        + _kimi("functions.get_weather:0", '{"city": "Paris"}')
        + "\n"
        + _kimi("functions.search:1", '{"q": "x"}')
        + "\n<|tool_calls_section_end|>"
    )
    parsed = kimi.parse(text, TOOLS)
    assert parsed == ParsedOutput(content="Let me look that up.", tool_calls=[WEATHER, SEARCH])
    assert [call.id for call in parsed.tool_calls] == ["functions.get_weather:0", "functions.search:1"]


def test_kimi_parses_nested_arguments_and_a_name_without_the_functions_prefix() -> None:
    text = "<|tool_calls_section_begin|>" + _kimi("get_weather:3", '{"where": {"lat": 1}}')
    assert kimi.parse(text, TOOLS).tool_calls == [ToolCall("get_weather", '{"where": {"lat": 1}}')]


def test_kimi_keeps_an_unknown_tool_and_a_truncated_call_as_content() -> None:
    for text in (
        "<|tool_calls_section_begin|>" + _kimi("functions.nope:0", "{}") + "<|tool_calls_section_end|>",
        "<|tool_calls_section_begin|><|tool_call_begin|>functions.search:0<|tool_call_argument_begin|>{",
    ):
        assert kimi.parse(text, TOOLS) == ParsedOutput(content=text, tool_calls=[])


# --- granite -------------------------------------------------------------------------------------------

granite = PARSERS["granite"]


def test_granite_parses_the_3_0_token_with_an_array_of_two_calls() -> None:
    text = (
        '<|tool_call|>[{"name": "get_weather", "arguments": {"city": "Paris"}}, '
        '{"name": "search", "arguments": {"q": "x"}}]'
    )
    assert granite.parse(text, TOOLS) == ParsedOutput(content=None, tool_calls=[WEATHER, SEARCH])


def test_granite_parses_the_3_1_text_marker_after_content_and_keeps_the_text_after_the_array() -> None:
    text = 'Sure.<tool_call>[{"name": "get_weather", "arguments": {"where": {"lat": 1}}}] Done.'
    assert granite.parse(text, TOOLS) == ParsedOutput(
        content="Sure. Done.", tool_calls=[ToolCall("get_weather", '{"where": {"lat": 1}}')]
    )


def test_granite_parses_granite_4s_hermes_style_block() -> None:
    text = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    assert granite.parse(text, TOOLS) == ParsedOutput(content=None, tool_calls=[WEATHER])


def test_granite_keeps_an_unknown_tool_and_a_truncated_call_as_content() -> None:
    for text in (
        '<|tool_call|>[{"name": "nope", "arguments": {}}]',
        '<|tool_call|>[{"name": "get_weather", "arguments": {"city": "Pa',
    ):
        assert granite.parse(text, TOOLS) == ParsedOutput(content=text, tool_calls=[])


# --- phi4_mini -----------------------------------------------------------------------------------------

phi = PARSERS["phi4_mini"]


def test_phi4_mini_parses_functools_with_two_calls_after_content() -> None:
    text = (
        'I will call two tools. functools[{"name": "get_weather", "arguments": {"city": "Paris"}}, '
        '{"name": "search", "arguments": {"q": "x"}}]'
    )
    assert phi.parse(text, TOOLS) == ParsedOutput(
        content="I will call two tools.", tool_calls=[WEATHER, SEARCH]
    )


def test_phi4_mini_parses_nested_arguments_and_its_tool_call_tokens() -> None:
    text = '<|tool_call|>{"name": "get_weather", "arguments": {"where": {"a": [1]}}}<|/tool_call|>'
    assert phi.parse(text, TOOLS).tool_calls == [ToolCall("get_weather", '{"where": {"a": [1]}}')]


def test_phi4_mini_keeps_an_unknown_tool_a_truncated_call_and_python_imports_as_content() -> None:
    for text in (
        'functools[{"name": "nope", "arguments": {}}]',
        'functools[{"name": "get_weather", "argu',
        "import functools\nfunctools.reduce(f, xs)",
    ):
        assert phi.parse(text, TOOLS) == ParsedOutput(content=text, tool_calls=[]), text


# --- harmony (gpt-oss) ---------------------------------------------------------------------------------

harmony = PARSERS["harmony"]
ANALYSIS = "<|channel|>analysis<|message|>The user wants the weather. Call get_weather.<|end|>"
WEATHER_CALL = (
    "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json"
    '<|message|>{"city":"Paris"}'
    "<|call|>"
)


def test_harmony_parses_a_call_after_the_analysis_channel_which_is_neither_call_nor_content() -> None:
    assert harmony.parse(ANALYSIS + WEATHER_CALL, TOOLS) == ParsedOutput(content=None, tool_calls=[WEATHER])


def test_harmony_parses_the_output_less_its_analysis_beginning_without_start_assistant() -> None:
    text = '<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}'
    assert harmony.parse(text, TOOLS) == ParsedOutput(content=None, tool_calls=[WEATHER])


def test_harmony_reads_the_recipient_before_the_channel_and_nested_arguments() -> None:
    text = ' to=functions.get_weather<|channel|>commentary json<|message|>{"where": {"lat": 1}}<|call|>'
    assert harmony.parse(text, TOOLS).tool_calls == [ToolCall("get_weather", '{"where": {"lat": 1}}')]


def test_harmony_gives_a_preamble_as_content_and_parses_two_calls() -> None:
    text = (
        ANALYSIS
        + "<|start|>assistant<|channel|>commentary<|message|>Checking two things.<|end|>"
        + WEATHER_CALL
        + '<|start|>assistant to=functions.search<|channel|>commentary <|constrain|>json<|message|>{"q": "x"}'
        + "<|call|>"
    )
    assert harmony.parse(text, TOOLS) == ParsedOutput(
        content="Checking two things.", tool_calls=[WEATHER, SEARCH]
    )


def test_harmony_gives_the_final_channels_text_as_content() -> None:
    text = ANALYSIS + "<|start|>assistant<|channel|>final<|message|>It is sunny in Paris.<|return|>"
    assert harmony.parse(text, TOOLS) == ParsedOutput(content="It is sunny in Paris.", tool_calls=[])
    assert harmony.parse("It is sunny in Paris.", TOOLS).content == "It is sunny in Paris."


def test_harmony_keeps_an_unknown_tool_a_builtin_tool_and_a_truncated_call_as_content() -> None:
    for call in (
        "<|start|>assistant<|channel|>commentary to=functions.nope <|constrain|>json<|message|>{}<|call|>",
        '<|start|>assistant<|channel|>analysis to=browser.search code<|message|>{"query": "x"}<|call|>',
        '<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"ci',
    ):
        assert harmony.parse(ANALYSIS + call, TOOLS) == ParsedOutput(content=call, tool_calls=[]), call


# --- mistral: the newest shape -------------------------------------------------------------------------


def test_mistral_parses_the_newest_name_then_json_format_without_args_token() -> None:
    text = 'Sure.[TOOL_CALLS]get_weather{"city": "Paris"}[TOOL_CALLS]search{"q": "x"}'
    assert mistral.parse(text, TOOLS) == ParsedOutput(content="Sure.", tool_calls=[WEATHER, SEARCH])


def test_mistral_gives_each_call_a_new_id_of_nine_letters_and_digits() -> None:
    text = '[TOOL_CALLS]get_weather[CALL_ID]abc[ARGS]{"city": "Paris"}[TOOL_CALLS]search[ARGS]{"q": "x"}'
    ids = [call.id or "" for call in mistral.parse(text, TOOLS).tool_calls]
    assert len(set(ids)) == 2 and all(len(i) == 9 and i.isalnum() for i in ids)


def test_mistral_parses_nested_arguments() -> None:
    text = '[TOOL_CALLS][{"name": "get_weather", "arguments": {"where": {"lat": 1, "tags": ["a"]}}}]'
    assert mistral.parse(text, TOOLS).tool_calls == [
        ToolCall("get_weather", '{"where": {"lat": 1, "tags": ["a"]}}')
    ]


# --- llama3_json: Llama 4's framing --------------------------------------------------------------------


def test_llama3_json_reads_llama4s_python_start_end_framing_as_content_then_calls() -> None:
    text = '<|python_start|>Checking.<|python_end|>{"name": "get_weather", "parameters": {"city": "Paris"}}'
    assert llama.parse(text, TOOLS) == ParsedOutput(content="Checking.", tool_calls=[WEATHER])


# --- registry and template choice ---------------------------------------------------------------------


def test_the_registry_holds_a_parser_for_every_familys_tool_parser_under_its_own_name() -> None:
    assert set(PARSERS) == TOOL_PARSER_NAMES
    assert all(parser.name == key for key, parser in PARSERS.items())


def test_every_familys_parsers_are_named_in_the_tables_name_sets() -> None:
    assert {family.tool_parser for family in FAMILIES} == TOOL_PARSER_NAMES
    assert len({family.name for family in FAMILIES}) == len(FAMILIES)


# Distinguishing excerpts of each family's published chat template (and its added tokens where the
# marker is a token the template does not spell), and the family (with its tool parser) they must give.
TEMPLATES = [
    (
        "gpt-oss",
        "{{- '<|start|>assistant<|channel|>analysis<|message|>' }}...{{- ' to=' + tool_call.name }}",
        (),
        "gpt_oss",
    ),
    (
        "GLM-4.5",
        "[gMASK]<sop>{{ '<tool_call>{function-name}\\n<arg_key>{arg-key-1}</arg_key>' }}"
        "{{- '/nothink' if (enable_thinking is defined and not enable_thinking) }}{{ '\\n<think></think>' }}",
        (),
        "glm45",
    ),
    (
        "Qwen3-Coder",
        "<tool_call>\\n<function=example_function_name>\\n<parameter=example_parameter_1>",
        (),
        "qwen3_coder",
    ),
    (
        "Qwen3",
        "{%- if enable_thinking is defined and enable_thinking is false %}"
        "{{- '<think>\\n\\n</think>\\n\\n' }}"
        '{{- \'<tool_call>\\n{"name": "\' }}',
        (),
        "qwen3",
    ),
    (
        "DeepSeek-V3.1",
        "{%- if not thinking is defined -%}{%- set thinking = false -%}{%- endif -%}"
        "{{'<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>'+ tool['function']['name'] + '<｜tool▁sep｜>'}}",
        (),
        "deepseek_v31",
    ),
    (
        "DeepSeek-R1-Distill-Qwen",
        "{{'<｜Assistant｜><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>' + tool['type'] + '<｜tool▁sep｜>'}}"
        "{% set content = content.split('</think>')[-1] %}{{'<｜Assistant｜><think>\\n'}}",
        ("<|start_header_id|>",),  # the Llama distills keep Llama 3's added tokens
        "deepseek_r1",
    ),
    (
        "DeepSeek-V3",
        "{{'<｜Assistant｜><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>' + tool['type'] + '<｜tool▁sep｜>'}}"
        "{% if '</think>' in content %}{% set content = content.split('</think>')[-1] %}{% endif %}",
        (),
        "deepseek_v3",
    ),
    (
        "Kimi K2",
        "{{ '<|im_assistant|>assistant<|im_middle|>' }}",
        ("<|tool_calls_section_begin|>", "<|tool_call_begin|>", "<|im_middle|>"),
        "kimi_k2",
    ),
    (
        "Granite 3.3",
        "respond only with <|tool_call|> followed by a JSON list of tools used. ... between <think></think>"
        "{{- '<|start_of_role|>available_tools<|end_of_role|>' }}",
        (),
        "granite",
    ),
    (
        "Granite 4.0",
        "{{- '<tool_call>\\n{\"name\": \"' }}{{- '<|start_of_role|>' + message.role + '<|end_of_role|>' }}",
        (),
        "granite",
    ),
    (
        "Phi-4-mini",
        "{{ '<|' + message['role'] + '|>' + message['content'] + '<|tool|>' + message['tools'] "
        "+ '<|/tool|>' + '<|end|>' }}",
        (),
        "phi4_mini",
    ),
    (
        "Phi-4-mini with vLLM's template",
        "prefix function calls with functools marker (no closing marker required)",
        ("<|tool|>", "<|/tool|>", "<|tool_call|>"),
        "phi4_mini",
    ),
    (
        "QwQ",
        "{{- '<tool_call>\\n{\"name\": \"' }}{%- set content = message.content.split('</think>')[-1] %}"
        "{{- '<|im_start|>assistant\\n<think>\\n' }}",
        (),
        "qwen_think",
    ),
    (
        "Qwen2.5",
        "{{- '<|im_start|>assistant' }}{{- '\\n<tool_call>\\n{\"name\": \"' }}",
        ("<tool_call>", "<|im_start|>"),
        "hermes",
    ),
    (
        "Hermes 3 (a Llama 3.1 fine-tune)",
        "{{- '<tool_call>\\n' }}{{- '{\"name\": \"' + tool_call.name + '\"' }}",
        ("<|start_header_id|>", "<|eot_id|>", "<|python_tag|>"),
        "hermes",
    ),
    (
        "Mistral Small 3.1",
        "{{- '[AVAILABLE_TOOLS] [' }}{{- '[TOOL_CALLS] [' }}{{- '[TOOL_RESULTS] {\"content\": ' }}",
        (),
        "mistral",
    ),
    (
        "Mistral 7B v0.3 (the marker only among the tokens)",
        "{{- '[INST] ' + message['content'] + '[/INST]' }}",
        ("[TOOL_CALLS]", "[AVAILABLE_TOOLS]"),
        "mistral",
    ),
    (
        "Llama 4 with vLLM's pythonic template",
        "- Use exact format: [func_name1(param1=value1, param2=value2), func_name2(...)]"
        "{{- '<|header_start|>assistant<|header_end|>\\n\\n' }}",
        (),
        "pythonic",
    ),
    (
        "Llama 4",
        "Given the following functions, please respond with a JSON for a function call"
        "{{- '<|header_start|>assistant<|header_end|>\\n\\n' -}}{{- '<|python_start|>' }}",
        (),
        "llama4",
    ),
    (
        "Llama 3.1",
        "{{- '<|start_header_id|>ipython<|end_header_id|>' }}{{- '<|python_tag|>' + tool_call.name }}",
        (),
        "llama3",
    ),
]


@pytest.mark.parametrize(("model", "template", "tokens", "family"), TEMPLATES, ids=[t[0] for t in TEMPLATES])
def test_a_published_chat_template_is_recognised_as_its_family(
    model: str, template: str, tokens: tuple[str, ...], family: str
) -> None:
    assert detect_family(template, dict.fromkeys(tokens, 1)).name == family


def test_the_families_tool_parsers_read_each_format() -> None:
    parsers = {family.name: family.tool_parser for family in FAMILIES}
    assert parsers["llama4"] == parsers["llama3"] == "llama3_json"  # Llama 4's template asks for JSON
    assert parsers["pythonic"] == "pythonic"
    assert parsers["deepseek_r1"] == parsers["deepseek_v3"] == "deepseek_v3"


def test_no_template_or_an_unrecognised_one_is_the_default_read_as_hermes() -> None:
    for template in (None, "", "{{ messages }}"):
        family = detect_family(template)
        assert (family.name, family.tool_parser) == ("default", "hermes")


# --- streaming hold-back, per format -------------------------------------------------------------------

# (parser, an output with content before its call, where the call's markup starts)
STREAMED = [
    ("hermes", 'Let me check.\n<tool_call>\n{"name": "search", "arguments": {"q": "x"}}\n</tool_call>'),
    ("qwen3_xml", "Let me check.\n" + _qwen_call("search", q="x")),
    ("llama3_json", 'Let me check.<|python_tag|>{"name": "search", "parameters": {"q": "x"}}'),
    ("pythonic", "Let me check.\n[search(q='x')]"),
    ("mistral", 'Let me check.[TOOL_CALLS]search[ARGS]{"q": "x"}'),
    ("deepseek_v3", "Let me check.<｜tool▁calls▁begin｜>" + _ds3("search", '{"q": "x"}')),
    (
        "deepseek_v31",
        "Let me check.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>search<｜tool▁sep｜>{}<｜tool▁call▁end｜>",
    ),
    (
        "glm45",
        "Let me check.\n<tool_call>search\n<arg_key>q</arg_key>\n<arg_value>x</arg_value>\n</tool_call>",
    ),
    ("kimi_k2", "Let me check.<|tool_calls_section_begin|>" + _kimi("functions.search:0", '{"q": "x"}')),
    ("granite", 'Let me check.<|tool_call|>[{"name": "search", "arguments": {"q": "x"}}]'),
    ("phi4_mini", 'Let me check. functools[{"name": "search", "arguments": {"q": "x"}}]'),
    ("harmony", "Let me check." + WEATHER_CALL),
]


@pytest.mark.parametrize(("name", "text"), STREAMED, ids=[s[0] for s in STREAMED])
def test_a_stream_releases_the_content_before_a_call_and_never_any_of_its_markup(
    name: str, text: str
) -> None:
    parser = PARSERS[name]
    content = parser.parse(text, TOOLS).content
    assert content == "Let me check." and parser.parse(text, TOOLS).tool_calls
    markup_at = text.index("Let me check.") + len("Let me check.")
    markup_at = len(text) - len(text[markup_at:].lstrip())
    for cut in range(len(text) + 1):
        assert streamable_length(text[:cut], parser.start_markers) <= markup_at, text[:cut]
    assert text[: streamable_length(text, parser.start_markers)].strip() == "Let me check."


# --- streamable_length --------------------------------------------------------------------------------

MARKERS = ("<tool_call>",)


def test_streamable_length_is_the_whole_text_without_any_marker() -> None:
    assert streamable_length("hello", MARKERS) == 5


def test_streamable_length_stops_before_a_complete_marker() -> None:
    assert streamable_length('hello <tool_call>{"name"', MARKERS) == 6


def test_streamable_length_holds_back_a_trailing_partial_marker() -> None:
    assert streamable_length("hello <tool", MARKERS) == 6


def test_streamable_length_holds_back_a_single_trailing_first_character_of_a_marker() -> None:
    assert streamable_length("a<", MARKERS) == 1


def test_streamable_length_releases_text_that_can_no_longer_become_a_marker() -> None:
    assert streamable_length("a<b", MARKERS) == 3


def test_streamable_length_is_zero_for_empty_text_and_for_text_starting_with_a_marker() -> None:
    assert streamable_length("", MARKERS) == 0
    assert streamable_length("<tool_call>", MARKERS) == 0


def test_streamable_length_uses_the_earliest_of_several_markers() -> None:
    assert streamable_length("ab {x} <|python_tag|>", ("<|python_tag|>", "{")) == 3
    assert streamable_length("ab <|py", ("<|python_tag|>", "{")) == 3


def test_streamable_length_ignores_empty_markers_and_no_markers() -> None:
    assert streamable_length("abc", ("",)) == 3
    assert streamable_length("abc", ()) == 3


def test_streamable_length_holds_back_a_trailing_prefix_of_any_of_several_markers() -> None:
    assert streamable_length("ab<", ("<", "zz")) == 2
    assert streamable_length("abz", ("<", "zz")) == 2


# --- properties ---------------------------------------------------------------------------------------

_PIECES = st.sampled_from(
    [
        "<tool_call>",
        "</tool_call>",
        "<|python_tag|>",
        "[TOOL_CALLS]",
        "[ARGS]",
        "[CALL_ID]",
        '{"name": "search", "arguments": ',
        '{"name": "get_weather", "parameters": {}}',
        '"{\\"q\\": 1}"',
        "{",
        "}",
        "[",
        "]",
        ";",
        ",",
        "NaN",
        '"\\ud800"',
        "search",
        "\n",
        # every other format's markup
        *(marker for parser in PARSERS.values() for marker in parser.start_markers),
        "<function=search>",
        "</function>",
        "<parameter=q>",
        "</parameter>",
        "<arg_key>",
        "</arg_key>",
        "<arg_value>",
        "</arg_value>",
        "<｜tool▁call▁begin｜>",
        "<｜tool▁sep｜>",
        "<｜tool▁call▁end｜>",
        "<｜tool▁calls▁end｜>",
        "function",
        "```json",
        "<|tool_call_begin|>",
        "<|tool_call_argument_begin|>",
        "<|tool_call_end|>",
        "functions.search:0",
        "<|python_end|>",
        "search(q='x')",
        "__import__('os')",
        "<|channel|>commentary to=functions.search",
        "<|constrain|>json",
        "<|message|>",
        "<|call|>",
        "<|end|>",
        "analysis",
    ]
)
_TEXT = st.lists(st.one_of(_PIECES, st.text(max_size=8)), max_size=12).map("".join)
_SCHEMAS = st.sampled_from([{}, {"properties": {"q": {"type": ["integer", "boolean", "object", "null"]}}}])


@given(text=_TEXT, tools=st.dictionaries(st.sampled_from([*TOOLS, "", "x"]), _SCHEMAS, max_size=3))
def test_every_parser_returns_well_formed_output_for_any_text(text: str, tools: dict[str, Any]) -> None:
    for parser in PARSERS.values():
        parsed = parser.parse(text, tools)
        assert parsed.content is None or (parsed.content and parsed.content == parsed.content.strip())
        for call in parsed.tool_calls:
            assert call.name in tools
            assert isinstance(json.loads(call.arguments), dict)
            call.arguments.encode("utf-8")


@given(text=_TEXT, markers=st.lists(st.one_of(_PIECES, st.text(max_size=4)), max_size=4))
def test_streamable_length_is_within_the_text_and_its_prefix_holds_no_marker(
    text: str, markers: list[str]
) -> None:
    length = streamable_length(text, markers)
    assert 0 <= length <= len(text)
    assert not any(marker and marker in text[:length] for marker in markers)


def test_an_artifacts_family_is_read_from_its_files_and_a_deployments_own_template_replaces_its(
    tmp_path: Path,
) -> None:
    """`artifact_family`: the gateway's reading of the files the replica's tokenizer loads (the named
    `default` template of `tokenizer_config.json`, the added tokens of both files)."""
    named = [{"name": "tool_use", "template": "[TOOL_CALLS]"}, {"name": "default", "template": "<arg_key>"}]
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": named}))
    assert artifact_family(tmp_path).name == "glm45"
    assert artifact_family(tmp_path, "{{ '[TOOL_CALLS]' }}").name == "mistral"
    (tmp_path / "tokenizer_config.json").write_text("not JSON")
    (tmp_path / "tokenizer.json").write_text(
        json.dumps({"added_tokens": [{"id": 5, "content": "<|channel|>"}]})
    )
    assert artifact_family(tmp_path).name == "gpt_oss"
    assert artifact_family(tmp_path / "missing").name == "default"
