"""Tool-call parsers: turn the tool-call markup in a model's own text into OpenAI ``tool_calls``.

With ``tool_choice: "auto"`` the model decides itself whether to call a tool, in the markup its chat
template taught it, which differs per model family. Parsing is forgiving: a block that does not parse,
names a tool the request did not offer, or has non-object arguments stays in the content as the model
wrote it, so nothing is lost and no input makes a parser raise. Standard library only, so the API layer
can import it without torch.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One call. ``arguments`` is an object's JSON text, as OpenAI's ``function.arguments``, always written
    as ``json.dumps(obj, ensure_ascii=False)`` (separators ``", "``, ``": "``), whatever the model wrote."""

    name: str
    arguments: str


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

    def parse(self, text: str, tool_names: Collection[str]) -> ParsedOutput: ...


_DECODER = json.JSONDecoder()
# RecursionError: deeply nested input ("[[[[...") overflows the decoder instead of failing to parse.
_JSON_ERRORS = (ValueError, RecursionError)


def _skip_ws(text: str, pos: int) -> int:
    while pos < len(text) and text[pos].isspace():
        pos += 1
    return pos


def _decode_at(text: str, pos: int) -> tuple[object, int] | None:
    """The JSON value starting at ``pos`` and where it ends, or None; the text after it is not looked at."""
    try:
        value, end = _DECODER.raw_decode(text, pos)
    except _JSON_ERRORS:
        return None
    return value, end


def _call_from(value: object, tool_names: Collection[str]) -> ToolCall | None:
    """A valid call from a decoded ``{"name", "arguments" | "parameters"}`` object, or None.

    String arguments are decoded once more (some models write them OpenAI-style, as JSON text);
    missing or null arguments mean ``{}``.
    """
    if not isinstance(value, dict):
        return None
    name = value.get("name")
    if not isinstance(name, str) or name not in tool_names:
        return None
    arguments = value.get("arguments", value.get("parameters"))
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
    except (*_JSON_ERRORS, UnicodeEncodeError):
        return None
    return ToolCall(name=name, arguments=text)


def _content(text: str, removed: Sequence[tuple[int, int]]) -> str | None:
    """``text`` without the (sorted, disjoint) ``removed`` spans, stripped; None when nothing is left."""
    pieces: list[str] = []
    pos = 0
    for start, end in removed:
        pieces.append(text[pos:start])
        pos = end
    pieces.append(text[pos:])
    return "".join(pieces).strip() or None


def _scan_sequence(text: str, pos: int, sep: str) -> tuple[list[tuple[int, int, object]], int]:
    """JSON values joined by ``sep`` from ``pos``: each (start, end, value), and where decoding stopped."""
    items: list[tuple[int, int, object]] = []
    while True:
        pos = _skip_ws(text, pos)
        decoded = _decode_at(text, pos)
        if decoded is None:
            return items, pos
        value, end = decoded
        items.append((pos, end, value))
        pos = _skip_ws(text, end)
        if not text.startswith(sep, pos):
            return items, end
        pos += len(sep)


class _HermesParser:
    """Qwen2/2.5 and Hermes: ``<tool_call>{"name": ..., "arguments": ...}</tool_call>`` blocks anywhere.

    A last block may lack ``</tool_call>`` (generation often stops right after the JSON), so a complete
    JSON object followed only by whitespace still counts.
    """

    name: str = "hermes"
    start_markers: tuple[str, ...] = ("<tool_call>",)
    _open = "<tool_call>"
    _close = "</tool_call>"

    def parse(self, text: str, tool_names: Collection[str]) -> ParsedOutput:
        calls: list[ToolCall] = []
        removed: list[tuple[int, int]] = []
        pos = 0
        while (start := text.find(self._open, pos)) != -1:
            pos = start + len(self._open)
            decoded = _decode_at(text, _skip_ws(text, pos))
            if decoded is None:
                continue
            value, end = decoded
            end = _skip_ws(text, end)
            if text.startswith(self._close, end):
                end += len(self._close)
            elif end < len(text):
                continue
            call = _call_from(value, tool_names)
            if call is None:
                continue
            calls.append(call)
            removed.append((start, end))
            pos = end
        return ParsedOutput(_content(text, removed), calls)


class _Llama3JsonParser:
    """Llama 3.1/3.2: ``<|python_tag|>`` then JSON objects joined by ``;``, or an output of only such objects.

    ``"{"`` is a start marker because an untagged call begins with it: streaming holds back content from its
    first ``{`` (latency) rather than ever sending a call as content. Each object is its own block.
    """

    name: str = "llama3_json"
    start_markers: tuple[str, ...] = ("<|python_tag|>", "{")
    _tag = "<|python_tag|>"

    def parse(self, text: str, tool_names: Collection[str]) -> ParsedOutput:
        tag = text.find(self._tag)
        if tag != -1:
            prefix, pos = text[:tag], tag + len(self._tag)
        else:
            prefix, pos = "", _skip_ws(text, 0)
            if not text.startswith("{", pos):
                return ParsedOutput(_content(text, []), [])
        items, stop = _scan_sequence(text, pos, ";")
        if tag == -1 and _skip_ws(text, stop) < len(text):
            # Untagged, the output is calls only if it is nothing but JSON objects; otherwise it is prose.
            return ParsedOutput(_content(text, []), [])
        calls: list[ToolCall] = []
        invalid: list[str] = []
        for start, end, value in items:
            call = _call_from(value, tool_names)
            if call is None:
                invalid.append(text[start:end])
            else:
                calls.append(call)
        if not calls:
            return ParsedOutput(_content(text, []), [])
        pieces = (prefix.strip(), "; ".join(invalid), text[stop:].strip())
        return ParsedOutput(" ".join(piece for piece in pieces if piece) or None, calls)


class _MistralParser:
    """Mistral: ``[TOOL_CALLS]`` + a JSON array of calls (older), or ``name[ARGS]{...}`` per marker (newer).

    The array is one block, taken only if every call in it is valid: one element cannot be cut out and
    left behind as readable text. A ``[CALL_ID]id`` after the name is ignored; the server makes call ids.
    """

    name: str = "mistral"
    start_markers: tuple[str, ...] = ("[TOOL_CALLS]",)
    _marker = "[TOOL_CALLS]"

    def parse(self, text: str, tool_names: Collection[str]) -> ParsedOutput:
        starts: list[int] = []
        while (found := text.find(self._marker, starts[-1] + 1 if starts else 0)) != -1:
            starts.append(found)
        calls: list[ToolCall] = []
        removed: list[tuple[int, int]] = []
        for i, start in enumerate(starts):
            segment = text[start : starts[i + 1] if i + 1 < len(starts) else len(text)]
            block = self._block(segment, tool_names)
            if block is not None:
                calls.extend(block[0])
                removed.append((start, start + block[1]))
        return ParsedOutput(_content(text, removed), calls)

    def _block(self, segment: str, tool_names: Collection[str]) -> tuple[list[ToolCall], int] | None:
        """The calls in one ``[TOOL_CALLS]...`` segment and where their markup ends, or None if invalid."""
        pos = _skip_ws(segment, len(self._marker))
        if segment.startswith(("[", "{"), pos):
            decoded = _decode_at(segment, pos)
            if decoded is None:
                return None
            value, end = decoded
            items = value if isinstance(value, list) else [value]
            calls = [_call_from(item, tool_names) for item in items]
            valid = [call for call in calls if call is not None]
            return (valid, end) if valid and len(valid) == len(calls) else None
        args_at = segment.find("[ARGS]", pos)
        if args_at == -1:
            return None
        name = segment[pos:args_at].split("[CALL_ID]")[0].strip()
        decoded = _decode_at(segment, _skip_ws(segment, args_at + len("[ARGS]")))
        if decoded is None:
            return None
        call = _call_from({"name": name, "arguments": decoded[0]}, tool_names)
        return None if call is None else ([call], decoded[1])


PARSERS: dict[str, ToolCallParser] = {
    "hermes": _HermesParser(),
    "llama3_json": _Llama3JsonParser(),
    "mistral": _MistralParser(),
}


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
