"""Mistral's ``[TOOL_CALLS]`` calls, in each tokenizer generation's shape."""

from __future__ import annotations

import re
import secrets
import string

from modelhost.generation.tool_parsers.base import (
    ParsedOutput,
    ToolCall,
    Tools,
    call_from_object,
    content_without,
    decode_at,
    make_call,
    skip_ws,
)

# `name`, an optional `[CALL_ID]id`, an optional `[ARGS]`: what comes before a call's JSON arguments.
_HEAD = re.compile(r"\s*([^\s\[\]{}]+)\s*(?:\[CALL_ID\][^\[{]*)?(?:\[ARGS\])?\s*")
_ID_CHARACTERS = string.ascii_letters + string.digits


class MistralParser:
    """``[TOOL_CALLS]`` + a JSON array of calls (tokenizers before v11), or ``name[ARGS]{...}`` (v11+, an
    optional ``[CALL_ID]id`` after the name) or ``name{...}`` (the newest) per marker.

    The array is one block, taken only if every call in it is valid: one element cannot be cut out and
    left behind as readable text. A model's ``[CALL_ID]`` is ignored; each call gets a new ID of 9 letters
    and digits, the only shape Mistral's chat templates accept when the call comes back in the next turn.
    """

    name = "mistral"
    start_markers: tuple[str, ...] = ("[TOOL_CALLS]",)
    _marker = "[TOOL_CALLS]"

    def parse(self, text: str, tools: Tools) -> ParsedOutput:
        starts: list[int] = []
        while (found := text.find(self._marker, starts[-1] + 1 if starts else 0)) != -1:
            starts.append(found)
        calls: list[ToolCall] = []
        removed: list[tuple[int, int]] = []
        for i, start in enumerate(starts):
            segment = text[start : starts[i + 1] if i + 1 < len(starts) else len(text)]
            block = self._block(segment, tools)
            if block is not None:
                calls.extend(ToolCall(call.name, call.arguments, _call_id()) for call in block[0])
                removed.append((start, start + block[1]))
        return ParsedOutput(content_without(text, removed), calls)

    def _block(self, segment: str, tools: Tools) -> tuple[list[ToolCall], int] | None:
        """The calls in one ``[TOOL_CALLS]...`` segment and where their markup ends, or None if invalid."""
        pos = skip_ws(segment, len(self._marker))
        if segment.startswith(("[", "{"), pos):
            decoded = decode_at(segment, pos)
            if decoded is None:
                return None
            value, end = decoded
            items = value if isinstance(value, list) else [value]
            calls = [call_from_object(item, tools) for item in items]
            valid = [call for call in calls if call is not None]
            return (valid, end) if valid and len(valid) == len(calls) else None
        head = _HEAD.match(segment, pos)
        if head is None:
            return None
        decoded = decode_at(segment, head.end())
        if decoded is None:
            return None
        call = make_call(head.group(1), decoded[0], tools)
        return None if call is None else ([call], decoded[1])


def _call_id() -> str:
    return "".join(secrets.choice(_ID_CHARACTERS) for _ in range(9))


MISTRAL = MistralParser()
