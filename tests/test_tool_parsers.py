"""Tool-call parsers: the model's own markup becomes OpenAI tool_calls, anything else stays content."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from modelhost.generation.families import FAMILIES, TOOL_PARSER_NAMES, detect_family
from modelhost.generation.tool_parsers import (
    PARSERS,
    ParsedOutput,
    ToolCall,
    streamable_length,
)

TOOLS = ("get_weather", "search")
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
    assert hermes.parse(text, ()) == ParsedOutput(content=text, tool_calls=[])


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


# --- registry and template choice ---------------------------------------------------------------------


def test_the_registry_holds_the_three_formats_under_their_own_names() -> None:
    assert sorted(PARSERS) == ["hermes", "llama3_json", "mistral"]
    assert all(parser.name == key for key, parser in PARSERS.items())
    assert PARSERS["hermes"].start_markers == ("<tool_call>",)
    assert PARSERS["llama3_json"].start_markers == ("<|python_tag|>", "{")
    assert PARSERS["mistral"].start_markers == ("[TOOL_CALLS]",)


def test_a_template_with_tool_calls_token_is_mistral() -> None:
    assert detect_family("{{ '[AVAILABLE_TOOLS]' }}...{{ '[TOOL_CALLS]' }}").tool_parser == "mistral"


def test_a_template_with_llama3_headers_is_llama3_json() -> None:
    template = "{{- '<|start_header_id|>ipython<|end_header_id|>' }}{{- '<|python_tag|>' + tool_call.name }}"
    assert detect_family(template).name == "llama3"
    assert detect_family(template).tool_parser == "llama3_json"


def test_a_template_with_tool_call_tags_and_no_other_markers_is_hermes() -> None:
    assert detect_family("{{- '<tool_call>\\n' }}").name == "hermes"


def test_a_qwen3_template_is_qwen3_with_its_thinking_switch() -> None:
    template = "{%- if enable_thinking is defined %}<think>{%- endif %}{{- '<tool_call>' }}"
    family = detect_family(template)
    assert (family.name, family.tool_parser, family.reasoning_parser) == ("qwen3", "hermes", "qwen3")
    assert family.thinking_switch == "enable_thinking"


def test_a_glm45_template_is_glm45_though_it_has_qwen3s_markers_too() -> None:
    template = (
        "{{- '<tool_call>{function-name}\\n<arg_key>{arg-key-1}</arg_key>' }}"
        "{%- if enable_thinking is defined and not enable_thinking %}{{- '<think></think>' }}{%- endif %}"
    )
    assert detect_family(template).name == "glm45"


def test_a_marker_among_the_added_tokens_counts_as_in_the_template() -> None:
    assert detect_family("{{ messages }}", {"<|channel|>": 200005}).name == "gpt_oss"


def test_no_template_or_an_unrecognised_one_is_hermes() -> None:
    assert detect_family(None).name == "hermes"
    assert detect_family("").name == "hermes"
    assert detect_family("{{ messages }}").name == "hermes"


def test_every_familys_parsers_are_named_in_the_tables_name_sets() -> None:
    assert {family.tool_parser for family in FAMILIES} == TOOL_PARSER_NAMES
    assert len({family.name for family in FAMILIES}) == len(FAMILIES)


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
    ]
)
_TEXT = st.lists(st.one_of(_PIECES, st.text(max_size=8)), max_size=12).map("".join)


@given(text=_TEXT, tool_names=st.lists(st.sampled_from([*TOOLS, "", "x"]), max_size=3))
def test_every_parser_returns_well_formed_output_for_any_text(text: str, tool_names: list[str]) -> None:
    for parser in PARSERS.values():
        parsed = parser.parse(text, tool_names)
        assert parsed.content is None or (parsed.content and parsed.content == parsed.content.strip())
        for call in parsed.tool_calls:
            assert call.name in tool_names
            assert isinstance(json.loads(call.arguments), dict)
            call.arguments.encode("utf-8")


@given(text=_TEXT, markers=st.lists(st.one_of(_PIECES, st.text(max_size=4)), max_size=4))
def test_streamable_length_is_within_the_text_and_its_prefix_holds_no_marker(
    text: str, markers: list[str]
) -> None:
    length = streamable_length(text, markers)
    assert 0 <= length <= len(text)
    assert not any(marker and marker in text[:length] for marker in markers)
