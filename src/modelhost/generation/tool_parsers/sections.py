"""Formats where special tokens open a section of calls, each call between its own tokens: DeepSeek V3 /
R1, DeepSeek V3.1, Kimi K2."""

from __future__ import annotations

from collections.abc import Callable

from modelhost.generation.tool_parsers.base import (
    ParsedOutput,
    ToolCall,
    Tools,
    make_call,
    parse_blocks,
    skip_ws,
)

# A call's text between its open and close tokens → (name, arguments text, the model's own call ID).
ReadCall = Callable[[str], tuple[str, str, str | None] | None]


class SectionParser:
    """``section_open`` (call_open body call_close)+ ``section_close``. A section is one block, taken only
    if every call in it is valid and nothing but blanks lies between its calls; ``section_close`` may be
    missing when nothing follows the last call (generation stopped there). Text around sections is content.
    """

    def __init__(
        self, name: str, section: tuple[str, str], call: tuple[str, str], read_call: ReadCall
    ) -> None:
        self.name = name
        self.start_markers: tuple[str, ...] = (section[0],)
        self._section = section
        self._call = call
        self._read_call = read_call

    def parse(self, text: str, tools: Tools) -> ParsedOutput:
        return parse_blocks(text, self.start_markers, tools, self._block)

    def _block(self, text: str, pos: int, tools: Tools) -> tuple[list[ToolCall], int] | None:
        """The calls of the section whose calls start at ``pos`` and where it ends, or None."""
        call_open, call_close = self._call
        calls: list[ToolCall] = []
        while True:
            pos = skip_ws(text, pos)
            if text.startswith(self._section[1], pos):
                end = pos + len(self._section[1])
                break
            if pos == len(text):
                end = pos
                break
            if not text.startswith(call_open, pos):
                return None
            close = text.find(call_close, pos + len(call_open))
            if close == -1:
                return None  # a call cut short
            read = self._read_call(text[pos + len(call_open) : close])
            call = None if read is None else make_call(read[0], read[1], tools, read[2])
            if call is None:
                return None
            calls.append(call)
            pos = close + len(call_close)
        return (calls, end) if calls else None


def _deepseek_v3_call(body: str) -> tuple[str, str, None] | None:
    """``function<｜tool▁sep｜>name\\n```json\\n{...}\\n``` ``: the JSON fenced as Markdown (the fence is
    optional: R1's distills drop it)."""
    kind, sep, rest = body.partition("<｜tool▁sep｜>")
    name, _, arguments = rest.partition("\n")
    if not sep or kind.strip() != "function":
        return None
    arguments = arguments.strip()
    if arguments.startswith("```"):
        arguments = arguments.removeprefix("```json").removeprefix("```").removesuffix("```")
    return name.strip(), arguments, None


def _deepseek_v31_call(body: str) -> tuple[str, str, None] | None:
    """``name<｜tool▁sep｜>{...}``."""
    name, sep, arguments = body.partition("<｜tool▁sep｜>")
    return (name.strip(), arguments, None) if sep else None


def _kimi_call(body: str) -> tuple[str, str, str | None] | None:
    """``functions.name:0<|tool_call_argument_begin|>{...}``: the header is Kimi's own call ID, which its
    template writes back in the next turn, so it is kept as the call's ID."""
    header, sep, arguments = body.partition("<|tool_call_argument_begin|>")
    if not sep:
        return None
    header = header.strip()
    qualified, colon, index = header.rpartition(":")
    if colon and index.isdigit():
        return qualified.removeprefix("functions."), arguments, header
    return header.removeprefix("functions."), arguments, None


DEEPSEEK_V3 = SectionParser(
    "deepseek_v3",
    ("<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"),
    ("<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>"),
    _deepseek_v3_call,
)
DEEPSEEK_V31 = SectionParser(
    "deepseek_v31",
    ("<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"),
    ("<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>"),
    _deepseek_v31_call,
)
KIMI_K2 = SectionParser(
    "kimi_k2",
    ("<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"),
    ("<|tool_call_begin|>", "<|tool_call_end|>"),
    _kimi_call,
)
