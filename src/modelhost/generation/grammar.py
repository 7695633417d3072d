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

A tenant writes these schemas, grammars and regexes: the grammar built here is only text, made in one
pass without recursion; before any request carrying it is dispatched, it is checked within bounds and
compiled by llguidance in a compile process (`compile_sandbox.GrammarChecker.check`), and every replica
checks it again before its engine compiles it (`grammar_bounds.check_engine_grammar`).
"""

from __future__ import annotations

import json
import re
from typing import Any

import orjson

from modelhost.generation.grammar_bounds import JSON_NESTING_LIMIT, too_complex, too_nested

TOOL_PREFIX = '{"name": "'
TOOL_MIDDLE = '", "arguments": '
# Compact JSON: flexible whitespace would let a looping model emit newlines until `max_tokens`.
_GUIDED = {"x-guidance": {"whitespace_flexible": False, "lenient": False}}
_BOUNDED_STRING_KEYS = ("maxLength", "enum", "const", "pattern", "format")
_BOUNDED_INTEGER_KEYS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "enum", "const")
SAFE_INTEGER = 2**53 - 1  # the largest integer every JSON reader holds exactly
# One schema's JSON (a `response_format`, a tool's parameters, a structured output's): far more than
# OpenAI's structured outputs accept, and within it the walk below takes about a tenth of a second
MAX_SCHEMA_BYTES = 512 << 10
# Where JSON Schema keywords hold subschemas: lists of them, maps of names to them, one of them.
_SUBSCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems", "items")
_SUBSCHEMA_MAPS = ("properties", "$defs", "definitions", "patternProperties", "dependentSchemas")
_SUBSCHEMAS = (
    *("items", "additionalProperties", "not", "if", "then", "else", "contains", "propertyNames"),
    *("additionalItems", "unevaluatedItems", "unevaluatedProperties"),
)


def shaped(schema: Any, max_string_length: int, closed: str, param: str) -> Any:
    """A copy of `schema` in which every unbounded string has `maxLength: max_string_length`, every
    unbounded integer ±`SAFE_INTEGER`, and objects take no properties beyond those they list:
    `additionalProperties: false` where an object schema says nothing of others, on all of them
    (`closed="all"`), on those that list their properties (`"listed"`) or none (`"none"`).

    One pass over the subschemas (by keyword), iterative: a tenant's schema is never recursed over, and
    one nested deeper than llguidance reads (`JSON_NESTING_LIMIT`) is a 400 naming `param` first. This
    runs on the gateway's event loop, so a schema whose JSON passes `MAX_SCHEMA_BYTES` (measured by
    orjson, at C speed) is a 400 before any of it is walked: the walk costs at most about a tenth of a
    second."""
    if _json_bytes(schema) > MAX_SCHEMA_BYTES:
        raise too_complex(param, "the JSON schema is longer than its limit in bytes", MAX_SCHEMA_BYTES)
    if json_nesting(schema) > JSON_NESTING_LIMIT:
        raise too_nested(param)
    if not isinstance(schema, dict):
        return schema
    top = dict(schema)
    todo = [top]
    while todo:
        node = todo.pop()
        kinds = node.get("type")
        is_string = kinds == "string" or (isinstance(kinds, list) and "string" in kinds)
        if is_string and not any(key in node for key in _BOUNDED_STRING_KEYS):
            node["maxLength"] = max_string_length
        if kinds == "integer" and not any(key in node for key in _BOUNDED_INTEGER_KEYS):
            node["minimum"], node["maximum"] = -SAFE_INTEGER, SAFE_INTEGER
        says_nothing = kinds == "object" and "additionalProperties" not in node
        if says_nothing and (closed == "all" or (closed == "listed" and "properties" in node)):
            node["additionalProperties"] = False
        for key, value in node.items():
            if key in _SUBSCHEMA_LISTS and isinstance(value, list):
                node[key] = [dict(s) if isinstance(s, dict) else s for s in value]
                todo += [s for s in node[key] if isinstance(s, dict)]
            elif key in _SUBSCHEMA_MAPS and isinstance(value, dict):
                node[key] = {n: dict(s) if isinstance(s, dict) else s for n, s in value.items()}
                todo += [s for s in node[key].values() if isinstance(s, dict)]
            elif key in _SUBSCHEMAS and isinstance(value, dict):
                node[key] = dict(value)
                todo.append(node[key])
    return top


def _json_bytes(value: Any) -> int:
    """The length of `value` as JSON (integers past 64 bits, which orjson refuses: by the json module)."""
    try:
        return len(orjson.dumps(value))
    except TypeError:
        return len(json.dumps(value))


def json_nesting(value: Any) -> int:
    """How deep objects and arrays nest in a JSON value, counted without recursion."""
    deepest, todo = 0, [(value, 1)]
    while todo:
        item, level = todo.pop()
        if isinstance(item, dict | list):
            deepest = max(deepest, level)
            if level <= JSON_NESTING_LIMIT:
                todo += [(child, level + 1) for child in (item.values() if isinstance(item, dict) else item)]
    return deepest


def json_schema_grammar(
    schema: dict[str, Any], max_string_length: int, strict: bool, param: str = "response_format"
) -> str:
    """A Lark grammar (llguidance dialect) for one JSON value following `schema`.

    `strict` (OpenAI's strict mode) forbids properties the schema does not list, as OpenAI does. Without
    it, an object schema that lists its properties and says nothing of others still gets no others: an
    answer without them validates all the same, and an extra property's value has no type to bound, so
    a looping model would write it until `max_tokens` (Instructor's schemas are like that). A bare
    `{"type": "object"}` (`json_object`) stays open."""
    body = json.dumps({**shaped(schema, max_string_length, "all" if strict else "listed", param), **_GUIDED})
    return f"start: %json {body}\n"


def tool_call_grammar(
    tools: list[tuple[str, dict[str, Any]]], max_string_length: int, param: str = "tools"
) -> str:
    """A Lark grammar for exactly one call of one of `tools` (name, parameters schema)."""
    lines = ["start: " + " | ".join(f"call_{i}" for i in range(len(tools)))]
    for i, (name, parameters) in enumerate(tools):
        schema = parameters or {"type": "object", "properties": {}}
        prefix = json.dumps(TOOL_PREFIX + name + TOOL_MIDDLE)
        lines.append(f'call_{i}: {prefix} args_{i} "}}"')
        body = json.dumps({**shaped(schema, max_string_length, "all", param), **_GUIDED})
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
