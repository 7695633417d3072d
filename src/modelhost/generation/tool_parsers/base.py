"""What every tool-call parser shares: the result types, the parser protocol, JSON and schema helpers.

A parser reads one model family's markup out of a whole generated text. It is forgiving: markup that does
not parse, names a tool the request did not offer, or has arguments that are not an object stays in the
content as the model wrote it, and no input makes a parser raise.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

# The request's tools: each offered tool's name → its `parameters` JSON schema ({} when it has none).
# Formats whose argument values are text (Qwen3-Coder's XML, GLM's <arg_value>) type them by the schema.
Tools = Mapping[str, Mapping[str, Any]]


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One call. ``arguments`` is an object's JSON text, as OpenAI's ``function.arguments``, always written
    as ``json.dumps(obj, ensure_ascii=False)`` (separators ``", "``, ``": "``), whatever the model wrote.
    ``id``: the call's ID where the family has its own (Kimi's ``functions.name:0``, which its template
    writes back in the next turn; Mistral's 9 characters, which its templates require); None lets the
    server make one. Two calls are equal whatever their IDs."""

    name: str
    arguments: str
    id: str | None = field(default=None, compare=False)


@dataclass(frozen=True, slots=True)
class ParsedOutput:
    """The text outside valid tool-call markup (stripped, ``None`` when empty) and the calls, in order."""

    content: str | None
    tool_calls: list[ToolCall]


class ToolCallParser(Protocol):
    """One chat-template family's format. ``start_markers`` let a stream hold back text that may become
    markup (see :func:`streamable_length`) rather than send content it would have to take back."""

    name: str
    start_markers: tuple[str, ...]

    def parse(self, text: str, tools: Tools) -> ParsedOutput: ...


_DECODER = json.JSONDecoder()
# RecursionError: deeply nested input ("[[[[...") overflows the decoder instead of failing to parse.
JSON_ERRORS = (ValueError, RecursionError)


def skip_ws(text: str, pos: int) -> int:
    while pos < len(text) and text[pos].isspace():
        pos += 1
    return pos


def decode_at(text: str, pos: int) -> tuple[object, int] | None:
    """The JSON value starting at ``pos`` and where it ends, or None; the text after it is not looked at."""
    try:
        value, end = _DECODER.raw_decode(text, pos)
    except JSON_ERRORS:
        return None
    return value, end


def decode_whole(text: str) -> object | None:
    """The JSON value that is all of ``text`` (surrounding whitespace allowed), or None."""
    text = text.strip()
    decoded = decode_at(text, 0)
    return decoded[0] if decoded is not None and decoded[1] == len(text) else None


def find_first(text: str, markers: Sequence[str], pos: int = 0) -> tuple[int, str] | None:
    """The earliest occurrence of any marker from ``pos`` (the longest marker on a tie), or None."""
    best: tuple[int, str] | None = None
    for marker in markers:
        found = text.find(marker, pos)
        if found != -1 and (best is None or (found, -len(marker)) < (best[0], -len(best[1]))):
            best = (found, marker)
    return best


# Reads the block whose markup starts at a position (after its marker): its calls and where it ends, or
# None where it is not valid markup (it then stays content).
ReadBlock = Callable[[str, int, Tools], tuple[list[ToolCall], int] | None]


def parse_blocks(text: str, markers: Sequence[str], tools: Tools, read_block: ReadBlock) -> ParsedOutput:
    """Every block that opens at one of ``markers`` and that ``read_block`` reads as valid, taken out of the
    content in order; a marker whose block is invalid stays content, and the search goes on after it."""
    calls: list[ToolCall] = []
    removed: list[tuple[int, int]] = []
    pos = 0
    while (found := find_first(text, markers, pos)) is not None:
        start, marker = found
        pos = start + len(marker)
        block = read_block(text, pos, tools)
        if block is not None:
            calls.extend(block[0])
            removed.append((start, block[1]))
            pos = block[1]
    return ParsedOutput(content_without(text, removed), calls)


def make_call(name: object, arguments: object, tools: Tools, call_id: str | None = None) -> ToolCall | None:
    """A valid call, or None: ``name`` is an offered tool and ``arguments`` an object (given as one, as its
    JSON text the way some models write it OpenAI-style, or missing / null for ``{}``)."""
    if not isinstance(name, str) or name not in tools:
        return None
    if arguments is None:
        arguments = {}
    try:
        if isinstance(arguments, str):
            arguments = _DECODER.decode(arguments)
        if not isinstance(arguments, dict):
            return None
        # allow_nan=False: NaN/Infinity parse, but are not JSON a client could read.
        text = json.dumps(arguments, ensure_ascii=False, allow_nan=False)
        text.encode("utf-8")  # a lone surrogate from a "\ud800" escape could not go out in a response
    except (*JSON_ERRORS, UnicodeEncodeError):
        return None
    return ToolCall(name=name, arguments=text, id=call_id)


def call_from_object(value: object, tools: Tools) -> ToolCall | None:
    """A valid call from a decoded ``{"name", "arguments" | "parameters"}`` object, or None."""
    if not isinstance(value, dict):
        return None
    return make_call(value.get("name"), value.get("arguments", value.get("parameters")), tools)


def content_without(text: str, removed: Sequence[tuple[int, int]]) -> str | None:
    """``text`` without the (sorted, disjoint) ``removed`` spans, stripped; None when nothing is left."""
    pieces: list[str] = []
    pos = 0
    for start, end in removed:
        pieces.append(text[pos:start])
        pos = end
    pieces.append(text[pos:])
    return "".join(pieces).strip() or None


def streamable_length(text: str, markers: Sequence[str]) -> int:
    """How many leading characters of ``text`` can already be streamed to the client as plain content.

    That is everything before the first occurrence of any marker, and never a trailing part of ``text``
    that is a proper prefix of a marker, since more text may complete it. Empty markers are ignored.
    E.g. with ``("<tool_call>",)``: ``"hello <tool"`` → 6, ``"a<"`` → 1, ``"a<b"`` → 3.
    """
    limit = len(text)
    for marker in markers:
        if not marker:
            continue
        found = text.find(marker)
        if found != -1:
            limit = min(limit, found)
        for start in range(max(0, len(text) - len(marker) + 1), limit):
            if marker.startswith(text[start:]):
                limit = start
                break
    return limit


# ---------------------------------------------------------------- typing text values by the schema

_TYPE_ALIASES = {
    "str": "string",
    "text": "string",
    "int": "integer",
    "long": "integer",
    "float": "number",
    "double": "number",
    "bool": "boolean",
    "dict": "object",
    "list": "array",
}
# The order a value is tried in when its schema allows several types (as vLLM's parsers try them).
_TYPE_ORDER = ("null", "integer", "number", "boolean", "object", "array", "string")


def typed_arguments(values: Mapping[str, str], schema: Mapping[str, Any]) -> dict[str, Any]:
    """Text argument values typed by the tool's ``parameters`` schema, as vLLM types them: a property
    whose schema allows a number, boolean, object, array or null gets the first of those its text reads
    as; a string property, one the schema does not describe, or a text that reads as none stays text."""
    properties = schema.get("properties")
    if not isinstance(properties, Mapping):
        return dict(values)
    return {key: _typed(value, properties.get(key)) for key, value in values.items()}


def _schema_types(schema: object) -> set[str]:
    """The JSON types a property's schema allows (``type``, ``enum`` values, ``anyOf``/``oneOf``/``allOf``);
    ``{"string"}`` when it says none."""
    if not isinstance(schema, Mapping):
        return {"string"}
    types: set[str] = set()
    given = schema.get("type")
    for name in [given] if isinstance(given, str) else given if isinstance(given, list) else []:
        if isinstance(name, str):
            types.add(_TYPE_ALIASES.get(name.strip().lower(), name.strip().lower()))
    enum = schema.get("enum")
    for value in enum if isinstance(enum, list) else []:
        types.add(_json_type(value))
    for key in ("anyOf", "oneOf", "allOf"):
        choices = schema.get(key)
        for choice in choices if isinstance(choices, list) else []:
            types |= _schema_types(choice)
    return types or {"string"}


def _json_type(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, dict):
        return "object"
    return "array" if isinstance(value, list) else "string"


def _typed(value: str, schema: object) -> Any:
    if schema is None:
        return value
    types = _schema_types(schema)
    for kind in _TYPE_ORDER:
        if kind not in types:
            continue
        if kind == "string":
            return value
        typed = _read_as(kind, value)
        if typed is not _UNREAD:
            return typed
    finite = _read_as("json", value)  # a type the order does not know: whatever JSON the text is
    return value if finite is _UNREAD else finite


_UNREAD = object()


def _read_as(kind: str, value: str) -> Any:
    """``value`` read as a JSON ``kind``, or ``_UNREAD``."""
    text = value.strip()
    if kind == "null":
        return None if text.lower() == "null" else _UNREAD
    if kind == "boolean":
        return {"true": True, "1": True, "false": False, "0": False}.get(text.lower(), _UNREAD)
    if kind == "integer":
        try:
            return int(text)
        except ValueError:
            return _UNREAD
    if kind == "number":
        try:
            number = float(text)
        except ValueError:
            return _UNREAD
        if not math.isfinite(number):
            return _UNREAD
        return int(number) if number.is_integer() and abs(number) < 2**53 else number
    parsed = decode_whole(text)
    if parsed is None and text != "null":
        return _UNREAD
    wanted = {"object": dict, "array": list}.get(kind)
    if not _finite(parsed) or (wanted is not None and not isinstance(parsed, wanted)):
        return _UNREAD
    return parsed


def _finite(value: object) -> bool:
    """No NaN or infinity anywhere in a decoded JSON value (they would not go out as JSON)."""
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, dict):
        return all(_finite(item) for item in value.values())
    if isinstance(value, list):
        return all(_finite(item) for item in value)
    return True
