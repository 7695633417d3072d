"""Formats where a marker is followed by JSON calls: Hermes / Qwen, Granite, Phi-4-mini."""

from __future__ import annotations

from modelhost.generation.tool_parsers.base import (
    ParsedOutput,
    ToolCall,
    Tools,
    call_from_object,
    decode_at,
    parse_blocks,
    skip_ws,
)


class MarkedJsonParser:
    """A start marker, then one call object or a JSON array of calls, then an optional closing marker.

    An array is one block, taken only if every call in it is valid: one element cannot be cut out and
    left behind as readable text. ``needs_close``: a block must end with the closing marker unless it is
    the last thing in the text (generation often stops right after the JSON); otherwise text after the
    JSON is content.
    """

    def __init__(self, name: str, opens: tuple[str, ...], close: str, needs_close: bool) -> None:
        self.name = name
        self.start_markers: tuple[str, ...] = opens
        self._close = close
        self._needs_close = needs_close

    def parse(self, text: str, tools: Tools) -> ParsedOutput:
        return parse_blocks(text, self.start_markers, tools, self._block)

    def _block(self, text: str, pos: int, tools: Tools) -> tuple[list[ToolCall], int] | None:
        """The calls of the block whose JSON starts at ``pos`` (after blanks) and where it ends, or None."""
        decoded = decode_at(text, skip_ws(text, pos))
        if decoded is None:
            return None
        value, end = decoded
        after = skip_ws(text, end)
        if text.startswith(self._close, after):
            end = after + len(self._close)
        elif self._needs_close and after < len(text):
            return None
        items = value if isinstance(value, list) else [value]
        block = [call_from_object(item, tools) for item in items]
        valid = [call for call in block if call is not None]
        return (valid, end) if valid and len(valid) == len(block) else None


# Qwen2/2.5/3, QwQ and Hermes: `<tool_call>{"name": ..., "arguments": ...}</tool_call>` blocks anywhere.
HERMES = MarkedJsonParser("hermes", ("<tool_call>",), "</tool_call>", needs_close=True)

# Granite 3.0 `<|tool_call|>[{...}]` (a special token), 3.1+ `<tool_call>[{...}]` (text), both with no
# closing marker; Granite 4 `<tool_call>\n{...}\n</tool_call>` as Hermes.
GRANITE = MarkedJsonParser("granite", ("<|tool_call|>", "<tool_call>"), "</tool_call>", needs_close=False)

# Phi-4-mini: `functools[{"name": ..., "arguments": ...}, ...]` (its tool prompt: "prefix function calls
# with functools marker (no closing marker required)"); also its tokenizer's `<|tool_call|>...<|/tool_call|>`.
PHI4_MINI = MarkedJsonParser("phi4_mini", ("functools", "<|tool_call|>"), "<|/tool_call|>", needs_close=False)
