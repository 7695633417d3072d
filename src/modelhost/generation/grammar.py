"""Constrained decoding: grammars for `response_format` and forced tool calls, enforced with llguidance.

The grammar is built in the gateway's request (pure text, no model needed) and compiled against the
model's tokenizer in the worker, where each step's allowed tokens mask the logits. So `json_schema`
output validates against its schema and `tool_choice: required` / a named tool yields a call whose
arguments validate against the tool's parameters, whatever the model's weights (DESIGN.md).

A forced tool call is generated as `{"name": "<tool>", "arguments": <object>}`: the name is fixed text
in the grammar (one alternative per allowed tool), the arguments follow the tool's JSON schema.

Strings without a length bound get `max_string_length` as `maxLength`, and integers without bounds
±(2**53 - 1): a model that loops inside a value (small or random-weight models do) would otherwise run
to `max_tokens` and leave invalid JSON. Tool arguments, like OpenAI's strict mode, take no properties
beyond those the tool's schema lists.
"""

from __future__ import annotations

import json
import re
from typing import Any

from modelhost.errors import InvalidRequest

TOOL_PREFIX = '{"name": "'
TOOL_MIDDLE = '", "arguments": '
# Compact JSON: flexible whitespace would let a looping model emit newlines until `max_tokens`.
JSON_OPTIONS = {"whitespace_flexible": False, "lenient": False}
_BOUNDED_STRING_KEYS = ("maxLength", "enum", "const", "pattern", "format")
_BOUNDED_INTEGER_KEYS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "enum", "const")
SAFE_INTEGER = 2**53 - 1  # the largest integer every JSON reader holds exactly
_SUBSCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SUBSCHEMA_MAPS = ("properties", "$defs", "definitions", "patternProperties")
_SUBSCHEMAS = ("items", "additionalProperties", "not", "if", "then", "else", "contains")


def bound_strings(schema: Any, max_length: int) -> Any:
    """A copy of `schema` where every unbounded string has `maxLength: max_length`."""
    if not isinstance(schema, dict):
        return schema
    bounded: dict[str, Any] = dict(schema)
    kinds = schema.get("type")
    is_string = kinds == "string" or (isinstance(kinds, list) and "string" in kinds)
    if is_string and not any(key in schema for key in _BOUNDED_STRING_KEYS):
        bounded["maxLength"] = max_length
    if kinds == "integer" and not any(key in schema for key in _BOUNDED_INTEGER_KEYS):
        bounded["minimum"], bounded["maximum"] = -SAFE_INTEGER, SAFE_INTEGER
    for key in _SUBSCHEMA_LISTS:
        if isinstance(schema.get(key), list):
            bounded[key] = [bound_strings(s, max_length) for s in schema[key]]
    for key in _SUBSCHEMA_MAPS:
        if isinstance(schema.get(key), dict):
            bounded[key] = {name: bound_strings(s, max_length) for name, s in schema[key].items()}
    for key in _SUBSCHEMAS:
        if isinstance(schema.get(key), dict):
            bounded[key] = bound_strings(schema[key], max_length)
    return bounded


def json_schema_grammar(schema: dict[str, Any], max_string_length: int, strict: bool) -> str:
    """A Lark grammar (llguidance dialect) for one JSON value following `schema`.

    `strict` (OpenAI's strict mode) forbids properties the schema does not list, as OpenAI does. Without
    it, an object schema that lists its properties and says nothing of others still gets no others: an
    answer without them validates all the same, and an extra property's value has no type to bound, so
    a looping model would write it until `max_tokens` (Instructor's schemas are like that). A bare
    `{"type": "object"}` (`json_object`) stays open."""
    options = JSON_OPTIONS
    schema = _no_extra_properties(schema, listed_only=not strict)
    body = json.dumps({**bound_strings(schema, max_string_length), "x-guidance": options})
    return f"start: %json {body}\n"


def tool_call_grammar(tools: list[tuple[str, dict[str, Any]]], max_string_length: int) -> str:
    """A Lark grammar for exactly one call of one of `tools` (name, parameters schema)."""
    lines = ["start: " + " | ".join(f"call_{i}" for i in range(len(tools)))]
    for i, (name, parameters) in enumerate(tools):
        schema = _no_extra_properties(parameters or {"type": "object", "properties": {}})
        prefix = json.dumps(TOOL_PREFIX + name + TOOL_MIDDLE)
        lines.append(f'call_{i}: {prefix} args_{i} "}}"')
        body = json.dumps({**bound_strings(schema, max_string_length), "x-guidance": JSON_OPTIONS})
        lines.append(f"args_{i}: %json {body}")
    return "\n".join(lines) + "\n"


def regex_grammar(pattern: str) -> str:
    """A Lark grammar whose whole output matches `pattern` (Rust regex syntax, as llguidance's and
    vLLM's): one regex terminal, its unescaped slashes and raw line breaks escaped so the pattern stays
    one `/.../` token."""
    escaped = re.sub(r"\\.|[/\n\r]", _escape_in_regex, pattern, flags=re.DOTALL)
    return f"start: /{escaped}/\n"


def _escape_in_regex(match: re.Match[str]) -> str:
    text = match.group()
    breaks = {"\n": "n", "\r": "r"}
    if text.startswith("\\"):  # an escape of the pattern's own: kept (an escaped line break spelt out)
        return "\\" + breaks.get(text[1], text[1])
    return "\\" + breaks.get(text, text)


def choice_grammar(choices: list[str]) -> str:
    """A Lark grammar whose output is one of `choices`, exactly (llguidance's own `choice`)."""
    return "start: " + " | ".join(json.dumps(choice) for choice in choices) + "\n"


def user_grammar(text: str, param: str) -> str:
    """A client's grammar as vLLM's guidance backend takes it: llguidance's Lark (a `start` rule) as it
    is, GBNF (a `root` rule) converted to Lark by llguidance; one it cannot read is a 400 naming `param`."""
    from llguidance.gbnf_to_lark import any_to_lark  # imported when used: the gateway starts faster

    try:
        return any_to_lark(text)
    except Exception as exc:  # the converter raises bare exceptions of several kinds
        raise InvalidRequest(f"{param}: neither Lark nor GBNF that can be read: {exc}", param=param) from None


def check_grammar(grammar: str, param: str) -> None:
    """A 400 naming `param` for a grammar llguidance rejects (a bad regex, an undefined rule...), found
    before any engine compiles it, so that both engines refuse it alike."""
    import llguidance

    error = llguidance.LLMatcher.validate_grammar(grammar)
    if error:
        raise InvalidRequest(f"{param} cannot be enforced: {error.strip()}", param=param)


def split_tool_call(text: str, names: list[str]) -> tuple[str, str] | None:
    """(name, arguments so far) of a forced call's text once its name is complete, else None.

    The text ends with the call's closing brace only when the whole call is done; callers drop it."""
    if not text.startswith(TOOL_PREFIX):
        return None
    rest = text[len(TOOL_PREFIX) :]
    for name in names:
        if rest.startswith(name + TOOL_MIDDLE):
            return name, rest[len(name) + len(TOOL_MIDDLE) :]
    return None


def _no_extra_properties(schema: Any, listed_only: bool = False) -> Any:
    """`additionalProperties: false` on every object schema that does not say (`listed_only`: on those
    that list their properties)."""
    if not isinstance(schema, dict):
        return schema

    def fix(sub: Any) -> Any:
        return _no_extra_properties(sub, listed_only)

    fixed = {k: fix(v) if isinstance(v, dict) else v for k, v in schema.items()}
    for key in ("properties", "$defs", "definitions"):
        if isinstance(schema.get(key), dict):
            fixed[key] = {n: fix(s) for n, s in schema[key].items()}
    for key in _SUBSCHEMA_LISTS:
        if isinstance(schema.get(key), list):
            fixed[key] = [fix(s) for s in schema[key]]
    says_nothing = schema.get("type") == "object" and "additionalProperties" not in schema
    if says_nothing and (not listed_only or "properties" in schema):
        fixed["additionalProperties"] = False
    return fixed
